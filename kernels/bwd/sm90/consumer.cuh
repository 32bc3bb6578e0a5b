// A consumer warpgroup (64 of the CTA's keys): walks the CTA's steps in step
// with the producer's warps (run: per step, waits for Q and dO and their
// row stats, runs the products of mainloop.cuh, releases each buffer as soon
// as its last reader is done, hands dS to the other warpgroup and dQ to the
// dQ writer), then its epilogue (store): dK (times grad_scale) and dV from
// the registers to their tensors, and zeros for the block's keys past
// seqused_k.
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/sm90/mainloop.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"

namespace flashcore::sm90 {

// The mainloop's members are those of a dependent base: named here.
// kAddsDq: whether this consumer computes dQ (Traits::kDqConsumers: at head
// dim 96 only the first does); a compile-time choice, since under a
// run-time one ptxas serialised the wgmmas (C7514) where the paths join.
template <typename Traits, bool kAddsDq = true>
struct BwdConsumer : BwdMainloop<Traits> {
    using Mainloop = BwdMainloop<Traits>;
    using Mainloop::Mainloop;
    using typename Mainloop::Element;
    using typename Mainloop::Fragments;
    using Mainloop::kBlockN;
    using Mainloop::kDqAtoms;
    using Mainloop::kKAtoms;
    using Mainloop::kSAtoms;
    using Mainloop::kVAtoms;
    using Mainloop::params;
    using Mainloop::sm;
    using Mainloop::consumer;
    using Mainloop::lane;
    using Mainloop::acc_dk;
    using Mainloop::acc_dv;
    using Mainloop::key_row0;
    using Mainloop::clear_key_tail;
    using Mainloop::issue_transposed_scores;
    using Mainloop::apply_mask;
    using Mainloop::probabilities;
    using Mainloop::pack_gradients;
    using Mainloop::issue_key_gradient;
    using Mainloop::store_ds;
    using Mainloop::issue_dq;
    using Mainloop::store_dq;

    // A barrier both consumers wait at: where they run different copies of
    // this loop (kDqConsumers 1), from different instructions.
    __device__ __forceinline__ static void sync_consumers(int id, int num_threads) {
        if constexpr (Traits::kDqConsumers == Traits::kConsumerWarpgroups) {
            named_barrier_sync_id(id, num_threads);
        } else {
            named_barrier_sync_id_unaligned(id, num_threads);
        }
    }

    template <typename Work>
    __device__ __forceinline__ void run(const Work &w) {
        const BwdKernelParams &p = params.bwd;
#pragma unroll
        for (int n = 0; n < kKAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[n][e] = 0.f;
        }
#pragma unroll
        for (int n = 0; n < kVAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dv[n][e] = 0.f;
        }
        mbarrier_wait(sm.kv_full(), 0);
        const bool partial_key_block = w.valid_keys < kBlockN;
        if (partial_key_block) {
            clear_key_tail(w.valid_keys);
            named_barrier_sync_id(kFirstConsumerBarrier + consumer, kWarpgroupThreads);
        }
        // The consumer's K and V rows, wgmma operands: warp_uniform.
        const uint32_t k_rows =
            warp_uniform(smem_address(sm.k()) + consumer * Traits::kKeysPerConsumer * Traits::kPanelRowBytes);
        const uint32_t v_rows =
            warp_uniform(smem_address(sm.v()) + consumer * Traits::kKeysPerConsumer * Traits::kPanelRowBytes);

        const int num_steps = bwd_walk_steps(w);
        BwdStep step = BwdStep::first(w);
        for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
            const int s = j % Traits::kStages;
            const uint32_t phase = (j / Traits::kStages) & 1;
            float acc_s[kSAtoms][4];
            float acc_dp[kSAtoms][4];
            mbarrier_wait(sm.q_full(s), phase);
            issue_transposed_scores(acc_s, k_rows, smem_address(sm.q(s)));
            mbarrier_wait(sm.do_full(s), phase);
            issue_transposed_scores(acc_dp, v_rows, smem_address(sm.dout(s)));
            wgmma_wait<1>();  // S^T is done
            fence_accumulators(acc_s);
            if (partial_key_block || w.queries.needs_mask(step.m_block)) apply_mask(w, step.m_block, acc_s);
            mbarrier_wait(sm.stats_full(s), phase);
            probabilities(s, acc_s);
            wgmma_wait<0>();  // dP^T is done
            fence_accumulators(acc_dp);
            Fragments p_frag, ds_frag;
            pack_gradients(s, acc_s, acc_dp, p_frag, ds_frag);
            issue_key_gradient(acc_dv, p_frag, smem_address(sm.dout(s)));
            // The stage's row stats are read; the loaders refill it for
            // step j + 2. Every thread arrives (BwdSmem::stats_empty says
            // why).
            mbarrier_arrive(sm.stats_empty(s));
            store_ds(ds_frag, s);
            fence_shared_to_async_proxy();
            sync_consumers(kDsReadyBarrier, Traits::kConsumerThreads);

            float acc_dq[kDqAtoms][4];
            if constexpr (kAddsDq) {
                issue_dq(acc_dq, s);
                wgmma_wait<1>();  // dV is done: dO's buffer may be refilled
            } else {
                wgmma_wait<0>();
            }
            fence_accumulators(acc_dv);
            fence_fragments(p_frag);
            if (lane == 0) mbarrier_arrive(sm.do_empty(s));

            issue_key_gradient(acc_dk, ds_frag, smem_address(sm.q(s)));
            if constexpr (kAddsDq) {
                wgmma_wait<1>();  // dQ is done
                fence_accumulators(acc_dq);
                // Into the dQ buffer once the writer has read the last
                // step's; the writer adds it to the workspace.
                const int b = j % Traits::kDqBuffers;
                named_barrier_sync_id(kDqEmptyBarrier + 2 * b, kDqWriterParticipants<Traits>);
                const DqBlock block = DqBlock::of<Traits>(p, w, step.head, step.m_block);
                store_dq(block, acc_dq, b);
                fence_shared_to_async_proxy();
                named_barrier_arrive_id(kDqFullBarrier + 2 * b, kDqWriterParticipants<Traits>);
            }
            wgmma_wait<0>();  // dK is done: Q's buffer may be refilled
            fence_accumulators(acc_dk);
            fence_fragments(ds_frag);
            if (lane == 0) mbarrier_arrive(sm.q_empty(s));
        }
    }

