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
struct BwdColumnSplitConsumer : BwdMainloop<Traits> {
    static_assert(Traits::kColumnSplit, "config.cuh: the form split by head-dim columns");
    using Mainloop = BwdMainloop<Traits>;
    using Mainloop::Mainloop;
    using typename Mainloop::DsSwizzle;
    using typename Mainloop::Element;
    using typename Mainloop::Swizzle;
    using Mainloop::kBlockM;
    using Mainloop::kBlockN;
    using Mainloop::kDqAtoms;
    using Mainloop::kQuerySteps;
    using Mainloop::params;
    using Mainloop::sm;
    using Mainloop::consumer;
    using Mainloop::lane;
    using Mainloop::warp;
    using Mainloop::acc_dk;
    using Mainloop::acc_dv;
    using Mainloop::start;
    using Mainloop::consumer_key_rows;
    using Mainloop::issue_scores;
    using Mainloop::issue_dq;
    using Mainloop::store_dq;
    using Mainloop::store_key_gradients;

    // n8 atoms of S and dP: the consumer's keys.
    static constexpr int kScoreAtoms = Traits::kKeysPerConsumer / kMmaN;
    static_assert(kScoreAtoms % 2 == 0, "stmatrix stores 16 keys at a time");
    // The consumer's first column of Q and of dO (MN-major B of dK and dV),
    // from the tiles' starts.
    static constexpr uint32_t kQColumnBytes = Traits::kDkCols / Traits::kPanelCols * Traits::kQPanelBytes;
    static constexpr uint32_t kDoColumnBytes = Traits::kDvCols / Traits::kPanelCols * Traits::kQPanelBytes;

    // The warp's first query row of S and dP, and this lane's first key of
    // them within the block.
    __device__ __forceinline__ int query_row0() const { return warp * kMmaM + frag_row(lane); }
    __device__ __forceinline__ int score_col0() const {
        return consumer * Traits::kKeysPerConsumer + frag_col(lane);
    }

