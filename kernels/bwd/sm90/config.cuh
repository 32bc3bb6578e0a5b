// Compile-time shape of the Hopper (sm_90a) backward kernel (BwdSm90Traits)
// and its configuration per head dim (BwdSm90Config): what the `hopper`
// lines of kernels/kernels.list instantiate.
//
// One CTA owns a block of kBlockN keys of a (batch, K/V head): K and V stay
// in shared memory, dK and dV in the registers of two consumer warpgroups,
// while the CTA walks the query blocks of kBlockM rows that see the keys
// (and, with GQA, every query head of the group). A producer warp loads
// each block's Q and dO (TMA) with its rows' lse and D into a ring of
// kStages stages. The consumers share the block in one of three forms
// (BwdSm90Form).
//
// Split by keys (head dims up to 128: kBlockN = 128, consumer c keys
// 64c .. 64c + 63, all head-dim columns of their dK and dV), FlashAttention
// 3's products per query block:
//   S^T  = K_c Q^T,  dP^T = V_c dO^T   wgmma m64 x kBlockM, both operands
//                                      K-major in shared memory
//   P^T  = exp2(S^T * scale_log2 - lse_log2), dS^T = P^T * (dP^T - D)
//   dV  += P^T dO,   dK  += dS^T Q     A from registers (the accumulators of
//                                      S^T and dP^T are the A fragments),
//                                      B MN-major in shared memory
//   dS -> shared memory (stmatrix, transposed), both warpgroups' keys
// Swapping S and dP to S^T and dP^T puts the keys on wgmma's M, so their
// accumulators feed dV and dK from registers and only dS goes through shared
// memory.
//
// Split by head-dim columns (kColumnSplit: head dim 256, where one
// warpgroup's dK and dV of 64 keys at every column would take 256 registers
// a thread): kBlockN = 64, every consumer all 64 keys of dK and dV but only
// its half of their head-dim columns (128 registers; FlashAttention 4's d256
// tiles under block sparsity):
//   S    = Q K_c^T,  dP = dO V_c^T     wgmma m64 (queries) x 32 (consumer
//                                      c's keys 32c .. 32c + 31), K-major
//   P    = exp2(S * scale_log2 - lse_log2), dS = P * (dP - D)
//   P, dS -> shared memory (stmatrix), both warpgroups' keys
//   dV_c += P^T dO_c, dK_c += dS^T Q_c A = P^T, dS^T (MN-major: P and dS as
//                                      stored, read transposed), B = the
//                                      consumer's columns of dO and Q
//                                      (MN-major)
// P and dS take two buffers; Q and dO one stage (64 KB).
//
// Split by keys with dK and dV transposed (kTransposedKeySplit: (192, 128),
// FlashAttention 4's tile for it): kBlockN = 96, consumer c keys
// 48c .. 48c + 47 and all head-dim columns of their dK and dV, transposed:
//   S    = Q K_c^T,  dP = dO V_c^T     wgmma m64 (queries) x 48, as above
//   P, dS -> shared memory (stmatrix, 32-byte panels of 16 keys), one buffer
//   dV^T += dO^T P_c, dK^T += Q^T dS_c head-dim columns on M (m64 tiles), the
//                                      consumer's keys on N: A = dO, Q read
//                                      transposed, B = P, dS (MN-major)
// A consumer's dK^T and dV^T read only its own P and dS; dQ reads both
// consumers' dS.
//
// In every form:
//   dQ   = dS K                        A = dS (K-major), B = K (MN-major):
//                                      each warpgroup a share of the block's
//                                      dQ (kDqSplitRows: rows, else head-dim
//                                      columns), or where half the columns
//                                      are not whole panels (head dim 96)
//                                      warpgroup 0 all of it (FlashAttention
//                                      4's dQ_single_wg), through shared memory
//                                      into the fp32 workspace (one bulk
//                                      reduction a step, issued by a
//                                      producer warp), in the portable
//                                      kernel's fragment order
//                                      (bwd/dq_accumulator.cuh)
#pragma once