    // dK (times grad_scale) and dV of the consumer's keys below the block's
    // valid ones and the call's head dims; then zeros for the block's keys
    // in [valid_keys, stored_keys) (keys past seqused_k), over both
    // consumers' threads (consumer_tid).
    template <typename Work>
    __device__ __forceinline__ void store(const Work &w, int consumer_tid, bool has_work) const {
        const BwdKernelParams &p = params.bwd;
        const int64_t first_key = int64_t(w.tile.seqs.k_row0) + int64_t(w.n_block) * kBlockN;
        Element *dk = static_cast<Element *>(p.dk) + w.tile.batch * p.dk_batch_stride + first_key * p.dk_seq_stride +
                      int64_t(w.tile.head_kv) * p.dk_head_stride;
        Element *dv = static_cast<Element *>(p.dv) + w.tile.batch * p.dv_batch_stride + first_key * p.dv_seq_stride +
                      int64_t(w.tile.head_kv) * p.dv_head_stride;
        const int valid_keys = has_work ? w.valid_keys : 0;
        if (has_work) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = key_row0() + frag_row(lane) + half * kFragRowHalf;
                if (row >= valid_keys) continue;
#pragma unroll
                for (int n = 0; n < kKAtoms; ++n) {
                    const int col = n * kMmaN + frag_col(lane);
                    if (col < p.fwd.head_dim) {
                        *reinterpret_cast<uint32_t *>(dk + row * p.dk_seq_stride + col) = pack2<Element>(
                            acc_dk[n][2 * half] * p.grad_scale, acc_dk[n][2 * half + 1] * p.grad_scale);
                    }
                }
#pragma unroll
                for (int n = 0; n < kVAtoms; ++n) {
                    const int col = n * kMmaN + frag_col(lane);
                    if (col < p.fwd.head_dim_v) {
                        *reinterpret_cast<uint32_t *>(dv + row * p.dv_seq_stride + col) =
                            pack2<Element>(acc_dv[n][2 * half], acc_dv[n][2 * half + 1]);
                    }
                }
            }
        }
        // Zeros, 16-byte stores.
        const int end = min(w.stored_keys, kBlockN);
        constexpr int kElems = kElemsPerVector<Element>;
        for (int idx = consumer_tid; idx < kBlockN * (Traits::kHeadDim / kElems); idx += Traits::kConsumerThreads) {
            const int row = idx / (Traits::kHeadDim / kElems);
            const int col = (idx % (Traits::kHeadDim / kElems)) * kElems;
            if (row < valid_keys || row >= end) continue;
            if (col < p.fwd.head_dim) {
                *reinterpret_cast<uint4 *>(dk + row * p.dk_seq_stride + col) = make_uint4(0u, 0u, 0u, 0u);
            }
            if (col < p.fwd.head_dim_v) {
                *reinterpret_cast<uint4 *>(dv + row * p.dv_seq_stride + col) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
};

}  // namespace flashcore::sm90
