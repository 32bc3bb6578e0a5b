// A consumer warpgroup of the form split by keys (64 of the CTA's keys:
// config.cuh): walks the CTA's steps in step with the producer's warps (run:
// per step, waits for Q and dO and their row stats, runs the products of
// mainloop.cuh, releases each buffer as soon as its last reader is done,
// hands dS to the other warpgroup and dQ to the dQ writer), then its
// epilogue (store_key_gradients): dK (times grad_scale) and dV from the
// registers to their tensors through shared memory, and zeros for the
// block's keys past seqused_k.
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
    static_assert(Traits::kForm == BwdSm90Form::kKeySplit && Traits::kDsStages == Traits::kStages,
                  "a dS buffer per Q/dO stage");
    using Mainloop = BwdMainloop<Traits>;
    using Mainloop::Mainloop;
    using typename Mainloop::Element;
    using typename Mainloop::Fragments;
    using Mainloop::kDqAtoms;
    using Mainloop::kSAtoms;
    using Mainloop::params;
    using Mainloop::sm;
    using Mainloop::consumer;
    using Mainloop::lane;
    using Mainloop::acc_dk;
    using Mainloop::acc_dv;
    using Mainloop::key_row0;
    using Mainloop::start;
    using Mainloop::consumer_key_rows;
    using Mainloop::issue_scores;
    using Mainloop::apply_mask;
    using Mainloop::probabilities;
    using Mainloop::pack_gradients;
    using Mainloop::issue_key_gradient;
    using Mainloop::store_ds;
    using Mainloop::issue_dq;
    using Mainloop::hand_over_dq;
    using Mainloop::store_key_gradients;

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
        const bool partial_key_block = start(w);
        const uint32_t k_rows = consumer_key_rows(sm.k());
        const uint32_t v_rows = consumer_key_rows(sm.v());

        const int num_steps = bwd_walk_steps(w);
        BwdStep step = BwdStep::first(w);
        for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
            const int s = j % Traits::kStages;
            const uint32_t phase = (j / Traits::kStages) & 1;
            float acc_s[kSAtoms][4];
            float acc_dp[kSAtoms][4];
            mbarrier_wait(sm.q_full(s), phase);
            issue_scores<Mainloop::kHeadSteps>(acc_s, k_rows, Traits::kKVPanelBytes, smem_address(sm.q(s)),
                                               Traits::kQPanelBytes);
            mbarrier_wait(sm.do_full(s), phase);
            issue_scores<Mainloop::kHeadStepsV>(acc_dp, v_rows, Traits::kKVPanelBytes, smem_address(sm.dout(s)),
                                                Traits::kQPanelBytes);
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
                hand_over_dq(w, step, j, acc_dq);
            }
            wgmma_wait<0>();  // dK is done: Q's buffer may be refilled
            fence_accumulators(acc_dk);
            fence_fragments(ds_frag);
            if (lane == 0) mbarrier_arrive(sm.q_empty(s));
        }
    }
};

}  // namespace flashcore::sm90
