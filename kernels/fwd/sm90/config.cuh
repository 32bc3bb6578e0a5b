// Tile configuration of the sm90 kernel per (input and output element
// types, head dims): the query rows (consumer warpgroups of 64), the key
// tile, the K/V ring depth, the Q buffers, the sets of P fragments and how O
// leaves, within 227 KB of shared memory and the consumers' registers
// (traits.cuh, consumer_registers: 240 a thread with two consumer
// warpgroups, 160 with three).
//
//   head dims    rows  keys  stages  Q bufs  P sets  O out      shared memory
//   32           128   128   4       2       2       TMA store  ~89 KB (a fourth stage: tput-2k/8k 1-6% faster, H100;
//                                                                   at d64 no change above the noise)
//   64           128   128   3       2       2       TMA store  ~144 KB (a third stage made tput-2k 4-6% faster)
//     wide       192   128   3       2       1       TMA store  ~168 KB (FA3's three consumer warpgroups; for
//                                                                   the calls wide_fits names)
//   96           128   128   3       2       2       TMA store  ~216 KB
//   128          128   128   2       2       2       TMA store  ~225 KB (a third stage does not fit)
//   192 / 128    128   96    2       2       2       registers  ~217 KB (against 64-key tiles, 2 stages, TMA store:
//                                                                   0.90-1.0 of the time, H100)
//   256          128   80    2       1       1       registers  ~225 KB (O alone is 128 registers a thread, so
//                                                                   two P sets allow only 48-key tiles; one set
//                                                                   and 80 keys, FA3's tile: +7-10% over 48 keys,
//                                                                   3 stages, two sets; 64 keys: +3-8%; H100)
//
// e4m3 inputs (fp8 prefill): 128-key tiles, one-byte tiles, so more stages
// fit beside the V^T ring (v_transpose.cuh): 4 at 64 (~130 KB), 3 at 128
// (~210 KB), 2 at 256 (~225 KB, one Q buffer; O stored from registers as for
// the 16-bit kernel), O staged in its bf16 panels. At 256, O's 128 registers
// a thread and 128-key S need consumers of 240 (traits.cuh,
// kWideConsumers): FA3's 128 x 128 tile, 9-11% faster than 128 x 64 with
// three stages (H100, B8 H16 S4k, full and causal). At head dim 64 the wide
// configuration (three consumer warpgroups, 192-row blocks, 152 registers a
// consumer thread beside the producer warpgroup's 48) serves most large
// calls (wide_fits): 0.74-0.78x FA3 became 0.95-1.04x unmasked.
//
// One P set cost 3-9% at head dims 64 and 128 with two consumer warpgroups
// (docs/log/hopper.md), where the key tile is not what limits; three
// consumer warpgroups' 160 registers leave room for one set only (S 64 + O
// 32 + P 32), and wider key tiles do not fit beside it (144, 160 and 176
// keys all spilled). FA3 stages P in shared memory for its 192 x 192
// tile; measured here, that ran 7-8% slower than the two-warpgroup kernel
// (docs/log/hopper.md).
//
// Two Q buffers let the next block's Q load, and its first S = Q*K^T start,
// while the current block finishes.
//
// Row maxima in 4 partial chains at head dims <= 64, where the exponentials
// and the tensor cores take turns and the softmax's latency shows: +4-20%
// at d32, +0-4% at d64 (tput-2k and -8k, full and causal, bf16 and fp16,
// H100); at d128 the same change lost ~2% at tput-2k, so it keeps one
// chain (docs/log/hopper.md, "Prefill against FlashAttention 3"); one
// chain with three consumer warpgroups, for registers.
#pragma once

#include <cstdint>

#include "common/element.cuh"
#include "common/params.h"
#include "fwd/sm90/traits.cuh"

