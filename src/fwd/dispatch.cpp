#include "fwd/dispatch.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "error.h"
#include "fwd/forward_params.h"
#include "fwd/registry.h"
#include "fwd/sm90/tensor_maps.h"
#include "fwd/validate.h"
#include "handle.h"
#include "merge/merge.h"

namespace flashcore {
namespace {

// A split pays for its merge only where the grid leaves CTA slots idle:
// from this fraction of a wave of slots on, calls do not split (as
// FlashAttention's num_splits_heuristic).
constexpr double kSplitMinGridFill = 0.8;
// The heuristic takes the fewest splits whose wave efficiency is within this
// factor of the best. FlashAttention uses 0.85; the parts' partial results
// cost little next to a wave's SMs left idle (decode over 32k keys on an
// H200: 14 parts filling 85% of the SMs 42.5 us, 16 parts filling 97%
// 41.5 us), so only near-ties go to fewer splits.
constexpr double kSplitEfficiencyMargin = 0.95;
// The most splits the heuristic picks (callers may force up to
// FLASHCORE_MAX_NUM_SPLITS).
constexpr int kMaxHeuristicSplits = 64;
// Each part of a split keeps at least this many pipeline steps of keys: the
// merge kernel and the partials' traffic cost about 3-4 us on an H100, which
// shorter parts do not win back (mission shape: 8.5 us unsplit, 12.3 us in 4
// parts of one step; 1024 keys in two parts of 4 steps: 13.1 vs 18.0 us;
// decode over 32k keys: 16 parts of 16 steps 55 us, 32 parts of 8: 68 us).
constexpr int64_t kMinKeyStepsPerSplit = 8;
// Decode over sequences of their own key counts (seqused_k, cu_seqlens_k):
// the host knows only their bound, seqlen_k, and an unsplit grid's time is
// then its longest sequence's tiles on one CTA, whose chain of dependent
// work, not the DRAM, sets the pace (B 32 serving decode, lengths 525-14586:
// the bf16 call 196 us unsplit against 189 in four parts, an e4m3 cache's
// 170 against 114; docs/log/perf.md). Such calls split so that a sequence
// of seqlen_k keys has parts of at most kRaggedDecodePartKeys, while each
// block's keys are cut into no more parts than hold
// kRaggedDecodeMinPartKeys (shorter sequences stay whole, their other
// splits empty), and into no more CTAs than kRaggedDecodeMaxWaves waves of
// the device's slots (an empty split still costs a CTA). A call of one
// sequence has no lengths to even out: its blocks all see the same keys, and
// the parts past the heuristic's wave only add a wave (B1 over a 128k-key
// cache: 32 parts, two waves of the decode tile, 3-4% slower than the dense
// call's 16; docs/log/perf.md, 2026-12-01).
constexpr int64_t kRaggedDecodePartKeys = 4096;
constexpr int kRaggedDecodeMinPartKeys = 2048;
constexpr int64_t kRaggedDecodeMaxWaves = 8;
// Query heads per K/V head are packed into one tile's rows when seqlen_q is
// below this (the key-split tile's rows): the unpacked tiles would be mostly
// empty, and every query head would read the same K/V again.
constexpr int kPackGqaMaxSeqlenQ = 64;
// ... and only where the packed rows of a (batch, K/V head), seqlen_q times
// the group, fit the kernels' 32-bit row counts with a tile's headroom
// (their ceil_div(rows, block_m) adds up to block_m - 1): a group of 34
// million query heads at seqlen_q 63 wrapped.
constexpr int64_t kTileRowsHeadroom = 256;
constexpr int64_t kMaxPackedRows = INT32_MAX - kTileRowsHeadroom;
// The sm_90a kernel serves calls whose query blocks are whole 128-row
// tiles; shorter query sequences (decode, speculative steps) run on the
// portable kernel, which packs GQA heads into its 64-row tiles.
constexpr int kSm90MinSeqlenQ = 128;
// The first compute capability with programmatic dependent launch: the
// split-KV merge is queued as the forward kernel's dependent there.
constexpr int kMinProgrammaticLaunchCcMajor = 9;

FwdKernelParams shape_params(const flashcore_forward_params &p, int packed_heads) {
    FwdKernelParams k = kernel_params(p);
    k.packed_heads = packed_heads;
    return k;
}

int64_t num_blocks(const flashcore_forward_params &p, const FwdKernel &kernel, int packed_heads) {
    return fwd_num_blocks(shape_params(p, packed_heads), kernel.info().block_m);
}

// CTAs of `kernel` that one SM of the handle's device holds at once.
int ctas_per_sm(const flashcore_handle_s &handle, const FwdKernel &kernel) {
    const FwdKernelInfo info = kernel.info();
    // The driver reserves 1 KB of shared memory per resident CTA.
    constexpr size_t kReservedSmemPerCta = 1024;
    const int by_smem = int(handle.smem_per_sm / (info.smem_bytes + kReservedSmemPerCta));
    const int ctas = by_smem < info.ctas_per_sm ? by_smem : info.ctas_per_sm;
    return ctas > 1 ? ctas : 1;
}

// CTA slots of `kernel` for the call on the handle's device: the SMs it
// may use (call_sms: its sm_margin left out) times CTAs per SM.
int64_t cta_slots(const flashcore_handle_s &handle, const flashcore_forward_params &p, const FwdKernel &kernel) {
    return int64_t(call_sms(handle, p.sm_margin)) * ctas_per_sm(handle, kernel);
}

// a / b rounded up, for a >= 0 and b > 0 that fit with b - 1 added.
int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The number of key splits that best fills `slots` CTA slots (SMs times
// CTAs per SM) with `blocks` query blocks of `key_steps` pipeline steps
// each: FlashAttention's wave-efficiency rule, with parts of at least
// kMinKeyStepsPerSplit steps. Splits that leave some part
// with no more steps than fewer splits would are skipped; the fewest splits
// within kSplitEfficiencyMargin of the best efficiency win, since each split
// adds partial results to write and merge. Crossovers measured on an H100:
// docs/log/perf.md.
int heuristic_splits(int64_t blocks, int64_t slots, int64_t key_steps) {
    if (double(blocks) >= kSplitMinGridFill * double(slots)) return 1;
    int64_t max_splits = kMaxHeuristicSplits;
    if (slots < max_splits) max_splits = slots;
    if (key_steps / kMinKeyStepsPerSplit < max_splits) max_splits = key_steps / kMinKeyStepsPerSplit;
    if (max_splits <= 1) return 1;
    const auto eligible = [&](int64_t s) { return s == 1 || ceil_div64(key_steps, s) != ceil_div64(key_steps, s - 1); };
    const auto efficiency = [&](int64_t s) {
        const double waves = double(blocks * s) / double(slots);
        return waves / std::ceil(waves);
    };
    double best = 0.0;
    for (int64_t s = 1; s <= max_splits; ++s) {
        if (eligible(s)) best = std::max(best, efficiency(s));
    }
    for (int64_t s = 1; s <= max_splits; ++s) {
        if (eligible(s) && efficiency(s) >= kSplitEfficiencyMargin * best) return int(s);
    }
    return 1;
}

// Pipeline steps of keys a query block visits: seqlen_k's, or under a
// window bounded on both sides (causal with window_left, say) the window's
// span plus the block's rows (its first and last rows' windows are that far
// apart), or with chunks a chunk plus the block's rows, whichever is least.
int64_t key_steps(const flashcore_forward_params &p, const FwdKernel &kernel) {
    const int64_t step = kernel.info().keys_per_step;
    int64_t keys = p.seqlen_k;
    const int32_t left = effective_window_left(p), right = effective_window_right(p);
    if (left != kWindowUnbounded && right != kWindowUnbounded) {
        keys = std::min<int64_t>(keys, int64_t(left) + right + 1 + kernel.info().block_m);
    }
    // A block's rows see one chunk each, at most two chunks' keys.
    if (p.attention_chunk > 0) {
        keys = std::min<int64_t>(keys, int64_t(p.attention_chunk) + kernel.info().block_m);
    }
    return ceil_div64(keys, step);
}

// The portable kernel for the call: the pinned variant where the environment
// asks for one, the build has it for these head dims (not every head dim
// has every variant: kernels/kernels.list), it serves the call (ragged
// calls: FwdKernelInfo::serves_ragged) and it fits the device's shared
// memory; else by grid size. Large tiles do the most work per byte read from
// shared memory, but a CTA walks its key tiles one after another: when the
// grid does not fill every SM's CTA slots once, finishing sooner matters
// more than efficiency, and the key-split variants (a half or a quarter of
// the serial chain per warp) win: the four-way split while its grid fits one
// wave, the two-way split (half the K/V re-reads per query row) beyond.
// Measured crossovers are in docs/log/perf.md. A variant that needs more
// shared memory than the device offers (handle.max_smem_per_block) is
// passed over; the large tiles fit every supported GPU (kMinSmemPerBlock,
// asserted in fwd/sm80/config.cuh) and serve every size.
// The portable kernel of `variant` at kernel head dims `dims` for the
// call's dtypes, where the build has it and it serves the call (ragged
// calls: FwdKernelInfo::serves_ragged); else nullptr.
const FwdKernel *serving_sm80(const flashcore_forward_params &p, DType dtype, DType kv, HeadDims dims,
                              FwdVariant variant) {
    const FwdKernel *kernel = fwd_kernels().find(KernelPath::kSm80, dtype, kv, dims, variant);
    return kernel != nullptr && (!is_ragged(p) || kernel->info().serves_ragged) ? kernel : nullptr;
}

// The same, and only where it fits the handle's shared memory per block.
const FwdKernel *fitting_sm80(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype,
                              DType kv, HeadDims dims, FwdVariant variant) {
    const FwdKernel *kernel = serving_sm80(p, dtype, kv, dims, variant);
    return kernel != nullptr && kernel->info().smem_bytes <= handle.max_smem_per_block ? kernel : nullptr;
}

flashcore_status choose_sm80(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype,
                             HeadDims dims, int packed_heads, const FwdKernel **chosen) {
    // Ragged calls (packed or paged tensors) run on the variants compiled
    // for them (FwdKernelInfo::serves_ragged: the decode tiles, the two-way
    // key split and the large tiles) and choose among them as dense calls
    // do. The large tiles fit every supported GPU, so every ragged call has
    // a kernel (head dims from 96 on sm_86 and sm_89, 256 on an A100 have
    // nothing else); where a ragged grid fills the GPU they are faster than
    // the key split, as for dense calls (a packed causal prefill of 32k
    // tokens at head dim 128 on an H200: 3815 against 4429 us;
    // docs/log/perf.md, issue 57). A quantized cache has decode tiles only
    // (kernels/fwd/family.cmake), which fit every GPU.
    const DType kv = DType(effective_kv_dtype(p));
    const auto serving = [&](FwdVariant variant) { return serving_sm80(p, dtype, kv, dims, variant); };
    const auto fitting = [&](FwdVariant variant) { return fitting_sm80(handle, p, dtype, kv, dims, variant); };
    const FamilySettings &settings = handle.env.settings(Family::fwd);
    if (settings.pinned_tile != FamilySettings::kNoPinnedTile) {
        *chosen = fitting(FwdVariant(settings.pinned_tile));
        if (*chosen != nullptr) return FLASHCORE_STATUS_SUCCESS;
    }
    const int64_t rows_per_head_group = int64_t(p.seqlen_q) * packed_heads;
    const auto fits_tile = [&](const FwdKernel *kernel) {
        return kernel != nullptr && rows_per_head_group <= kernel->info().block_m;
    };
    // Head dims past 256 have the wide tiles only (kernels/kernels.list):
    // the 16-row ones for (packed) blocks of at most 16 rows, where their
    // 64-row twin would compute rows that are not there, and wherever that
    // twin does not fit the device's shared memory; the 64-row ones (K/V
    // read once per 64 rows, not 16) for the rest.
    // On sm_90 the 64-row blocks run on the wide tile's wgmma twin where the
    // build has it (d512, and MLA's 576 / 512 on a 16-bit cache).
    const FwdKernel *wide = fitting(FwdVariant::kWide);
    const FwdKernel *wide_decode = fitting(FwdVariant::kWideDecode);
    if (wide != nullptr || wide_decode != nullptr) {
        *chosen = wide != nullptr && !fits_tile(wide_decode) ? wide : wide_decode;
        if (*chosen == wide && settings.use_hopper) {
            const FwdKernel *wide_wgmma =
                fwd_kernels().find(KernelPath::kSm90, dtype, kv, dims, FwdVariant::kWideWgmma);
            if (wide_wgmma != nullptr && wide_wgmma->info().smem_bytes <= handle.max_smem_per_block) {
                *chosen = wide_wgmma;
            }
        }
        return FLASHCORE_STATUS_SUCCESS;
    }
    const FwdKernel *large = fitting(FwdVariant::kLargeTiles);
    const FwdKernel *key_split = fitting(FwdVariant::kKeySplit);
    const FwdKernel *key_split4 = fitting(FwdVariant::kKeySplit4);
    const FwdKernel *decode = fitting(FwdVariant::kDecode);
    const auto fits_one_wave = [&](const FwdKernel *kernel) {
        return kernel != nullptr && num_blocks(p, *kernel, packed_heads) <= cta_slots(handle, p, *kernel);
    };
    // Decode: a (packed) query block of at most the decode tile's rows. Its
    // time is the K/V read, which the decode tiles keep most bytes in flight
    // for; larger tiles would compute rows that are not there (plan_sm80
    // may take the decode tile's paired twin). Likewise the smallest
    // key-split tile that holds all the rows.
    if (fits_tile(decode)) {
        *chosen = decode;
    } else if (fits_tile(key_split4) || fits_one_wave(key_split4)) {
        *chosen = key_split4;
    } else if (fits_tile(key_split)) {
        *chosen = key_split;
    } else if (large != nullptr && num_blocks(p, *large, packed_heads) >= cta_slots(handle, p, *large)) {
        *chosen = large;
    } else {
        *chosen = key_split != nullptr ? key_split : large != nullptr ? large : decode;
    }
    if (*chosen != nullptr) return FLASHCORE_STATUS_SUCCESS;
    // Nothing fits: a limit below every supported GPU's (only
    // FLASHCORE_TEST_SMEM_PER_BLOCK sets one). UNSUPPORTED, naming what the
    // large tiles need.
    for (FwdVariant smallest : {FwdVariant::kLargeTiles, FwdVariant::kWideDecode}) {
        if (const FwdKernel *any = serving(smallest)) {
            const flashcore_status status = check_kernel_smem(handle, fwd_tile_name(any->tile), int(dims.head_dim),
                                                              int(dims.head_dim_v), any->info().smem_bytes);
            if (status != FLASHCORE_STATUS_SUCCESS) return status;
        }
    }
    return fail(FLASHCORE_STATUS_INTERNAL, "no portable kernel for head dims (%d, %d) in the kernel registry",
                int(dims.head_dim), int(dims.head_dim_v));
}

// Whether the driver can describe the call's tensors to the TMA unit as the
// sm90 kernel `kernel` reads and writes them.
bool tma_describes(const flashcore_forward_params &p, const FwdKernel &kernel) {
    return sm90::fwd_maps_describable(kernel_params(p), kernel.input, kernel.output,
                                      kernel.info().stores_out_by_tma);
}

// The sm_90a kernel's plan for the call, or false where the portable kernel
// should serve it: query sequences shorter than a tile (kSm90MinSeqlenQ),
// and grids too small to fill the SMs that cannot split either (few keys),
// where the portable key-split variant's lower per-block latency wins
// (docs/log/hopper.md), and kernels that need more shared memory than
// the handle allows (only under FLASHCORE_TEST_SMEM_PER_BLOCK: the sm_90a
// kernels fit every GPU they run on), and tensors the TMA unit cannot
// describe (tma_describes). The sm_90a kernel never packs GQA heads.
bool plan_sm90(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype, HeadDims dims,
               ForwardPlan *plan) {
    const FamilySettings &settings = handle.env.settings(Family::fwd);
    if (!settings.use_hopper) return false;
    // The sm_90a kernel reads K/V of q's type only.
    if (has_quantized_kv(p)) return false;
    if (p.seqlen_q < kSm90MinSeqlenQ && !settings.hopper_forced) return false;
    const FwdKernel *sm90 = fwd_kernels().find(KernelPath::kSm90, dtype, dtype, dims, FwdVariant::kPersistent);
    if (sm90 == nullptr || sm90->info().smem_bytes > handle.max_smem_per_block) return false;
    // Tensors the TMA unit cannot describe: the portable kernel serves them.
    if (!tma_describes(p, *sm90)) return false;
    const int64_t blocks = num_blocks(p, *sm90, 1);
    if (blocks > INT_MAX / std::max<int64_t>(p.num_splits, 1)) return false;
    const int sms = call_sms(handle, p.sm_margin);
    const int splits =
        p.num_splits > 0 ? p.num_splits : heuristic_splits(blocks, sms, key_steps(p, *sm90));
    const bool fills_sms = splits > 1 || double(blocks) >= kSplitMinGridFill * sms;
    if (!fills_sms && !settings.hopper_forced) return false;
    *plan = ForwardPlan{sm90, splits, 1};
    return true;
}

// fp8 queries: the sm_90a kernels on e4m3 inputs, the only ones there are
// (whatever FLASHCORE_FWD_VARIANT pins, and for every grid size).
flashcore_status plan_fp8(const flashcore_handle_s &handle, const flashcore_forward_params &p, HeadDims dims,
                          ForwardPlan *plan) {
    if (handle.cc_major != 9 || handle.cc_minor != 0) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3) run on sm_90 GPUs (H100, H200) only; device %d has "
                    "compute capability %d.%d (e4m3 K/V under fp16 or bf16 queries run everywhere)",
                    handle.device, handle.cc_major, handle.cc_minor);
    }
    const FwdKernel *kernel =
        fwd_kernels().find(KernelPath::kSm90, DType::kE4m3, DType::kE4m3, dims, FwdVariant::kPersistent);
    if (kernel == nullptr) {
        return fail(FLASHCORE_STATUS_INTERNAL, "no fp8 kernel for head dims (%d, %d) in the kernel registry",
                    int(dims.head_dim), int(dims.head_dim_v));
    }
    // Only FLASHCORE_TEST_SMEM_PER_BLOCK sets a limit below the kernel's
    // (every sm_90 GPU gives a block 227 KiB); there is no other fp8 kernel.
    if (kernel->info().smem_bytes > handle.max_smem_per_block) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "fp8 queries at head dims (%d, %d) run on the sm_90a kernel only, which needs %zu bytes of shared "
                    "memory per block; the handle allows %zu (FLASHCORE_TEST_SMEM_PER_BLOCK lowers device %d's limit)",
                    int(dims.head_dim), int(dims.head_dim_v), kernel->info().smem_bytes, handle.max_smem_per_block,
                    handle.device);
    }
    if (!tma_describes(p, *kernel)) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "the TMA unit cannot describe q, k, v or out as given (fp8 queries run on the sm_90a kernels "
                    "only): every stride below 2^40 bytes, every extent from 1 to 2^32");
    }
    const int64_t blocks = num_blocks(p, *kernel, 1);
    if (blocks > INT_MAX / std::max<int64_t>(p.num_splits, 1)) {
        return fail_grid_limit("num_heads_q", "seqlen_q", kernel->info().block_m, static_cast<long long>(blocks));
    }
    const int splits =
        p.num_splits > 0 ? p.num_splits
                         : heuristic_splits(blocks, call_sms(handle, p.sm_margin), key_steps(p, *kernel));
    *plan = ForwardPlan{kernel, splits, 1};
    return FLASHCORE_STATUS_SUCCESS;
}