    // Scores a query does not see set to -inf (P = 0): per query row the
    // keys KeyMask gives it (window, chunk, keys past seqlen_k).
    template <typename Work>
    __device__ __forceinline__ void apply_mask(const Work &w, int m_block, float (&acc_s)[kScoreAtoms][4]) const {
        const int first_query = m_block * kBlockM + query_row0();
        const int first_key = w.n_block * kBlockN + score_col0();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const RowKeys keys = w.mask.row(first_query + half * kFragRowHalf);
#pragma unroll
            for (int n = 0; n < kScoreAtoms; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (!keys.contains(first_key + n * kMmaN + e)) acc_s[n][2 * half + e] = -INFINITY;
                }
            }
        }
    }

    // P = exp2(S * scale_log2 - lse_log2) in place of S, once S is done (dP
    // may still run).
    __device__ __forceinline__ void probabilities(int s, float (&acc_s)[kScoreAtoms][4]) const {
        const float scale_log2 = params.bwd.fwd.softmax_scale_log2;
        const float *lse_log2 = sm.lse_log2(s) + query_row0();
        const float lse[2] = {lse_log2[0], lse_log2[kFragRowHalf]};
#pragma unroll
        for (int n = 0; n < kScoreAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[n][e] = fast_exp2(fmaf(acc_s[n][e], scale_log2, -lse[e / 2]));
        }
    }

    // dS = P (dP - D) in place of dP.
    __device__ __forceinline__ void gradients(int s, const float (&prob)[kScoreAtoms][4],
                                              float (&acc_dp)[kScoreAtoms][4]) const {
        const float *row_dot = sm.row_dot(s) + query_row0();
        const float dot[2] = {row_dot[0], row_dot[kFragRowHalf]};
#pragma unroll
        for (int n = 0; n < kScoreAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dp[n][e] = prob[n][e] * (acc_dp[n][e] - dot[e / 2]);
        }
    }

    // The consumer's keys of P or dS (rows: queries, keys along them) into
    // a buffer: stmatrix, 16 queries x 16 keys at a time (atoms 2i, 2i + 1:
    // matrix m is rows (m % 2) * 8 .., keys (m / 2) * 8 .. of them, the A
    // fragment's order).
    __device__ __forceinline__ void store_scores(const float (&acc)[kScoreAtoms][4], unsigned char *buffer) const {
        const int matrix = lane / 8;
        const int row = warp * kMmaM + (matrix % 2) * kFragRowHalf + lane % 8;
        const int first_chunk = (consumer * Traits::kKeysPerConsumer + (matrix / 2) * kMmaN) / 8;  // 8 keys: 16 bytes
        const uint32_t panel = smem_address(buffer);
#pragma unroll
        for (int i = 0; i < kScoreAtoms / 2; ++i) {
            const uint32_t frag[4] = {
                pack2<Element>(acc[2 * i][0], acc[2 * i][1]), pack2<Element>(acc[2 * i][2], acc[2 * i][3]),
                pack2<Element>(acc[2 * i + 1][0], acc[2 * i + 1][1]),
                pack2<Element>(acc[2 * i + 1][2], acc[2 * i + 1][3])};
            stmatrix_x4(panel + DsSwizzle::offset(row, first_chunk + 2 * i), frag);
        }
    }

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
        const BwdKernelParams &p = params.bwd;
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
            mbarrier_wait(sm.q_full(s), phase);
            issue_scores<Mainloop::kHeadSteps>(acc_s, smem_address(sm.q(s)), Traits::kQPanelBytes, k_rows,
                                               Traits::kKVPanelBytes);
            mbarrier_wait(sm.do_full(s), phase);
            issue_scores<Mainloop::kHeadStepsV>(acc_dp, smem_address(sm.dout(s)), Traits::kQPanelBytes, v_rows,
                                                Traits::kKVPanelBytes);
            wgmma_wait<1>();  // S is done
            fence_accumulators(acc_s);
            if (partial_key_block || w.queries.needs_mask(step.m_block)) apply_mask(w, step.m_block, acc_s);
            mbarrier_wait(sm.stats_full(s), phase);
            probabilities(s, acc_s);
            wgmma_wait<0>();  // dP is done
            fence_accumulators(acc_dp);
            gradients(s, acc_s, acc_dp);
            // The stage's row stats are read (BwdSmem::stats_empty: every
            // thread arrives).
            mbarrier_arrive(sm.stats_empty(s));
            store_scores(acc_s, sm.p(d));
            store_scores(acc_dp, sm.ds(d));
            fence_shared_to_async_proxy();
            named_barrier_sync_id(kDsReadyBarrier, Traits::kConsumerThreads);

            issue_key_gradient(acc_dv, sm.p(d), sm.dout(s), kDoColumnBytes);
            issue_key_gradient(acc_dk, sm.ds(d), sm.q(s), kQColumnBytes);
            float acc_dq[kDqAtoms][4];
            issue_dq(acc_dq, d);
            wgmma_wait<2>();  // dV is done: dO's buffer may be refilled
            fence_accumulators(acc_dv);
            if (lane == 0) mbarrier_arrive(sm.do_empty(s));
            wgmma_wait<1>();  // dK is done: Q's buffer may be refilled
            fence_accumulators(acc_dk);
            if (lane == 0) mbarrier_arrive(sm.q_empty(s));
            wgmma_wait<0>();  // dQ is done
            fence_accumulators(acc_dq);
            // Into the dQ buffer once the writer has read the last step's;
            // the writer adds it to the workspace.
            const int b = j % Traits::kDqBuffers;
            named_barrier_sync_id(kDqEmptyBarrier + 2 * b, kDqWriterParticipants<Traits>);
            const DqBlock block = DqBlock::of<Traits>(p, w, step.head, step.m_block);
            store_dq(block, acc_dq, b);
            fence_shared_to_async_proxy();
            named_barrier_arrive_id(kDqFullBarrier + 2 * b, kDqWriterParticipants<Traits>);
        }
    }
};

}  // namespace flashcore::sm90