namespace flashcore::sm90 {

// The configuration of kConsumerWarpgroups consumer warpgroups (64 rows
// each) for the head dims.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, int kConsumerWarpgroups>
struct Sm90TraitsOf {
    static constexpr bool kFp8 = kInput == DType::kE4m3;
    static constexpr bool kLarge = kHeadDim > 128;    // 192, 256: two K/V stages, O stored from registers
    static constexpr bool kHuge = kHeadDimV > 128;    // 256: 80-key tiles (16-bit), one Q buffer, one P set
    static constexpr bool kOnePSet = kHuge || kConsumerWarpgroups == 3;
    static constexpr int kStages16 = kHeadDim == 128 || kLarge ? 2 : kHeadDim == 32 ? 4 : 3;
    static constexpr int kStagesFp8 = kHeadDim <= 64 ? 4 : kHuge ? 2 : 3;
    using type = Sm90Traits<ElementType<kInput>, ElementType<kOutput>, kHeadDim, kHeadDimV,
                            /*kBlockN=*/kFp8 ? 128 : kHuge ? 80 : kLarge ? 96 : 128,
                            /*kStages=*/kFp8 ? kStagesFp8 : kStages16,
                            /*kQStages=*/kHuge ? 1 : 2,
                            kLarge ? OutputPath::kRegisters : OutputPath::kTmaStore,
                            /*kRowMaxChains=*/kHeadDimV <= 64 && kConsumerWarpgroups < 3 ? 4 : 1,
                            /*kPSets=*/kOnePSet ? 1 : 2, kConsumerWarpgroups>;
};

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV>
struct Sm90Config {
    // Two consumer warpgroups: every call can run it, and the dispatcher
    // plans by its blocks (fwd_info_sm90).
    using Traits = typename Sm90TraitsOf<kInput, kOutput, kHeadDim, kHeadDimV, 2>::type;
    // Head dim 64 also has FA3's three consumer warpgroups, 192-row blocks
    // (wide_fits says for which calls).
    static constexpr bool kHasWide = kHeadDim == 64 && kHeadDimV == 64;
    using WideTraits = typename Sm90TraitsOf<kInput, kOutput, kHeadDim, kHeadDimV, 3>::type;
};

// Whether a call runs the wide configuration (Sm90Config::WideTraits)
// rather than the two-warpgroup one. Measured on an H100 (docs/log/hopper.md,
// "FA3's configuration per head dim, first round"): 192-row blocks win 2-5% without
// a mask at S 3000, 8k and 16k, but lose 2-5% with a causal mask (a 192-row
// diagonal spans two or three 128-key tiles, all masked, and more of each
// block lies past it). On an H200 (2026-11-30, with the kernels since issue
// 63's fence work) they also win where they pad the queries: S 2k (10.7
// blocks, the last a third empty, 1/32 of the rows more than 128-row blocks)
// ran 5.3-5.7% faster, bf16 and fp16; causal ran 2-7% slower again at 2k and
// 8k. Hence: no mask, no softcap (its exponentials do not fit the 160
// registers a thread of three consumers), no split and no ragged batch (kept
// to the measured case), at most 1/32 of the rows more padding than 128-row
// blocks, and at least two waves of blocks.
template <typename Traits, typename WideTraits>
inline bool wide_fits(const FwdKernelParams &p, int max_ctas) {
    const bool unmasked = !p.causal && fwd_sees_every_key(p);
    if (p.softcap_prescale != 0.f || p.num_splits != 1 || p.ragged) return false;
    const int64_t wide_blocks = (int64_t(p.seqlen_q) + WideTraits::kBlockM - 1) / WideTraits::kBlockM;
    constexpr int64_t kMinWaves = 2;
    const bool fills_waves = wide_blocks * p.num_heads_q * p.batch_size >= kMinWaves * max_ctas;
    if constexpr (Traits::kFp8) {
        // fp8 (H100, issue 36's d64 cases, against the two-warpgroup
        // kernel): unmasked +4-33% at 2k-16k queries (2k's padding
        // included), causal +10-18% at 8k and 16k but -6% at 2k.
        constexpr int kFp8WideMinMaskedSeqlenQ = 4096;
        return fills_waves && (unmasked || p.seqlen_q >= kFp8WideMinMaskedSeqlenQ);
    }
    if (!unmasked) return false;
    const int64_t blocks = (int64_t(p.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM;
    const int64_t extra_padding = wide_blocks * WideTraits::kBlockM - blocks * Traits::kBlockM;
    constexpr int64_t kMaxExtraPaddingShare = 32;  // rows per row of extra padding
    return extra_padding * kMaxExtraPaddingShare <= p.seqlen_q && fills_waves;
}

}  // namespace flashcore::sm90
