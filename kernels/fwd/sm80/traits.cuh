// Compile-time shape of one portable forward kernel variant: tile sizes, warp
// layout and the shared-memory budget that follows from them.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"

namespace flashcore {

template <typename Element_, typename ElementKV_, typename ElementOut_, int kHeadDim_, int kHeadDimV_, int kBlockM_,
          int kBlockN_, int kWarpsPerSplit_, int kKeySplits_, int kStages_, int kMaxRegisters_, bool kQInRegisters_>
struct FwdTraits {
    using Element = Element_;        // of Q
    using ElementKV = ElementKV_;    // of K and V
    using ElementOut = ElementOut_;  // of O
    // K/V in a narrower type (e4m3: a quantized cache), widened in registers
    // on their way to the MMAs (sm80/warp_gemm_e4m3.cuh); P and V then
    // multiply in fp16.
    static constexpr bool kQuantizedKV = !std::is_same_v<ElementKV, Element>;
    // The row-split kernel (mainloop.cuh), not WideTraits' column split;
    // its V is a tile of its own.
    static constexpr bool kSplitsColumns = false;
    static constexpr bool kVInK = false;
    static constexpr int kHeadDim = kHeadDim_;    // of Q and K
    static constexpr int kHeadDimV = kHeadDimV_;  // of V and O
    static constexpr int kBlockM = kBlockM_;      // query rows per CTA
    static constexpr int kBlockN = kBlockN_;      // key rows per K/V tile
    // The CTA's warps form kKeySplits groups of kWarpsPerSplit. Every group
    // covers all kBlockM query rows but only every kKeySplits-th key tile, with
    // its own K/V ring and barrier; the groups' partial results are merged at
    // the end. Splitting the keys shortens each warp's serial chain of tiles:
    // that is what bounds the latency of problems too small to fill the GPU.
    static constexpr int kWarpsPerSplit = kWarpsPerSplit_;
    static constexpr int kKeySplits = kKeySplits_;
    static constexpr int kNumWarps = kWarpsPerSplit * kKeySplits;
    static constexpr int kNumThreads = kNumWarps * kWarpSize;
    static constexpr int kThreadsPerSplit = kWarpsPerSplit * kWarpSize;
    // K/V tiles in flight: slots of the shared-memory ring (see the kernel).
    static constexpr int kStages = kStages_;
    // Register cap per thread. Without one the scheduler hoists fragment
    // loads far ahead until it spills; the cap is set per configuration to
    // what its live accumulators need plus room for a few loads in flight.
    static constexpr int kMaxRegisters = kMaxRegisters_;
    // Whether Q's MMA fragments are loaded once into registers, or re-read
    // from shared memory each k-step (fewer registers, more ldmatrix).
    static constexpr bool kQInRegisters = kQInRegisters_;

    // Each warp owns a contiguous band of query rows for the whole kernel:
    // its S = Q*K^T and O accumulators stay in its registers.
    static constexpr int kRowsPerWarp = kBlockM / kWarpsPerSplit;
    static constexpr int kMAtoms = kRowsPerWarp / kMmaM;   // m16 tiles per warp
    static constexpr int kNAtomsS = kBlockN / kMmaN;       // n8 tiles of S
    static constexpr int kNAtomsO = kHeadDimV / kMmaN;     // n8 tiles of O
    static constexpr int kKStepsQK = kHeadDim / kMmaK;     // k16 steps of Q*K^T
    static constexpr int kKStepsPV = kBlockN / kMmaK;      // k16 steps of P*V
    static constexpr int kQFragSteps = kQInRegisters ? kKStepsQK : 1;  // Q k-steps held at once