#include <cstddef>

#include "bwd/params.h"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// How the two consumer warpgroups share a block (above).
enum class BwdSm90Form { kKeySplit, kColumnSplit, kTransposedKeySplit };

template <typename Element_, int kHeadDim_, int kHeadDimV_, int kBlockM_, int kBlockN_, BwdSm90Form kForm_>
struct BwdSm90Traits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;   // of Q and K (and dQ, dK)
    static constexpr int kHeadDimV = kHeadDimV_; // of V and dO (and dV)
    static constexpr int kBlockM = kBlockM_;     // query rows per step
    static constexpr int kBlockN = kBlockN_;     // keys per CTA
    static constexpr BwdSm90Form kForm = kForm_;
    static constexpr bool kColumnSplit = kForm == BwdSm90Form::kColumnSplit;
    static constexpr bool kTransposedKv = kForm == BwdSm90Form::kTransposedKeySplit;
    static constexpr int kConsumerWarpgroups = 2;
    // A consumer's keys in S^T / S (its share of the block), and its
    // head-dim columns of dK and of dV.
    static constexpr int kKeysPerConsumer = kBlockN / kConsumerWarpgroups;
    static constexpr int kDkCols = kColumnSplit ? kHeadDim / kConsumerWarpgroups : kHeadDim;
    static constexpr int kDvCols = kColumnSplit ? kHeadDimV / kConsumerWarpgroups : kHeadDimV;
    // A consumer's n8 accumulator atoms of dK and dV: its columns' (keys on
    // M), or transposed (kTransposedKv: its keys on N, head-dim columns on M
    // in m64 tiles).
    static constexpr int kDkAtoms = kTransposedKv ? kHeadDim / 64 * (kKeysPerConsumer / 8) : kDkCols / 8;
    static constexpr int kDvAtoms = kTransposedKv ? kHeadDimV / 64 * (kKeysPerConsumer / 8) : kDvCols / 8;
    static constexpr int kNumThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
    static constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
    // P and dS buffers (dS only, split by keys): two, so that in the column
    // split a consumer's next step does not overwrite what the other may
    // still be reading; one in the transposed form, whose consumers meet at
    // a barrier before storing the next (transposed_split.cuh). The stages
    // of Q and dO (and their row stats): two where shared memory has room
    // (kStages, below), else one (head dim 256).
    static constexpr int kDsStages = kTransposedKv ? 1 : 2;
    static constexpr bool kRotatedWalk = true;  // BwdKernelParams::rotated_walk
    // The deterministic mode's dQ counts released two steps at once
    // (dq_writer.cuh, bwd_write_dq): where a step is at most half a key
    // block's rows (head dim 128), so that under a causal mask the next key
    // block reaches a query block two steps later. At head dim 64 (steps of
    // kBlockN rows) the held count cost the key blocks waiting for it more
    // than the fence it saves (docs/log/hopper.md: 2k d64 causal +2% to +40%).
    static constexpr bool kPairedDqReleases = 2 * kBlockM <= kBlockN;

    // Registers: the producer warpgroup gives up all but 24 a thread, the
    // consumers take 240 (dK, dV, S^T, dP^T and dQ live together). A CTA
    // launches at kLaunchRegisters a thread; setmaxnreg.inc takes only what
    // .dec released (fwd/sm90/traits.cuh says why this check is needed).
    static constexpr int kProducerRegisters = 24;
    static constexpr int kConsumerRegisters = 240;
    static constexpr int kLaunchRegisters = (64 * 1024 / kNumThreads) / 8 * 8;
    static_assert(kConsumerWarpgroups * (kConsumerRegisters - kLaunchRegisters) <=
                      kLaunchRegisters - kProducerRegisters,
                  "the consumers ask for more registers than the producer releases");

    // Q, K, V and dO in swizzled panels (sm90/ptx.cuh, PanelSwizzle), as
    // TMA writes them: 128-byte rows where the head dims, and each
    // consumer's columns of dK and dV (column split) or of dQ (transposed
    // form), are whole ones (64 columns), else 64-byte rows (32 columns:
    // head dim 96, and (192, 128), 96 columns of dQ a consumer), as the
    // forward's (fwd/sm90/traits.cuh).
    static constexpr bool whole_128_byte_rows(int cols) { return cols * int(sizeof(Element)) % 128 == 0; }
    static constexpr int kPanelRowBytes = whole_128_byte_rows(kHeadDim) && whole_128_byte_rows(kHeadDimV) &&
                                                  whole_128_byte_rows(kDkCols) && whole_128_byte_rows(kDvCols) &&
                                                  (!kTransposedKv || whole_128_byte_rows(kHeadDim / 2))
                                              ? 128
                                              : 64;
    using Swizzle = PanelSwizzle<kPanelRowBytes>;
    static constexpr int kPanelCols = kPanelRowBytes / int(sizeof(Element));
    static constexpr int kPanels = kHeadDim / kPanelCols;    // of Q and K
    static constexpr int kVPanels = kHeadDimV / kPanelCols;  // of V and dO
    static constexpr uint32_t kKVPanelBytes = kBlockN * kPanelRowBytes;
    static constexpr uint32_t kQPanelBytes = kBlockM * kPanelRowBytes;
    static constexpr uint32_t kKBytes = kPanels * kKVPanelBytes;
    static constexpr uint32_t kVBytes = kVPanels * kKVPanelBytes;
    static constexpr uint32_t kQBytes = kPanels * kQPanelBytes;
    static constexpr uint32_t kDoBytes = kVPanels * kQPanelBytes;
    // dS (and in the column split and the transposed form P): kBlockM rows
    // of kBlockN keys, a 128-byte panel per 64 keys whatever the head dim;
    // in the transposed form 32-byte panels of 16 keys (a consumer's 48
    // keys are whole ones, the B operand of its dK^T and dV^T).
    static constexpr int kDsPanelRowBytes = kTransposedKv ? 32 : 128;
    using DsSwizzle = PanelSwizzle<kDsPanelRowBytes>;
    static constexpr int kDsPanelKeys = kDsPanelRowBytes / int(sizeof(Element));
    static constexpr uint32_t kDsPanelBytes = kBlockM * kDsPanelRowBytes;
    static constexpr uint32_t kDsBytes = (kBlockN / kDsPanelKeys) * kDsPanelBytes;
    // A stage's rows' lse (log2 units) and D.
    static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);

    static constexpr uint32_t kPBytes = kColumnSplit || kTransposedKv ? kDsBytes : 0;
    // A step's dQ (fp32, kBlockM x kHeadDim) on its way to the workspace:
    // the consumers store it, a producer warp adds it there with one bulk
    // reduction (dq_writer.cuh). Two buffers where they fit (head dim 128): the
    // consumers then store a step's dQ while the last one's is still being
    // added, which in the deterministic mode includes the wait for its turn.
    static constexpr uint32_t kDqBytes = kBlockM * kHeadDim * sizeof(float);

    // Static shared memory beside the dynamic (the CTA's work: kernel.cuh).
    static constexpr size_t kStaticSmemBytes = 256;
    static constexpr size_t kMaxSmemPerBlock = 227 * 1024;  // an H100's opt-in limit
    // The dynamic shared memory of `stages` Q/dO stages and `dq_buffers`
    // dQ buffers, laid out as the offsets below, with their mbarriers
    // (kv_full, and q_full, q_empty, do_full, do_empty, stats_empty,
    // stats_full per stage) and the alignment slack.
    static constexpr size_t smem_bytes(int stages, int dq_buffers) {
        return kKBytes + kVBytes + stages * (kQBytes + kDoBytes + 2 * kRowStatBytes) +
               kDsStages * (kDsBytes + kPBytes) + dq_buffers * kDqBytes + (1 + 6 * stages) * sizeof(uint64_t) +
               kSmemBaseAlignment;
    }
    static constexpr bool fits(size_t dynamic_bytes) { return dynamic_bytes + kStaticSmemBytes <= kMaxSmemPerBlock; }
    static constexpr int kStages = fits(smem_bytes(2, 1)) ? 2 : 1;
    static constexpr int kDqBuffers = fits(smem_bytes(kStages, 2)) ? 2 : 1;
    static constexpr int kBarriers = 1 + 6 * kStages;
    static constexpr size_t kSmemBytes = smem_bytes(kStages, kDqBuffers);

    static constexpr uint32_t kKOffset = 0;
    static constexpr uint32_t kVOffset = kKOffset + kKBytes;
    static constexpr uint32_t kQOffset = kVOffset + kVBytes;
    static constexpr uint32_t kDoOffset = kQOffset + kStages * kQBytes;
    static constexpr uint32_t kDsOffset = kDoOffset + kStages * kDoBytes;
    static constexpr uint32_t kPOffset = kDsOffset + kDsStages * kDsBytes;
    static constexpr uint32_t kLseOffset = kPOffset + kDsStages * kPBytes;
    static constexpr uint32_t kDOffset = kLseOffset + kStages * kRowStatBytes;
    static constexpr uint32_t kDqOffset = kDOffset + kStages * kRowStatBytes;
    static constexpr uint32_t kBarrierOffset = kDqOffset + kDqBuffers * kDqBytes;
    static_assert(kBarrierOffset + kBarriers * sizeof(uint64_t) + kSmemBaseAlignment == kSmemBytes,
                  "smem_bytes counts the offsets' buffers");

    // dK and dV on their way to their tensors (mainloop.cuh:
    // store_key_gradients): staged from the registers (stmatrix) into the K,
    // V and Q/dO buffers, which no one reads once both consumers are past
    // their last step, as rows of a key's kHeadDim (dK) and kHeadDimV (dV)
    // elements, each padded by 16 bytes so that an 8x8 matrix's rows fall in
    // distinct banks; then copied out in 16-byte pieces of whole rows. (Each
    // thread storing its own fragments, 4 or 2 bytes at a time, took a
    // tenth of the 2k kernels' warp samples: ncu, docs/log/hopper.md.)
    // Each consumer stages and copies its own keys (split by keys: the
    // kStagedRows from consumer * kStagedRows) or columns (column split: all
    // kStagedRows keys).
    static constexpr uint32_t kStagedDkRowBytes = kHeadDim * sizeof(Element) + 16;
    static constexpr uint32_t kStagedDvRowBytes = kHeadDimV * sizeof(Element) + 16;
    static constexpr uint32_t kStagedDkOffset = kKOffset;
    static constexpr uint32_t kStagedDvOffset = kStagedDkOffset + kBlockN * kStagedDkRowBytes;
    static constexpr int kStagedRows = kColumnSplit ? kBlockN : kKeysPerConsumer;
    static_assert(kStagedDvOffset + kBlockN * kStagedDvRowBytes <= kDsOffset,
                  "dK and dV staged within the K, V, Q and dO buffers");

    // dQ = dS K (kBlockM x kHeadDim) over the consumers: by rows where
    // each gets 64 (kBlockM 128), else by head-dim columns where each half
    // is whole panels (a wgmma's MN-major B starts at a panel), else all of
    // it in consumer 0 (kDqConsumers 1: head dim 96, the other consumer
    // skips the product).
    static constexpr bool kDqSplitRows = kBlockM == 2 * 64;
    static constexpr int kDqConsumers =
        kDqSplitRows || (kHeadDim / kConsumerWarpgroups) % kPanelCols == 0 ? kConsumerWarpgroups : 1;
    static constexpr int kDqThreads = kDqConsumers * kWarpgroupThreads;
    static constexpr int kDqRows = kDqSplitRows ? kBlockM / kConsumerWarpgroups : kBlockM;
    static constexpr int kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / kDqConsumers;

    // The dQ accumulator's fragment order (bwd/dq_accumulator.cuh,
    // shared with the convert kernel) in its terms: the dQ consumers'
    // warps, each an m16 strip of the block's rows and kDqCols columns,
    // one pass.
    static constexpr int kNumWarps = kConsumerThreads / kWarpSize;
    static constexpr int kDqWarps = kDqThreads / kWarpSize;
    static constexpr int kWarpsDdQ = kHeadDim / kDqCols;
    static constexpr int kWarpsMdQ = kDqWarps / kWarpsDdQ;
    static constexpr int kdQMTiles = 1;
    static constexpr int kdQNTiles = kDqCols / kMmaN;
    static constexpr int kdQPasses = 1;

    static_assert(kDqRows == 64 && kBlockM / kWarpsMdQ == kMmaM, "a consumer's dQ rows are one wgmma M");
    static_assert(kColumnSplit   ? kBlockM == 64 && kBlockN == 64 && kDkCols % kPanelCols == 0 &&
                                       kDvCols % kPanelCols == 0
                  : kTransposedKv ? kBlockM == 64 && kKeysPerConsumer % 16 == 0 && kHeadDim % 64 == 0 &&
                                       kHeadDimV % 64 == 0
                                 : kKeysPerConsumer == 64 && kHeadDim == kHeadDimV,
                  "the consumers' forms (above): keys on wgmma's M at one head dim, 64 x 64 blocks of whole "
                  "panels, or transposed dK and dV of m64 tiles and whole 16-key panels");
    static_assert(kBlockM % 64 == 0 && kBlockM <= 128, "kBlockM: S^T's N, and the dQ split");
    static_assert(kHeadDim % kPanelCols == 0 && kHeadDimV % kPanelCols == 0, "whole panels");
    static_assert(kHeadDimV <= kHeadDim, "V's panels are loaded beside K's (producer.cuh)");
    static_assert(kDqCols % kPanelCols == 0, "a dQ consumer's columns are whole panels of K");
    static_assert(kSmemBytes + kStaticSmemBytes <= kMaxSmemPerBlock, "an H100's shared memory per block");
};

