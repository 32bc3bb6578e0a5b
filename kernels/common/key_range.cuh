// Score masking for key columns a query row may not see: columns past
// seqlen_k (the partial last key tile) and, under a causal mask, columns
// right of the row's diagonal. Masked scores become -inf so that the softmax
// gives them exactly zero weight.
#pragma once

#include <cmath>

#include "kernel_traits.cuh"

namespace flashcore {

// The layout of an m16n8 accumulator fragment: lane l holds rows l/4 and
// l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1 of its tile, in the order
// (row, col), (row, col+1), (row+8, col), (row+8, col+1).
__device__ __forceinline__ int frag_row(int lane) { return lane / 4; }
__device__ __forceinline__ int frag_col(int lane) { return 2 * (lane % 4); }
constexpr int kFragRowHalf = 8;

// Whether key tile n_block needs any masking for query block m_block: only
// the partial last tile and tiles crossing the causal diagonal do. Deciding
// per tile keeps the common full tiles free of per-element comparisons.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool tile_needs_mask(int m_block, int n_block, int seqlen_k, bool causal,
                                                int shift) {
    const int tile_key_end = (n_block + 1) * kBlockN;  // exclusive
    if (tile_key_end > seqlen_k) return true;
    // The block's first query row sees the fewest keys.
    return causal && tile_key_end - 1 > m_block * kBlockM + shift;
}

// One past the last key query `row` may see: seqlen_k, or under the causal
// mask the key on its diagonal.
__device__ __forceinline__ int visible_key_end(int row, int seqlen_k, bool causal, int shift) {
    return causal ? min(seqlen_k, row + shift + 1) : seqlen_k;
}

// scores[m][n][e]: this thread's fragments of one warp's S tile.
// first_row: global query row of the warp's first row; first_col: global key
// index of the tile's first column.
template <int kMAtoms, int kNAtoms>
__device__ __forceinline__ void apply_mask(float (&scores)[kMAtoms][kNAtoms][4], int first_row, int first_col,
                                           int seqlen_k, bool causal, int shift, int lane) {
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
            const int visible_end = visible_key_end(row, seqlen_k, causal, shift);
#pragma unroll
            for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int col = first_col + n * kMmaN + frag_col(lane) + j;
                    if (col >= visible_end) scores[m][n][half * 2 + j] = -INFINITY;
                }
            }
        }
    }
}

}  // namespace flashcore
