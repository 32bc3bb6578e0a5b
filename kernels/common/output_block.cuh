// Writes a CTA's finished output tile and log-sum-exp values.
//
// The O fragments are scattered over the warp's lanes in MMA layout; going
// through shared memory turns them into whole 16-byte row vectors, so the
// global stores are full, coalesced lines whatever the output strides.
#pragma once

#include <cmath>

#include "mask.cuh"
#include "fwd_params.h"
#include "smem_tile.cuh"
#include "tile_scheduler.cuh"

namespace flashcore {

// Where a CTA's query block goes: its first output row and LSE entry, and how
// many of its rows exist.
template <typename Element>
struct OutputBlock {
    Element *out;
    float *lse;  // nullptr: not requested
    int valid_rows;

    __device__ __forceinline__ static OutputBlock of(const FwdKernelParams &p, const FwdTile &tile, int block_m) {
        const int first_query = tile.m_block * block_m;
        OutputBlock b;
        b.out = static_cast<Element *>(p.out) + tile.batch * p.out_batch_stride + tile.head_q * p.out_head_stride +
                first_query * p.out_seq_stride;
        b.lse = p.lse == nullptr
                    ? nullptr
                    : p.lse + (int64_t(tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q + first_query;
        b.valid_rows = fwd_valid_rows(p, tile.m_block, block_m);
        return b;
    }
};

// Stages the output fragments of the threads that hold them (holds_fragments)
// through shared memory, then all the CTA's threads copy the tile out.
template <typename Traits>
__device__ __forceinline__ void store_output(const float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                             bool holds_fragments, typename Traits::Element *smem_o,
                                             typename Traits::Element *gmem_o, int64_t out_seq_stride,
                                             int valid_rows, int warp_first_row, int lane, int tid) {
    using Element = typename Traits::Element;
    if (holds_fragments) {
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
                for (int n = 0; n < Traits::kNAtomsO; ++n) {
                    const int col = n * kMmaN + frag_col(lane);
                    const int offset = swizzled_offset<Traits::kHeadDim>(row, col / kElemsPerVector) +
                                       col % kElemsPerVector;
                    *reinterpret_cast<uint32_t *>(smem_o + offset) =
                        pack2<Element>(out[m][n][half * 2], out[m][n][half * 2 + 1]);
                }
            }
        }
    }
    __syncthreads();
    store_tile<Traits, Traits::kBlockM>(gmem_o, out_seq_stride, smem_o, valid_rows, tid);
}

// lse points at this CTA's first query row; one lane of each quad writes its
// two rows per m16 tile (kRows = 2 per m16 tile).
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
// tid = 0 .. num_threads - 1. valid_rows is at most the block's rows.
template <typename Element, int kHeadDim>
__device__ __forceinline__ void store_empty_block(const OutputBlock<Element> &dst, int64_t out_seq_stride, int tid,
                                                  int num_threads) {
    constexpr int kVectorsPerRow = kHeadDim / kElemsPerVector;
    for (int i = tid; i < dst.valid_rows * kVectorsPerRow; i += num_threads) {
        *reinterpret_cast<uint4 *>(dst.out + (i / kVectorsPerRow) * out_seq_stride +
                                   (i % kVectorsPerRow) * kElemsPerVector) = make_uint4(0, 0, 0, 0);
    }
    if (dst.lse != nullptr) {
        for (int row = tid; row < dst.valid_rows; row += num_threads) dst.lse[row] = -INFINITY;
    }
}

}  // namespace flashcore
