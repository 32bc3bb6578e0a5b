// Stores of a query block's results row by row, where rows are not one
// strided run of out: a split-KV part's fp32 rows in the workspace, and the
// rows of a GQA-packed tile, which belong to several query heads
// (fwd_params.h). Both kernels' usual output paths (staged through shared
// memory, or TMA) serve everything else.
//
// Row r of a block is packed row first_row + r of its (batch, head group):
// query (first_row + r) / packed_heads of head head_q + that remainder.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fragment_layout.cuh"
#include "fwd/params.h"
#include "common/ptx.cuh"
#include "fwd/tile_coords.cuh"

namespace flashcore {

template <typename T>
__device__ __forceinline__ void store_pair(T *dst, float lo, float hi) {
    *reinterpret_cast<uint32_t *>(dst) = pack2<T>(lo, hi);
}
template <>
__device__ __forceinline__ void store_pair<float>(float *dst, float lo, float hi) {
    *reinterpret_cast<float2 *>(dst) = make_float2(lo, hi);
}

// Where each row of one query block goes: out rows of T and LSE entries.
template <typename T>
struct RowDestination {
    T *out;      // the block's (batch, first head), query 0
    float *lse;  // likewise; nullptr: not written
    int64_t seq_stride, head_stride;  // of out, in elements
    int64_t lse_head_stride;          // of lse (its query stride is 1)
    int first_row;
    int packed_heads;
    int valid_rows;

    __device__ __forceinline__ int64_t out_offset(int row) const {
        const int r = first_row + row;
        return packed_heads == 1 ? int64_t(r) * seq_stride
                                 : int64_t(r / packed_heads) * seq_stride + int64_t(r % packed_heads) * head_stride;
    }
    __device__ __forceinline__ int64_t lse_offset(int row) const {
        const int r = first_row + row;
        return packed_heads == 1 ? int64_t(r) : int64_t(r / packed_heads) + int64_t(r % packed_heads) * lse_head_stride;
    }
};

// The workspace rows of split `split` (fwd_params.h gives the layout).
__device__ __forceinline__ RowDestination<float> split_destination(const FwdKernelParams &p, const FwdTile &tile,
                                                                   int block_m, int split) {
    const int64_t first_head_row =
        ((int64_t(split) * p.batch_size + tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q;
    RowDestination<float> d;
    d.out = p.partial_out + first_head_row * p.head_dim_v;
    d.lse = p.partial_lse + first_head_row;
    d.seq_stride = p.head_dim_v;
    d.head_stride = int64_t(p.seqlen_q) * p.head_dim_v;
    d.lse_head_stride = p.seqlen_q;
    d.first_row = tile.m_block * block_m;
    d.packed_heads = p.packed_heads;
    d.valid_rows = fwd_valid_rows(p, tile, block_m);
    return d;
}

// out and lse rows of a block (for packed tiles; any tile works).
template <typename Element>
__device__ __forceinline__ RowDestination<Element> output_destination(const FwdKernelParams &p, const FwdTile &tile,
                                                                      int block_m) {
    RowDestination<Element> d;
    d.out = static_cast<Element *>(p.out) + fwd_out_offset(p, tile);
    d.lse = p.lse == nullptr ? nullptr : p.lse + fwd_lse_offset(p, tile);
    d.seq_stride = p.out_seq_stride;
    d.head_stride = p.out_head_stride;
    d.lse_head_stride = p.lse_head_stride;
    d.first_row = tile.m_block * block_m;
    d.packed_heads = p.packed_heads;
    d.valid_rows = fwd_valid_rows(p, tile, block_m);
    return d;
}

// Writes a warp's finished accumulator rows (kMAtoms m16 tiles from block
// row warp_first_row; columns below valid_cols) and, from one lane of each
// quad, their LSE values. Each store is a pair of columns: 4 or 8 bytes.
template <typename T, int kMAtoms, int kNAtoms>
__device__ __forceinline__ void store_fragment_rows(const RowDestination<T> &dst,
                                                    const float (&out)[kMAtoms][kNAtoms][4],
                                                    const float (&lse)[kMAtoms * 2], int warp_first_row, int lane,
                                                    int valid_cols) {
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
            if (row >= dst.valid_rows) continue;
            T *row_out = dst.out + dst.out_offset(row) + frag_col(lane);
#pragma unroll
            for (int n = 0; n < kNAtoms; ++n) {
                if (n * kMmaN + frag_col(lane) < valid_cols) {
                    store_pair<T>(row_out + n * kMmaN, out[m][n][half * 2], out[m][n][half * 2 + 1]);
                }
            }
            if (dst.lse != nullptr && lane % 4 == 0) dst.lse[dst.lse_offset(row)] = lse[m * 2 + half];
        }
    }
}

// A block in which no row sees a key: out = 0 and lse = -inf for its valid
// rows, by threads tid = 0 .. num_threads - 1.
template <typename T>
__device__ __forceinline__ void store_empty_rows(const RowDestination<T> &dst, int valid_cols, int tid,
                                                 int num_threads) {
    const int pairs_per_row = valid_cols / 2;
    for (int i = tid; i < dst.valid_rows * pairs_per_row; i += num_threads) {
        store_pair<T>(dst.out + dst.out_offset(i / pairs_per_row) + (i % pairs_per_row) * 2, 0.f, 0.f);
    }
    if (dst.lse != nullptr) {
        for (int row = tid; row < dst.valid_rows; row += num_threads) dst.lse[dst.lse_offset(row)] = -INFINITY;
    }
}

}  // namespace flashcore
