// The shared-memory pipeline between the producer warp and the consumer
// warpgroups: where each stage's tiles live and which mbarrier guards them.
//
// The kernel is persistent, so a CTA's K/V tiles are counted across all the
// query blocks it computes: stage s holds the CTA's K/V tile j (counted from
// its first) for j % kStages == s. Its barriers complete once per use, so the
// phase to wait for is (j / kStages) & 1. Q buffers are used in turn the
// same way, counted by the query blocks the CTA computed:
//   q_full[b]: the block's Q landed (1 arrival + bytes);
//   q_empty[b]: every consumer warp's last S = Q*K^T of the block completed
//   (kConsumerWarps arrivals), so a later block's Q may load;
//   k_full[s], v_full[s]: the TMA copy of K (V) landed (1 arrival + bytes);
//   k_empty[s], v_empty[s]: every consumer warp is done reading K (V)
//   (kConsumerWarps arrivals). K and V are released separately: a tile's K
//   is free as soon as S = Q*K^T is done, a GEMM before its V, so the next
//   K copy starts that much earlier.
// One-byte (fp8) inputs add a V^T ring (v_transpose.cuh): the transposing
// producer warps wait on v_full and signal v_empty (Traits::
// kVTransposeWarps arrivals: they are V's readers), and
//   vt_full[s]: V^T written (kVTransposeWarps arrivals);
//   vt_empty[s]: every consumer warp is done reading V^T (kConsumerWarps).
// The producer's first wait on an empty barrier passes at once (parity 1 of
// a fresh barrier counts as complete).
//
// K/V positions are 64-bit: with 3 stages, a 32-bit count would wrap after
// 2^32 tiles at a point that is not a multiple of the stages (2^32 % 3 = 1),
// and the stage and phase computed after the wrap would disagree with the
// barriers' (a hang, or a stage refilled while in use). A persistent CTA
// reaches that on long enough inputs with few CTAs. Query-block counts stay
// 32-bit: their buffers number 1 or 2, which divide 2^32.
#pragma once

#include <cstdint>

#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// A K/V tile's place in a CTA's sequence of tiles.
using KvPosition = uint64_t;

// Pipeline::v_tile_keys after the CTA's last tile: the transposing warps
// stop.
constexpr int kNoMoreVTiles = -1;

template <typename Traits>
struct Pipeline {
    unsigned char *smem;  // kSmemBaseAlignment-aligned base

    __device__ __forceinline__ uint64_t *barriers() const {
        return reinterpret_cast<uint64_t *>(smem + Traits::kSmemBarriers);
    }
    __device__ __forceinline__ uint64_t *q_full(int buffer) const { return barriers() + buffer; }
    __device__ __forceinline__ uint64_t *q_empty(int buffer) const {
        return barriers() + Traits::kQStages + buffer;
    }
    __device__ __forceinline__ uint64_t *k_full(int stage) const {
        return barriers() + 2 * Traits::kQStages + stage;
    }
    __device__ __forceinline__ uint64_t *v_full(int stage) const {
        return barriers() + 2 * Traits::kQStages + Traits::kStages + stage;
    }
    __device__ __forceinline__ uint64_t *k_empty(int stage) const {
        return barriers() + 2 * Traits::kQStages + 2 * Traits::kStages + stage;
    }
    __device__ __forceinline__ uint64_t *v_empty(int stage) const {
        return barriers() + 2 * Traits::kQStages + 3 * Traits::kStages + stage;
    }

    __device__ __forceinline__ uint64_t *vt_full(int stage) const {
        return barriers() + 2 * Traits::kQStages + 4 * Traits::kStages + stage;
    }
    __device__ __forceinline__ uint64_t *vt_empty(int stage) const {
        return barriers() + 2 * Traits::kQStages + 5 * Traits::kStages + stage;
    }

    __device__ __forceinline__ unsigned char *q_tile(int buffer) const { return smem + buffer * Traits::kQBytes; }
    __device__ __forceinline__ unsigned char *k_tile(int stage) const {
        return smem + Traits::kSmemK + stage * Traits::kKTileBytes;
    }
    // Byte offsets from the base of V, V^T and the valid-keys words, for the
    // 32-bit shared addresses of the transposing warps (v_transpose.cuh).
    // The pointers below spell the same sums out term by term: taken as one
    // offset, they changed the kernels' register allocation (the machine
    // code the tests ran).
    __device__ __forceinline__ static uint32_t v_tile_offset(int stage) {
        return Traits::kSmemV + stage * Traits::kVTileBytes;
    }
    __device__ __forceinline__ static uint32_t vt_tile_offset(int stage) {
        return Traits::kSmemVt + stage * Traits::kVtTileBytes;
    }
    __device__ __forceinline__ static uint32_t v_tile_keys_offset(int stage) {
        return Traits::kSmemVTileKeys + stage * uint32_t(sizeof(int));
    }

