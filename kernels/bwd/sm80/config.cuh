// Compile-time shape of the portable backward kernel (BwdTraits) and its
// configuration per head dims (BwdConfig): what kernels/kernels.list
// instantiates.
//
// One CTA of kNumWarps warps owns a block of kBlockN keys: their K and V
// tiles stay in shared memory, and dK, dV accumulate in registers while the
// CTA walks the kBlockM-row query blocks that see them. Per query block:
//   S  = Q K^T,  dP = dO V^T          warps tiled kWarpsMSdP x (the rest)
//                                     over [kBlockM x kBlockN]
//   P  = exp2(S * scale_log2 - lse_log2), dS = P * (dP - D)
//   P, dS -> shared memory (the next products read them transposed)
//   dV += P^T dO, dK += dS^T Q        warps kWarpsNdKV x (the rest) over
//                                     [kBlockN x head dim]
//   dQ  = dS K -> fp32 accumulator    warps kWarpsMdQ x (the rest) over
//                                     [kBlockM x head_dim], atomically added
// The warp tilings are FlashAttention 2's (its Flash_bwd_kernel_traits for
// sm_80): each product's warps split its output so that every operand
// fragment a warp reads from shared memory feeds several MMAs.
//
// Registers: dK and dV live through the whole kernel, kBlockN * (head_dim +
// head_dim_v) / kNumThreads floats per thread (128 at d128 with 128 keys,
// 128 at d256 with 64), S and dP next to them. 255 registers at 256 threads
// is one CTA per SM, as FlashAttention 2's kernels run.
//
// Shared memory: K, V, kStages x (Q, dO, the rows' lse and D) and P, dS. Q
// and dO of the next query block load while the current one computes
// (kStages 2) where the budget allows it. A kernel has a list of
// configurations (BwdTiers), most shared memory first, and runs the first
// that fits the device's limit per block (BwdTiers::index_for: run_bwd_sm80
// launches it, bwd_info_sm80 reports it to the dispatcher); BwdConfig says
// what each head dim runs, and why:
//   227 KiB (sm_90)          two stages at every head dim
//   163 KiB (sm_80, sm_87)   the same but one stage at d256
//   99 KiB (sm_86, sm_89:    FlashAttention 2's smaller tiles on those GPUs:
//   kMinSmemPerBlock)        64 query rows, fewer keys, one stage from d128
#pragma once

#include <cstddef>
#include <type_traits>

#include "bwd/params.h"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/launch_options.h"

namespace flashcore {

template <typename Element_, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kStages_,
          int kWarpsMSdP_, int kWarpsNdKV_, int kWarpsMdQ_>
struct BwdTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;    // of Q, K, dQ, dK
    static constexpr int kHeadDimV = kHeadDimV_;  // of V, O, dO, dV
    static constexpr int kBlockM = kBlockM_;      // query rows per step
    static constexpr int kBlockN = kBlockN_;      // keys per CTA
    static constexpr int kStages = kStages_;      // Q/dO buffers
    static constexpr int kNumWarps = 8;
    static constexpr int kNumThreads = kNumWarps * kWarpSize;
    static constexpr int kMaxRegisters = 255;

