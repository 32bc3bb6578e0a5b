// Where a query block's results go, and the stores both kernels share: the
// log-sum-exp values from registers, and the block in which no row sees a
// key.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fragment_layout.cuh"
#include "fwd/params.h"
#include "fwd/tile_coords.cuh"

namespace flashcore {

// A query block's first output row and LSE entry, and how many of its rows
// exist.
template <typename Element>
struct OutputBlock {
    Element *out;
    float *lse;  // nullptr: not requested
    int valid_rows;

    __device__ __forceinline__ static OutputBlock of(const FwdKernelParams &p, const FwdTile &tile, int block_m) {
        const int first_query = tile.m_block * block_m;
        OutputBlock b;
        b.out = static_cast<Element *>(p.out) + fwd_out_offset(p, tile) + first_query * p.out_seq_stride;
        b.lse = p.lse == nullptr ? nullptr : p.lse + fwd_lse_offset(p, tile) + first_query;
        b.valid_rows = fwd_valid_rows(p, tile, block_m);
        return b;
    }
};

// lse points at the block's first query row; one lane of each quad writes its
// two rows per m16 tile (kRows = 2 per m16 tile) of the warp's rows from
// warp_first_row.
template <int kRows>
__device__ __forceinline__ void store_lse(const float (&lse)[kRows], float *gmem_lse, int valid_rows,
                                          int warp_first_row, int lane) {
    if (lane % 4 != 0) return;
#pragma unroll
    for (int m = 0; m < kRows / 2; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
            if (row < valid_rows) gmem_lse[row] = lse[m * 2 + half];
        }
    }
}

// A query block in which no row sees any key (causal, seqlen_q > seqlen_k):
// out = 0 and lse = -inf, written without touching K or V by threads
// tid = 0 .. num_threads - 1. Writes the first head_dim_v columns of each of
// the block's valid rows.
template <typename Element>
__device__ __forceinline__ void store_empty_block(const OutputBlock<Element> &dst, int64_t out_seq_stride,
                                                  int head_dim_v, int tid, int num_threads) {
    const int vectors_per_row = head_dim_v / kElemsPerVector;
    for (int i = tid; i < dst.valid_rows * vectors_per_row; i += num_threads) {
        *reinterpret_cast<uint4 *>(dst.out + (i / vectors_per_row) * out_seq_stride +
                                   (i % vectors_per_row) * kElemsPerVector) = make_uint4(0, 0, 0, 0);
    }
    if (dst.lse != nullptr) {
        for (int row = tid; row < dst.valid_rows; row += num_threads) dst.lse[row] = -INFINITY;
    }
}

}  // namespace flashcore
