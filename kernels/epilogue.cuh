// Writes a CTA's finished output tile and log-sum-exp values.
//
// The O fragments are scattered over the warp's lanes in MMA layout; going
// through shared memory turns them into whole 16-byte row vectors, so the
// global stores are full, coalesced lines whatever the output strides.
#pragma once

#include <cmath>

#include "mask.cuh"
#include "smem_tile.cuh"

namespace flashcore {

template <typename Traits>
__device__ __forceinline__ void store_output(const float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                             typename Traits::Element *smem_o,
                                             typename Traits::Element *gmem_o, int64_t out_seq_stride,
                                             int valid_rows, int warp_first_row, int lane, int tid) {
    using Element = typename Traits::Element;
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
    __syncthreads();
    store_tile<Traits, Traits::kBlockM>(gmem_o, out_seq_stride, smem_o, valid_rows, tid);
}

// lse points at this CTA's first query row; one lane of each quad writes its
// two rows per m16 tile.
template <typename Traits>
__device__ __forceinline__ void store_lse(const float (&lse)[Traits::kMAtoms * 2], float *gmem_lse,
                                          int valid_rows, int warp_first_row, int lane) {
    if (lane % 4 != 0) return;
#pragma unroll
    for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
            if (row < valid_rows) gmem_lse[row] = lse[m * 2 + half];
        }
    }
}

// A query block in which no row sees any key (causal, seqlen_q > seqlen_k):
// out = 0 and lse = -inf, written without touching K or V. valid_rows is at
// most kBlockM.
template <typename Traits>
__device__ __forceinline__ void store_empty_block(typename Traits::Element *gmem_o, int64_t out_seq_stride,
                                                  float *gmem_lse, int valid_rows, int tid) {
    for_each_tile_vector<Traits, Traits::kBlockM>(tid, [&](int row, int vec) {
        if (row < valid_rows) {
            *reinterpret_cast<uint4 *>(gmem_o + row * out_seq_stride + vec * kElemsPerVector) =
                make_uint4(0, 0, 0, 0);
        }
    });
    if (gmem_lse != nullptr) {
        for (int row = tid; row < valid_rows; row += Traits::kNumThreads) {
            gmem_lse[row] = -INFINITY;
        }
    }
}

}  // namespace flashcore