    // S and dP: kWarpsMSdP warps along the queries, the rest along the keys.
    static constexpr int kWarpsMSdP = kWarpsMSdP_;
    static constexpr int kWarpsNSdP = kNumWarps / kWarpsMSdP;
    static constexpr int kSdPMTiles = kBlockM / kWarpsMSdP / kMmaM;
    static constexpr int kSdPNTiles = kBlockN / kWarpsNSdP / kMmaN;
    // dK and dV: kWarpsNdKV warps along the keys, the rest along the head dim.
    static constexpr int kWarpsNdKV = kWarpsNdKV_;
    static constexpr int kWarpsDdKV = kNumWarps / kWarpsNdKV;
    static constexpr int kdKVMTiles = kBlockN / kWarpsNdKV / kMmaM;
    static constexpr int kdKNTiles = kHeadDim / kWarpsDdKV / kMmaN;
    static constexpr int kdVNTiles = kHeadDimV / kWarpsDdKV / kMmaN;
    // dQ: kWarpsMdQ warps along the queries, the rest along the head dim.
    static constexpr int kWarpsMdQ = kWarpsMdQ_;
    static constexpr int kWarpsDdQ = kNumWarps / kWarpsMdQ;
    static constexpr int kdQMTiles = kBlockM / kWarpsMdQ / kMmaM;
    // Past head dim 128 a warp's dQ columns are computed in two passes (four
    // past 192; past 256 as many as leave it 4 n8 tiles a pass), so that its
    // accumulators (live beside dK and dV) stay small.
    static constexpr int kdQPasses = kHeadDim > 256   ? kHeadDim / kWarpsDdQ / kMmaN / 4
                                     : kHeadDim > 192 ? 4
                                     : kHeadDim > 128 ? 2
                                                      : 1;
    static constexpr int kdQNTiles = kHeadDim / kWarpsDdQ / kMmaN / kdQPasses;  // per pass
    // Whether the deterministic mode may rotate the walk (BwdKernelParams::
    // rotated_walk): past head dim 192 its turn's arithmetic, beside dK and
    // dV, spilled.
    static constexpr bool kRotatedWalk = kdQPasses <= 2;

    // Shared memory, in this order: K, V, kStages x (Q, dO, lse, D), P, dS.
    static constexpr size_t kSmemKBytes = size_t(kBlockN) * kHeadDim * sizeof(Element);
    static constexpr size_t kSmemVBytes = size_t(kBlockN) * kHeadDimV * sizeof(Element);
    static constexpr size_t kSmemQBytes = size_t(kBlockM) * kHeadDim * sizeof(Element);
    static constexpr size_t kSmemDoBytes = size_t(kBlockM) * kHeadDimV * sizeof(Element);
    // A stage's lse and D values of its rows (fp32), loaded with Q and dO.
    static constexpr size_t kSmemRowStatsBytes = size_t(kBlockM) * sizeof(float);
    static constexpr size_t kSmemStageBytes = kSmemQBytes + kSmemDoBytes + 2 * kSmemRowStatsBytes;
    static constexpr size_t kSmemPBytes = size_t(kBlockM) * kBlockN * sizeof(Element);
    static constexpr size_t kSmemKOffset = 0;
    static constexpr size_t kSmemVOffset = kSmemKOffset + kSmemKBytes;
    static constexpr size_t kSmemStagesOffset = kSmemVOffset + kSmemVBytes;
    static constexpr size_t kSmemPOffset = kSmemStagesOffset + kStages * kSmemStageBytes;
    static constexpr size_t kSmemDsOffset = kSmemPOffset + kSmemPBytes;
    static constexpr size_t kSmemBytes = kSmemDsOffset + kSmemPBytes;

    static_assert(kBlockM % (kWarpsMSdP * kMmaM) == 0 && kBlockM % (kWarpsMdQ * kMmaM) == 0,
                  "query rows split into whole m16 tiles per warp");
    static_assert(kBlockN % (kWarpsNdKV * kMmaM) == 0, "keys split into whole m16 tiles per warp");
    static_assert(kSdPNTiles > 0 && kdKNTiles > 0 && kdVNTiles > 0 && kdQNTiles > 0,
                  "every warp has whole n8 tiles of each product");
    static_assert(kStages == 1 || kStages == 2, "Q and dO are single- or double-buffered");
    static_assert(2 * kBlockM <= kNumThreads, "a thread per row loads each of the stage's lse and D values");
    static_assert(kHeadDim % (4 * kElemsPerVector<Element>) == 0 && kHeadDimV % (4 * kElemsPerVector<Element>) == 0 &&
                      kBlockN % (4 * kElemsPerVector<Element>) == 0,
                  "rows are swizzled in groups of 8 or 4 16-byte vectors (smem_tile.cuh)");
};

// A configuration as a value: what BwdTiers::visit hands its function.
template <typename Traits_>
struct BwdTier {
    using Traits = Traits_;
};

// A kernel's configurations (BwdTraits), most shared memory first, each
// needing less than the one before.
template <typename... Traits>
struct BwdTiers {
    static constexpr int kCount = int(sizeof...(Traits));
    static constexpr size_t kSmemBytes[sizeof...(Traits)] = {Traits::kSmemBytes...};
    static constexpr int kBlockM[sizeof...(Traits)] = {Traits::kBlockM...};
    static constexpr int kBlockN[sizeof...(Traits)] = {Traits::kBlockN...};