template <DType kInput, int kHeadDim, int kHeadDimV>
struct BwdSm90Config;

// kBlockM: 128 query rows at head dim 64 (S^T and dP^T are 64 x 128 per
// consumer, dK and dV small), 64 at 96 and 128 (dK and dV take 96 and 128
// registers). FlashAttention 3's tiles for these head dims (its causal 128
// one), and at 96 FlashAttention 4's (dQ in one warpgroup). At 256 and
// (192, 128): 64 x 64 blocks split by head-dim columns.
template <DType kInput, int kHeadDim, int kHeadDimV>
struct BwdSm90Config {
    static_assert((kHeadDim == kHeadDimV && (kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 ||
                                             kHeadDim == 256)) ||
                      (kHeadDim == 192 && kHeadDimV == 128),
                  "the sm90 backward has head dims 64, 96, 128, 256 and (192, 128)");
    static constexpr BwdSm90Form kForm = kHeadDim == 256   ? BwdSm90Form::kColumnSplit
                                         : kHeadDim == 192 ? BwdSm90Form::kTransposedKeySplit
                                                           : BwdSm90Form::kKeySplit;
    static constexpr int kBlockN = kForm == BwdSm90Form::kColumnSplit          ? 64
                                   : kForm == BwdSm90Form::kTransposedKeySplit ? 96
                                                                               : 128;
    using Traits = BwdSm90Traits<ElementType<kInput>, kHeadDim, kHeadDimV, kHeadDim == 64 ? 128 : 64, kBlockN, kForm>;
};

}  // namespace flashcore::sm90