    static constexpr size_t kSmemQBytes = size_t(kBlockM) * kHeadDim * sizeof(Element);
    static constexpr int kSmemKElems = kBlockN * kHeadDim;   // one K tile
    static constexpr int kSmemVElems = kBlockN * kHeadDimV;  // one V tile
    static constexpr int kSmemSlotElems = kSmemKElems + kSmemVElems;
    // Q, then per key split kStages slots of one K and one V tile each. The
    // output tile reuses Q's space; the key-split merge (key_split.cuh)
    // reuses the K/V rings, whose exchange of a split's O and softmax state
    // may take more than a small ring: the ring is at least that.
    static constexpr size_t kSmemSlotBytes = size_t(kSmemSlotElems) * sizeof(ElementKV);
    static constexpr size_t kSmemMergeBytes =
        size_t(kMAtoms * kNAtomsO * 4 + 2 * 2 * kMAtoms) * kThreadsPerSplit * sizeof(float);
    static constexpr size_t kSmemRingBytes = kKeySplits == 1 || size_t(kStages) * kSmemSlotBytes >= kSmemMergeBytes
                                                 ? size_t(kStages) * kSmemSlotBytes
                                                 : kSmemMergeBytes;
    static constexpr size_t kSmemBytes = kSmemQBytes + size_t(kKeySplits) * kSmemRingBytes;

    static_assert(kKeySplits == 1 || kKeySplits == 2 || kKeySplits == 4, "key_split.cuh merges 1, 2 or 4 splits");
    static_assert(kStages >= 2, "the ring needs a slot to fill while another is read");
    static_assert(kRowsPerWarp % kMmaM == 0, "each warp needs whole m16 tiles");
    static_assert(kBlockN % kMmaK == 0, "K/V tiles are consumed in k16 steps");
    static_assert(kHeadDim % (4 * kElemsPerVector<Element>) == 0 && kHeadDimV % (4 * kElemsPerVector<Element>) == 0,
                  "rows are swizzled in groups of 8 or 4 16-byte vectors (smem_tile.cuh)");
    static_assert(kHeadDimV <= kHeadDim, "the output tile reuses Q's shared memory");
    static_assert(!kQuantizedKV || (sizeof(ElementKV) == 1 && sizeof(Element) == 2),
                  "quantized K/V are one-byte (e4m3) under a 16-bit input");
    static_assert(kHeadDim % kElemsPerVector<ElementKV> == 0 && kHeadDimV % kElemsPerVector<ElementKV> == 0,
                  "K/V rows are whole 16-byte vectors");
    static_assert(sizeof(ElementOut) == sizeof(Element), "the output tile is staged in Q's rows, with Q's swizzle");
};

// The wide kernel's shape (wide_mainloop.cuh): head dims whose output
// rows do not fit one warp's registers (a 16 x 512 fp32 accumulator is 256
// registers a thread), so its warps split O's columns instead of its rows.
//
// S = Q K^T is split over the warps as a grid of kRowGroups m16 row bands
// by kKeyGroups key ranges of each tile; P goes through shared memory, and
// every warp then multiplies all kBlockM rows of P by its kColsPerWarp
// columns of V. The key groups of a row band meet in shared memory for the
// tile's row maximum, so every warp holds the same running maxima.
//
// kVInK: V is the first kHeadDimV columns of K's rows (MLA's latent cache,
// where V is a view of the cache K is): one tile in shared memory serves
// both products and V is never loaded on its own.
//
// K/V in e4m3 (a quantized cache; ElementKV != Element): each landed slot
// is widened once into a 16-bit tile in shared memory (every e4m3 value is
// exact in fp16 and bf16: common/fp8.cuh), which both products then read as
// they read a 16-bit slot; the descale factors scale the scores and the
// output.
template <typename Element_, typename ElementKV_, typename ElementOut_, int kHeadDim_, int kHeadDimV_, int kBlockM_,
          int kBlockN_, int kNumWarps_, int kStages_, bool kVInK_>
struct WideTraits {
    using Element = Element_;
    using ElementKV = ElementKV_;
    using ElementOut = ElementOut_;
    static constexpr bool kQuantizedKV = !std::is_same_v<ElementKV, Element>;
    static constexpr bool kSplitsColumns = true;
    static constexpr bool kVInK = kVInK_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kNumWarps = kNumWarps_;
    static constexpr int kNumThreads = kNumWarps * kWarpSize;
    static constexpr int kStages = kStages_;
    static constexpr int kMaxRegisters = 255;
    // One ring, taken by every warp (KvRing's key split 0).
    static constexpr int kKeySplits = 1;
    static constexpr int kThreadsPerSplit = kNumThreads;

