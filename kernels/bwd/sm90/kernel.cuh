// The Hopper (sm_90a) backward kernel (config.cuh gives the products and
// the tiles). One CTA per key block of a (batch, K/V head), as the portable
// kernel's schedule (bwd/sm80/scheduler.cuh: increasing key blocks, so that
// under a causal mask the longest work starts first; decreasing in the
// deterministic mode), in three warpgroups:
//   warpgroup 0, the producer: gives up its registers (setmaxnreg); its
//     first warp loads K and V once, then for each step (a query block of
//     one query head of the group) Q and dO with TMA into a two-stage ring
//     (bwd_load_tiles); its third and fourth put the rows' lse and
//     D = rowsum(dO * O) beside them (bwd_load_row_stats); its second adds
//     each step's dQ from shared memory to the fp32 workspace with a bulk
//     reduction (bwd_write_dq).
//   warpgroups 1 and 2, the consumers: 64 keys each; the products of
//     config.cuh per step, dK and dV in registers across the steps, dQ
//     into shared memory for the writer, and at the end dK (times
//     grad_scale) and dV to their tensors.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "bwd/params.h"
#include "bwd/dq_accumulator.cuh"
#include "bwd/row_stats.cuh"
#include "bwd/scheduler.cuh"
#include "bwd/sm90/config.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "common/ptx.cuh"
#include "common/types.h"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_bwd.cuh"

namespace flashcore::sm90 {

// The launch's parameters: the backward's, and the TMA descriptors of Q,
// K, V and dO (__grid_constant__: the TMA unit reads them in place).
struct BwdSm90Params {
    BwdKernelParams bwd;
    CUtensorMap tma_q;
    CUtensorMap tma_k;
    CUtensorMap tma_v;
    CUtensorMap tma_dout;
};

// Named barriers (0 is __syncthreads): both consumers' dS of a step is in
// shared memory; one consumer's own threads (its K/V rows cleared); per dQ
// buffer b, it holds a step's dQ (kDqFullBarrier + 2b: the consumers arrive,
// the dQ writer waits) and is free again (kDqEmptyBarrier + 2b: the writer
// arrives, the consumers wait).
constexpr int kDsReadyBarrier = 1;
constexpr int kFirstConsumerBarrier = 2;  // and 3
constexpr int kDqFullBarrier = 4;
constexpr int kDqEmptyBarrier = 5;  // 4 .. 7 with two dQ buffers
// Per stage s, its row stats are written: the two row-stats loaders arrive
// on kStatsFullBarrier + s, the consumers wait. (Their release goes through
// an mbarrier: BwdSmem::stats_empty.)
constexpr int kStatsFullBarrier = 8;  // 8, 9
template <typename Traits>
constexpr int kStatsFullParticipants = Traits::kConsumerThreads + 2 * kWarpSize;

// The CTA's shared memory (config.cuh's offsets).
template <typename Traits>
struct BwdSmem {
    unsigned char *base;

    __device__ __forceinline__ unsigned char *k() const { return base + Traits::kKOffset; }
    __device__ __forceinline__ unsigned char *v() const { return base + Traits::kVOffset; }
    __device__ __forceinline__ unsigned char *q(int s) const { return base + Traits::kQOffset + s * Traits::kQBytes; }
    __device__ __forceinline__ unsigned char *dout(int s) const {
        return base + Traits::kDoOffset + s * Traits::kQBytes;
    }
    __device__ __forceinline__ unsigned char *ds(int s) const {
        return base + Traits::kDsOffset + s * Traits::kDsBytes;
    }
    __device__ __forceinline__ float *lse_log2(int s) const {
        return reinterpret_cast<float *>(base + Traits::kLseOffset + s * Traits::kRowStatBytes);
    }
    __device__ __forceinline__ float *row_dot(int s) const {
        return reinterpret_cast<float *>(base + Traits::kDOffset + s * Traits::kRowStatBytes);
    }
    __device__ __forceinline__ float *dq(int b) const {
        return reinterpret_cast<float *>(base + Traits::kDqOffset + b * Traits::kDqBytes);
    }
    __device__ __forceinline__ uint64_t *barrier(int i) const {
        return reinterpret_cast<uint64_t *>(base + Traits::kBarrierOffset) + i;
    }
    __device__ __forceinline__ uint64_t *kv_full() const { return barrier(0); }
    __device__ __forceinline__ uint64_t *q_full(int s) const { return barrier(1 + s); }
    __device__ __forceinline__ uint64_t *q_empty(int s) const { return barrier(1 + Traits::kStages + s); }
    __device__ __forceinline__ uint64_t *do_full(int s) const { return barrier(1 + 2 * Traits::kStages + s); }
    __device__ __forceinline__ uint64_t *do_empty(int s) const { return barrier(1 + 3 * Traits::kStages + s); }
    // The stage's row stats have been read: every consumer thread arrives,
    // both row-stats loaders wait. compute-sanitizer's racecheck takes the
    // consumers' reads as ordered before the loaders' next stores only
    // this way: through a named barrier completed by the consumers'
    // bar.arrive, or an mbarrier that one lane per warp arrives on after
    // __syncwarp, it reports them, and a bar.sync on both sides, at two
    // places in the code, fails synccheck (docs/hopper-notes.md,
    // "racecheck and the hand-overs").
    __device__ __forceinline__ uint64_t *stats_empty(int s) const { return barrier(1 + 4 * Traits::kStages + s); }

