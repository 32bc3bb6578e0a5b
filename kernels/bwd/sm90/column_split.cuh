// A consumer warpgroup of the form split by head-dim columns (config.cuh: head
// dims 256 and (192, 128), 64 x 64 blocks). Consumer c computes S and dP of
// the query block against its 32 keys (32c .. 32c + 31) untransposed, queries
// on wgmma's M, and puts P and dS into shared memory; once both consumers'
// halves are there, it adds P^T dO and dS^T Q to its columns of dV and dK
// (both operands read from shared memory) and computes its columns of dQ
// (mainloop.cuh: issue_dq, store_dq). dK and dV of all 64 keys at its kDkCols
// and kDvCols columns stay in its registers (mainloop.cuh: acc_dk, acc_dv,
// store_key_gradients).
//
// Per step, the waits on the producer's warps as the form split by keys
// (consumer.cuh): dO is released once dV is done, Q once dK is, so that
// with one Q/dO stage (head dim 256) the next step's loads overlap this
// one's dQ.
#pragma once

#include <cmath>
#include <cstdint>

#include "bwd/params.h"
#include "bwd/sm90/mainloop.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/row_scores.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_bwd.cuh"

namespace flashcore::sm90 {

template <typename Traits>
struct BwdColumnSplitConsumer : BwdRowScores<Traits> {
    static_assert(Traits::kColumnSplit, "config.cuh: the form split by head-dim columns");
    using Base = BwdRowScores<Traits>;
    using Base::Base;
    using typename Base::DsSwizzle;
    using typename Base::Element;
    using typename Base::Swizzle;
    using Base::kBlockN;
    using Base::kDqAtoms;
    using Base::kQuerySteps;
    using Base::kScoreAtoms;
    using Base::params;
    using Base::sm;
    using Base::consumer;
    using Base::lane;
    using Base::acc_dk;
    using Base::acc_dv;
    using Base::start;
    using Base::consumer_key_rows;
    using Base::issue_dq;
    using Base::store_key_gradients;
    using Base::store_scores;
    using Base::compute_scores;
    using Base::finish_step;

    // The consumer's first column of Q and of dO (MN-major B of dK and dV),
    // from the tiles' starts.
    static constexpr uint32_t kQColumnBytes = Traits::kDkCols / Traits::kPanelCols * Traits::kQPanelBytes;
    static constexpr uint32_t kDoColumnBytes = Traits::kDvCols / Traits::kPanelCols * Traits::kQPanelBytes;

    // acc += A^T (A: kBlockM queries x the block's 64 keys, as stored: P or
    // dS, read MN-major, keys on wgmma's M) * (the consumer's columns of an
    // MN-major kBlockM-row tile, column_bytes on from its start: dO or Q):
    // dV_c += P^T dO_c, dK_c += dS^T Q_c.
    template <int kNAtoms>
    __device__ __forceinline__ void issue_key_gradient(float (&acc)[kNAtoms][4], const unsigned char *scores,
                                                       const unsigned char *tile, uint32_t column_bytes) const {
        const auto desc_a = DsSwizzle::mn_major(smem_address(scores), Traits::kDsPanelBytes);
        const auto desc_b =
            Swizzle::mn_major(warp_uniform(smem_address(tile) + consumer * column_bytes), Traits::kQPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kQuerySteps; ++kk) {
            // 16 query rows: two swizzle atoms further down, in both.
            WgmmaSs<Element, Element, kNAtoms * kMmaN, WgmmaMajor::kMN, WgmmaMajor::kMN>::mma(
                acc, desc_a.at(kk * 16 * Traits::kDsPanelRowBytes), desc_b.at(kk * 16 * Traits::kPanelRowBytes), 1);
        }
        wgmma_commit();
    }

    template <typename Work>
    __device__ __forceinline__ void run(const Work &w) {
        // The other consumer's keys past the valid ones, which this one's
        // dQ reads, are cleared before the first step's hand-over of P and
        // dS (a barrier of both).
        const bool partial_key_block = start(w);
        const uint32_t k_rows = consumer_key_rows(sm.k());
        const uint32_t v_rows = consumer_key_rows(sm.v());

        const int num_steps = bwd_walk_steps(w);
        BwdStep step = BwdStep::first(w);
        for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
            const int s = j % Traits::kStages;
            const uint32_t phase = (j / Traits::kStages) & 1;
            const int d = j % Traits::kDsStages;
            float acc_s[kScoreAtoms][4];
            float acc_dp[kScoreAtoms][4];
            compute_scores(w, step, s, phase, partial_key_block, k_rows, v_rows, acc_s, acc_dp);
            store_scores(acc_s, sm.p(d));
            store_scores(acc_dp, sm.ds(d));
            fence_shared_to_async_proxy();
            named_barrier_sync_id(kDsReadyBarrier, Traits::kConsumerThreads);

            issue_key_gradient(acc_dv, sm.p(d), sm.dout(s), kDoColumnBytes);
            issue_key_gradient(acc_dk, sm.ds(d), sm.q(s), kQColumnBytes);
            float acc_dq[kDqAtoms][4];
            issue_dq(acc_dq, d);
            finish_step(w, step, j, s, acc_dq);
        }
    }
};

}  // namespace flashcore::sm90