// The splits of a decode call over sequences of their own key counts
// (kRaggedDecodePartKeys above), or 1 for other calls and for one sequence.
int ragged_decode_splits(const flashcore_forward_params &p, const FwdKernel &kernel, int64_t blocks, int64_t slots) {
    const bool decode_tile = kernel.tile == FwdVariant::kDecode || kernel.tile == FwdVariant::kDecodePair;
    if (!decode_tile || (p.seqused_k == nullptr && p.cu_seqlens_k == nullptr) || p.batch_size == 1) return 1;
    const int64_t keys = key_steps(p, kernel) * kernel.info().keys_per_step;
    int64_t splits = ceil_div64(keys, kRaggedDecodePartKeys);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, kRaggedDecodeMaxWaves * slots / std::max<int64_t>(blocks, 1)));
    return int(std::clamp<int64_t>(splits, 1, kMaxHeuristicSplits));
}

flashcore_status plan_sm80(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype,
                           HeadDims dims, ForwardPlan *plan) {
    const int group = p.num_heads_q / p.num_heads_kv;
    const int packed_heads =
        group > 1 && p.seqlen_q < kPackGqaMaxSeqlenQ && int64_t(p.seqlen_q) * group <= kMaxPackedRows ? group : 1;
    const FwdKernel *kernel = nullptr;
    const flashcore_status status = choose_sm80(handle, p, dtype, dims, packed_heads, &kernel);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // A kernel's splits: the caller's num_splits, else heuristic_splits, or
    // ragged_decode_splits where that is more (then with its parts' least
    // keys).
    const auto plan_splits = [&](const FwdKernel &k, int *min_keys) {
        *min_keys = 0;
        if (p.num_splits != 0) return p.num_splits;
        const int64_t k_blocks = num_blocks(p, k, packed_heads);
        const int64_t k_slots = cta_slots(handle, p, k);
        const int heuristic = heuristic_splits(k_blocks, k_slots, key_steps(p, k));
        const int ragged = ragged_decode_splits(p, k, k_blocks, k_slots);
        if (ragged <= heuristic) return heuristic;
        *min_keys = kRaggedDecodeMinPartKeys;
        return ragged;
    };
    int split_min_keys = 0;
    int splits = plan_splits(*kernel, &split_min_keys);
    // The decode tile's paired twin, where the build has it (and the tile
    // was not pinned): two CTAs an SM, each streaming while the other fills
    // or drains its rings, and tiles of half the keys, so twice the splits
    // within the same least keys a part (fwd/sm80/config.cuh, kDecodePair).
    // It serves a grid that does not split and takes more than a wave of
    // the decode tile's CTAs, and one whose CTAs fill fewer than half the
    // SMs where it splits into more. Elsewhere the deeper rings are faster.
    if (kernel->tile == FwdVariant::kDecode &&
        handle.env.settings(Family::fwd).pinned_tile == FamilySettings::kNoPinnedTile) {
        const FwdKernel *paired =
            fitting_sm80(handle, p, kernel->input, kernel->kv, kernel->dims, FwdVariant::kDecodePair);
        if (paired != nullptr) {
            const int64_t blocks = num_blocks(p, *kernel, packed_heads);
            int paired_min_keys = 0;
            const int paired_splits = plan_splits(*paired, &paired_min_keys);
            const bool unsplit_past_a_wave = splits == 1 && blocks > cta_slots(handle, p, *kernel);
            // blocks * splits < half of them, without the product, which
            // overflows on the largest shapes validation accepts (the fuzzer's).
            const int64_t half_the_sms = call_sms(handle, p.sm_margin) / 2;
            const bool under_half_the_sms = blocks < ceil_div64(half_the_sms, splits);
            if (unsplit_past_a_wave || (under_half_the_sms && paired_splits > splits)) {
                kernel = paired;
                splits = paired_splits;
                split_min_keys = paired_min_keys;
            }
        }
    }
    *plan = ForwardPlan{kernel, splits, packed_heads};
    plan->split_min_keys = split_min_keys;
    return FLASHCORE_STATUS_SUCCESS;
}

