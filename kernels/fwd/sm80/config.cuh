// Tile configurations of the portable forward kernel per (input and output
// element types, head dims, variant): what kernels/kernels.list instantiates
// and the launch heuristic (src/fwd/dispatch.cpp) chooses from. The 64 and 128 entries
// were measured on an H200 with a scratch sweep over block sizes, warps,
// stages and Q in registers or not (docs/log/perf.md); the others follow
// them within the register and shared-memory budgets.
//
// kLargeTiles, for grids that fill the GPU: 128 query rows, 4 warps of two
// m16 tiles each, so every K/V fragment read from shared memory feeds two
// MMAs. From head_dim 96 on, 32-key tiles keep the live S tile small enough
// to fit 255 registers without spilling; past 128 the blocks have 64 rows (at
// 192 x 128 the 128-row block spills on sm_90, and at 256 the O accumulators
// alone are 128 registers per 16 rows). The only variant within
// kMinSmemPerBlock at every head dim (at most 96 KB, at 256); its ragged
// kernel (launch.cuh, kServesRagged) serves packed and paged calls as the
// dense one serves dense calls, and those that no other variant fits. It
// keeps Q in shared memory at head dim 64 (RaggedTraits).
//
// kKeySplit, for small problems: 64 query rows, two groups of 4 warps
// splitting the key tiles between them, so each warp's serial chain of tiles
// is half as long (the latency of a small problem is that chain). From
// head_dim 96 on its two rings take more shared memory than sm_86 and sm_89
// offer (99 KB), and at 192 x 128 more than an A100's (163 KB): there the
// dispatcher uses the large tiles (src/fwd/dispatch.cpp).
//
// kKeySplit4, for grids of at most one CTA per SM: 32 query rows, four
// groups of 2 warps, so twice the CTAs of kKeySplit and half its chain per
// warp. It re-reads the head's K/V once per 32 rows instead of per 64, so
// once the grid needs a second wave kKeySplit is faster (mission shape
// 1x8x512x64 on an H100: 6.7 against 8.2 us; 1x8x1024x64, 256 CTAs: 16.3
// against 12.5).
//
// kDecode, for query blocks of at most 16 rows (decode and speculative steps,
// GQA heads packed into the rows): 16 query rows, four single-warp key splits
// each streaming its own ring of K/V tiles. Decode reads every K/V byte once
// and does little arithmetic per byte, so what it needs is bytes in flight:
// 4 splits x (kDecodeStages - 1) tiles of about kDecodeSlotBytes per SM.
// The 64-row tiles computed 4 to 16 times the rows decode has, and that
// arithmetic, not the memory system, set their pace.
#pragma once

#include "common/element.cuh"
#include "common/launch_options.h"
#include "fwd/params.h"
#include "fwd/sm80/traits.cuh"

