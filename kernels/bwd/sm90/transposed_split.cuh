// A consumer warpgroup of the transposed key split (config.cuh: (192, 128),
// 64 query rows x 96 keys; FlashAttention 4's tile for these head dims).
// Consumer c owns keys 48c .. 48c + 47: it computes S and dP against them
// untransposed (queries on wgmma's M: row_scores.cuh), puts P and dS into
// shared memory, and adds dO^T P and Q^T dS to its dV^T and dK^T: head-dim
// columns on wgmma's M (m64 tiles), its keys on N, both operands read from
// shared memory. Only dQ = dS K reads both consumers' dS (mainloop.cuh:
// issue_dq, hand_over_dq): a barrier of both before it. At the end it
// stages dK and dV transposed back into rows of keys (stage_transposed) for
// the mainloop's store.
//
// P and dS take one buffer: before a step stores them, both consumers have
// finished the last step's products (kScoresFreeBarrier, the step's other
// barrier of both).
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/sm90/mainloop.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/row_scores.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_bwd.cuh"

namespace flashcore::sm90 {

template <typename Traits>
struct BwdTransposedConsumer : BwdRowScores<Traits> {
    static_assert(Traits::kTransposedKv && Traits::kDsStages == 1, "config.cuh: the transposed key split");
    using Base = BwdRowScores<Traits>;
    using Base::Base;
    using typename Base::DsSwizzle;
    using typename Base::Element;
    using typename Base::Swizzle;
    using Base::kDqAtoms;
    using Base::kQuerySteps;
    using Base::kScoreAtoms;
    using Base::params;
    using Base::sm;
    using Base::consumer;
    using Base::lane;
    using Base::warp;
    using Base::acc_dk;
    using Base::acc_dv;
    using Base::start;
    using Base::consumer_key_rows;
    using Base::issue_dq;
    using Base::store_key_gradients_staged;
    using Base::store_scores;
    using Base::compute_scores;
    using Base::finish_step;

    // dK^T and dV^T: m64 tiles of head-dim columns, each kScoreAtoms n8
    // atoms (the consumer's keys).
    static constexpr int kDkTiles = Traits::kHeadDim / 64;
    static constexpr int kDvTiles = Traits::kHeadDimV / 64;
    static_assert(Traits::kDkAtoms == kDkTiles * kScoreAtoms && Traits::kDvAtoms == kDvTiles * kScoreAtoms,
                  "config.cuh's atoms of dK^T and dV^T");
    // Bytes from one m64 tile of Q's or dO's columns to the next.
    static constexpr uint32_t kTileBytes = 64 / Traits::kPanelCols * Traits::kQPanelBytes;
    // The consumer's first panel of P and dS.
    static constexpr uint32_t kScoresBytes = Traits::kKeysPerConsumer / Traits::kDsPanelKeys * Traits::kDsPanelBytes;

    // acc (kTiles m64 tiles of head-dim columns x the consumer's keys) +=
    // A^T B: A = Q or dO (kBlockM rows, read MN-major: its columns on M),
    // B = the consumer's keys of dS or P (MN-major: keys along the rows):
    // dK^T += Q^T dS_c, dV^T += dO^T P_c.
    template <int kTiles>
    __device__ __forceinline__ void issue_transposed_gradient(float (&acc)[kTiles * kScoreAtoms][4],
                                                              const unsigned char *tile,
                                                              const unsigned char *scores) const {
        const auto desc_a = Swizzle::mn_major(smem_address(tile), Traits::kQPanelBytes);
        const auto desc_b =
            DsSwizzle::mn_major(warp_uniform(smem_address(scores) + consumer * kScoresBytes), Traits::kDsPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int m = 0; m < kTiles; ++m) {
            auto &acc_tile = *reinterpret_cast<float(*)[kScoreAtoms][4]>(&acc[m * kScoreAtoms]);
#pragma unroll
            for (int kk = 0; kk < kQuerySteps; ++kk) {
                // 16 query rows: two swizzle atoms further down, in both.
                WgmmaSs<Element, Element, kScoreAtoms * kMmaN, WgmmaMajor::kMN, WgmmaMajor::kMN>::mma(
                    acc_tile, desc_a.at(m * kTileBytes + kk * 16 * Traits::kPanelRowBytes),
                    desc_b.at(kk * 16 * Traits::kDsPanelRowBytes), 1);
            }
        }
        wgmma_commit();
    }