    __device__ __forceinline__ void init() const {
        mbarrier_init(kv_full(), 1);
        for (int s = 0; s < Traits::kStages; ++s) {
            // Full: the tile loader's leader (its arrival carries the
            // copy's bytes). Empty: the consumers' warps.
            mbarrier_init(q_full(s), 1);
            mbarrier_init(do_full(s), 1);
            mbarrier_init(q_empty(s), Traits::kNumWarps);
            mbarrier_init(do_empty(s), Traits::kNumWarps);
            mbarrier_init(stats_empty(s), Traits::kConsumerThreads);
        }
        fence_barrier_init();
    }
};

using sm80::bwd_batch_key_blocks;
using sm80::bwd_dq_counter;
using sm80::bwd_dq_rank;
using sm80::bwd_has_work;
using sm80::bwd_walk_steps;
using sm80::bwd_rotated_walk_releases_in_pairs;
using sm80::BwdStep;

// Where step (head, m_block)'s dQ goes: its query block's rows of the fp32
// accumulator, and whether they are stored by fragment (a whole block at
// the kernel's head dim: DqAccumLayout) or row by row (valid_rows rows of
// head_dim floats).
struct DqBlock {
    float *accumulator;
    int valid_rows;
    bool by_fragment;

    template <typename Traits, typename Work>
    __device__ __forceinline__ static DqBlock of(const BwdKernelParams &p, const Work &w, int head, int m_block) {
        const int first_row = m_block * Traits::kBlockM;
        DqBlock b;
        b.accumulator = p.dq_accum + w.tile.batch * p.dq_accum_batch_stride + head * p.dq_accum_head_stride +
                        (int64_t(w.tile.seqs.q_row0) + first_row) * p.fwd.head_dim;
        b.valid_rows = w.tile.seqs.seqlen_q - first_row;
        b.by_fragment = DqAccumLayout<Traits>::by_fragment(b.valid_rows, p.fwd.head_dim);
        return b;
    }

