// Compile-time shape of the sm90 forward kernel: tile sizes, warp roles,
// register split and shared-memory layout.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "sm90/ptx.cuh"
#include "sm90/tile_scheduler.cuh"

namespace flashcore::sm90 {

// Kernel arguments: the portable kernel's parameters plus the TMA
// descriptors of Q, K, V and O (4-d: head_dim, seq, head, batch), encoded
// per call on the host. __grid_constant__, so the TMA unit reads them in
// place.
struct Sm90KernelParams {
    FwdKernelParams fwd;
    CUtensorMap tma_q;
    CUtensorMap tma_k;
    CUtensorMap tma_v;
    CUtensorMap tma_o;
    // Where the CTAs' count of K/V tiles starts (Pipeline::first_position):
    // 0, except in the test that starts it near 2^32
    // (FLASHCORE_TEST_KV_POSITION).
    uint64_t first_kv_position;
    // Paged K/V: rows per TMA box of tma_k and tma_v (one page's share of a
    // tile; producer.cuh).
    int kv_box_rows;
    // The persistent schedule (tile_scheduler.cuh) as the host computed it,
    // for the kernels that read it from here (schedule_of).
    ScheduleNumbers schedule;
};

// The CTA's persistent schedule: the numbers the host put in the kernel's
// parameters, which ptxas reads from the constant bank where they are used
// instead of keeping them in registers (computed by each CTA, as they were
// before chunks were paired, two of them spilled with three consumer
// warpgroups at 160 registers a thread, and the chunk runs' divisions
// spilled 4 bytes in the e4m3 d256 kernel's producer).
template <typename Traits>
__device__ __forceinline__ PersistentSchedule<Traits::kBlockM, Traits::kBlockN> schedule_of(
    const Sm90KernelParams &params) {
    PersistentSchedule<Traits::kBlockM, Traits::kBlockN> s;
    static_cast<ScheduleNumbers &>(s) = params.schedule;
    // Known here, so that the compact walk is not compiled where it does
    // not fit.
    if constexpr (!Traits::kCompactRaggedSchedule) s.compact = false;
    return s;
}

// Whether the rows of a batch's last K/V tile past its keys (up to
// tile_end, the tile's end as a key of the batch) may hold anything, so
// that the consumers must zero them in V (v_tail.cuh): their probabilities
// are 0, but 0 times NaN is NaN. Dense maps zero-fill past seqlen_k, so only
// a KV cache's unused tail past seqused_k needs it; so do pages the batch
// does not own. Packed keys (cu_seqlens_k) are followed by the next
// sequence's, finite, which need no zeroing (it costs each block a wait for
// its first V tile and a barrier of both consumers: varlen prefill ran
// ~2.5% slower), except past the last sequence, where a larger buffer may
// hold anything up to total_seqlen_k.
template <bool kRagged>
__device__ __forceinline__ bool v_tail_may_hold_garbage(const FwdKernelParams &p, const BatchSeqs &seqs,
                                                        int tile_end) {
    if (kRagged && (p.block_table != nullptr || (p.cu_seqlens_k != nullptr && p.seqused_k != nullptr))) return true;
    if (kRagged && p.cu_seqlens_k != nullptr) {
        const int packed_end = min(max(__ldg(p.cu_seqlens_k + p.batch_size), 0), p.total_seqlen_k);
        return seqs.k_row0 + tile_end > packed_end;
    }
    return seqs.seqlen_k < p.seqlen_k;
}

// Shared memory an sm_90 block may opt into (H100, H200): 227 KB.
constexpr size_t kMaxSmemPerBlock = 227 * 1024;

// Consumer warpgroups a CTA may have (Sm90Traits::kConsumerWarpgroups).
constexpr int kMaxConsumerWarpgroups = 3;

// Named barriers (0 is __syncthreads): one per consumer warpgroup (the
// epilogue's), then one for all the consumers (v_tail.cuh).
constexpr int kFirstConsumerBarrier = 1;
constexpr int kAllConsumersBarrier = kFirstConsumerBarrier + kMaxConsumerWarpgroups;
// Then one per consumer warpgroup for its turn to issue GEMMs (IssueTurns,
// mainloop.cuh).
constexpr int kFirstIssueTurnBarrier = kAllConsumersBarrier + 1;

// Registers per thread after setmaxnreg, by consumer warpgroups (2 or 3)
// and whether the producer warpgroup's other warps transpose V (e4m3
// inputs, v_transpose.cuh): the producer keeps only what its one issuing
// thread (and the transposing warps) need, the consumers share the rest of
// the SM's 64K (S, P and O live in their registers). The counts are
// multiples of 8, and (1 + consumers) x 128 threads fit 64K:
//   2: 128 x 24 + 256 x 240;  3: 128 x 32 + 384 x 160 (FA3's split);
//   transposing V: 2: 128 x 48 + 256 x 224;  3: 128 x 48 + 384 x 152 (at 24
//   the transposing warps' loop and the producer's spilled; at 40 the
//   ragged producer did);
//   transposing V with consumers of 240 (wide_consumers: fp8 at head dim
//   256, whose 128-key tiles need them: S 64 + O 128 + P 16 registers a
//   thread): 128 x 24 + 256 x 240, FA3's split, which the producer fits by
//   run_producer's economies (producer.cuh).
constexpr int producer_registers(int consumer_warpgroups, bool transposes_v, bool wide_consumers) {
    if (wide_consumers) return 24;
    return transposes_v ? 48 : consumer_warpgroups == 2 ? 24 : 32;
}
constexpr int consumer_registers(int consumer_warpgroups, bool transposes_v, bool wide_consumers) {
    if (wide_consumers) return 240;
    if (transposes_v) return consumer_warpgroups == 2 ? 224 : 152;
    return consumer_warpgroups == 2 ? 240 : 160;
}

// How finished rows of O leave the CTA.
enum class OutputPath {
    kTmaStore,   // staged in shared memory, one TMA store per block (drains while the next block runs)
    kRegisters,  // stored from the accumulators (where shared memory has no room for staging)
};

// Producer warps that transpose V for the P*V product of one-byte (e4m3)
// inputs (v_transpose.cuh): the producer warpgroup's warps after the first,
// whose one thread issues the TMA copies.
constexpr int kVTransposeWarps = kWarpgroupThreads / 32 - 1;

template <typename Element_, typename ElementOut_, int kHeadDim_, int kHeadDimV_, int kBlockN_, int kStages_,
          int kQStages_, OutputPath kOutputPath_, int kRowMaxChains_ = 1, int kPSets_ = 2,
          int kConsumerWarpgroups_ = 2>
struct Sm90Traits {
    using Element = Element_;        // of Q, K and V
    using ElementOut = ElementOut_;  // of O
    // One-byte (e4m3) inputs: wgmma reads fp8 operands K-major only, so the
    // P*V product needs V transposed (keys contiguous, v_transpose.cuh);
    // P is fp8 too, scaled by 2^kProbExponent so that the largest
    // probability of a row (1 before scaling) uses e4m3's range (max 448)
    // instead of its subnormals (FA3's offset of 8).
    static constexpr bool kFp8 = sizeof(Element) == 1;
    static constexpr int kProbExponent = kFp8 ? 8 : 0;
    // Keys per wgmma k-step: 16 of a two-byte type, 32 of fp8.
    static constexpr int kMmaKeys = kFp8 ? 32 : 16;
    static constexpr int kVTransposeWarps = kFp8 ? sm90::kVTransposeWarps : 0;
    // The two consumer warpgroups take turns issuing their GEMMs (FA3's
    // ping-pong, IssueTurns): on fp8 the tensor cores finish a tile about as
    // fast as the exponentials (MUFU) do, so each warpgroup's softmax should
    // run while the other's GEMMs do. Measured on one H100 against the same
    // kernel without turns (issue 36's fp8 cases): head dim 64 +0-11%, 256
    // +1-17%; 128 -4% to +5%, and 16k causal -9%: not there.
    static constexpr bool kIssueInTurns = kFp8 && kHeadDimV_ != 128;
    static constexpr int kHeadDim = kHeadDim_;    // of Q and K
    static constexpr int kHeadDimV = kHeadDimV_;  // of V and O
    static constexpr int kBlockN = kBlockN_;      // keys per K/V tile
    static constexpr int kStages = kStages_;      // K/V tiles in flight
    // Q buffers: with two, the next query block's Q loads while the current
    // one's is still in use.
    static constexpr int kQStages = kQStages_;
    static constexpr OutputPath kOutputPath = kOutputPath_;
    // Partial maxima per row in the softmax (OnlineSoftmax's kMaxChains).
    static constexpr int kRowMaxChains = kRowMaxChains_;
    // Register sets of P fragments (Mainloop): two let P_j be written while
    // P_{j-1} * V_{j-1} still reads the other; one leaves room for wider key
    // tiles where O fills the registers.
    static constexpr int kPSets = kPSets_;

