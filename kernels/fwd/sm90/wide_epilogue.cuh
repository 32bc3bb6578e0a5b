// The sm_90a wide kernel's epilogue (wide_mainloop.cuh): each warp holds
// its 16 rows of its warpgroup's half of O's columns. They are finalised
// (the sink included: fwd_row_sink) and go to the block's destination
// (fwd/output_destination.cuh): a plain block staged through Q's shared
// memory into whole 16-byte row vectors, split-KV parts and GQA-packed rows
// pair by pair from the fragments. Warpgroup 0 writes the log-sum-exp values.
#pragma once

#include "common/params.h"
#include "fwd/output_destination.cuh"
#include "fwd/sm80/epilogue.cuh"
#include "fwd/sm80/wide_epilogue.cuh"

namespace flashcore::sm90 {

template <typename Traits, typename Scheduler>
struct WideEpilogue {
    using ElementOut = typename Traits::ElementOut;

    // A block none of whose rows sees a key: as the portable kernels'.
    template <typename Work>
    __device__ __forceinline__ static void store_empty(const FwdKernelParams &p, const Work &work, int tid) {
        sm80::Epilogue<Traits, Scheduler>::store_empty(p, work, tid);
    }

    template <typename Mainloop>
    __device__ __forceinline__ static void store(const FwdKernelParams &p, const Mainloop &loop,
                                                 typename Mainloop::Accumulators &acc_o,
                                                 typename Mainloop::Softmax &softmax,
                                                 typename Mainloop::RowValues &row_lse, unsigned char * /*smem*/) {
        const int lane = loop.lane;
        const int first_col = loop.warpgroup * Traits::kColsPerWarpgroup;
        const FwdTile tile = Scheduler::tile_again(p);
        sm80::finalize_rows<Traits>(p, tile, loop, loop.warp_first_row, lane, softmax, acc_o, row_lse);

        // Q's shared memory is free for a plain block's staging: its last
        // reads (the last S = Q K^T) were before the mainloop's final barrier.
        with_output_destination<ElementOut, true>(
            p, tile, Traits::kBlockM, Scheduler::split_again(), [&](const auto &dst) {
                sm80::store_wide_columns<Traits::kHeadDim, Traits::kHeadDimV, Traits::kBlockM, Traits::kNumThreads>(
                    dst, acc_o, row_lse, loop.warp_first_row, first_col, lane, loop.warpgroup == 0,
                    reinterpret_cast<ElementOut *>(loop.smem), p, loop.tid);
            });
    }
};

}  // namespace flashcore::sm90
