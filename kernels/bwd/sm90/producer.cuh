// The producer warpgroup's loaders: the tile loader (its first warp; one
// lane issues the TMA copies of K and V once, then each step's Q and dO
// into the next stage of the ring) and the row-stats loaders (its third and
// fourth warps: each step's rows' lse and D beside them). The producer
// warpgroup gives up its registers (setmaxnreg), so each warp holds one
// walk within 24 registers a thread. Its second warp, the dQ writer, is
// dq_writer.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "bwd/params.h"
#include "bwd/row_stats.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// The tile loader (the producer warpgroup's first warp; its leader lane
// issues): K and V once, then each step's Q and dO into the next stage once
// the consumers have released it.
template <typename Traits, typename Work>
__device__ __forceinline__ void bwd_load_tiles(const BwdSm90Params &params, const BwdSmem<Traits> &sm, const Work &w,
                                               int lane) {
    const BwdKernelParams &p = params.bwd;
    const bool leader = lane == 0;
    if (leader) {
        // Packed (variable-length) tensors: their maps are one batch of all
        // rows.
        const int k_batch = p.fwd.cu_seqlens_k != nullptr ? 0 : w.tile.batch;
        const int first_key = w.tile.seqs.k_row0 + w.n_block * Traits::kBlockN;
        mbarrier_arrive_expect_tx(sm.kv_full(), Traits::kKBytes + Traits::kVBytes);
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
            tma_load_4d(sm.k() + panel * Traits::kKVPanelBytes, &params.tma_k, panel * Traits::kPanelCols, first_key,
                        w.tile.head_kv, k_batch, sm.kv_full());
            if (panel < Traits::kVPanels) {
                tma_load_4d(sm.v() + panel * Traits::kKVPanelBytes, &params.tma_v, panel * Traits::kPanelCols,
                            first_key, w.tile.head_kv, k_batch, sm.kv_full());
            }
        }
    }
    const int q_batch = p.fwd.cu_seqlens_q != nullptr ? 0 : w.tile.batch;
    const int num_steps = bwd_walk_steps(w);
    BwdStep step = BwdStep::first(w);
    for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
        const int s = j % Traits::kStages;
        const uint32_t free_phase = ((j / Traits::kStages) & 1) ^ 1u;
        const int row0 = w.tile.seqs.q_row0 + step.m_block * Traits::kBlockM;
        mbarrier_wait(sm.q_empty(s), free_phase);
        if (leader) {
            mbarrier_arrive_expect_tx(sm.q_full(s), Traits::kQBytes);
#pragma unroll
            for (int panel = 0; panel < Traits::kPanels; ++panel) {
                tma_load_4d(sm.q(s) + panel * Traits::kQPanelBytes, &params.tma_q, panel * Traits::kPanelCols, row0,
                            step.head, q_batch, sm.q_full(s));
            }
        }
        mbarrier_wait(sm.do_empty(s), free_phase);
        if (leader) {
            mbarrier_arrive_expect_tx(sm.do_full(s), Traits::kDoBytes);
#pragma unroll
            for (int panel = 0; panel < Traits::kVPanels; ++panel) {
                tma_load_4d(sm.dout(s) + panel * Traits::kQPanelBytes, &params.tma_dout, panel * Traits::kPanelCols,
                            row0, step.head, q_batch, sm.do_full(s));
            }
        }
    }
}

// The row-stats loaders (the producer warpgroup's third and fourth warps):
// each step's rows' lse, in log2 units (+inf for rows past the sequence and
// rows that saw no key: their P is 0; kDout false), or D (kDout true),
// into the stage's buffers, handed to the consumers through
// BwdSmem::stats_full and back through stats_empty. Two warps, so
// that each holds one walk within the producer warpgroup's 24 registers.
template <typename Traits, bool kDout, typename Work>
__device__ __forceinline__ void bwd_load_row_stats(const BwdKernelParams &p, const BwdSmem<Traits> &sm, const Work &w,
                                                   int lane) {
    constexpr int kRowsPerLane = Traits::kBlockM / kWarpSize;
    const int num_steps = bwd_walk_steps(w);
    BwdStep step = BwdStep::first(w);
    for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
        const int head = step.head;
        const int m_block = step.m_block;
        const int s = j % Traits::kStages;
        const int first_row = m_block * Traits::kBlockM;
        const int valid_rows = w.tile.seqs.seqlen_q - first_row - lane;  // of this lane's first row on
        const int64_t row0 = int64_t(w.tile.seqs.q_row0) + first_row + lane;
        mbarrier_wait(sm.stats_empty(s), ((j / Traits::kStages) & 1) ^ 1u);
        if constexpr (kDout) {
            const char *dot = reinterpret_cast<const char *>(bwd_row_stats(p, w.tile.batch, head, row0));
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i) {
                // This lane's rows are kWarpSize apart (two-byte elements).
                const float *row_dot = reinterpret_cast<const float *>(dot + i * kWarpSize * p.dq_seq_stride * 2);
                sm.row_dot(s)[lane + i * kWarpSize] = i * kWarpSize < valid_rows ? *row_dot : 0.f;
            }
        } else {
            const float *lse =
                p.fwd.lse + w.tile.batch * p.fwd.lse_batch_stride + head * p.fwd.lse_head_stride + row0;
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i) {
                const float value = i * kWarpSize < valid_rows ? lse[i * kWarpSize] : -INFINITY;
                sm.lse_log2(s)[lane + i * kWarpSize] = value == -INFINITY ? INFINITY : value * kLog2e;
            }
        }
        mbarrier_arrive(sm.stats_full(s));
    }
}

}  // namespace flashcore::sm90