    // One producer warpgroup issues the TMA copies; each consumer warpgroup
    // owns 64 query rows (one wgmma M) of the CTA's block.
    static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
    static constexpr int kRowsPerConsumer = 64;
    static constexpr int kBlockM = kConsumerWarpgroups * kRowsPerConsumer;
    static constexpr int kNumThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
    static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;

    // Registers per thread after the split (producer_registers).
    // fp8 at head dim 256: 128-key tiles (config.cuh) in consumers of 240.
    static constexpr bool kWideConsumers = kFp8 && kHeadDimV_ > 128;
    static constexpr int kProducerRegisters = producer_registers(kConsumerWarpgroups, kFp8, kWideConsumers);
    static constexpr int kConsumerRegisters = consumer_registers(kConsumerWarpgroups, kFp8, kWideConsumers);
    // Whether ragged batches of packed queries walk each sequence's own
    // blocks (ScheduleNumbers::compact). Not beside consumers of 240, whose
    // producer walks from shared memory (SharedStep): the batch search
    // spilled 12 bytes of its 24 registers (e4m3, head dim 256), so there
    // every batch keeps the longest one's items.
    static constexpr bool kCompactRaggedSchedule = !kWideConsumers;

    // Panels: 128-byte rows where both head dims' rows are multiples of 128
    // bytes (of two-byte elements: 64 columns), else 64-byte rows (32, 96).
    static constexpr int kElementBytes = int(sizeof(Element));
    static constexpr int kPanelRowBytes = kHeadDim * kElementBytes % 128 == 0 && kHeadDimV * kElementBytes % 128 == 0
                                              ? 128
                                              : 64;
    using Swizzle = PanelSwizzle<kPanelRowBytes>;
    static constexpr int kPanelCols = kPanelRowBytes / kElementBytes;
    static constexpr int kQKPanels = kHeadDim / kPanelCols;
    static constexpr int kVPanels = kHeadDimV / kPanelCols;
    static constexpr uint32_t kQPanelBytes = kBlockM * kPanelRowBytes;
    static constexpr uint32_t kQBytes = kQKPanels * kQPanelBytes;
    static constexpr uint32_t kKVPanelBytes = kBlockN * kPanelRowBytes;
    static constexpr uint32_t kKTileBytes = kQKPanels * kKVPanelBytes;
    static constexpr uint32_t kVTileBytes = kVPanels * kKVPanelBytes;

