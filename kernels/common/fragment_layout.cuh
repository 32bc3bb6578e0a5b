// The register layout of the tensor cores' m16n8 accumulator fragments,
// shared by mma.sync (sm80) and wgmma (sm90, whose warps each hold 16 rows
// in the same layout), and the units both kernels' tiles are counted in.
#pragma once

namespace flashcore {

constexpr int kMmaM = 16;  // rows of one m16n8k16 tile: the unit along the query axis
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kWarpSize = 32;

// Lane l holds rows l/4 and l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1 of its
// m16n8 tile, in the order (row, col), (row, col+1), (row+8, col),
// (row+8, col+1).
__device__ __forceinline__ int frag_row(int lane) { return lane / 4; }
__device__ __forceinline__ int frag_col(int lane) { return 2 * (lane % 4); }
constexpr int kFragRowHalf = 8;

}  // namespace flashcore