    // Bytes of the accumulator the step adds to.
    template <typename Traits>
    __device__ __forceinline__ uint32_t bytes(int head_dim) const {
        return by_fragment ? Traits::kDqBytes : uint32_t(min(valid_rows, Traits::kBlockM) * head_dim) * 4u;
    }
};

// ---- the producer warps ------------------------------------------------------

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
        mbarrier_arrive_expect_tx(sm.kv_full(), 2 * Traits::kKBytes);
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
            tma_load_4d(sm.k() + panel * Traits::kKVPanelBytes, &params.tma_k, panel * Traits::kPanelCols, first_key,
                        w.tile.head_kv, k_batch, sm.kv_full());
            tma_load_4d(sm.v() + panel * Traits::kKVPanelBytes, &params.tma_v, panel * Traits::kPanelCols, first_key,
                        w.tile.head_kv, k_batch, sm.kv_full());
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
            mbarrier_arrive_expect_tx(sm.do_full(s), Traits::kQBytes);
#pragma unroll
            for (int panel = 0; panel < Traits::kPanels; ++panel) {
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
// kStatsFullBarrier and back through BwdSmem::stats_empty. Two warps, so
// that each holds one walk within the producer warpgroup's 24 registers.
template <typename Traits, bool kDout, typename Work>
__device__ __forceinline__ void bwd_load_row_stats(const BwdKernelParams &p, const BwdSmem<Traits> &sm, const Work &w,
                                                   int lane) {
    static_assert(Traits::kStages == 2, "the stage is the step's parity");
    constexpr int kRowsPerLane = Traits::kBlockM / kWarpSize;
    const int num_steps = bwd_walk_steps(w);
    BwdStep step = BwdStep::first(w);
    for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
        const int head = step.head;
        const int m_block = step.m_block;
        const int s = j & 1;
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
        named_barrier_arrive_id(kStatsFullBarrier + s, kStatsFullParticipants<Traits>);
    }
}

// The dQ writer (the producer warpgroup's second warp): per step, once both
// consumers have stored their dQ in shared memory, its leader adds the
// block to the workspace with one bulk reduction (the TMA unit does the
// adds; no consumer waits for them), and the buffer is released when the
// reduction has read it. In the deterministic mode it first waits for the
// key block's turn, and counts the block once the reduction is complete.
//
// That count's release is a fence at GPU scope, which waits for the
// reduction to land: the per-step fence was most of the mode's cost at d128
// (hopper-notes). So at head dim 128 (Traits::kPairedDqReleases) the
// writer releases two steps' counts with one fence: the first step's count
// waits for the second's reduction too. The key block that adds next to
// that query block mostly reaches it later anyway (kRotatedWalkStagger
// steps on a rotated walk, kBlockN / kBlockM under a causal mask);
// hopper-notes has the times. Not on rotated walks with no more steps than key blocks, where that could
// make the waits go round in a circle (bwd_rotated_walk_releases_in_pairs).
template <typename Traits, typename Work>
__device__ __forceinline__ void bwd_write_dq(const BwdKernelParams &p, const BwdSmem<Traits> &sm, const Work &w,
                                             int lane) {
    constexpr int kParticipants = Traits::kConsumerThreads + kWarpSize;
    const int num_steps = bwd_walk_steps(w);
    for (int b = 0; b < Traits::kDqBuffers && b < num_steps; ++b) {
        named_barrier_arrive_id(kDqEmptyBarrier + 2 * b, kParticipants);
    }
    const bool release_in_pairs =
        Traits::kPairedDqReleases && p.deterministic && !(Traits::kRotatedWalk && p.rotated_walk &&
                             !bwd_rotated_walk_releases_in_pairs(num_steps, bwd_batch_key_blocks<Traits::kBlockN>(w)));
    int *held_counter = nullptr;  // the previous step's, released with this one's
    BwdStep step = BwdStep::first(w);
    for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
        const int b = j % Traits::kDqBuffers;
        // What it does with the step's dQ it works out itself (handed over
        // in shared memory by a consumer, racecheck reported its reads
        // against the next step's stores), before the consumers are done
        // with it: in the deterministic mode whatever comes between the
        // turn and the release is on the path every key block of the query
        // block waits along. The turn first: its mask arithmetic beside
        // the other values would not fit the warp's 24 registers.
        int turn = 0;
        int *counter = nullptr;
        if (p.deterministic) {
            turn = bwd_dq_rank<Traits>(p, w, step);
            counter = bwd_dq_counter<Traits::kBlockM>(p, w, step.head, step.m_block);
        }
        const DqBlock block = DqBlock::of<Traits>(p, w, step.head, step.m_block);
        const uint32_t bytes = block.bytes<Traits>(p.fwd.head_dim);
        named_barrier_sync_id(kDqFullBarrier + 2 * b, kParticipants);
        if (lane == 0) {
            if (counter != nullptr) {
                while (load_acquire(counter) < turn) {
                }
            }
            bulk_reduce_add_f32(block.accumulator, smem_address(sm.dq(b)), bytes);
            bulk_commit_group();
            bulk_wait_group_read_all();
        }
        __syncwarp();
        // The buffer is free once read; the step's adds may still be on
        // their way to the workspace.
        if (j + Traits::kDqBuffers < num_steps) named_barrier_arrive_id(kDqEmptyBarrier + 2 * b, kParticipants);
        // The deterministic mode: the next key block's turn comes once they
        // have landed.
        if (lane == 0 && counter != nullptr) {
            if (release_in_pairs && held_counter == nullptr && j + 1 < num_steps) {
                held_counter = counter;
            } else {
                bulk_wait_group_all();
                if (held_counter != nullptr) {
                    fence_release_gpu();
                    add_relaxed(held_counter, 1);
                    add_relaxed(counter, 1);
                    held_counter = nullptr;
                } else {
                    add_release(counter, 1);
                }
            }
        }
    }
    // The last reductions' global writes, before the CTA ends.
    if (lane == 0) bulk_wait_group_all();
}

