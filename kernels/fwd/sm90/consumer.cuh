// A consumer warpgroup: walks the CTA's schedule in step with the producer,
// computing its 64 rows of each query block, with its state explicit:
//   loop      the Mainloop's registers (O accumulators, softmax state, S,
//             one or two sets of P fragments);
//   pending   the block whose last O += P*V is still to be issued;
//   kv_count, q_count  the pipeline positions (K/V tiles and query blocks
//             consumed so far), whose stage and phase the barriers use.
//
// Neighbouring blocks overlap: block t's last O += P*V is issued, then block
// t + 1's S_0 = Q*K_0^T (its Q and first K tile were loaded ahead), and block
// t is normalised and stored while S_0 runs. (Issuing S_0 first, so that
// block t + 1's first softmax would overlap the P*V product, was slower:
// block t then cannot finish before block t + 1's first K lands.)
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/key_range.cuh"
#include "fwd/output_destination.cuh"
#include "fwd/sm90/epilogue.cuh"
#include "fwd/sm90/mainloop.cuh"
#include "fwd/sm90/pipeline.cuh"
#include "fwd/sm90/traits.cuh"
#include "common/tile_coords.cuh"
#include "sm90/tile_scheduler.cuh"

namespace flashcore::sm90 {

// Cap: Softcap or NoSoftcap (common/softcap.cuh), the kernel's choice;
// kRagged: packed and paged tensors (kernel.cuh).
template <typename Traits, typename Cap, bool kRagged>
struct Consumer {
    using ElementOut = typename Traits::ElementOut;
    using KeyRange = BlockKeyRange<Traits::kBlockM, Traits::kBlockN>;

    const Sm90KernelParams &params;
    int consumer;  // which warpgroup: rows consumer * 64 .. + 63 of each block
    int wg_tid;    // thread index within the warpgroup
    Mainloop<Traits, Cap> loop;

    bool pending = false;
    FwdTile pending_tile{};
    int pending_split = 0;
    KvPosition pending_last_kv = 0;  // its last K/V tile
    // fp8: its LSE's score scale (softmax_scale times q's and k's descales)
    // and v's descale, the output's.
    float pending_lse_scale = 0.f;
    float pending_v_descale = 1.f;

    KvPosition kv_count = Pipeline<Traits>::first_position(params.first_kv_position);  // as the producer's
    uint32_t q_count = 0;

    __device__ __forceinline__ Consumer(const Sm90KernelParams &params_, const Pipeline<Traits> &pipe, int consumer_,
                                        int wg_tid_)
        : params(params_),
          consumer(consumer_),
          wg_tid(wg_tid_),
          loop{pipe,
               wg_tid_ % 32,
               consumer_ * Traits::kRowsPerConsumer + (wg_tid_ / 32) * kMmaM,
               params_.fwd.softmax_scale_log2,
               Cap::of(params_.fwd.softcap_prescale),
               IssueTurns<Traits>{consumer_}} {}

    __device__ __forceinline__ void run() {
        loop.turns.start();
        schedule_of<Traits>(params).template for_each_block<kRagged>(
            params.fwd, [&](const FwdTile &tile, const KeyRange &keys, int split) { compute_block(tile, keys, split); });
        if (pending) {
            const float sink = pending_sink();
            loop.turns.wait();
            issue_pending_output();
            loop.turns.pass();
            wgmma_wait<0>();
            finish_pending(sink);
        }
        // The staging buffers live in this CTA's shared memory: the last
        // stores must be done with them before the CTA exits.
        if (wg_tid == 0) bulk_wait_group_all();
    }

