// The products of a step on S and dP untransposed (queries on wgmma's M,
// the consumer's kKeysPerConsumer keys on N), for the forms that compute
// them so (config.cuh: the column split, the transposed key split): the
// mask and the row stats per query row, P and dS in place of S and dP, and
// their store into shared memory (rows: queries, keys along them), where
// dV and dK (and dQ) read them.
#pragma once

#include <cmath>
#include <cstdint>

#include "bwd/sm90/mainloop.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

template <typename Traits>
struct BwdRowScores : BwdMainloop<Traits> {
    using Mainloop = BwdMainloop<Traits>;
    using Mainloop::Mainloop;
    using typename Mainloop::DsSwizzle;
    using typename Mainloop::Element;
    using Mainloop::kBlockM;
    using Mainloop::kBlockN;
    using Mainloop::params;
    using Mainloop::sm;
    using Mainloop::consumer;
    using Mainloop::lane;
    using Mainloop::warp;

    // n8 atoms of S and dP: the consumer's keys.
    static constexpr int kScoreAtoms = Traits::kKeysPerConsumer / kMmaN;
    static_assert(kScoreAtoms % 2 == 0, "stmatrix stores 16 keys at a time");

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
    // fragment's order). One panel holds the block's keys (the column
    // split's 64), or each 16 keys have a panel of their own (the
    // transposed form's 32-byte ones).
    __device__ __forceinline__ void store_scores(const float (&acc)[kScoreAtoms][4], unsigned char *buffer) const {
        static_assert(kBlockN <= Traits::kDsPanelKeys || Traits::kDsPanelKeys == 16, "panels of the block or of 16 keys");
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
            if constexpr (kBlockN <= Traits::kDsPanelKeys) {
                stmatrix_x4(panel + DsSwizzle::offset(row, first_chunk + 2 * i), frag);
            } else {
                // Keys 16 (first_chunk / 2 + i) .. : that panel, chunk
                // matrix / 2 of its row.
                stmatrix_x4(panel + uint32_t(first_chunk / 2 + i) * Traits::kDsPanelBytes +
                                DsSwizzle::offset(row, first_chunk % 2),
                            frag);
            }
        }
    }

    // A step's S and dP against the consumer's keys (k_rows, v_rows:
    // consumer_key_rows), once Q and dO of stage s have landed, turned into P
    // (acc_s) and dS (acc_dp); the stage's row stats released once read.
    template <typename Work>
    __device__ __forceinline__ void compute_scores(const Work &w, const BwdStep &step, int s, uint32_t phase,
                                                   bool partial_key_block, uint32_t k_rows, uint32_t v_rows,
                                                   float (&acc_s)[kScoreAtoms][4],
                                                   float (&acc_dp)[kScoreAtoms][4]) const {
        mbarrier_wait(sm.q_full(s), phase);
        this->template issue_scores<Mainloop::kHeadSteps>(acc_s, smem_address(sm.q(s)), Traits::kQPanelBytes,
                                                          k_rows, Traits::kKVPanelBytes);
        mbarrier_wait(sm.do_full(s), phase);
        this->template issue_scores<Mainloop::kHeadStepsV>(acc_dp, smem_address(sm.dout(s)), Traits::kQPanelBytes,
                                                           v_rows, Traits::kKVPanelBytes);
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
    }

    // The end of step j, whose dV, dK (or dV^T, dK^T) and dQ were issued in
    // that order: stage s's dO and Q released as the products reading them
    // finish, then dQ handed over.
    template <typename Work>
    __device__ __forceinline__ void finish_step(const Work &w, const BwdStep &step, int j, int s,
                                                float (&acc_dq)[Mainloop::kDqAtoms][4]) {
        wgmma_wait<2>();  // dV is done: dO's buffer may be refilled
        fence_accumulators(this->acc_dv);
        if (lane == 0) mbarrier_arrive(sm.do_empty(s));
        wgmma_wait<1>();  // dK is done: Q's buffer may be refilled
        fence_accumulators(this->acc_dk);
        if (lane == 0) mbarrier_arrive(sm.q_empty(s));
        wgmma_wait<0>();  // dQ is done
        fence_accumulators(acc_dq);
        this->hand_over_dq(w, step, j, acc_dq);
    }
};

}  // namespace flashcore::sm90