// ---- the consumers -------------------------------------------------------------

// Keeps A fragments in their registers until the wgmma reading them has
// been waited for (the compiler sees the issuing asm as their last use).
template <int kSteps>
__device__ __forceinline__ void fence_fragments(uint32_t (&frag)[kSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(frag[kk][r])::"memory");
    }
}

template <typename Traits>
struct BwdConsumer {
    using Element = typename Traits::Element;
    using Swizzle = typename Traits::Swizzle;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    static constexpr int kSAtoms = kBlockM / kMmaN;    // n8 atoms of S^T, dP^T (queries)
    static constexpr int kQuerySteps = kBlockM / 16;   // k-steps of dV, dK (queries)
    static constexpr int kHeadSteps = Traits::kHeadDim / 16;  // k-steps of S^T, dP^T
    static constexpr int kKeySteps = kBlockN / 16;     // k-steps of dQ (keys)
    static constexpr int kKAtoms = Traits::kHeadDim / kMmaN;
    static constexpr int kVAtoms = Traits::kHeadDimV / kMmaN;
    static constexpr int kDqAtoms = Traits::kDqCols / kMmaN;
    static constexpr int kStepsPerPanel = Traits::kPanelCols / 16;
    using Fragments = uint32_t[kQuerySteps][4];
    using Layout = DqAccumLayout<Traits>;

    const BwdSm90Params &params;
    const BwdSmem<Traits> &sm;
    int consumer;  // 0 or 1: keys consumer * 64 ...
    int tid;       // within the consumer warpgroup
    int lane;
    int warp;      // within the consumer warpgroup

    float acc_dk[kKAtoms][4];
    float acc_dv[kVAtoms][4];

    // The accumulators are left alone: run() zeroes them (value-initialized
    // by an aggregate initialization, ptxas kept them in local memory).
    __device__ __forceinline__ BwdConsumer(const BwdSm90Params &params_, const BwdSmem<Traits> &sm_, int consumer_,
                                           int consumer_tid)
        : params(params_),
          sm(sm_),
          consumer(consumer_),
          tid(consumer_tid % kWarpgroupThreads),
          lane(consumer_tid % kWarpSize),
          warp((consumer_tid % kWarpgroupThreads) / kWarpSize) {}

    __device__ __forceinline__ int key_row0() const { return consumer * Traits::kKeysPerConsumer + warp * kMmaM; }
    // The warp's dQ rows and columns within the block, and its index in the
    // accumulator's fragment order (DqAccumLayout: warps by m16 strip, then
    // column share).
    __device__ __forceinline__ int dq_row0() const {
        return (Traits::kDqSplitRows ? consumer * Traits::kDqRows : 0) + warp * kMmaM;
    }
    __device__ __forceinline__ int dq_col0() const { return Traits::kDqSplitRows ? 0 : consumer * Traits::kDqCols; }
    __device__ __forceinline__ int dq_warp() const {
        return (dq_row0() / kMmaM) * Traits::kWarpsDdQ + dq_col0() / Traits::kDqCols;
    }

