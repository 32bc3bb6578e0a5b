// The fp32 dQ accumulator's layout inside a query block.
//
// The accumulator has a float per query row, head and dimension (the
// workspace contract: flashcore_backward_workspace_size), the rows of a
// (batch, query head) kHeadDim floats apart. Between the preprocess, which
// zeroes it, and the convert kernel, which reads it into dq, only the
// backward's own kernels see it, so inside a whole query block (kBlockM rows
// that exist, at the kernel's own head dim: kBlockM x kHeadDim contiguous
// floats) the values are stored in the order the main kernel's warps hold
// them rather than row by row: per dQ pass, warp, m16 tile and n8 tile
// (config.cuh) a group of 128 floats, the warp's 32 lanes x 4 accumulator
// values. A warp's reduction of one fragment tile then covers whole
// contiguous lines: row by row its 32 lanes' values span 8 rows, 8 lines per
// instruction (ncu: the reductions' lg_throttle stalls, and loads waiting on
// their registers). FlashAttention 2 lays its dQ accumulator out by its MMA
// tiling for the same reason.
//
// Within a group, sm_90 keeps a lane's four values together (one v4
// reduction of 512 contiguous bytes per tile); sm_80, which has only scalar
// reductions, keeps each value's 32 lanes together (four reductions of 128
// contiguous bytes). The convert kernel is built in the same pass as the
// main kernel, so both read the layout of the architecture they run on.
//
// The last, partial block of a sequence and calls whose head dim is padded
// to the kernel's keep rows (bounds per element).
#pragma once

#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"

namespace flashcore {

template <typename Traits>
struct DqAccumLayout {
    static constexpr int kValues = 4;  // a lane's values of an m16n8 tile
    static constexpr int kGroupFloats = kWarpSize * kValues;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    static constexpr int kLaneStride = 1;
    static constexpr int kValueStride = kWarpSize;
#else
    static constexpr int kLaneStride = kValues;
    static constexpr int kValueStride = 1;
#endif
    static constexpr int kRowsPerWarp = Traits::kBlockM / Traits::kWarpsMdQ;
    static constexpr int kColsPerWarp = Traits::kHeadDim / Traits::kWarpsDdQ;
    static constexpr int kColsPerPass = Traits::kdQNTiles * kMmaN;

    // Whether query block rows [first_row, first_row + kBlockM) of a call
    // with head_dim are stored by fragment (valid_rows: the rows of the
    // sequence from first_row on).
    __device__ __forceinline__ static bool by_fragment(int valid_rows, int head_dim) {
        return valid_rows >= Traits::kBlockM && head_dim == Traits::kHeadDim;
    }

    // The first float of the group of (pass, warp, m tile, n tile).
    __device__ __forceinline__ static int group(int pass, int warp, int m, int n) {
        return (((pass * Traits::kNumWarps + warp) * Traits::kdQMTiles + m) * Traits::kdQNTiles + n) * kGroupFloats;
    }

    // Adds a lane's values of tile (m, n) into its group; warp_base: the
    // block's accumulator + group(pass, warp, 0, 0) + lane * kLaneStride
    // (so that each tile is an immediate offset from it).
    __device__ __forceinline__ static void add(float *warp_base, int m, int n, const float (&values)[kValues]) {
        float *lane_base = warp_base + group(0, 0, m, n);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#pragma unroll
        for (int e = 0; e < kValues; ++e) red_add(lane_base + e * kValueStride, values[e]);
#else
        red_add4(lane_base, values);
#endif
    }

    // The float of (row, col) in a whole block, and of (row, col + 1) at
    // + kValueStride (col even): the inverse of the above, from the warps'
    // places in config.cuh (dq_row0, dq_col0 in mainloop.cuh) and the
    // fragment layout (frag_row, frag_col).
    __device__ __forceinline__ static int offset(int row, int col) {
        const int warp = (row / kRowsPerWarp) * Traits::kWarpsDdQ + col / kColsPerWarp;
        const int warp_row = row % kRowsPerWarp;
        const int warp_col = col % kColsPerWarp;
        const int tile_row = warp_row % kMmaM;
        const int tile_col = warp_col % kColsPerPass % kMmaN;
        const int lane = (tile_row % kFragRowHalf) * (kMmaN / 2) + tile_col / 2;
        const int value = (tile_row / kFragRowHalf) * 2 + tile_col % 2;
        return group(warp_col / kColsPerPass, warp, warp_row / kMmaM, warp_col % kColsPerPass / kMmaN) +
               lane * kLaneStride + value * kValueStride;
    }
};

}  // namespace flashcore