    // fp8: V^T tiles, one per stage: head_dim_v rows of the tile's keys
    // (panels of up to 128 keys), the B operand of P*V, K-major.
    static constexpr int kVtRowBytes = !kFp8 || kBlockN > 128 ? 128 : kBlockN;
    using VtSwizzle = PanelSwizzle<kVtRowBytes>;
    static constexpr int kVtPanelKeys = kVtRowBytes;  // one-byte elements
    static constexpr uint32_t kVtPanelBytes = kHeadDimV * kVtRowBytes;
    static constexpr uint32_t kVtTileBytes = kFp8 ? (kBlockN / kVtPanelKeys) * kVtPanelBytes : 0;

    // Each consumer stages its finished rows of O for the TMA store, in
    // panels of the input's layout, or for a one-byte input those of its
    // two-byte output.
    static constexpr int kOutPanelRowBytes =
        !kFp8 ? kPanelRowBytes : kHeadDimV * int(sizeof(ElementOut)) % 128 == 0 ? 128 : 64;
    using OutSwizzle = PanelSwizzle<kOutPanelRowBytes>;
    static constexpr int kOutPanelCols = kOutPanelRowBytes / int(sizeof(ElementOut));
    static constexpr int kOutPanels = kHeadDimV / kOutPanelCols;
    static constexpr uint32_t kOPanelBytes = kRowsPerConsumer * kOutPanelRowBytes;
    static constexpr uint32_t kOStagingBytes =
        kOutputPath == OutputPath::kTmaStore ? kOutPanels * kOPanelBytes : 0;