    // acc = (64 rows of a K-major tile from `a_rows`) * (kBlockM rows of a
    // K-major tile)^T over the head dim: S^T = K_c Q^T, dP^T = V_c dO^T.
    __device__ __forceinline__ void issue_transposed_scores(float (&acc)[kSAtoms][4], uint32_t a_rows,
                                                            uint32_t b_tile) const {
        const auto desc_a = Swizzle::k_major(a_rows);
        const auto desc_b = Swizzle::k_major(b_tile);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadSteps; ++kk) {
            const uint32_t step = (kk % kStepsPerPanel) * kKStepRowBytes;
            const uint32_t panel = kk / kStepsPerPanel;
            Wgmma<Element, kBlockM>::ss(acc, desc_a.at(panel * Traits::kKVPanelBytes + step),
                                        desc_b.at(panel * Traits::kQPanelBytes + step), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
    }

    // acc += A (registers: the 64 keys x kBlockM queries of P^T or dS^T) *
    // (kBlockM rows of an MN-major tile): dV += P^T dO, dK += dS^T Q.
    template <int kNAtoms>
    __device__ __forceinline__ void issue_key_gradient(float (&acc)[kNAtoms][4], const Fragments &a,
                                                       uint32_t b_tile) const {
        const auto desc_b = Swizzle::mn_major(b_tile, Traits::kQPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kQuerySteps; ++kk) {
            // 16 query rows: two swizzle atoms further down.
            Wgmma<Element, kNAtoms * kMmaN>::rs(acc, a[kk], desc_b.at(kk * 16 * Traits::kPanelRowBytes), 1);
        }
        wgmma_commit();
    }

    // acc = dS (this consumer's rows, K-major, keys along them) * K (its
    // head-dim columns, MN-major) over the block's keys.
    __device__ __forceinline__ void issue_dq(float (&acc)[kDqAtoms][4], int s) const {
        const uint32_t ds_rows =
            smem_address(sm.ds(s)) + (Traits::kDqSplitRows ? consumer * Traits::kDqRows * Traits::kPanelRowBytes : 0);
        const uint32_t k_cols = smem_address(sm.k()) + (Traits::kDqSplitRows ? 0 : consumer * Traits::kKVPanelBytes);
        const auto desc_a = Swizzle::k_major(ds_rows);
        const auto desc_b = Swizzle::mn_major(k_cols, Traits::kKVPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKeySteps; ++kk) {
            const uint32_t a_offset =
                (kk / kStepsPerPanel) * Traits::kDsPanelBytes + (kk % kStepsPerPanel) * kKStepRowBytes;
            WgmmaSs<Element, Element, Traits::kDqCols, WgmmaMajor::kK, WgmmaMajor::kMN>::mma(
                acc, desc_a.at(a_offset), desc_b.at(kk * 16 * Traits::kPanelRowBytes), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
    }

    // The consumer's keys past the block's valid ones, zeroed in K and V:
    // they may hold another sequence's rows or unused cache rows (with
    // seqused_k), whose values must not reach dQ (dS K) or dP (V dO^T).
    __device__ __forceinline__ void clear_key_tail(int valid_keys) const {
        const int first = max(valid_keys, consumer * Traits::kKeysPerConsumer);
        const int end = (consumer + 1) * Traits::kKeysPerConsumer;
        if (first >= end) return;
        constexpr int kChunks = Traits::kPanelRowBytes / 16;
        for (int i = tid; i < (end - first) * kChunks * Traits::kPanels; i += kWarpgroupThreads) {
            const int chunk = i % kChunks;
            const int row = first + (i / kChunks) % (end - first);
            const int panel = i / kChunks / (end - first);
            const uint32_t offset = panel * Traits::kKVPanelBytes + row * Traits::kPanelRowBytes + chunk * 16;
            *reinterpret_cast<uint4 *>(sm.k() + offset) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4 *>(sm.v() + offset) = make_uint4(0u, 0u, 0u, 0u);
        }
        fence_shared_to_async_proxy();
    }

    // Scores of S^T a query does not see set to -inf (P = 0). Query q sees
    // key k iff k < seqlen_k and lowest <= k - q <= highest (KeyMask: the
    // window around q's diagonal q + seqlen_k - seqlen_q), i.e. iff q is in
    // [k - highest, k - lowest]: per key row one offset and one span, per
    // element one add and one unsigned compare. KeyMask::row per element
    // made the loop too long for the instruction cache (ncu: no_instruction
    // stalls), and a predicate per element spilled at head dim 64. The
    // bounds are clamped to what k - q can be (keys below seqlen_k, queries
    // from 0 to seqlen_q + kBlockM), which keeps every difference within
    // 32 bits.
    template <typename Work>
    __device__ __forceinline__ void apply_mask(const Work &w, int m_block, float (&acc_s)[kSAtoms][4]) const {
        const KeyMask &mask = w.mask;
        const int lowest = max(mask.diagonal_shift() - mask.window_left, -(mask.seqlen_q + kBlockM));
        const int highest = min(mask.diagonal_shift() + mask.window_right, mask.seqlen_k);
        const uint32_t span = uint32_t(highest - lowest);
        const int first_key = w.n_block * kBlockN + key_row0() + frag_row(lane);
        const int first_query = m_block * kBlockM + frag_col(lane);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = first_key + half * kFragRowHalf;
            // first_query - (key - highest): 0 for the first query the key
            // is visible to. A key past the sequence: an offset that no
            // element brings within the span (which is < 2^31).
            const uint32_t offset =
                key < mask.seqlen_k ? uint32_t(first_query - key + highest) : uint32_t(INT32_MIN);
#pragma unroll
            for (int n = 0; n < kSAtoms; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (offset + uint32_t(n * kMmaN + e) > span) acc_s[n][2 * half + e] = -INFINITY;
                }
            }
        }
    }

    // P^T = exp2(S^T * scale_log2 - lse_log2) in place of S^T, once S^T is
    // done (dP^T may still run).
    __device__ __forceinline__ void probabilities(int s, float (&acc_s)[kSAtoms][4]) const {
        const float scale_log2 = params.bwd.fwd.softmax_scale_log2;
        const float *lse_log2 = sm.lse_log2(s);
#pragma unroll
        for (int n = 0; n < kSAtoms; ++n) {
            const float2 lse = *reinterpret_cast<const float2 *>(lse_log2 + n * kMmaN + frag_col(lane));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc_s[n][e] = fast_exp2(fmaf(acc_s[n][e], scale_log2, -(e % 2 ? lse.y : lse.x)));
            }
        }
    }