    // The configuration a device that lets a block opt in to
    // max_smem_per_block bytes runs: the first that fits, which is the
    // largest. Where none does, or the limit is unknown (0), the last, the
    // one every supported GPU can run (the dispatcher refuses a call whose
    // configuration exceeds the device's limit).
    static constexpr int index_for(size_t max_smem_per_block) {
        for (int i = 0; i < kCount; ++i) {
            if (kSmemBytes[i] <= max_smem_per_block) return i;
        }
        return kCount - 1;
    }

    // Whether each configuration needs less than the one before (index_for
    // then picks the largest that fits).
    static constexpr bool decreasing() {
        for (int i = 1; i < kCount; ++i) {
            if (kSmemBytes[i] >= kSmemBytes[i - 1]) return false;
        }
        return true;
    }

    // fn(BwdTier<T>{}) for T the configuration at `index` (index_for's): a
    // run-time choice among compile-time configurations.
    template <typename Fn>
    static decltype(auto) visit(int index, Fn &&fn) {
        return visit_from<0, Traits...>(index, fn);
    }

private:
    template <int kIndex, typename First, typename... Rest, typename Fn>
    static decltype(auto) visit_from(int index, Fn &fn) {
        if constexpr (sizeof...(Rest) == 0) {
            return fn(BwdTier<First>{});
        } else {
            if (index == kIndex) return fn(BwdTier<First>{});
            return visit_from<kIndex + 1, Rest...>(index, fn);
        }
    }
};

// The configurations of a list, in order, each once (a head dim whose
// tiers are alike has one configuration).
template <typename List, typename... Traits>
struct DistinctBwdTiers {
    using type = List;
};
template <typename... Kept, typename Next, typename... Rest>
struct DistinctBwdTiers<BwdTiers<Kept...>, Next, Rest...>
    : DistinctBwdTiers<std::conditional_t<(std::is_same_v<Kept, Next> || ...), BwdTiers<Kept...>,
                                          BwdTiers<Kept..., Next>>,
                       Rest...> {};
template <typename First, typename... Rest>
using BwdTiersOf = typename DistinctBwdTiers<BwdTiers<First>, Rest...>::type;

template <DType kInput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
struct BwdConfig;

// BwdTraits<Element, head_dim, head_dim_v, BlockM, BlockN, Stages, WarpsMSdP, WarpsNdKV, WarpsMdQ>
//
// Where a block may have 163 KiB (an A100's; sm_90: 227 KiB): query rows per
// step: 128 up to head dim 64 (its registers and shared memory allow it, and
// each step's fixed costs, its barriers and the lse and D loads, are spread
// over twice the rows), else 64. Keys per CTA: 128 at head dims 32, 64 and
// 128; 64 at 96 (its 12-vector rows take more address registers: 128 keys
// spill) and past 128, which keeps dK and dV within the registers (192: 80
// floats; 256: 128); at 256 one Q/dO stage keeps shared memory at 145 KB,
// within an A100's 163 KB, and GPUs that allow 209 KB per block (sm_90: 227
// KB) run two (LargeSmemTraits: 6% faster on an H200), as the other head
// dims do.
//
// Where it may have 99 KiB (kMinSmemPerBlock: sm_86, sm_89), FlashAttention
// 2's tiles for those GPUs (its run_mha_bwd_hdim* below 144 KB), as far as
// this layout (Q and dO staged together) allows: 64 query rows, 128 keys,
// two stages up to head dim 64 (97 KB at d64); at 96 the configuration
// above (89 KB); 64 x 64 tiles with one stage at 128 (81 KB: two would take
// 113 KB) and at 192 (97 KB); at 256 32 x 32 tiles with one stage (68 KB:
// with 64 keys or 64 rows even one stage takes over 104 KB), which leaves a
// warp of the S and dP products one n8 tile (warp_mma reads it alone).
template <DType kInput, int kHeadDim, int kHeadDimV>
struct BwdConfig<kInput, kHeadDim, kHeadDimV, BwdVariant::kKvBlock> {
    template <int kBlockM, int kBlockN, int kStages, int kWarpsNdKV, int kWarpsMdQ>
    using TraitsOf = BwdTraits<ElementType<kInput>, kHeadDim, kHeadDimV, kBlockM, kBlockN, kStages, 2, kWarpsNdKV,
                               kWarpsMdQ>;