// Bytes of the split-KV partial results (common/params.h gives their layout),
// each array FLASHCORE_ALIGNMENT aligned. False where they would not fit a
// size_t.
bool partial_bytes(const flashcore_forward_params &p, int num_splits, size_t *out_bytes, size_t *lse_bytes) {
    const auto align = [](unsigned __int128 n) { return (n + FLASHCORE_ALIGNMENT - 1) / FLASHCORE_ALIGNMENT * FLASHCORE_ALIGNMENT; };
    const unsigned __int128 rows = (unsigned __int128)num_splits * unsigned(p.batch_size) * unsigned(p.num_heads_q) *
                                   unsigned(p.seqlen_q);
    const unsigned __int128 out = align(rows * unsigned(effective_head_dim_v(p)) * sizeof(float));
    const unsigned __int128 lse = align(rows * sizeof(float));
    if (out + lse > (unsigned __int128)(SIZE_MAX / 2)) return false;
    *out_bytes = size_t(out);
    *lse_bytes = size_t(lse);
    return true;
}

}  // namespace

flashcore_status plan_forward(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                              ForwardPlan *plan) {
    HeadDims dims{};
    if (!covering_head_dims(fwd_head_dims_for(p), {p.head_dim, effective_head_dim_v(p)}, &dims)) {
        return fail(FLASHCORE_STATUS_INTERNAL, "no kernel covers head dims (%d, %d), which validation accepted",
                    int(p.head_dim), int(effective_head_dim_v(p)));
    }
    const DType dtype = DType(p.dtype);
    flashcore_status status = check_sm_margin(handle, p.sm_margin);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (has_fp8_queries(p)) {
        status = plan_fp8(handle, p, dims, plan);
    } else if (!plan_sm90(handle, p, dtype, dims, plan)) {
        status = plan_sm80(handle, p, dtype, dims, plan);
    }
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    plan->workspace_bytes = 0;
    if (plan->num_splits > 1) {
        size_t out_bytes = 0, lse_bytes = 0;
        if (!partial_bytes(p, plan->num_splits, &out_bytes, &lse_bytes)) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "the %d-way split of the keys would need a workspace larger than the address space; pass "
                        "num_splits = 1 (no split)",
                        plan->num_splits);
        }
        plan->partial_lse_offset = out_bytes;
        plan->workspace_bytes = out_bytes + lse_bytes;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status forward_workspace_bytes(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                                         size_t *bytes) {
    ForwardPlan plan;
    const flashcore_status status = plan_forward(handle, p, &plan);
    if (status == FLASHCORE_STATUS_SUCCESS) *bytes = plan.workspace_bytes;
    return status;
}