namespace flashcore {

// Every call needs a kernel within kMinSmemPerBlock (common/
// launch_options.h), ragged calls (packed or paged tensors) included: the
// large tiles on 16-bit K/V and the decode tiles on a quantized cache, the
// variants built for ragged batches that fit it at every head dim, are
// checked against it below.

// Each configuration's Traits; RaggedTraits, those of its kernel for ragged
// batches (launch.cuh, kServesRagged), which differ only where that kernel
// would spill with Traits and never in what the dispatcher plans by
// (FwdKernelInfo: launch.cuh checks).
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
struct FwdConfig;

// FwdTraits<Element, ElementKV, ElementOut, head_dim, head_dim_v, BlockM, BlockN, WarpsPerSplit, KeySplits, Stages,
//           MaxRegisters, QInRegisters>
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kLargeTiles> {
    static constexpr int kBlockM = kHeadDim <= 128 ? 128 : 64;
    static constexpr int kBlockN = kHeadDim <= 64 ? 64 : 32;
    using Traits = FwdTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV, kBlockM, kBlockN, 4, 1, 2,
                             255, kHeadDim <= 64>;
    // Q in shared memory from head dim 64 on: with Q's 32 registers a
    // thread, the ragged kernel's page lookups and run-time rows spilled 4
    // bytes at 64 on sm_80 (255 registers; sm_90 fit). Q from shared memory
    // costs an ldmatrix per k-step (238 registers).
    using RaggedTraits = FwdTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV,
                                   kBlockM, kBlockN, 4, 1, 2, 255, kHeadDim <= 32>;
    static_assert(Traits::kSmemBytes <= kMinSmemPerBlock,
                  "the large tiles serve the ragged calls that no other variant fits: they must fit the 99 KB of "
                  "shared memory sm_86 and sm_89 give a block (kMinSmemPerBlock) at every head dim");
};

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kKeySplit> {
    using Traits = FwdTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV, 64, 64, 4, 2, 2, 255,
                             kHeadDim <= 96>;
    using RaggedTraits = Traits;
};

// Past head_dim 64, 32-key tiles keep four splits' rings (2 slots each)
// within the 227 KB an sm_90 CTA may have (d128 64-key slots: 256 KB).
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kKeySplit4> {
    using Traits = FwdTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV, 32,
                             kHeadDim <= 64 ? 64 : 32, 2, 4, 2, 255, kHeadDim <= 96>;
    using RaggedTraits = Traits;  // no ragged kernel (launch.cuh)
};

#ifndef FLASHCORE_DECODE_SLOT_BYTES  // scratch sweeps override these three
#define FLASHCORE_DECODE_SLOT_BYTES 16384
#endif
#ifndef FLASHCORE_DECODE_STAGES
#define FLASHCORE_DECODE_STAGES 3
#endif
#ifndef FLASHCORE_DECODE_KEY_SPLITS
#define FLASHCORE_DECODE_KEY_SPLITS 4
#endif
// Bytes of one ring slot (a K and a V tile) the decode tiles aim for.
constexpr int kDecodeSlotBytes = FLASHCORE_DECODE_SLOT_BYTES;
constexpr int kDecodeStages = FLASHCORE_DECODE_STAGES;
constexpr int kDecodeKeySplits = FLASHCORE_DECODE_KEY_SPLITS;
constexpr int kDecodeBlockM = 16;

constexpr int min_int(int a, int b) { return a < b ? a : b; }

// Keys per decode tile: kSlotBytes of K and V rows of element_bytes
// elements, a multiple of 16 (the P*V k-step), from 16 to 64.
template <int kSlotBytes = kDecodeSlotBytes>
constexpr int decode_block_n(int head_dim, int head_dim_v, int element_bytes) {
    const int keys = kSlotBytes / ((head_dim + head_dim_v) * element_bytes) / kMmaK * kMmaK;
    return keys < kMmaK ? kMmaK : (keys > 64 ? 64 : keys);
}

// On a quantized (e4m3) cache the decode tiles keep the 16-bit tiles' keys
// per tile, in slots of half the bytes, and 2 of them: the decode tiles are
// the only ones on such a cache, so they must fit the 99 KB of shared memory
// sm_86 and sm_89 give a block (at d128, 3 slots take 100 KB), and at about
// 70 KB two CTAs share an H100's or A100's SM, which keeps as many bytes in
// flight per SM as one CTA of 3 slots would.
#ifndef FLASHCORE_DECODE_QUANTIZED_STAGES  // scratch sweeps override it
#define FLASHCORE_DECODE_QUANTIZED_STAGES 2
#endif
constexpr int kDecodeQuantizedStages = FLASHCORE_DECODE_QUANTIZED_STAGES;
// And at most 32 keys per tile: the e4m3 products widen a tile's K in
// registers, which with 64 keys (head dims up to 64) spilled.
constexpr int kDecodeQuantizedMaxKeys = 32;

// Both decode tiles (kDecode, kDecodePair): kDecodeBlockM rows, kDecodeKeySplits
// single-warp key splits, each streaming its ring of kStages tiles of kBlockN
// keys; Q in registers up to head dim 128.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, int kBlockN, int kStages>
using DecodeTraits = FwdTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV,
                               kDecodeBlockM, kBlockN, 1, kDecodeKeySplits, kStages, 255, kHeadDim <= 128>;

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kDecode> {
    static constexpr bool kQuantizedKV = kKV != kInput;
    static constexpr int kBlockN = decode_block_n(kHeadDim, kHeadDimV, int(dtype_bytes(kInput)));
    using Traits = DecodeTraits<kInput, kKV, kOutput, kHeadDim, kHeadDimV,
                                kQuantizedKV ? min_int(kBlockN, kDecodeQuantizedMaxKeys) : kBlockN,
                                kQuantizedKV ? kDecodeQuantizedStages : kDecodeStages>;
    using RaggedTraits = Traits;
    static_assert(!kQuantizedKV || Traits::kSmemBytes <= kMinSmemPerBlock,
                  "the decode tiles are the only kernels on a quantized cache: they must fit the 99 KB of shared "
                  "memory sm_86 and sm_89 give a block (kMinSmemPerBlock)");
};

// An H100's or H200's shared memory per SM, and what the system reserves of
// it per CTA.
constexpr size_t kSm90SmemPerSm = 228 * 1024;
constexpr size_t kSmemReservedPerCta = 1024;

// kDecodePair: the decode tiles with slots of half the bytes (at head dim
// 128, 16 keys), so that a CTA takes 100 KB and two share an SM: as many
// bytes in flight per SM, in two CTAs, one streaming while the other fills
// or drains its rings. Where a decode grid takes more than a wave of the
// decode tile's CTAs, and so does not split, that is 6-9% faster (H200,
// B64 over 1k keys at GQA 32/8 and 32/4: 71.3 -> 66.8 us, 38.7 -> 35.7);
// so is a grid too small to fill half the SMs, which its shorter tiles
// split twice as finely (B1 over 2k keys: 15.0 -> 12.2 us); where the
// decode tile's grid splits into a wave, its deeper rings are 1-5% faster
// (docs/log/perf.md, 2026-11-30; plan_sm80 chooses). 16-bit K/V only.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kDecodePair> {
    static_assert(kKV == kInput, "the paired decode tiles read 16-bit K/V (fwd/family.cmake)");
    static constexpr int kSlotBytes = kDecodeSlotBytes / 2;
    using Traits =
        DecodeTraits<kInput, kKV, kOutput, kHeadDim, kHeadDimV,
                     decode_block_n<kSlotBytes>(kHeadDim, kHeadDimV, int(dtype_bytes(kInput))), kDecodeStages>;
    using RaggedTraits = Traits;
    static_assert(2 * (Traits::kSmemBytes + kSmemReservedPerCta) <= kSm90SmemPerSm,
                  "two paired decode CTAs share an sm_90 SM's shared memory");
};

