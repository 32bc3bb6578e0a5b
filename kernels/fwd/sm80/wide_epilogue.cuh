// The wide kernel's epilogue (wide_mainloop.cuh): every warp holds all the
// block's rows of its own columns of O. They are finalised (the sink
// included: fwd_row_sink) and go to the block's destination
// (fwd/output_destination.cuh): a plain block staged through Q's shared
// memory into whole 16-byte row vectors, split-KV parts and GQA-packed rows
// pair by pair from the fragments. Warp 0 writes the log-sum-exp values.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/online_softmax.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "fwd/output_destination.cuh"
#include "fwd/sm80/epilogue.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"

namespace flashcore::sm80 {

template <typename Traits, typename Scheduler>
struct WideEpilogue {
    using ElementOut = typename Traits::ElementOut;

    // A block none of whose rows sees a key: as the row-split kernel's.
    template <typename Work>
    __device__ __forceinline__ static void store_empty(const FwdKernelParams &p, const Work &work, int tid) {
        Epilogue<Traits, Scheduler>::store_empty(p, work, tid);
    }

    template <typename Mainloop>
    __device__ __forceinline__ static void store(const FwdKernelParams &p, const Mainloop &loop,
                                                 typename Mainloop::Accumulators &acc_o,
                                                 typename Mainloop::Softmax &softmax,
                                                 typename Mainloop::RowValues &row_lse, unsigned char *smem) {
        const int tid = opaque_thread_index();
        const int lane = tid % kWarpSize;
        const int warp = tid / kWarpSize;
        const int first_col = warp * Traits::kColsPerWarp;
        const FwdTile tile = Scheduler::tile_again(p);
        finalize_rows<Traits>(p, tile, loop, 0, lane, softmax, acc_o, row_lse);

        with_output_destination<ElementOut, true>(
            p, tile, Traits::kBlockM, Scheduler::split_again(), [&](const auto &dst) {
                using Destination = std::decay_t<decltype(dst)>;
                using T = typename Destination::Element;
                if constexpr (Destination::kLayout == RowLayout::kScattered) {
#pragma unroll
                    for (int m = 0; m < Traits::kMAtomsO; ++m) {
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int row = m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                            if (row >= dst.valid_rows) continue;
                            T *row_out = dst.out + dst.out_offset(row) + first_col + frag_col(lane);
#pragma unroll
                            for (int n = 0; n < Traits::kNAtomsO; ++n) {
                                if (first_col + n * kMmaN + frag_col(lane) < p.head_dim_v) {
                                    store_pair<T>(row_out + n * kMmaN, acc_o[m][n][half * 2],
                                                  acc_o[m][n][half * 2 + 1]);
                                }
                            }
                            if (warp == 0 && dst.lse != nullptr && lane % 4 == 0) {
                                dst.lse[dst.lse_offset(row)] = row_lse[m * 2 + half];
                            }
                        }
                    }
                } else {
                    // Q's tile is free: its last reads were before the
                    // mainloop's final barrier.
                    ElementOut *smem_o = reinterpret_cast<ElementOut *>(smem);
                    store_fragments<ElementOut, Traits::kHeadDim, Traits::kMAtomsO, Traits::kNAtomsO>(smem_o, acc_o, 0,
                                                                                                      first_col, lane);
                    if (warp == 0 && dst.lse != nullptr) store_fragment_lse(dst.lse, dst.valid_rows, row_lse, 0, lane);
                    __syncthreads();
                    constexpr int kElems = kElemsPerVector<ElementOut>;
                    store_tile<ElementOut, Traits::kHeadDim, Traits::kHeadDimV / kElems, Traits::kBlockM,
                               Traits::kNumThreads>(dst.out, *dst.seq_stride, smem_o, dst.valid_rows,
                                                    p.head_dim_v / kElems, tid);
                }
            });
    }
};

}  // namespace flashcore::sm80
