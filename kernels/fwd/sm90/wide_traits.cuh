// Compile-time shape of the sm_90a wide kernel (wide_mainloop.cuh): head
// dims past 256 on wgmma: MLA's latent cache (576 / 512, V in K's rows) and
// d512 (V of its own).
//
// O's 64 x 512 fp32 accumulators are 256 registers a thread on one
// warpgroup, so two warpgroups share each 64-row block, each owning half of
// O's columns (FlashMLA's split). They take the block's key tiles in pairs,
// one tile each for S = Q K^T (a wgmma of N = kBlockN keys over the whole
// head dim), meet in shared memory for the pair's row maxima, write their
// probabilities into one 64 x 2 kBlockN tile of P, and each multiplies all
// of P by its half of both tiles' V.
//
// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle's
// atom): Q, the ring of kStages slots (two pairs: the next pair loads while
// this one is computed; a slot is a K tile, and a V tile where V is not in
// K's rows), P, the row exchange. Every operand is stored
// in panels of 64 columns (128-byte rows, PanelSwizzle<128>), the layout
// wgmma reads: Q and K K-major, V (K's first head_dim_v columns) MN-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/fragment_layout.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// ElementKV_: the cache's type, Element_'s or e4m3 (a quantized cache, whose
// tiles land in the upper part of their slot as they are stored and are
// widened there to Element's panels before the products).
template <typename Element_, typename ElementOut_, int kHeadDim_, int kHeadDimV_, typename ElementKV_ = Element_>
struct Sm90WideTraits {
    using Element = Element_;
    using ElementKV = ElementKV_;
    using ElementOut = ElementOut_;
    static constexpr bool kFp8 = false;
    static constexpr bool kQuantizedKV = !std::is_same_v<ElementKV, Element>;
    // V is the first kHeadDimV columns of K's rows (MLA's latent cache;
    // validation takes such calls only where v is k's view).
    static constexpr bool kVInK = kHeadDimV_ < kHeadDim_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;

    static constexpr int kBlockM = 64;  // one wgmma M: both warpgroups' rows
    // Keys of one warpgroup's S: 32, or 16 where V has tiles of its own (two
    // pairs of K and V tiles then fit beside Q).
    static constexpr int kBlockN = kVInK ? 32 : 16;
    static constexpr int kWarpgroups = 2;
    static constexpr int kNumThreads = kWarpgroups * kWarpgroupThreads;
    static constexpr int kPairKeys = kWarpgroups * kBlockN;
    // Two pairs of tiles: the pair after this one loads while it is
    // computed.
    static constexpr int kStages = 2 * kWarpgroups;

    static constexpr int kElementBytes = int(sizeof(Element));
    static constexpr int kPanelRowBytes = 128;
    using Swizzle = PanelSwizzle<kPanelRowBytes>;
    static constexpr int kPanelCols = kPanelRowBytes / kElementBytes;
    static constexpr int kQKPanels = kHeadDim / kPanelCols;
    static constexpr int kVPanels = kHeadDimV / kPanelCols;
    static constexpr int kColsPerWarpgroup = kHeadDimV / kWarpgroups;
    static constexpr int kVPanelsPerWarpgroup = kVPanels / kWarpgroups;
    static constexpr uint32_t kQPanelBytes = kBlockM * kPanelRowBytes;
    static constexpr uint32_t kQBytes = kQKPanels * kQPanelBytes;
    static constexpr uint32_t kKVPanelBytes = kBlockN * kPanelRowBytes;
    static constexpr uint32_t kKTileBytes = kQKPanels * kKVPanelBytes;
    // A ring slot: a K tile, then where V is not in K's rows its V tile.
    static constexpr uint32_t kSlotBytes = kKTileBytes + (kVInK ? 0 : kVPanels * kKVPanelBytes);
    // A quantized cache's tile as it lands: kBlockN rows of kHeadDim bytes
    // (16-byte chunks), at the end of its slot.
    static constexpr int kRawRowChunks = kHeadDim * int(sizeof(ElementKV)) / 16;
    static constexpr uint32_t kRawTileBytes = kQuantizedKV ? kBlockN * kRawRowChunks * 16u : 0u;
    static constexpr uint32_t kRawTileOffset = kSlotBytes - kRawTileBytes;
    // P: the pair's probabilities, one 64 x kPairKeys panel (128- or 64-byte
    // rows).
    static constexpr int kPRowBytes = kPairKeys * kElementBytes;
    using PSwizzle = PanelSwizzle<kPRowBytes>;
    static constexpr uint32_t kPBytes = kBlockM * kPRowBytes;
    // The exchange: each warpgroup's row maxima of a pair, then at the end
    // its row sums.
    static constexpr int kExchangeFloats = 2 * kWarpgroups * kBlockM;

    static constexpr uint32_t kSmemRing = kQBytes;
    static constexpr uint32_t kSmemP = kSmemRing + kStages * kSlotBytes;
    static constexpr uint32_t kSmemExchange = kSmemP + kPBytes;
    static constexpr size_t kSmemBytes = kSmemExchange + kExchangeFloats * sizeof(float) + kSmemBaseAlignment;

    static_assert(kHeadDim % kPanelCols == 0 && kVPanels % kWarpgroups == 0,
                  "whole panels, and whole panels of V for each warpgroup");
    static_assert(kColsPerWarpgroup <= 256, "a warpgroup's columns of O are one wgmma N");
    static_assert(kPRowBytes == 128 || kPRowBytes == 64, "P is one panel of 128- or 64-byte rows");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory beyond what an sm_90 block may opt into");
    static_assert(!kQuantizedKV || (sizeof(ElementKV) == 1 && kVInK && kHeadDim % 16 == 0),
                  "a quantized cache: one-byte (e4m3) MLA latent rows of whole 16-byte chunks");
    static_assert(sizeof(ElementOut) == sizeof(Element) && kHeadDimV <= kHeadDim,
                  "the output block is staged in Q's shared memory");
};

}  // namespace flashcore::sm90