    __device__ __forceinline__ unsigned char *v_tile(int stage) const {
        return smem + Traits::kSmemV + stage * Traits::kVTileBytes;
    }
    // fp8: the keys of V tile `stage` that the transposing warps keep (the
    // rest become zeros), or kNoMoreVTiles; written by the producer before
    // it arms v_full, so the transposers read it after their wait.
    __device__ __forceinline__ int *v_tile_keys(int stage) const {
        return reinterpret_cast<int *>(smem + Traits::kSmemVTileKeys) + stage;
    }
    __device__ __forceinline__ unsigned char *vt_tile(int stage) const {
        return smem + Traits::kSmemVt + stage * Traits::kVtTileBytes;
    }
    __device__ __forceinline__ unsigned char *o_staging(int consumer) const {
        return smem + Traits::kSmemO + consumer * Traits::kOStagingBytes;
    }

    // By one thread, before any use; the caller synchronises the CTA after.
    __device__ __forceinline__ void init() const {
#pragma unroll
        for (int b = 0; b < Traits::kQStages; ++b) {
            mbarrier_init(q_full(b), 1);
            mbarrier_init(q_empty(b), Traits::kConsumerWarps);
        }
#pragma unroll
        for (int s = 0; s < Traits::kStages; ++s) {
            mbarrier_init(k_full(s), 1);
            mbarrier_init(v_full(s), 1);
            mbarrier_init(k_empty(s), Traits::kConsumerWarps);
            if constexpr (Traits::kFp8) {
                mbarrier_init(v_empty(s), Traits::kVTransposeWarps);
                mbarrier_init(vt_full(s), Traits::kVTransposeWarps);
                mbarrier_init(vt_empty(s), Traits::kConsumerWarps);
            } else {
                mbarrier_init(v_empty(s), Traits::kConsumerWarps);
            }
        }
        fence_barrier_init();
    }

    // Where a CTA's count of K/V tiles starts: the params' first position
    // (0, or a test's FLASHCORE_TEST_KV_POSITION) rounded down to a whole
    // number of barrier cycles. Fresh barriers are in phase 0, so the first
    // tile a stage holds must be one whose phase_of is 0; any other start
    // would let the first waits pass before their tiles landed, or never.
    __device__ __forceinline__ static KvPosition first_position(uint64_t requested) {
        constexpr KvPosition kCycle = 2 * Traits::kStages;
        return requested - requested % kCycle;
    }
    // The producer's places in its two rings, the K/V stages and the Q
    // buffers: each its count modulo one barrier cycle (2 * kStages tiles,
    // 2 * kQStages blocks), all that a stage or buffer and its phase are
    // made of, packed in one 32-bit register (the producer thread has 24
    // beside consumers of 240: a 64-bit tile count and a block count
    // spilled). Starts at 0, where first_position puts the consumers' count.
    class ProducerRings {
        static constexpr uint32_t kQShift = 16;
        static constexpr uint32_t kKvMask = (1u << kQShift) - 1;
        uint32_t bits_ = 0;

      public:
        __device__ __forceinline__ int kv_stage() const { return int((bits_ & kKvMask) % Traits::kStages); }
        __device__ __forceinline__ uint32_t kv_phase() const { return ((bits_ & kKvMask) / Traits::kStages) & 1u; }
        __device__ __forceinline__ int q_buffer() const { return int((bits_ >> kQShift) % Traits::kQStages); }
        __device__ __forceinline__ uint32_t q_phase() const { return ((bits_ >> kQShift) / Traits::kQStages) & 1u; }
        __device__ __forceinline__ void next_kv() {
            bits_ = (bits_ & kKvMask) + 1 == 2 * Traits::kStages ? bits_ & ~kKvMask : bits_ + 1;
        }
        __device__ __forceinline__ void next_q() {
            bits_ = (bits_ >> kQShift) + 1 == 2 * Traits::kQStages ? bits_ & kKvMask : bits_ + (1u << kQShift);
        }
    };

    __device__ __forceinline__ static int stage_of(KvPosition j) { return int(j % Traits::kStages); }
    __device__ __forceinline__ static uint32_t phase_of(KvPosition j) { return uint32_t(j / Traits::kStages) & 1u; }
    __device__ __forceinline__ static int q_buffer_of(uint32_t block) { return int(block % Traits::kQStages); }
    __device__ __forceinline__ static uint32_t q_phase_of(uint32_t block) {
        return (block / Traits::kQStages) & 1u;
    }
};

}  // namespace flashcore::sm90
