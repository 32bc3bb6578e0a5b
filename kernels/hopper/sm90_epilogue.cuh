// Writes a consumer warpgroup's finished rows of O and the log-sum-exp
// straight from the accumulator fragments: each quad of lanes stores 16
// contiguous bytes of a row.
#pragma once

#include <cmath>

#include "fwd_params.h"
#include "mask.cuh"
#include "ptx.cuh"
#include "tile_scheduler.cuh"

namespace flashcore::sm90 {

// first_row: query index of the warp's first row (16 rows per warp).
template <typename Element, int kNAtomsO>
__device__ __forceinline__ void store_rows(const FwdKernelParams &p, const FwdTile &tile,
                                           const float (&out)[kNAtomsO][4], const float (&lse)[2], int first_row,
                                           int lane) {
    Element *o = static_cast<Element *>(p.out) + tile.batch * p.out_batch_stride + tile.head_q * p.out_head_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = first_row + frag_row(lane) + half * kFragRowHalf;
        if (row >= p.seqlen_q) continue;
        Element *dst = o + row * p.out_seq_stride + frag_col(lane);
#pragma unroll
        for (int n = 0; n < kNAtomsO; ++n) {
            *reinterpret_cast<uint32_t *>(dst + n * kMmaN) = pack2<Element>(out[n][half * 2], out[n][half * 2 + 1]);
        }
        if (p.lse != nullptr && lane % 4 == 0) {
            p.lse[(int64_t(tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q + row] = lse[half];
        }
    }
}

// A query block in which no row sees any key (causal, seqlen_q > seqlen_k):
// out = 0 and lse = -inf, by all threads of the CTA.
template <typename Element, int kHeadDim>
__device__ __forceinline__ void store_empty_rows(const FwdKernelParams &p, const FwdTile &tile, int block_m,
                                                 int tid, int num_threads) {
    constexpr int kVectorsPerRow = kHeadDim / kElemsPerVector;
    const int valid_rows = fwd_valid_rows(p, tile.m_block, block_m);
    Element *o = static_cast<Element *>(p.out) + tile.batch * p.out_batch_stride + tile.head_q * p.out_head_stride +
                 int64_t(tile.m_block) * block_m * p.out_seq_stride;
    for (int i = tid; i < valid_rows * kVectorsPerRow; i += num_threads) {
        const int row = i / kVectorsPerRow;
        *reinterpret_cast<uint4 *>(o + row * p.out_seq_stride + (i % kVectorsPerRow) * kElemsPerVector) =
            make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
        float *lse = p.lse + (int64_t(tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q +
                     int64_t(tile.m_block) * block_m;
        for (int row = tid; row < valid_rows; row += num_threads) lse[row] = -INFINITY;
    }
}

}  // namespace flashcore::sm90