// The wide kernel (WideTraits, traits.cuh), for head dims past 256: every
// warp holds O's rows of its own columns. A head dim narrower for V than for
// K (MLA's 576 / 512, the only such wide pair) reads V from K's tile:
// validation takes such calls only where v is k's view (src/fwd/validate.cpp).
template <int kHeadDim, int kHeadDimV>
constexpr bool kWideVInK = kHeadDimV < kHeadDim;

// kWide: 64 rows on 8 warps (4 row bands x 2 key groups of S; 64 columns
// of O a warp, 128 registers), 32-key tiles; 3 slots where V is in K's
// tile (190 KB at 576; an e4m3 cache 168 KB with its widened tile), 2 where
// it has its own (202 KB at 512): sm_90 and GPUs with as much shared
// memory.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kWide> {
    using Traits = WideTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV, 64, 32, 8,
                              kWideVInK<kHeadDim, kHeadDimV> ? 3 : 2, kWideVInK<kHeadDim, kHeadDimV>>;
    using RaggedTraits = Traits;
};

// kWideDecode: 16 rows (decode's GQA-packed heads) on 4 warps of 128
// columns of O each, 2 ring slots, within kMinSmemPerBlock so that every GPU
// has a kernel at these head dims. V in K's tile: 32-key tiles, 8 keys of S
// a warp (94 KB at 576; an e4m3 cache 92 KB with its widened tile). V of
// its own: a 32-key slot would take 64 KB, so 16-key tiles, whose S two of
// the warps compute (80 KB at 512; on 2 warps of 256 columns the dense
// kernel spilled on sm_90).
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
struct FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, FwdVariant::kWideDecode> {
    static constexpr bool kVInK = kWideVInK<kHeadDim, kHeadDimV>;
    using Traits = WideTraits<ElementType<kInput>, ElementType<kKV>, ElementType<kOutput>, kHeadDim, kHeadDimV, 16,
                              kVInK ? 32 : 16, 4, 2, kVInK>;
    using RaggedTraits = Traits;
    static_assert(Traits::kSmemBytes <= kMinSmemPerBlock,
                  "the wide decode tiles are the one kernel at their head dims that every GPU fits: within the 99 KB "
                  "of shared memory sm_86 and sm_89 give a block (kMinSmemPerBlock)");
};
}  // namespace flashcore