namespace {

// The merge of a split call's parts into out and lse: the parts described
// as a merge's inputs (their layout: common/params.h), then the merge kernel's
// parameters from that, as flashcore_merge_states gets them, plus the
// packed queries' rows, which only a split call has.
MergeKernelParams split_merge_params(const flashcore_forward_params &p, const FwdKernelParams &k) {
    const int64_t dv = k.head_dim_v;
    const int64_t rows_per_head = p.seqlen_q;
    flashcore_merge_params parts{};
    parts.partial_dtype = FLASHCORE_DTYPE_FP32;
    parts.out_dtype = effective_out_dtype(p);
    parts.partial_out = k.partial_out;
    parts.partial_lse = k.partial_lse;
    parts.out = p.out;
    parts.lse = p.lse;
    parts.num_states = k.num_splits;
    parts.batch_size = p.batch_size;
    parts.num_heads = p.num_heads_q;
    parts.seqlen = p.seqlen_q;
    parts.head_dim = k.head_dim_v;
    parts.partial_seq_stride = dv;
    parts.partial_head_stride = rows_per_head * dv;
    parts.partial_batch_stride = int64_t(p.num_heads_q) * rows_per_head * dv;
    parts.partial_state_stride = int64_t(p.batch_size) * parts.partial_batch_stride;
    parts.lse_seq_stride = 1;
    parts.lse_head_stride = rows_per_head;
    parts.lse_batch_stride = int64_t(p.num_heads_q) * rows_per_head;
    parts.lse_state_stride = int64_t(p.batch_size) * parts.lse_batch_stride;
    parts.out_batch_stride = p.out_batch_stride;
    parts.out_seq_stride = p.out_seq_stride;
    parts.out_head_stride = p.out_head_stride;
    parts.sinks = p.sinks;  // the parts are computed without them
    MergeKernelParams m = merge_kernel_params(parts);
    m.cu_seqlens = p.cu_seqlens_q;
    m.total_seqlen = p.total_seqlen_q;
    return m;
}

}  // namespace

