// Tile configuration of the sm90 kernel per (input and output element
// types, head dims): 128
// query rows (two consumer warpgroups of 64), the key tile, the K/V ring
// depth, the Q buffers, the sets of P fragments and how O leaves, within 227
// KB of shared memory and 240 registers per consumer thread (O, S, P).
//
//   head dims    keys  stages  Q bufs  P sets  O out      shared memory
//   32           128   3       2       2       TMA store  ~88 KB
//   64           128   3       2       2       TMA store  ~144 KB (a third stage made tput-2k 4-6% faster)
//   96           128   3       2       2       TMA store  ~216 KB
//   128          128   2       2       2       TMA store  ~225 KB (a third stage does not fit)
//   192 / 128    96    2       2       2       registers  ~217 KB (against 64-key tiles, 2 stages, TMA store:
//                                                            0.90-1.0 of the time, H100)
//   256          80    2       1       1       registers  ~225 KB (O alone is 128 registers a thread, so
//                                                            two P sets allow only 48-key tiles; one set
//                                                            and 80 keys, FA3's tile: +7-10% over 48 keys,
//                                                            3 stages, two sets; 64 keys: +3-8%; H100)
//
// One P set cost 3-9% at head dims 64 and 128 (docs/hopper-notes.md), where
// the key tile is not what limits.
//
// Two Q buffers let the next block's Q load, and its first S = Q*K^T start,
// while the current block finishes.
//
// Row maxima in 4 partial chains at head dims <= 64, where the exponentials
// and the tensor cores take turns and the softmax's latency shows: +4-20%
// at d32, +0-4% at d64 (tput-2k and -8k, full and causal, bf16 and fp16,
// H100); at d128 the same change lost ~2% at tput-2k, so it keeps one
// chain (docs/hopper-notes.md, "Prefill against FlashAttention 3").
#pragma once

#include "common/element.cuh"
#include "fwd/params.h"
#include "fwd/sm90/traits.cuh"

namespace flashcore::sm90 {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV>
struct Sm90Config {
    static constexpr bool kLarge = kHeadDim > 128;    // 192, 256: two K/V stages, O stored from registers
    static constexpr bool kHuge = kHeadDimV > 128;    // 256: 80-key tiles, one Q buffer, one P set
    using Traits = Sm90Traits<ElementType<kInput>, ElementType<kOutput>, kHeadDim, kHeadDimV,
                              /*kBlockN=*/kHuge ? 80 : kLarge ? 96 : 128,
                              /*kStages=*/kHeadDim == 128 || kLarge ? 2 : 3,
                              /*kQStages=*/kHuge ? 1 : 2,
                              kLarge ? OutputPath::kRegisters : OutputPath::kTmaStore,
                              /*kRowMaxChains=*/kHeadDimV <= 64 ? 4 : 1,
                              /*kPSets=*/kHuge ? 1 : 2>;
};

}  // namespace flashcore::sm90