    __device__ __forceinline__ void compute_block(const FwdTile &tile, const KeyRange &keys, int split) {
        if (keys.num_blocks() <= 0) {
            const int tid = consumer * kWarpgroupThreads + wg_tid;
            constexpr int kThreads = Traits::kConsumerWarpgroups * kWarpgroupThreads;
            with_output_destination<ElementOut, false>(params.fwd, tile, Traits::kBlockM, split, [&](const auto &dst) {
                store_empty_rows(dst, params.fwd.head_dim_v, tid, kThreads, params.fwd, tile, Traits::kBlockM);
            });
            return;
        }
        const KvPosition kv_base = kv_count;
        const int q_buffer = Pipeline<Traits>::q_buffer_of(q_count);
        // Opaque, so that with one Q buffer the compiler does not keep a
        // descriptor per k-step of Q live over the whole kernel (16
        // registers at head dim 256, where that made ptxas spill).
        const uint32_t q_rows = opaque(smem_address(loop.pipe.q_tile(q_buffer)) +
                                       consumer * Traits::kRowsPerConsumer * Traits::kPanelRowBytes);

        // The pending block's last P*V product, then S_0 of this one: the
        // pending block is normalised and stored while S_0 runs. Without a
        // pending block nothing is committed before S_0, and wait<1> below
        // then waits for nothing. (An empty commit group in its place, so
        // that both paths waited for the same groups, made ptxas inject a
        // warpgroup.arrive, warning C7519, in every sm_90a forward kernel.)
        // The pending block's sink (global memory) is read before the waits,
        // behind which its latency hides.
        const float sink = pending ? pending_sink() : -INFINITY;
        loop.turns.wait();
        if (pending) issue_pending_output();
        mbarrier_wait(loop.pipe.q_full(q_buffer), Pipeline<Traits>::q_phase_of(q_count));
        loop.issue_scores(q_rows, kv_base);
        loop.turns.pass();
        wgmma_wait<1>();
        if (pending) finish_pending(sink);
        const KeyMask mask = KeyMask::of_unpacked(params.fwd, tile.seqs);
        if constexpr (Traits::kFp8) {
            // The descales of the block's (batch, K/V head): q's and k's
            // scale the scores, v's the output (finish_pending).
            const FwdKernelParams &p = params.fwd;
            const float qk_descale =
                fwd_descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, tile.batch,
                            tile.head_kv) *
                fwd_descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, tile.batch,
                            tile.head_kv);
            loop.scale_log2 = p.softmax_scale_log2 * qk_descale;
            pending_lse_scale = p.softmax_scale * qk_descale;
            pending_v_descale = fwd_descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride,
                                            tile.batch, tile.head_kv);
        }
        loop.clear_v_tail(mask, keys, kv_base,
                          v_tail_may_hold_garbage<kRagged>(params.fwd, tile.seqs,
                                                           (keys.n_block(0) + 1) * Traits::kBlockN),
                          consumer * kWarpgroupThreads + wg_tid);
        loop.softmax.init();
        loop.zero_output();

        loop.first_tile(mask, keys, tile.m_block, kv_base, q_buffer);
        loop.remaining_tiles(mask, keys, tile.m_block, q_rows, kv_base, q_buffer);

        pending = true;
        pending_tile = tile;
        pending_split = split;
        pending_last_kv = kv_base + keys.num_blocks() - 1;
        kv_count += keys.num_blocks();
        ++q_count;
    }

    // The pending block's last O += P*V.
    __device__ __forceinline__ void issue_pending_output() { loop.issue_output(loop.last_p(), pending_last_kv); }

    // The pending block's learnable sink (fwd_row_sink): every row of a
    // Hopper tile is of one query head (no GQA packing on this path).
    __device__ __forceinline__ float pending_sink() const {
        return fwd_row_sink(params.fwd, pending_tile, Traits::kBlockM, 0);
    }

    // After its last P*V product completed: normalise (with `sink`,
    // pending_sink's) and store the pending block.
    __device__ __forceinline__ void finish_pending(float sink) {
        fence_accumulators(loop.acc_o[0]);
        loop.release_v(pending_last_kv);
        float row_lse[2];
        const float sinks[2] = {sink, sink};
        if constexpr (Traits::kFp8) {
            loop.softmax.finalize(loop.acc_o, pending_lse_scale, row_lse, pending_v_descale, &sinks);
        } else {
            loop.softmax.finalize(loop.acc_o, params.fwd.softmax_scale, row_lse, 1.f, &sinks);
        }
        // The plain block deferred (PlainBlock): its addresses are computed
        // after O is staged.
        with_output_destination<ElementOut, false, /*kDeferPlain=*/true>(
            params.fwd, pending_tile, Traits::kBlockM, pending_split, [&](const auto &dst) {
                if constexpr (std::decay_t<decltype(dst)>::kLayout == RowLayout::kScattered) {
                    // A split-KV part: fp32 rows and LSE to the workspace.
                    store_fragment_rows(dst, loop.acc_o, row_lse,
                                        consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * kMmaM, wg_tid % 32,
                                        params.fwd);
                } else {
                    store_rows<Traits, kRagged>(params, pending_tile, dst, loop.pipe.o_staging(consumer), consumer,
                                                loop.acc_o, row_lse, wg_tid);
                }
            });
    }
};

}  // namespace flashcore::sm90