    // dS^T = P^T (dP^T - D), and P^T and dS^T packed to A fragments (atoms
    // 2i, 2i + 1: k-step i).
    __device__ __forceinline__ void pack_gradients(int s, const float (&prob)[kSAtoms][4],
                                                   const float (&acc_dp)[kSAtoms][4], Fragments &p_frag,
                                                   Fragments &ds_frag) const {
        const float *row_dot = sm.row_dot(s);
#pragma unroll
        for (int n = 0; n < kSAtoms; ++n) {
            const float2 dot = *reinterpret_cast<const float2 *>(row_dot + n * kMmaN + frag_col(lane));
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) ds[e] = prob[n][e] * (acc_dp[n][e] - (e % 2 ? dot.y : dot.x));
            p_frag[n / 2][(n % 2) * 2] = pack2<Element>(prob[n][0], prob[n][1]);
            p_frag[n / 2][(n % 2) * 2 + 1] = pack2<Element>(prob[n][2], prob[n][3]);
            ds_frag[n / 2][(n % 2) * 2] = pack2<Element>(ds[0], ds[1]);
            ds_frag[n / 2][(n % 2) * 2 + 1] = pack2<Element>(ds[2], ds[3]);
        }
    }

    // dS (rows: queries, keys along them) into stage s's buffer, from the
    // fragments of dS^T: stmatrix, transposed, two atoms (16 queries) of
    // both 8-key halves of the warp's rows at a time.
    __device__ __forceinline__ void store_ds(const Fragments &ds_frag, int s) const {
        const int matrix = lane / 8;
        const int query_in_pair = (matrix / 2) * kMmaN + lane % 8;
        const int chunk = (warp * kMmaM + (matrix % 2) * kFragRowHalf) / 8;  // 8 keys: 16 bytes
        const uint32_t panel = smem_address(sm.ds(s)) + consumer * Traits::kDsPanelBytes;
#pragma unroll
        for (int kk = 0; kk < kQuerySteps; ++kk) {
            // A k-step's fragments are atoms 2kk (registers 0, 1: key rows
            // g, g + 8) and 2kk + 1 (registers 2, 3): the four matrices in
            // stmatrix's order (matrix m: atom 2kk + m / 2, half m % 2).
            stmatrix_x4_trans(panel + Swizzle::offset(kk * 16 + query_in_pair, chunk), ds_frag[kk]);
        }
    }

    // The warp's dQ fragments into the shared buffer, in the accumulator's
    // layout for the step's block (DqBlock): by fragment tile (a lane's
    // four values of a tile together, 16-byte stores), or row by row for the
    // rows and head-dim columns that exist.
    __device__ __forceinline__ void store_dq(const DqBlock &block, const float (&acc_dq)[kDqAtoms][4], int b) const {
        float *dq = sm.dq(b);
        if (block.by_fragment) {
            float *warp_base = dq + Layout::group(0, dq_warp(), 0, 0) + lane * Layout::kLaneStride;
#pragma unroll
            for (int n = 0; n < kDqAtoms; ++n) {
                *reinterpret_cast<float4 *>(warp_base + Layout::group(0, 0, 0, n)) =
                    make_float4(acc_dq[n][0], acc_dq[n][1], acc_dq[n][2], acc_dq[n][3]);
            }
            return;
        }
        const int head_dim = params.bwd.fwd.head_dim;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = dq_row0() + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
            for (int n = 0; n < kDqAtoms; ++n) {
                const int col = dq_col0() + n * kMmaN + frag_col(lane);
                if (row < block.valid_rows && col < head_dim) {
                    *reinterpret_cast<float2 *>(dq + row * head_dim + col) =
                        make_float2(acc_dq[n][2 * half], acc_dq[n][2 * half + 1]);
                }
            }
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
        const uint32_t k_rows = smem_address(sm.k()) + consumer * Traits::kKeysPerConsumer * Traits::kPanelRowBytes;
        const uint32_t v_rows = smem_address(sm.v()) + consumer * Traits::kKeysPerConsumer * Traits::kPanelRowBytes;

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
            named_barrier_sync_id(kStatsFullBarrier + s, kStatsFullParticipants<Traits>);
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
            named_barrier_sync_id(kDsReadyBarrier, Traits::kConsumerThreads);

            float acc_dq[kDqAtoms][4];
            issue_dq(acc_dq, s);
            wgmma_wait<1>();  // dV is done: dO's buffer may be refilled
            fence_accumulators(acc_dv);
            fence_fragments(p_frag);
            if (lane == 0) mbarrier_arrive(sm.do_empty(s));

            issue_key_gradient(acc_dk, ds_frag, smem_address(sm.q(s)));
            wgmma_wait<1>();  // dQ is done
            fence_accumulators(acc_dq);
            // Into the dQ buffer once the writer has read the last step's;
            // the writer adds it to the workspace.
            const int b = j % Traits::kDqBuffers;
            named_barrier_sync_id(kDqEmptyBarrier + 2 * b, Traits::kConsumerThreads + kWarpSize);
            const DqBlock block = DqBlock::of<Traits>(p, w, step.head, step.m_block);
            store_dq(block, acc_dq, b);
            fence_shared_to_async_proxy();
            named_barrier_arrive_id(kDqFullBarrier + 2 * b, Traits::kConsumerThreads + kWarpSize);
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

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdSm90Params params) {
    extern __shared__ unsigned char smem_raw[];
    // The swizzles repeat every 1024-byte atom; TMA and wgmma assume tiles
    // aligned to it (kSmemBytes includes the slack). Aligned by an offset
    // from smem_raw, not through an integer, so that the compiler still
    // knows the pointers derived from it are shared: the row stats and dQ
    // are then read and written with LDS/STS, where generic loads and stores
    // waited on the long scoreboard (ncu: a third of the consumers' stalls).
    const uint32_t misalignment = smem_address(smem_raw) % kSmemBaseAlignment;
    unsigned char *smem = smem_raw + (misalignment == 0 ? 0 : kSmemBaseAlignment - misalignment);
    const BwdSmem<Traits> sm{smem};
    // The CTA's work, worked out once into shared memory: the producer
    // warps read its fields where they use them (in their 24 registers
    // they could not hold it all), the consumers copy it.
    using Scheduler = sm80::KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>;
    __shared__ typename Scheduler::Work shared_work;
    static_assert(sizeof(shared_work) <= Traits::kStaticSmemBytes, "config.cuh's budget for static shared memory");
    if (threadIdx.x == 0) {
        sm.init();
        shared_work = Scheduler::work(params.bwd);
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    if (warpgroup == 0) {
        setmaxnreg_decrease<Traits::kProducerRegisters>();
        const auto &work = shared_work;
        if (!bwd_has_work(work)) return;
        const int warp = threadIdx.x / kWarpSize;
        const int lane = threadIdx.x % kWarpSize;
        if (warp == 0) {
            bwd_load_tiles<Traits>(params, sm, work, lane);
        } else if (warp == 1) {
            bwd_write_dq<Traits>(params.bwd, sm, work, lane);
        } else if (warp == 2) {
            bwd_load_row_stats<Traits, false>(params.bwd, sm, work, lane);
        } else {
            bwd_load_row_stats<Traits, true>(params.bwd, sm, work, lane);
        }
        return;
    }
    setmaxnreg_increase<Traits::kConsumerRegisters>();
    const auto work = shared_work;
    const bool has_work = bwd_has_work(work);
    const int consumer_tid = threadIdx.x - kWarpgroupThreads;
    BwdConsumer<Traits> consumer(params, sm, warpgroup - 1, consumer_tid);
    if (has_work) consumer.run(work);
    consumer.store(work, consumer_tid, has_work);
}

}  // namespace flashcore::sm90