    // Shared memory, from an aligned base: the Q buffers, the K ring, the V
    // ring, (fp8) the V^T ring, the O staging of each consumer, then the
    // mbarriers.
    static constexpr uint32_t kSmemK = kQStages * kQBytes;
    static constexpr uint32_t kSmemV = kSmemK + kStages * kKTileBytes;
    static constexpr uint32_t kSmemVt = kSmemV + kStages * kVTileBytes;
    static constexpr uint32_t kSmemO = kSmemVt + kStages * kVtTileBytes;
    static constexpr uint32_t kSmemBarriers = kSmemO + kConsumerWarpgroups * kOStagingBytes;
    // q_full, q_empty per Q buffer; k_full, v_full, k_empty, v_empty per
    // stage; fp8: vt_full, vt_empty per stage
    static constexpr int kNumBarriers = 2 * kQStages + (kFp8 ? 6 : 4) * kStages;
    // fp8: after the barriers, per stage the V tile's valid keys, which the
    // producer passes to the transposing warps (v_transpose.cuh).
    static constexpr uint32_t kSmemVTileKeys = kSmemBarriers + kNumBarriers * sizeof(uint64_t);
    static constexpr size_t kSmemBytes =
        kSmemVTileKeys + (kFp8 ? kStages * sizeof(int) : 0) + kSmemBaseAlignment;
    // Static shared memory beside it: the producer warp's schedule step
    // where it keeps it there (kWideConsumers; producer.cuh).
    static constexpr size_t kStaticSmemBytes = 16;  // one int, in a section ptxas aligns to 16 bytes

    static_assert(kSmemBytes + kStaticSmemBytes <= kMaxSmemPerBlock,
                  "shared memory beyond what an sm_90 block may opt into");
    static_assert(kHeadDim % kPanelCols == 0 && kHeadDimV % kPanelCols == 0,
                  "head dims must be whole numbers of panels");
    static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and TMA box rows");
    static_assert(kPSets == 1 || kPSets == 2, "one or two sets of P fragments");
    static_assert(kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3, "two or three consumer warpgroups");
    // The register split must come out of what the CTA launched with:
    // setmaxnreg.inc waits until the CTA's pool holds the registers it asks
    // for, and the pool holds only what setmaxnreg.dec released (PTX ISA,
    // setmaxnreg). Launched at kLaunchRegisters a thread (ptxas's allocation
    // under __launch_bounds__(kNumThreads, 1)), the consumers may gain no
    // more than the producer warpgroup gives up, or they wait forever.
    // (A trial of 32 / 240 at two consumer warpgroups fits the 64K register
    // file, but asks 256 x 72 of a pool of 128 x 136: it hung.)
    static constexpr int kLaunchRegisters = (64 * 1024 / kNumThreads) / 8 * 8;
    static_assert(kConsumerWarpgroups * (kConsumerRegisters - kLaunchRegisters) <=
                      kLaunchRegisters - kProducerRegisters,
                  "the consumers' setmaxnreg.inc must be covered by the producer's setmaxnreg.dec");
    static_assert(kHeadDimV % kOutPanelCols == 0 && (kFp8 || sizeof(ElementOut) == sizeof(Element)),
                  "O is staged in whole panels, the input's unless the input is fp8");
    static_assert(!kFp8 || (kBlockN % kMmaKeys == 0 && kBlockN % kVtPanelKeys == 0 && kVtPanelBytes % VtSwizzle::kAtomBytes == 0 &&
                            kHeadDimV % 32 == 0),
                  "fp8: V^T panels of whole swizzle atoms, head_dim_v whole 32-column steps of the transpose");
    static_assert(kQPanelBytes % Swizzle::kAtomBytes == 0 && kKVPanelBytes % Swizzle::kAtomBytes == 0 &&
                      kOPanelBytes % Swizzle::kAtomBytes == 0,
                  "panels must keep the swizzle atom's alignment");
};

}  // namespace flashcore::sm90
