// The portable kernel's epilogue: a block's results to their destination
// (fwd/output_destination.cuh: a split-KV part, a GQA-packed tile or the
// plain block).
//
// The plain block's O goes through shared memory (store_staged_block): the
// fragments are scattered over the warp's lanes in MMA layout, and staging
// turns them into whole 16-byte row vectors, so the global stores are full,
// coalesced lines whatever the output strides. Split parts and packed tiles
// are written row by row from the fragments.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "fwd/output_destination.cuh"
#include "common/params.h"
#include "sm80/smem_tile.cuh"

namespace flashcore::sm80 {

// Stages the output fragments of the threads that hold them (holds_fragments)
// through shared memory, then all the CTA's threads copy the block out: its
// valid rows, the vectors of each within the call's head_dim_v.
//
// smem_o is Q's tile, and O's rows are laid out with Q's row pitch
// (head_dim, not head_dim_v): each warp then writes only within its own
// rows of Q, which no other warp reads, so no CTA barrier is needed between
// the last Q*K^T and these writes (a warp one is).
template <typename Traits>
__device__ __forceinline__ void store_staged_block(const float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                                   bool holds_fragments, typename Traits::ElementOut *smem_o,
                                                   const BlockRows<typename Traits::ElementOut> &dst,
                                                   const FwdKernelParams &p, int warp_first_row, int lane, int tid) {
    using ElementOut = typename Traits::ElementOut;
    constexpr int kElems = kElemsPerVector<ElementOut>;
    const int64_t seq_stride = *dst.seq_stride;
    const int valid_vectors = p.head_dim_v / kElems;
    // Within the warp the rows' last reads were ldmatrix loads whose
    // addresses other lanes gave: ordered before these writes (racecheck
    // reports the lanes' hazard otherwise, for warps that diverge).
    __syncwarp();
    if (holds_fragments) {
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
                for (int n = 0; n < Traits::kNAtomsO; ++n) {
                    const int col = n * kMmaN + frag_col(lane);
                    const int offset = swizzled_offset<ElementOut, Traits::kHeadDim>(row, col / kElems) + col % kElems;
                    *reinterpret_cast<uint32_t *>(smem_o + offset) =
                        pack2<ElementOut>(out[m][n][half * 2], out[m][n][half * 2 + 1]);
                }
            }
        }
    }
    __syncthreads();
    store_tile<ElementOut, Traits::kHeadDim, Traits::kHeadDimV / kElems, Traits::kBlockM, Traits::kNumThreads>(
        dst.out, seq_stride, smem_o, dst.valid_rows, valid_vectors, tid);
}

// Normalises a thread's rows of O (kRows: 2 per m16 tile from block row
// warp_first_row; acc_o the thread's fragments of them, any columns) with
// the rows' softmax state, their sinks and a quantized V's descale, and
// gives their log-sum-exp values: both portable epilogues' (this one's,
// wide_epilogue.cuh's). loop: the mainloop (its lse_scale).
template <typename Traits, typename Mainloop, typename Softmax, typename Accumulators, int kRows>
__device__ __forceinline__ void finalize_rows(const FwdKernelParams &p, const FwdTile &tile, const Mainloop &loop,
                                              int warp_first_row, int lane, Softmax &softmax, Accumulators &acc_o,
                                              float (&row_lse)[kRows]) {
    float sinks[kRows];
    fwd_fragment_sinks(p, tile, Traits::kBlockM, warp_first_row, lane, sinks);
    if constexpr (Traits::kQuantizedKV) {
        const float v_descale =
            fwd_descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, tile.batch, tile.head_kv);
        softmax.finalize(acc_o, loop.lse_scale(p), row_lse, v_descale, &sinks);
    } else {
        softmax.finalize(acc_o, p.softmax_scale, row_lse, 1.f, &sinks);
    }
}

// Scheduler: the kernel's (scheduler.cuh), whose blockIdx the epilogue reads
// again.
template <typename Traits, typename Scheduler>
struct Epilogue {
    using ElementOut = typename Traits::ElementOut;

    // A block none of whose rows sees a key of its part: zeros and -inf,
    // without touching K or V.
    template <typename Work>
    __device__ __forceinline__ static void store_empty(const FwdKernelParams &p, const Work &work, int tid) {
        with_output_destination<ElementOut, true>(p, work.tile, Traits::kBlockM, work.split, [&](const auto &dst) {
            store_empty_rows(dst, p.head_dim_v, tid, Traits::kNumThreads, p, work.tile, Traits::kBlockM);
        });
    }

    // The finished block of `loop` (Mainloop: mainloop.cuh): O's
    // accumulators and the softmax state of the thread's rows, its key
    // splits merged, normalised and stored with their log-sum-exp (row_lse:
    // room for it). smem: the kernel's, whose Q tile stages the plain
    // block's rows.
    template <typename Mainloop>
    __device__ __forceinline__ static void store(const FwdKernelParams &p, const Mainloop &loop,
                                                 typename Mainloop::Accumulators &acc_o,
                                                 typename Mainloop::Softmax &softmax,
                                                 typename Mainloop::RowValues &row_lse, unsigned char *smem) {
        // Recomputed rather than kept: values live across the tile loop but
        // used only here would take registers the loop needs (ptxas spills
        // them).
        const int tid = opaque_thread_index();
        const int split = tid / Traits::kThreadsPerSplit;
        const int lane = tid % kWarpSize;
        const int warp_first_row = ((tid % Traits::kThreadsPerSplit) / kWarpSize) * Traits::kRowsPerWarp;
        loop.merge_splits(acc_o, softmax, smem, split, tid % Traits::kThreadsPerSplit, p);

        const FwdTile tile = Scheduler::tile_again(p);
        finalize_rows<Traits>(p, tile, loop, warp_first_row, lane, softmax, acc_o, row_lse);
        // After a merge only split 0 holds the result.
        const bool holds_result = split == 0;
        with_output_destination<ElementOut, true>(
            p, tile, Traits::kBlockM, Scheduler::split_again(), holds_result, [&](const auto &dst) {
                if constexpr (std::decay_t<decltype(dst)>::kLayout == RowLayout::kScattered) {
                    store_fragment_rows(dst, acc_o, row_lse, warp_first_row, lane, p);
                } else {
                    if (holds_result && dst.lse != nullptr) {
                        store_fragment_lse(dst.lse, dst.valid_rows, row_lse, warp_first_row, lane);
                    }
                    // Each warp of split 0 reuses only its own rows of Q's
                    // shared memory for the output tile; every warp that
                    // read those rows is past the last barrier of the tile
                    // loop (the merge) or is the writer itself.
                    store_staged_block<Traits>(acc_o, holds_result, reinterpret_cast<ElementOut *>(smem), dst, p,
                                               warp_first_row, lane, tid);
                }
            });
    }
};

}  // namespace flashcore::sm80
