// Writes the portable kernel's finished output tile.
//
// The O fragments are scattered over the warp's lanes in MMA layout; going
// through shared memory turns them into whole 16-byte row vectors, so the
// global stores are full, coalesced lines whatever the output strides.
#pragma once

#include <cstdint>

#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "sm80/smem_tile.cuh"

namespace flashcore {

// Stages the output fragments of the threads that hold them (holds_fragments)
// through shared memory, then all the CTA's threads copy the tile out: its
// valid_rows rows, valid_vectors 16-byte vectors of each.
//
// smem_o is Q's tile, and O's rows are laid out with Q's row pitch
// (head_dim, not head_dim_v): each warp then writes only within its own
// rows of Q, which no other warp reads, so no barrier is needed between the
// last Q*K^T and these writes.
template <typename Traits>
__device__ __forceinline__ void store_output(const float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                             bool holds_fragments, typename Traits::Element *smem_o,
                                             typename Traits::Element *gmem_o, int64_t out_seq_stride,
                                             int valid_rows, int valid_vectors, int warp_first_row, int lane,
                                             int tid) {
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
    store_tile<Element, Traits::kHeadDim, Traits::kHeadDimV / kElemsPerVector, Traits::kBlockM, Traits::kNumThreads>(
        gmem_o, out_seq_stride, smem_o, valid_rows, valid_vectors, tid);
}

}  // namespace flashcore