flashcore_status launch_forward(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                                void *workspace, size_t workspace_bytes, void *stream) {
    ForwardPlan plan;
    flashcore_status status = plan_forward(handle, p, &plan);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    char splits[64];
    std::snprintf(splits, sizeof splits, "the call splits its keys %d ways", plan.num_splits);
    ByteRange ranges[kMaxForwardRanges + 1];
    status = check_workspace(workspace, workspace_bytes, plan.workspace_bytes, "flashcore_forward_workspace_size",
                             splits, ranges, plan.workspace_bytes > 0 ? forward_ranges(p, ranges) : 0);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const FwdKernelInfo info = plan.kernel->info();
    status = check_kernel_smem(handle, fwd_tile_name(plan.kernel->tile), plan.kernel->dims.head_dim,
                               plan.kernel->dims.head_dim_v, info.smem_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const int64_t blocks = num_blocks(p, *plan.kernel, plan.packed_heads);
    if (blocks > INT_MAX) {
        return fail_grid_limit("num_heads_q", "seqlen_q", info.block_m, static_cast<long long>(blocks));
    }

    if (handle.emulated != nullptr) {
        return emulated_launch(handle,
                               "the forward on the %s %s kernel for head dims (%d, %d) with %zu bytes of shared "
                               "memory, %d split(s), %d query head(s) packed per tile, %lld thread blocks, on %d "
                               "of %d SMs",
                               plan.kernel->path == KernelPath::kSm90 ? "sm_90a" : "portable",
                               fwd_tile_name(plan.kernel->tile), int(plan.kernel->dims.head_dim),
                               int(plan.kernel->dims.head_dim_v), info.smem_bytes, plan.num_splits, plan.packed_heads,
                               static_cast<long long>(blocks), call_sms(handle, p.sm_margin), handle.num_sms);
    }
    DeviceGuard guard(handle.device);
    if (guard.status() != FLASHCORE_STATUS_SUCCESS) return guard.status();
    FwdKernelParams kparams = kernel_params(p);
    kparams.num_splits = plan.num_splits;
    kparams.split_min_keys = plan.split_min_keys;
    kparams.packed_heads = plan.packed_heads;
    kparams.divisors = fwd_divisors(kparams, info.block_m);
    if (plan.num_splits > 1) {
        kparams.partial_out = static_cast<float *>(workspace);
        kparams.partial_lse =
            reinterpret_cast<float *>(static_cast<unsigned char *>(workspace) + plan.partial_lse_offset);
    }
    const char *failed_call = "the launch";
    const FwdLaunchOptions options{persistent_ctas(handle, p.sm_margin), &failed_call, handle.env.first_kv_position,
                                   handle.device, handle.max_smem_per_block, handle.env.fail_opt_in};
    const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
    cudaError_t err = plan.kernel->run(kparams, options, cuda_stream);
    if (err == cudaErrorNotSupported && plan.kernel->path == KernelPath::kSm90) {
        // Planning found the tensors describable (tma_describes): the
        // driver disagrees. Nothing was launched.
        return fail(FLASHCORE_STATUS_INTERNAL,
                    "the driver refused a TMA descriptor of q, k, v or out that planning found describable "
                    "(cuTensorMapEncodeTiled); nothing was launched");
    }
    if (err != cudaSuccess) {
        char operation[160];
        std::snprintf(operation, sizeof operation, "launching the attention kernel (%s)", failed_call);
        return fail_cuda(err, operation);
    }
    if (plan.num_splits > 1) {
        // Programmatic dependent launch exists from sm_90 on.
        const bool after_forward = handle.cc_major >= kMinProgrammaticLaunchCcMajor;
        err = cleared(run_merge_states(MergeType::kFp32, MergeType(effective_out_dtype(p)), split_merge_params(p, kparams),
                                       cuda_stream, after_forward));
        if (err != cudaSuccess) {
            return fail_cuda(err,
                             "launching the split-KV merge kernel (cudaLaunchKernelEx; the attention kernel before "
                             "it was queued, its partial results are discarded)");
        }
    }
    return FLASHCORE_STATUS_SUCCESS;
}


}  // namespace flashcore
