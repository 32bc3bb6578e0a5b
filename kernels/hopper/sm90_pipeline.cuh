// The shared-memory pipeline between the producer warp and the consumer
// warpgroups: where each stage's tiles live and which mbarrier guards them.
//
// Stage s holds K/V tile j for j % kStages == s. Its barriers complete once
// per use, so the phase to wait for is (j / kStages) & 1:
//   k_full[s], v_full[s]: the TMA copy of K (V) landed (1 arrival + bytes);
//   k_empty[s], v_empty[s]: every consumer warp is done reading K (V)
//   (kConsumerWarps arrivals). K and V are released separately: a tile's K
//   is free as soon as S = Q*K^T is done, a GEMM before its V, so the next
//   K copy starts that much earlier.
// The producer's first wait on an empty barrier passes at once (parity 1 of
// a fresh barrier counts as complete).
#pragma once

#include <cstdint>

#include "sm90_ptx.cuh"

namespace flashcore::sm90 {

template <typename Traits>
struct Pipeline {
    unsigned char *smem;  // 1024-byte aligned base

    __device__ __forceinline__ uint64_t *barriers() const {
        return reinterpret_cast<uint64_t *>(smem + Traits::kSmemBarriers);
    }
    __device__ __forceinline__ uint64_t *q_full() const { return barriers(); }
    __device__ __forceinline__ uint64_t *k_full(int stage) const { return barriers() + 1 + stage; }
    __device__ __forceinline__ uint64_t *v_full(int stage) const { return barriers() + 1 + Traits::kStages + stage; }
    __device__ __forceinline__ uint64_t *k_empty(int stage) const {
        return barriers() + 1 + 2 * Traits::kStages + stage;
    }
    __device__ __forceinline__ uint64_t *v_empty(int stage) const {
        return barriers() + 1 + 3 * Traits::kStages + stage;
    }

    __device__ __forceinline__ unsigned char *q_tile() const { return smem; }
    __device__ __forceinline__ unsigned char *k_tile(int stage) const {
        return smem + Traits::kSmemK + stage * Traits::kKVTileBytes;
    }
    __device__ __forceinline__ unsigned char *v_tile(int stage) const {
        return smem + Traits::kSmemV + stage * Traits::kKVTileBytes;
    }

    // By one thread, before any use; the caller synchronises the CTA after.
    __device__ __forceinline__ void init() const {
        mbarrier_init(q_full(), 1);
#pragma unroll
        for (int s = 0; s < Traits::kStages; ++s) {
            mbarrier_init(k_full(s), 1);
            mbarrier_init(v_full(s), 1);
            mbarrier_init(k_empty(s), Traits::kConsumerWarps);
            mbarrier_init(v_empty(s), Traits::kConsumerWarps);
        }
        fence_barrier_init();
    }

    __device__ __forceinline__ static int stage_of(int j) { return j % Traits::kStages; }
    __device__ __forceinline__ static uint32_t phase_of(int j) { return uint32_t(j / Traits::kStages) & 1u; }
};

}  // namespace flashcore::sm90