    // Past head dim 256 (512: Gemma's), 32 keys a block keep dK and dV at
    // 128 floats a thread. Where a block may have 227 KiB, 64 query rows
    // with one Q/dO stage (200 KiB: 2-3% faster on an H200 than 32 rows with
    // two, 196 KiB; docs/log/models-2026.md); within an A100's 163 KiB, 32
    // rows with one (132 KiB). Nothing fits 99 KiB in this layout: 16 keys
    // make P's rows too short for the swizzle, and 16 query rows leave 8
    // warps less than an n8 tile each of S. sm_86 and sm_89 have no backward
    // there (the dispatcher refuses it: check_kernel_smem).
    static constexpr bool kWide = kHeadDim > 256;
    static constexpr int kWideA100BlockM = 32;
    static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;
    static constexpr int kBlockN = kWide ? 32 : kHeadDim == 96 || kHeadDim > 128 ? 64 : 128;
    static constexpr int kWarpsNdKV = kHeadDim > 128 ? 2 : 4;
    // dQ's warps: 2 x 4 over 64 x 128 at head dim 128 (32 x 32 per warp: 32
    // fragment loads per step, not the 40 of 16 x 64), else 4 along the
    // rows; 2 along 32 rows (4 would have less than an m16 tile each).
    static constexpr int kWarpsMdQ = kHeadDim == 128 ? 2 : 4;
    static constexpr int kWarpsMdQ32Rows = 2;
    using LargeSmemTraits = TraitsOf<kBlockM, kBlockN, (kWide ? 1 : 2), kWarpsNdKV, kWarpsMdQ>;
    using A100Traits =
        std::conditional_t<kWide, TraitsOf<kWideA100BlockM, kBlockN, 1, kWarpsNdKV, kWarpsMdQ32Rows>,
                           TraitsOf<kBlockM, kBlockN, (kHeadDim > 192 ? 1 : 2), kWarpsNdKV, kWarpsMdQ>>;

    // Where the configuration above fits 99 KiB (d96), or nothing does (past
    // 256), it is the small one too; otherwise 64 rows where it has 128 and
    // 64 keys where it has 128 past d64 (32 x 32 past 192), two stages up to
    // d64.
    static constexpr int kSmallBlockM = kHeadDim > 192 ? 32 : 64;
    static constexpr int kSmallBlockN = kHeadDim <= 64 ? 128 : kHeadDim > 192 ? 32 : 64;
    static constexpr int kSmallStages = kHeadDim <= 64 ? 2 : 1;
    // 4 warps along 128 keys, 2 along fewer (a warp keeps 2 m16 tiles of
    // dK and dV at 64 keys).
    static constexpr int kSmallWarpsNdKV = kSmallBlockN == 128 ? 4 : 2;
    // 2 along the rows at head dim 128 (as above) and at 32 rows.
    static constexpr int kSmallWarpsMdQ = kHeadDim == 128 || kSmallBlockM < 64 ? 2 : 4;
    using SmallSmemTraits =
        std::conditional_t<A100Traits::kSmemBytes <= kMinSmemPerBlock || kWide, A100Traits,
                           TraitsOf<kSmallBlockM, kSmallBlockN, kSmallStages, kSmallWarpsNdKV, kSmallWarpsMdQ>>;

    using Tiers = BwdTiersOf<LargeSmemTraits, A100Traits, SmallSmemTraits>;
    static_assert(Tiers::decreasing(), "configurations are listed by decreasing shared memory");
    static_assert(kWide || Tiers::kSmemBytes[Tiers::kCount - 1] <= kMinSmemPerBlock,
                  "the backward kernel of every head dims up to 256 has a configuration within sm_86's and sm_89's "
                  "99 KiB per block");
};

}  // namespace flashcore
