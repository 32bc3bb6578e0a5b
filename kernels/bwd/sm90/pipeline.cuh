// The hand-overs between the producer warpgroup's warps and the consumer
// warpgroups: the launch's parameters (the TMA descriptors the tile loader
// copies through), the named barriers, the CTA's shared memory with its
// mbarriers (BwdSmem: K and V once, a ring of Q, dO and their rows' lse and
// D, the dS (and P) buffers, one or two dQ buffers), and where a
// step's dQ goes (DqBlock: the consumers store it into a dQ buffer in that
// layout, the dQ writer adds it to the workspace).
//
// Per stage s of the ring: q_full/do_full (the tile loader's copy landed),
// q_empty/do_empty (every consumer warp is done with the tile), row stats
// written (stats_full) and read (stats_empty). Per dQ
// buffer b: full (kDqFullBarrier + 2b) and free again (kDqEmptyBarrier + 2b).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "bwd/dq_accumulator.cuh"
#include "bwd/params.h"
#include "bwd/sm90/config.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"

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
// The transposed key split's one P/dS buffer is free again: both consumers
// are past the last step's products (transposed_split.cuh).
constexpr int kScoresFreeBarrier = 8;
// Both consumers are past their last step: the K, V, Q and dO buffers may
// take the staged dK and dV (mainloop.cuh: store_key_gradients_staged).
constexpr int kStagingFreeBarrier = 9;
// The dQ buffers' barriers: the consumers that compute dQ and the writer.
template <typename Traits>
constexpr int kDqWriterParticipants = Traits::kDqThreads + kWarpSize;

// The row-stats loaders' threads (producer.cuh: two warps, lse and D).
constexpr int kRowStatsLoaderThreads = 2 * kWarpSize;

// The CTA's shared memory (config.cuh's offsets).
template <typename Traits>
struct BwdSmem {
    unsigned char *base;

    __device__ __forceinline__ unsigned char *k() const { return base + Traits::kKOffset; }
    __device__ __forceinline__ unsigned char *v() const { return base + Traits::kVOffset; }
    __device__ __forceinline__ unsigned char *q(int s) const { return base + Traits::kQOffset + s * Traits::kQBytes; }
    __device__ __forceinline__ unsigned char *dout(int s) const {
        return base + Traits::kDoOffset + s * Traits::kDoBytes;
    }
    __device__ __forceinline__ unsigned char *ds(int s) const {
        return base + Traits::kDsOffset + s * Traits::kDsBytes;
    }
    // P beside dS, in the forms that store it (config.cuh: kPBytes).
    __device__ __forceinline__ unsigned char *p(int s) const { return base + Traits::kPOffset + s * Traits::kPBytes; }
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
    // places in the code, fails synccheck (docs/log/hopper.md,
    // "racecheck and the hand-overs").
    __device__ __forceinline__ uint64_t *stats_empty(int s) const { return barrier(1 + 4 * Traits::kStages + s); }
    // The stage's row stats are written: every thread of both row-stats
    // loaders arrives, each consumer warp waits on its own. (A named barrier
    // of the loaders and both consumers held the consumers in step: under
    // ncu 6.6% of their samples waited there, at d128 2k causal.)
    __device__ __forceinline__ uint64_t *stats_full(int s) const { return barrier(1 + 5 * Traits::kStages + s); }

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
            mbarrier_init(stats_full(s), kRowStatsLoaderThreads);
        }
        fence_barrier_init();
    }
};

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

}  // namespace flashcore::sm90
