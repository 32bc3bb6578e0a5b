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

// A wide kernel's warp's finished O (kMAtoms m16 tiles from block row
// first_row, its n8 tiles from column first_col) and, where writes_lse, its
// rows' LSE values, to the block's destination dst: scattered rows (split-KV
// parts, GQA-packed rows) pair by pair from the fragments; a plain block
// staged in smem_o (Q's shared memory, rows of kRowElems) and written in
// whole 16-byte row vectors by the CTA's kThreads threads after a barrier.
// Both wide epilogues' (this one's and the sm_90a twin's).
template <int kRowElems, int kHeadDimV, int kBlockM, int kThreads, typename ElementOut, typename Destination,
          int kMAtoms, int kNAtoms>
__device__ __forceinline__ void store_wide_columns(const Destination &dst, const float (&acc_o)[kMAtoms][kNAtoms][4],
                                                   const float (&row_lse)[kMAtoms * 2], int first_row, int first_col,
                                                   int lane, bool writes_lse, ElementOut *smem_o,
                                                   const FwdKernelParams &p, int tid) {
    using T = typename Destination::Element;
    if constexpr (Destination::kLayout == RowLayout::kScattered) {
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                if (row >= dst.valid_rows) continue;
                T *row_out = dst.out + dst.out_offset(row) + first_col + frag_col(lane);
#pragma unroll
                for (int n = 0; n < kNAtoms; ++n) {
                    if (first_col + n * kMmaN + frag_col(lane) < p.head_dim_v) {
                        store_pair<T>(row_out + n * kMmaN, acc_o[m][n][half * 2], acc_o[m][n][half * 2 + 1]);
                    }
                }
                if (writes_lse && dst.lse != nullptr && lane % 4 == 0) {
                    dst.lse[dst.lse_offset(row)] = row_lse[m * 2 + half];
                }
            }
        }
    } else {
        store_fragments<ElementOut, kRowElems, kMAtoms, kNAtoms>(smem_o, acc_o, first_row, first_col, lane);
        if (writes_lse && dst.lse != nullptr) store_fragment_lse(dst.lse, dst.valid_rows, row_lse, first_row, lane);
        __syncthreads();
        constexpr int kElems = kElemsPerVector<ElementOut>;
        store_tile<ElementOut, kRowElems, kHeadDimV / kElems, kBlockM, kThreads>(
            dst.out, *dst.seq_stride, smem_o, dst.valid_rows, p.head_dim_v / kElems, tid);
    }
}

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

        // Q's tile is free for a plain block's staging: its last reads were
        // before the mainloop's final barrier.
        with_output_destination<ElementOut, true>(
            p, tile, Traits::kBlockM, Scheduler::split_again(), [&](const auto &dst) {
                store_wide_columns<Traits::kHeadDim, Traits::kHeadDimV, Traits::kBlockM, Traits::kNumThreads>(
                    dst, acc_o, row_lse, 0, first_col, lane, warp == 0, reinterpret_cast<ElementOut *>(smem), p, tid);
            });
    }
};

}  // namespace flashcore::sm80