    template <typename Work>
    __device__ __forceinline__ void run(const Work &w) {
        // The other consumer's keys past the valid ones, which this one's
        // dQ reads, are cleared before the first step's barrier of both.
        const bool partial_key_block = start(w);
        const uint32_t k_rows = consumer_key_rows(sm.k());
        const uint32_t v_rows = consumer_key_rows(sm.v());

        const int num_steps = bwd_walk_steps(w);
        BwdStep step = BwdStep::first(w);
        for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
            const int s = j % Traits::kStages;
            const uint32_t phase = (j / Traits::kStages) & 1;
            float acc_s[kScoreAtoms][4];
            float acc_dp[kScoreAtoms][4];
            compute_scores(w, step, s, phase, partial_key_block, k_rows, v_rows, acc_s, acc_dp);
            // The one P/dS buffer: both consumers are past the last step's
            // products (each waited for its dQ, the last reader of dS).
            if (j > 0) named_barrier_sync_id(kScoresFreeBarrier, Traits::kConsumerThreads);
            store_scores(acc_s, sm.p(0));
            store_scores(acc_dp, sm.ds(0));
            fence_shared_to_async_proxy();
            // The consumer's own keys of P and dS, which its dV^T and dK^T
            // read.
            named_barrier_sync_id(kFirstConsumerBarrier + consumer, kWarpgroupThreads);
            issue_transposed_gradient<kDvTiles>(acc_dv, sm.dout(s), sm.p(0));
            issue_transposed_gradient<kDkTiles>(acc_dk, sm.q(s), sm.ds(0));
            // Both consumers' dS, which dQ reads.
            named_barrier_sync_id(kDsReadyBarrier, Traits::kConsumerThreads);
            float acc_dq[kDqAtoms][4];
            issue_dq(acc_dq, 0);
            finish_step(w, step, j, s, acc_dq);
        }
    }

    // dK (times grad_scale) and dV to their tensors, staged from dK^T and
    // dV^T (mainloop.cuh: store_key_gradients_staged).
    template <typename Work>
    __device__ __forceinline__ void store_key_gradients(const Work &w, int consumer_tid, bool has_work) const {
        store_key_gradients_staged(w, consumer_tid, has_work, [this] {
            stage_transposed<kDkTiles>(Traits::kStagedDkOffset, Traits::kStagedDkRowBytes, acc_dk,
                                       params.bwd.grad_scale);
            stage_transposed<kDvTiles>(Traits::kStagedDvOffset, Traits::kStagedDvRowBytes, acc_dv, 1.f);
        });
    }

    // dK^T or dV^T into the staging rows (a key a row), transposed back by
    // stmatrix: element (column d, key k) of tile m, atom n is d = 64 m +
    // the fragment's row, k = the consumer's first key + 8 n + the
    // fragment's column. Four 8x8 matrices at a time: both halves of the
    // warp's 16 columns of atoms n and n + 1; lane i's row is key 8 (n + i /
    // 16) + i % 8 of them, at column half (i / 8) % 2.
    template <int kTiles>
    __device__ __forceinline__ void stage_transposed(uint32_t staged_offset, uint32_t row_bytes,
                                                     const float (&acc)[kTiles * kScoreAtoms][4], float scale) const {
        const int matrix = lane / 8;
        const uint32_t key = consumer * Traits::kKeysPerConsumer + (matrix / 2) * kMmaN + lane % 8;
        const uint32_t col = warp * kMmaM + (matrix % 2) * kFragRowHalf;
        const uint32_t lane_row = smem_address(sm.base + staged_offset) + key * row_bytes + col * sizeof(Element);
#pragma unroll
        for (int m = 0; m < kTiles; ++m) {
#pragma unroll
            for (int n = 0; n < kScoreAtoms; n += 2) {
                const float(&a)[4] = acc[m * kScoreAtoms + n];
                const float(&b)[4] = acc[m * kScoreAtoms + n + 1];
                const uint32_t frag[4] = {pack2<Element>(a[0] * scale, a[1] * scale),
                                          pack2<Element>(a[2] * scale, a[3] * scale),
                                          pack2<Element>(b[0] * scale, b[1] * scale),
                                          pack2<Element>(b[2] * scale, b[3] * scale)};
                stmatrix_x4_trans(lane_row + n * kMmaN * row_bytes + m * 64 * sizeof(Element), frag);
            }
        }
    }
};

}  // namespace flashcore::sm90