    // S's split: warp w < kSWarps takes row band w % kRowGroups and key
    // group w / kRowGroups of each tile; where the tile has fewer n8 key
    // tiles than that leaves warps, the rest compute only O.
    static constexpr int kRowGroups = kBlockM / kMmaM;
    static constexpr int kKeyGroups =
        kNumWarps / kRowGroups < kBlockN / kMmaN ? kNumWarps / kRowGroups : kBlockN / kMmaN;
    static constexpr int kSWarps = kRowGroups * kKeyGroups;
    static constexpr int kKeysPerWarp = kBlockN / kKeyGroups;
    static constexpr int kNAtomsS = kKeysPerWarp / kMmaN;
    static constexpr int kKStepsQK = kHeadDim / kMmaK;
    // O's split: warp w holds columns [w * kColsPerWarp, + kColsPerWarp) of
    // every row.
    static constexpr int kColsPerWarp = kHeadDimV / kNumWarps;
    static constexpr int kMAtomsO = kBlockM / kMmaM;
    static constexpr int kNAtomsO = kColsPerWarp / kMmaN;
    static constexpr int kKStepsPV = kBlockN / kMmaK;
    // Elements of a V row in shared memory: K's row where V is in it.
    static constexpr int kVRowElems = kVInK ? kHeadDim : kHeadDimV;

    static constexpr size_t kSmemQBytes = size_t(kBlockM) * kHeadDim * sizeof(Element);
    static constexpr int kSmemKElems = kBlockN * kHeadDim;
    static constexpr int kSmemVElems = kVInK ? 0 : kBlockN * kHeadDimV;
    static constexpr int kSmemSlotElems = kSmemKElems + kSmemVElems;
    static constexpr size_t kSmemSlotBytes = size_t(kSmemSlotElems) * sizeof(ElementKV);
    static constexpr size_t kSmemRingBytes = size_t(kStages) * kSmemSlotBytes;
    // A quantized slot widened to 16 bits (none for a 16-bit cache).
    static constexpr size_t kSmemWidenedBytes = kQuantizedKV ? size_t(kSmemSlotElems) * sizeof(Element) : 0;
    // After the ring: P's tile, then the row exchange (floats): each key
    // group's partial row maxima and at the end its row sums, the tile's
    // correction factors, the final row maxima.
    // P's rows are at least 32 elements (4 vectors, the narrowest row the
    // swizzle takes: sm80/smem_tile.cuh); 16-key tiles use half of each.
    static constexpr int kPRowElems = kBlockN < 32 ? 32 : kBlockN;
    static constexpr size_t kSmemPBytes = size_t(kBlockM) * kPRowElems * sizeof(Element);
    static constexpr int kExchangeFloats = 2 * kKeyGroups * kBlockM + 2 * kBlockM;
    static constexpr size_t kSmemBytes =
        kSmemQBytes + kSmemRingBytes + kSmemWidenedBytes + kSmemPBytes + size_t(kExchangeFloats) * sizeof(float);

    static_assert(kBlockM % kMmaM == 0 && kNumWarps % kRowGroups == 0, "whole m16 row bands, each on whole warps");
    static_assert(kBlockN % kKeyGroups == 0 && kKeysPerWarp % kMmaN == 0, "whole n8 key tiles per warp");
    static_assert(kHeadDimV % kNumWarps == 0 && kColsPerWarp % (2 * kMmaN) == 0,
                  "whole pairs of n8 column tiles per warp (V is read two at a time)");
    static_assert(kBlockN % kMmaK == 0, "K/V tiles are consumed in k16 steps");
    static_assert(kHeadDimV <= kHeadDim, "the output tile reuses Q's shared memory");
    static_assert(kStages >= 2, "the ring needs a slot to fill while another is read");
    static_assert(sizeof(ElementOut) == sizeof(Element), "the output tile is staged in Q's rows, with Q's swizzle");
    static_assert(!kQuantizedKV || (sizeof(ElementKV) == 1 && sizeof(Element) == 2),
                  "quantized K/V are one-byte (e4m3) under a 16-bit input");
};

}  // namespace flashcore
