// Host fuzzer of the C API's validation: random flashcore_forward_params,
// flashcore_merge_params and flashcore_backward_params (mostly near the
// edges of each rule) against a small model of the rules
// flashcore.h states. For each call the model lists the statuses the header
// allows (every rule the parameters break gives one; the library reports
// the first it checks); the call must return one of them, say why on
// failure and nothing on success, never write its const input, and
// flashcore_set_contiguous_strides (and the backward one) must write exactly
// the packed strides or nothing. flashcore_forward and flashcore_backward
// are fuzzed with NULL and made-up handles (which must be refused as such),
// and on handles for emulated GPUs (below), which need no GPU.
//
//   fuzz_api [--calls N] [--seed S] [--threads T]
//
// Runs N calls with the fixed seed 15, then N with S (default: random,
// printed so a failure can be replayed), then T threads (default 8) at once,
// N / (4 T) calls each, seeds S + 1 to S + T. Exits 1 on the first mismatch,
// printing the parameters.
//
// Every parameter set a check accepts is then planned on a handle for an
// emulated GPU (FLASHCORE_TEST_EMULATE_GPU: an A100, A10, L4, H100 or H200
// in turn): its workspace query and the call itself, which stops where it
// would launch. It must plan (NO_DEVICE naming the plan, or SUCCESS for an
// empty call): the only refusals a device may add are fp8 queries off the
// sm_90a kernels, a grid past its limit and an asked-for split whose
// workspace passes the address space (UNSUPPORTED); never INTERNAL.
// And one field of an accepted forward set made bad must be refused with a
// message that names it (messages say what was wrong).
//
// The callers it plays are of every header version: of this one, of an
// older one (a smaller struct_size: where that header's struct ends, or
// its sizeof; the bytes after it are garbage, not its fields), of none (a
// size that ends inside a field), and of a newer one (a larger
// struct_size, whose fields past the last this library knows, sinks or
// the backward's dsinks, it does not know: zero, or now and then set);
// for each of the three structs.
//
// The fields of 0.8 (an fp8 K/V cache: kv_dtype, out_dtype and the descale
// factors) are modelled as flashcore.h states them; where it leaves a
// status or a rule open (which status refuses an out_dtype, whether an
// empty call looks at the descale pointers, whether they join the aliasing
// rule), the model allows either answer (Expected::maybe). fp8 queries
// (dtype FLASHCORE_DTYPE_FP8_E4M3: q, k and v e4m3, out bf16, on the sm_90a
// kernels only) are modelled as the fp8 prefill rules state them: kv_dtype
// 0 or e4m3, out_dtype 0 or bf16, no softcap (each UNSUPPORTED otherwise),
// head dims those the fp8 kernels of the build cover (every fp8 query
// UNSUPPORTED in a build without them), q_descale for fp8 queries only
// (INVALID_ARGUMENT otherwise), and no backward pass (UNSUPPORTED).
//
// The fields of 0.9 (attention_chunk and sinks, in the forward and backward
// structs, sinks in the merge's, dsinks in the backward's): a chunk length
// >= 0 (INVALID_ARGUMENT otherwise, checked in empty calls too: it is no
// pointer); sinks and dsinks NULL or 4-byte aligned (MISALIGNED), arrays of
// num_heads_q floats (num_heads for the merge) in the aliasing rule, sinks
// read, dsinks written; dsinks only with sinks (INVALID_ARGUMENT). Empty
// calls look at neither pointer. sm_margin (0.9, forward and backward)
// >= 0 (INVALID_ARGUMENT, empty calls too), and leaving an SM of the
// device: past that, planning on an emulated GPU refuses it
// (INVALID_ARGUMENT, naming the device's SMs).
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashcore.h"

extern "C" flashcore_status set_contiguous_strides_of_int(flashcore_forward_params *params, int value);

namespace {

using i128 = __int128;

// Where flashcore_forward_params of each released header ends: after the
// last field that version added (0.1's before head_dim_v; 0.7 added none;
// 0.9's, after sm_margin, is ours).
// A struct_size below ours must be one of these or that version's sizeof
// (the end padded to the struct's alignment; flashcore.h's ABI policy). A
// field is the caller's where the struct_size covers it, else its default.
#define FIELD_END(field) (offsetof(flashcore_forward_params, field) + sizeof(flashcore_forward_params::field))
constexpr size_t kEndV0_1 = offsetof(flashcore_forward_params, head_dim_v);
constexpr size_t kEndV0_2 = FIELD_END(head_dim_v);
constexpr size_t kEndV0_3 = FIELD_END(num_splits);
constexpr size_t kEndV0_4 = FIELD_END(softcap);
constexpr size_t kEndV0_5 = FIELD_END(seqused_k);
constexpr size_t kEndV0_6 = FIELD_END(num_pages);
constexpr size_t kEndV0_8 = FIELD_END(v_descale_head_stride);
constexpr size_t kEndV0_9 = FIELD_END(sm_margin);
#undef FIELD_END
constexpr size_t kReleasedEnds[] = {kEndV0_1, kEndV0_2, kEndV0_3, kEndV0_4, kEndV0_5, kEndV0_6, kEndV0_8};
// A struct's end rounded up to its alignment: that header's sizeof.
template <typename S = flashcore_forward_params>
constexpr size_t padded(size_t end) {
    return (end + alignof(S) - 1) / alignof(S) * alignof(S);
}
// Where the last field of this header (sm_margin) ends: a newer header's
// fields lie past it.
constexpr size_t kKnownEnd = kEndV0_9;
constexpr size_t kMaxStructSize = 64 * 1024;
// The largest seqlen_q, seqlen_k, total_seqlen_q/_k and page_size.
constexpr int32_t kMaxSeqlen = 1 << 30;
constexpr int kMaxBruteForceRows = 512;
constexpr float kLog2e = 1.4426950408889634f;

// A caller's struct S with room for a newer header's fields after ours:
// the library reads struct_size bytes of it, which may reach into `newer`.
constexpr size_t kNewerBytes = 16;
template <typename S>
struct Caller {
    S p;
    unsigned char newer[kNewerBytes];
};
using CallerParams = Caller<flashcore_forward_params>;
using BackwardCaller = Caller<flashcore_backward_params>;
using MergeCaller = Caller<flashcore_merge_params>;
static_assert(offsetof(CallerParams, newer) == sizeof(flashcore_forward_params) &&
                  offsetof(BackwardCaller, newer) == sizeof(flashcore_backward_params) &&
                  offsetof(MergeCaller, newer) == sizeof(flashcore_merge_params),
              "newer follows ours directly");

// Whether a struct_size of S is one the library reads: a released header's
// end or sizeof (`ends`: where S ended in each header before ours), or ours
// or larger (a newer header's) up to 64 KiB. Any other size ends inside a
// field.
template <typename S, size_t N>
bool released_size(size_t size, const size_t (&ends)[N]) {
    if (size >= sizeof(S)) return size <= kMaxStructSize;
    for (size_t end : ends)
        if (size == end || size == padded<S>(end)) return true;
    return false;
}
bool struct_size_ok(size_t size) { return released_size<flashcore_forward_params>(size, kReleasedEnds); }

// Whether a caller's struct (c.p, and the newer header's bytes after it)
// is larger than ours and sets a byte past `known_end`, the fields this
// library knows (refused as UNSUPPORTED, flashcore.h's ABI policy). Valid
// struct sizes only: a struct_size past 64 KiB is refused before this is
// looked at.
template <typename C>
bool sets_newer(const C &c, size_t known_end) {
    if (c.p.struct_size <= sizeof c.p || c.p.struct_size > sizeof c) return false;
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&c);
    for (size_t i = known_end; i < c.p.struct_size; ++i)
        if (bytes[i] != 0) return true;
    return false;
}
bool sets_newer_fields(const CallerParams &c) { return sets_newer(c, kKnownEnd); }

std::vector<std::pair<int32_t, int32_t>> g_head_dims;  // flashcore_supported_head_dims

// The head dims of the build's fp8 prefill kernels (the generated kernel
// list's lines on e4m3 inputs, kernels/kernels.list); empty in a build
// without the sm_90a kernels, which refuses every fp8 query.
struct KernelLine {
    const char *input;
    int32_t head_dim, head_dim_v;
};
struct KernelKvLine {
    const char *input, *kv;
    int32_t head_dim, head_dim_v;
};
// The head dims of the forward kernel lines whose input and K/V types
// `selected` takes (sorted, each once).
template <typename Selected>
std::vector<std::pair<int32_t, int32_t>> forward_head_dims_where(Selected selected) {
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile) \
    KernelKvLine{#input, #kv, head_dim, head_dim_v},
    const KernelKvLine lines[] = {
#include "fwd_kernels.inc"
    };
#undef FLASHCORE_KERNEL
    std::set<std::pair<int32_t, int32_t>> pairs;
    for (const KernelKvLine &line : lines)
        if (selected(std::string(line.input), std::string(line.kv))) pairs.emplace(line.head_dim, line.head_dim_v);
    return {pairs.begin(), pairs.end()};
}
std::vector<std::pair<int32_t, int32_t>> fp8_prefill_head_dims() {
    return forward_head_dims_where([](const std::string &input, const std::string &) { return input == "kE4m3"; });
}
const std::vector<std::pair<int32_t, int32_t>> g_fp8_head_dims = fp8_prefill_head_dims();
// An fp8 cache under 16-bit queries (kv_dtype e4m3): the quantized kernels'
// head dims (kernels/kernels.list's e4m3 K/V lines), fewer than the 16-bit
// ones past 256.
const std::vector<std::pair<int32_t, int32_t>> g_fp8_kv_head_dims =
    forward_head_dims_where([](const std::string &input, const std::string &kv) {
        return input != "kE4m3" && kv == "kE4m3";
    });
// The backward's head dims (its generated list): up to 512 where the
// forward's reach 576.
std::vector<std::pair<int32_t, int32_t>> backward_head_dims() {
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile) \
    KernelKvLine{#input, #kv, head_dim, head_dim_v},
    const KernelKvLine lines[] = {
#include "bwd_kernels.inc"
    };
#undef FLASHCORE_KERNEL
    std::set<std::pair<int32_t, int32_t>> pairs;
    for (const KernelKvLine &line : lines) pairs.emplace(line.head_dim, line.head_dim_v);
    return {pairs.begin(), pairs.end()};
}
const std::vector<std::pair<int32_t, int32_t>> g_backward_head_dims = backward_head_dims();
// MLA's latent-cache kernel (the header's head_dim_v): calls it covers take
// v only as k's view.
constexpr std::pair<int32_t, int32_t> kLatentCacheHeadDims{576, 512};

struct Rng {
    std::mt19937_64 engine;
    uint64_t next() { return engine(); }
    uint64_t below(uint64_t n) { return next() % n; }
    bool chance(int percent) { return below(100) < uint64_t(percent); }
    template <typename T, size_t N>
    T pick(const T (&values)[N]) { return values[below(N)]; }
};

int32_t random_size(Rng &r) {
    if (r.chance(85)) return int32_t(r.below(7));  // 0..6: small enough to model exactly
    const int32_t edges[] = {-1, -7, 8, 100, 1 << 20, 1 << 30, (1 << 30) + 1, INT32_MAX, INT32_MIN};
    return r.pick(edges);
}

// Rows of a packed tensor (total_seqlen_q/_k): mostly a few, else from
// the edges of [0, 2^30].
int32_t random_rows(Rng &r) {
    if (r.chance(85)) return int32_t(r.below(13));
    const int32_t edges[] = {-1, INT32_MIN, 100, kMaxSeqlen, kMaxSeqlen + 1, INT32_MAX};
    return r.pick(edges);
}

int64_t random_stride(Rng &r, int64_t packed) {
    if (r.chance(60)) return packed;
    const int64_t edges[] = {0, -8, 4, 8, 64, 72, 128, 512, int64_t(1) << 40, int64_t(1) << 62, INT64_MAX, INT64_MIN};
    if (r.chance(50)) return int64_t(r.below(100)) * 8;  // small multiples of 8: interleavings
    return r.chance(50) ? packed + 8 * (int64_t(r.below(9)) - 4) : r.pick(edges);
}

// A set of fake, 16-byte aligned device addresses: tensors apart, or made
// to overlap another tensor, or null, or misaligned.
const void *random_pointer(Rng &r, int index, const std::vector<uintptr_t> &others) {
    const uintptr_t base = (uintptr_t(index) + 1) << 44;
    if (r.chance(93)) return reinterpret_cast<const void *>(base);
    const int kind = int(r.below(4));
    if (kind == 0) return nullptr;
    if (kind == 1) return reinterpret_cast<const void *>(base + 2 * (1 + r.below(7)));  // misaligned for 16
    if (kind == 2 && !others.empty()) {
        return reinterpret_cast<const void *>(others[r.below(others.size())] + 16 * r.below(64));  // alias
    }
    return reinterpret_cast<const void *>(base + 16 * r.below(1024));
}

// An array of `count` 4-byte values the kernels read (int32, or float:
// the sinks) or write (the backward's dsinks): random_pointer's (apart, on
// top of another tensor, NULL, or 2-, 4- or 8-byte aligned), or now and
// then ending where `out` begins, or one value into it (refused).
template <typename T = int32_t>
const T *random_array(Rng &r, int index, const std::vector<uintptr_t> &others, const void *out, i128 count) {
    static_assert(sizeof(T) == 4, "4-byte values");
    if (out != nullptr && count > 0 && count < (1 << 20) && r.chance(5)) {
        const uintptr_t end = reinterpret_cast<uintptr_t>(out) + (r.chance(50) ? 4 : 0);
        return reinterpret_cast<const T *>(end - uintptr_t(count) * 4);
    }
    return static_cast<const T *>(random_pointer(r, index, others));
}

// A chunk length (0.9): mostly 0 (off); else mostly a few keys (the
// sizes here are mostly a few), now and then a long one or a negative one
// (refused).
int32_t random_chunk(Rng &r) {
    if (r.chance(70)) return 0;
    const int32_t chunks[] = {1, 2, 16, 64, 128, 1 << 13, 1 << 30, INT32_MAX, -1, -2, -64, INT32_MIN};
    return r.chance(70) ? int32_t(1 + r.below(8)) : r.pick(chunks);
}

// SMs left to other streams (0.9): mostly 0; else a few, all but one or
// all of an emulated GPU's (58 to 132 SMs), more, or negative (refused).
int32_t random_sm_margin(Rng &r) {
    if (r.chance(85)) return 0;
    const int32_t margins[] = {1, 8, 57, 58, 71, 72, 107, 108, 131, 132, 1000, INT32_MAX, -1, INT32_MIN};
    return r.pick(margins);
}

struct Expected {
    std::set<int> statuses;  // rules broken
    bool unsure = false;     // the model cannot tell whether out overlaps itself
    // Refusals flashcore.h leaves open: allowed besides `statuses` (or
    // besides SUCCESS where no rule is broken).
    std::set<int> maybe;
    void add(flashcore_status s) { statuses.insert(int(s)); }
    void add_maybe(flashcore_status s) { maybe.insert(int(s)); }
};

struct Tensor {
    const char *name;
    const void *ptr;
    i128 batch, seqlen, heads, dim;
    int64_t bs, ss, hs;
    i128 element_bytes = 2;  // 1: an fp8 cache's k or v
};

i128 last_offset(const Tensor &t) {
    return (t.dim - 1) + (t.batch - 1) * t.bs + (t.seqlen - 1) * t.ss + (t.heads - 1) * t.hs;
}

// Whether a forward call's k and v are an fp8 cache (0.8).
bool fp8_kv(const flashcore_forward_params &p) { return p.kv_dtype == FLASHCORE_DTYPE_FP8_E4M3; }
// Whether its queries are fp8 (fp8 prefill: k and v e4m3 too, out bf16).
bool fp8_q(const flashcore_forward_params &p) { return p.dtype == FLASHCORE_DTYPE_FP8_E4M3; }
// Whether k and v hold one-byte e4m3 elements: an fp8 cache or fp8 queries.
bool kv_e4m3(const flashcore_forward_params &p) { return fp8_kv(p) || fp8_q(p); }

// Brute force: do two (b, s, h) rows of out share an element?
int self_overlap(const Tensor &t) {  // 1 yes, 0 no, -1 too large to tell
    if (t.batch * t.seqlen * t.heads > kMaxBruteForceRows) return -1;
    std::vector<i128> starts;
    for (i128 b = 0; b < t.batch; ++b)
        for (i128 s = 0; s < t.seqlen; ++s)
            for (i128 h = 0; h < t.heads; ++h) starts.push_back(b * t.bs + s * t.ss + h * t.hs);
    std::sort(starts.begin(), starts.end());
    for (size_t i = 1; i < starts.size(); ++i)
        if (starts[i] - starts[i - 1] < t.dim) return 1;
    return 0;
}

bool covered(const std::vector<std::pair<int32_t, int32_t>> &pairs, int32_t d, int32_t dv) {
    for (const auto &p : pairs)
        if (p.first >= d && p.second >= dv) return true;
    return false;
}

// Whether the first pair covering (d, dv) is the latent cache's.
bool covered_by_latent_cache(const std::vector<std::pair<int32_t, int32_t>> &pairs, int32_t d, int32_t dv) {
    for (const auto &p : pairs)
        if (p.first >= d && p.second >= dv) return p == kLatentCacheHeadDims;
    return false;
}

// The head dims a forward call's kernels have: fp8 prefill's, an fp8
// cache's, or the 16-bit ones.
const std::vector<std::pair<int32_t, int32_t>> &forward_head_dims_of(const flashcore_forward_params &p) {
    return fp8_q(p) ? g_fp8_head_dims : fp8_kv(p) ? g_fp8_kv_head_dims : g_head_dims;
}

// A tensor's bytes as [begin, end); written: out, lse (the aliasing rule).
struct Range {
    i128 begin, end;
    bool written;
};

// Whether a written range overlaps any other range.
bool written_overlap(const std::vector<Range> &ranges) {
    for (size_t i = 0; i < ranges.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            if ((ranges[i].written || ranges[j].written) && ranges[i].begin < ranges[j].end &&
                ranges[j].begin < ranges[i].end)
                return true;
    return false;
}

// The rules of the sizes and options flashcore.h states for a forward call,
// which a backward call shares (its view as a forward call's parameters):
// adds to *e a status for each one `p` breaks; `empty`: whether the call
// has nothing to compute (its keys may then be missing). Returns the
// entries of a block-table row (0 without a paged cache).
i128 model_shapes(const flashcore_forward_params &p, bool empty, Expected *e, bool backward = false) {
    const int32_t dv = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
    const bool paged = p.block_table != nullptr;
    if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16 && !fp8_q(p))
        e->add(FLASHCORE_STATUS_UNSUPPORTED);
    // The K/V dtype (0.8): 0 or dtype itself (k and v of q's type), or
    // FLASHCORE_DTYPE_FP8_E4M3 (with fp16 or bf16 q); others have no kernel,
    // as dtype's (UNSUPPORTED). (flashcore.h names 0 for q's type; dtype is
    // its flashcore_dtype as well.) fp8 queries take e4m3 K/V only.
    if (p.kv_dtype != 0 && p.kv_dtype != p.dtype && !fp8_kv(p)) e->add(FLASHCORE_STATUS_UNSUPPORTED);
    // out's dtype (0.8): 0 or the type out is written in, q's (bf16 for fp8
    // queries); any other is refused, with a status flashcore.h does not
    // name for 16-bit queries (UNSUPPORTED for fp8 ones).
    const int32_t out_type = fp8_q(p) ? int32_t(FLASHCORE_DTYPE_BF16) : p.dtype;
    if (p.out_dtype != 0 && p.out_dtype != out_type) {
        e->add(FLASHCORE_STATUS_UNSUPPORTED);
        if (!fp8_q(p)) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    // fp8 queries: no softcap, and the sm_90a kernels, which a build may
    // lack (UNSUPPORTED).
    if (fp8_q(p) && (p.softcap != 0.f || g_fp8_head_dims.empty())) e->add(FLASHCORE_STATUS_UNSUPPORTED);
    bool sizes_ok = true;
    for (int32_t v : {p.batch_size, p.seqlen_q, p.seqlen_k, p.num_heads_q, p.num_heads_kv}) sizes_ok &= v >= 0;
    sizes_ok &= p.head_dim >= 1 && p.head_dim_v >= 0;
    sizes_ok &= !(p.num_heads_kv == 0 && p.num_heads_q != 0) && !(p.seqlen_k == 0 && !empty);
    if (!sizes_ok) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    if (p.num_heads_kv > 0 && p.num_heads_q % p.num_heads_kv != 0) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // Head dims: multiples of 8, of 16 with an fp8 cache or fp8 queries (16
    // one-byte elements a vector), that a kernel covers (for fp8 queries,
    // an fp8 kernel).
    const int32_t multiple = kv_e4m3(p) ? 16 : 8;
    if (p.head_dim >= 1 && p.head_dim_v >= 0 &&
        (p.head_dim % multiple != 0 || dv % multiple != 0 ||
         !covered(backward ? g_backward_head_dims : forward_head_dims_of(p), p.head_dim, dv)))
        e->add(FLASHCORE_STATUS_UNSUPPORTED);
    if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) e->add(FLASHCORE_STATUS_UNSUPPORTED);
    if (p.num_splits < 0 || p.num_splits > FLASHCORE_MAX_NUM_SPLITS) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // The scale: +0 is the default; -0 is refused (0.6).
    const float s = p.softmax_scale;
    const bool default_scale = s == 0.f && !std::signbit(s);
    if (!default_scale && !(std::isfinite(s) && s > 0.f)) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    const float effective = default_scale ? 1.f / std::sqrt(float(std::max(p.head_dim, 1))) : s;
    if (!std::isfinite(effective * kLog2e)) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // The window (0.4): its bounds only with use_window non-zero; each -1
    // or >= 0, and window_right -1 or 0 with causal.
    if (p.use_window != 0) {
        if (p.window_left < -1 || p.window_right < -1) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (p.causal != 0 && p.window_right > 0) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    // Chunks (0.9): 0 (off) or a chunk length > 0, whatever else is set.
    if (p.attention_chunk < 0) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // SMs left to other streams (0.9): >= 0 (the device's count is planning's).
    if (p.sm_margin < 0) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // The softcap (0.4): 0 (or -0) is off; otherwise finite and > 0, with
    // softcap * log2(e) a finite float and scale / softcap a finite float > 0
    // (flashcore.h says "must not underflow to 0"; an overflow to infinity
    // is refused too).
    const float cap = p.softcap;
    if (cap != 0.f) {
        const float quotient = effective / cap;
        if (!(std::isfinite(cap) && cap > 0.f && std::isfinite(cap * kLog2e) && std::isfinite(quotient) &&
              quotient > 0.f))
            e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    // Variable-length batches (0.6): total_seqlen_q/_k count the rows of the
    // packed tensors, in [0, 2^30] with cu_seqlens_q/_k and 0 without them;
    // packed keys hold a row where the output is not empty. (flashcore.h
    // states none of these three.)
    const struct {
        bool packed;
        int32_t total;
    } packing[] = {{packed_q, p.total_seqlen_q}, {packed_k, p.total_seqlen_k}};
    for (const auto &t : packing) {
        if (t.packed ? t.total < 0 || t.total > kMaxSeqlen : t.total != 0) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    if (packed_k && p.total_seqlen_k == 0 && !empty) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // A paged cache (0.6): not with cu_seqlens_k; page_size a multiple of 16
    // (a size <= 0 is an INVALID_ARGUMENT, flashcore_status says; a
    // positive page_size off the multiple, or past 2^30, is UNSUPPORTED, as
    // for head_dim); num_pages >= 1. Each row of the table lists
    // ceil(seqlen_k / page_size) pages: rows of a non-empty call's table
    // (an empty call's strides are not looked at) are that far apart or
    // farther, at a stride >= 0 (not stated in flashcore.h). Without a
    // table, its page_size, num_pages and stride stay 0 (not stated in
    // flashcore.h either).
    i128 pages_per_row = 0;
    if (!paged) {
        if (p.page_size != 0 || p.num_pages != 0 || p.block_table_batch_stride != 0)
            e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    } else {
        if (packed_k) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (p.page_size < 1) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (p.page_size >= 1 && (p.page_size % 16 != 0 || p.page_size > kMaxSeqlen))
            e->add(FLASHCORE_STATUS_UNSUPPORTED);
        if (p.num_pages < 1) e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (p.page_size >= 1) pages_per_row = (i128(p.seqlen_k) + p.page_size - 1) / p.page_size;
        if (!empty && p.page_size >= 1 &&
            (p.block_table_batch_stride < 0 || (p.batch_size > 1 && p.block_table_batch_stride < pages_per_row)))
            e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        // The table's last entry addressable in bytes, as the tensors' are.
        if (!empty && p.page_size >= 1 && p.block_table_batch_stride >= 0 &&
            ((i128(p.batch_size) - 1) * p.block_table_batch_stride + pages_per_row - 1) * 4 > i128(INT64_MAX))
            e->add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    return pages_per_row;
}

// Whether a forward call has no output row: batch_size, seqlen_q or
// num_heads_q 0, or packed queries with total_seqlen_q 0 (not stated in
// flashcore.h).
bool forward_empty(const flashcore_forward_params &p) {
    return p.batch_size == 0 || p.seqlen_q == 0 || p.num_heads_q == 0 ||
           (p.cu_seqlens_q != nullptr && p.total_seqlen_q == 0);
}

// The descale arrays of a forward call (0.8): factor (b, h) of each at
// element b * batch_stride + h * head_stride, h a K/V head.
struct DescaleArray {
    const float *ptr;
    int64_t batch_stride, head_stride;
};
constexpr int kDescaleArrays = 3;  // q, k, v
void descale_arrays(const flashcore_forward_params &p, DescaleArray *d) {
    d[0] = {p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride};
    d[1] = {p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride};
    d[2] = {p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride};
}

// The element after a descale array's last factor (strides >= 0).
i128 descale_extent(const flashcore_forward_params &p, const DescaleArray &d) {
    return (i128(p.batch_size) - 1) * d.batch_stride + (i128(p.num_heads_kv) - 1) * d.head_stride + 1;
}

// The rules of a forward call's sizes, options, tensors and arrays, for its
// fields as the library reads them (an older caller's missing ones at their
// defaults); the descale factors' own rules are model_descales'.
Expected model_call(const flashcore_forward_params &p) {
    Expected e;
    const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
    const bool paged = p.block_table != nullptr;
    const bool empty = forward_empty(p);
    const int32_t dv = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    const i128 pages_per_row = model_shapes(p, empty, &e);
    if (empty || !e.statuses.empty()) return e;  // pointers and strides of an empty call are not looked at

    // Packed tensors are one batch of all their rows, their batch strides
    // ignored; a paged k and v are num_pages batches of page_size rows.
    // An fp8 cache's k and v (and with fp8 queries q, k and v) have
    // one-byte elements: their strides are multiples of 16
    // (FLASHCORE_ALIGNMENT bytes), their extents in bytes half a 16-bit
    // tensor's; out is 16-bit (bf16 for fp8 queries).
    const i128 q_batches = packed_q ? 1 : p.batch_size, q_rows = packed_q ? p.total_seqlen_q : p.seqlen_q;
    i128 kv_batches = packed_k ? 1 : p.batch_size, kv_rows = packed_k ? p.total_seqlen_k : p.seqlen_k;
    if (paged) kv_batches = p.num_pages, kv_rows = p.page_size;
    const i128 kv_bytes = kv_e4m3(p) ? 1 : 2, q_bytes = fp8_q(p) ? 1 : 2;
    const Tensor tensors[] = {
        {"q", p.q, q_batches, q_rows, p.num_heads_q, p.head_dim, packed_q ? 0 : p.q_batch_stride, p.q_seq_stride,
         p.q_head_stride, q_bytes},
        {"k", p.k, kv_batches, kv_rows, p.num_heads_kv, p.head_dim, packed_k ? 0 : p.k_batch_stride, p.k_seq_stride,
         p.k_head_stride, kv_bytes},
        {"v", p.v, kv_batches, kv_rows, p.num_heads_kv, dv, packed_k ? 0 : p.v_batch_stride, p.v_seq_stride,
         p.v_head_stride, kv_bytes},
        {"out", p.out, q_batches, q_rows, p.num_heads_q, dv, packed_q ? 0 : p.out_batch_stride, p.out_seq_stride,
         p.out_head_stride},
    };
    bool tensors_ok = true;
    for (const Tensor &t : tensors) {
        if (t.ptr == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (reinterpret_cast<uintptr_t>(t.ptr) % 16 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
        for (int64_t st : {t.bs, t.ss, t.hs}) {
            if (st < 0) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
            if (st % (16 / t.element_bytes) != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
        }
        tensors_ok &= t.ptr != nullptr && t.bs >= 0 && t.ss >= 0 && t.hs >= 0;
        if (tensors_ok && last_offset(t) * t.element_bytes > i128(INT64_MAX)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    // lse (rows: [num_heads_q][total_seqlen_q] for packed queries), the
    // sinks (0.9, num_heads_q floats) and the int32 arrays the kernels
    // read, each 4-byte aligned: seqused_k (0.5, batch_size values),
    // cu_seqlens_q/_k (0.6, batch_size + 1) and the block table (0.6, its
    // rows' ceil(seqlen_k / page_size) entries).
    const struct {
        const void *ptr;
        i128 bytes;
        bool written;
    } arrays[] = {
        {p.lse, (packed_q ? i128(p.total_seqlen_q) : i128(p.batch_size) * p.seqlen_q) * p.num_heads_q * 4, true},
        {p.sinks, i128(p.num_heads_q) * 4, false},
        {p.seqused_k, i128(p.batch_size) * 4, false},
        {p.cu_seqlens_q, (i128(p.batch_size) + 1) * 4, false},
        {p.cu_seqlens_k, (i128(p.batch_size) + 1) * 4, false},
        {p.block_table, ((i128(p.batch_size) - 1) * p.block_table_batch_stride + pages_per_row) * 4, false},
    };
    bool arrays_misaligned = false;
    for (const auto &a : arrays) arrays_misaligned |= a.ptr != nullptr && reinterpret_cast<uintptr_t>(a.ptr) % 4 != 0;
    if (arrays_misaligned) e.add(FLASHCORE_STATUS_MISALIGNED);
    if (!tensors_ok || e.statuses.size() > size_t(arrays_misaligned)) return e;
    const int overlap = self_overlap(tensors[3]);
    if (overlap == 1) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    e.unsure = overlap < 0;
    // Head dims on MLA's latent-cache kernel: v must be k's view (the same
    // pointer and strides), checked after each tensor's own rules and
    // before the aliasing rule.
    if (covered_by_latent_cache(forward_head_dims_of(p), p.head_dim, dv) &&
        !(p.v == p.k && p.v_batch_stride == p.k_batch_stride && p.v_seq_stride == p.k_seq_stride &&
          p.v_head_stride == p.k_head_stride && dv <= p.head_dim)) {
        e.add(FLASHCORE_STATUS_UNSUPPORTED);
        return e;
    }
    // Aliasing: out and lse against everything, as byte ranges.
    std::vector<Range> ranges;
    for (int i = 0; i < 4; ++i) {
        const i128 begin = i128(reinterpret_cast<uintptr_t>(tensors[i].ptr));
        ranges.push_back({begin, begin + (last_offset(tensors[i]) + 1) * tensors[i].element_bytes, i == 3});
    }
    for (const auto &a : arrays) {
        if (a.ptr == nullptr) continue;
        const i128 begin = i128(reinterpret_cast<uintptr_t>(a.ptr));
        ranges.push_back({begin, begin + a.bytes, a.written});
    }
    if (written_overlap(ranges)) {
        e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        return e;
    }
    // The descale arrays are read too, but flashcore.h's aliasing rule does
    // not list them: out or lse on top of one may be refused.
    DescaleArray descales[kDescaleArrays];
    descale_arrays(p, descales);
    for (const DescaleArray &d : descales) {
        if (d.ptr == nullptr || d.batch_stride < 0 || d.head_stride < 0) continue;
        const i128 begin = i128(reinterpret_cast<uintptr_t>(d.ptr));
        ranges.push_back({begin, begin + descale_extent(p, d) * 4, false});
    }
    if (written_overlap(ranges)) e.add_maybe(FLASHCORE_STATUS_INVALID_ARGUMENT);
    return e;
}

// The descale factors' rules (0.8), beside model_call's: q_descale is for
// fp8 queries only (INVALID_ARGUMENT otherwise); k_descale and v_descale
// need e4m3 k and v, an fp8 cache or fp8 queries (refused otherwise, the
// status not named);
// each array given is 4-byte aligned (MISALIGNED) with strides >= 0
// (INVALID_ARGUMENT); the strides of an array not given stay 0
// (INVALID_ARGUMENT; not stated in flashcore.h, as page_size without a
// block table). flashcore.h leaves open whether an array reaching past
// 2^63 bytes is refused; and, an empty call's pointers and strides not
// being looked at, whether an empty call is held to any of these.
void model_descales(const flashcore_forward_params &p, bool empty, Expected *e) {
    Expected d;
    if (p.q_descale != nullptr && !fp8_q(p)) d.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    if ((p.k_descale != nullptr || p.v_descale != nullptr) && !kv_e4m3(p)) {
        d.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        d.add(FLASHCORE_STATUS_UNSUPPORTED);
    }
    DescaleArray arrays[kDescaleArrays];
    descale_arrays(p, arrays);
    for (const DescaleArray &a : arrays) {
        if (a.ptr == nullptr) {
            if (a.batch_stride != 0 || a.head_stride != 0) d.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
            continue;
        }
        if (reinterpret_cast<uintptr_t>(a.ptr) % 4 != 0) d.add(FLASHCORE_STATUS_MISALIGNED);
        if (a.batch_stride < 0 || a.head_stride < 0) {
            d.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        } else if ((descale_extent(p, a) - 1) * 4 > i128(INT64_MAX)) {
            d.add(FLASHCORE_STATUS_INVALID_ARGUMENT);  // the last factor addressable in bytes, as the tensors'
        } else if (descale_extent(p, a) * 4 > i128(INT64_MAX)) {
            d.add_maybe(FLASHCORE_STATUS_INVALID_ARGUMENT);
        }
    }
    if (empty) {
        d.maybe.insert(d.statuses.begin(), d.statuses.end());
        d.statuses.clear();
    }
    e->statuses.insert(d.statuses.begin(), d.statuses.end());
    e->maybe.insert(d.maybe.begin(), d.maybe.end());
}

// The fields of a caller's struct as the library reads them: those an
// older header's struct lacks at their defaults.
flashcore_forward_params as_read(const flashcore_forward_params &in) {
    flashcore_forward_params p = in;
    if (p.struct_size < kEndV0_2) p.head_dim_v = 0;
    if (p.struct_size < kEndV0_3) p.num_splits = 0;
    if (p.struct_size < kEndV0_4) {
        p.use_window = p.window_left = p.window_right = 0;
        p.softcap = 0.f;
    }
    if (p.struct_size < kEndV0_5) p.seqused_k = nullptr;
    if (p.struct_size < kEndV0_6) {
        p.cu_seqlens_q = p.cu_seqlens_k = p.block_table = nullptr;
        p.total_seqlen_q = p.total_seqlen_k = p.page_size = p.num_pages = 0;
        p.block_table_batch_stride = 0;
    }
    if (p.struct_size < kEndV0_8) {
        p.kv_dtype = p.out_dtype = 0;
        p.q_descale = p.k_descale = p.v_descale = nullptr;
        p.q_descale_batch_stride = p.q_descale_head_stride = 0;
        p.k_descale_batch_stride = p.k_descale_head_stride = 0;
        p.v_descale_batch_stride = p.v_descale_head_stride = 0;
    }
    if (p.struct_size < kEndV0_9) {
        p.attention_chunk = 0;
        p.sinks = nullptr;
        p.sm_margin = 0;
    }
    return p;
}

// The model: what flashcore.h says flashcore_forward_check returns. The
// descale rules stand beside the others: the library may check them at any
// point, so each call's broken rules are those of both.
Expected model_check(const CallerParams &caller) {
    const flashcore_forward_params &in = caller.p;
    Expected e;
    if (!struct_size_ok(in.struct_size)) {
        e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        return e;  // nothing else is read
    }
    if (sets_newer_fields(caller)) {
        e.add(FLASHCORE_STATUS_UNSUPPORTED);
        return e;  // nor is anything read
    }
    const flashcore_forward_params p = as_read(in);
    e = model_call(p);
    model_descales(p, forward_empty(p), &e);
    return e;
}

// A window bound: -1 (unbounded) and 0 (the diagonal), the two that causal
// allows on the right, more often than 1, small, large and INT32_MAX; 1 in
// 5 below -1 (refused where the window is on).
int32_t random_window_bound(Rng &r) {
    switch (r.below(10)) {
    case 0: return r.chance(50) ? -2 : -int32_t(2 + r.below(1000));
    case 1: return INT32_MIN;
    case 2:
    case 3: return -1;
    case 4:
    case 5: return 0;
    case 6: return 1;
    case 7: return int32_t(2 + r.below(300));
    case 8: return int32_t(1) << (10 + r.below(21));  // 1024 .. 2^30
    default: return INT32_MAX;
    }
}

// Past a caller's struct_size (from `first_end` on, where the struct
// first appeared; a smaller size is refused whatever follows it):
// garbage, not its fields. A newer caller's own fields past ours: zero, or
// now and then one byte of them past `known_end` set.
template <typename C>
void fill_past_struct_size(Rng &r, C *c, size_t first_end, size_t known_end) {
    constexpr size_t kOurs = sizeof c->p;
    unsigned char *bytes = reinterpret_cast<unsigned char *>(c);
    const size_t end = std::min(c->p.struct_size, sizeof *c);
    if (end >= first_end && end < kOurs) std::memset(bytes + end, 0xAB, kOurs - end);
    if (end > kOurs) {
        std::memset(bytes + kOurs, 0, end - kOurs);
        if (r.chance(50)) bytes[known_end + r.below(end - known_end)] = static_cast<unsigned char>(1 + r.below(255));
    }
}

CallerParams random_params(Rng &r) {
    CallerParams c;
    std::memset(c.newer, 0xAB, sizeof c.newer);  // garbage, unless a newer caller's struct reaches into it
    flashcore_forward_params &p = c.p;
    flashcore_forward_params_init(&p, sizeof p);
    // Each field: mostly a valid value, sometimes one from the edges of its
    // rule, so that both the success path and every refusal are frequent.
    // dtype: mostly fp16 or bf16, now and then fp8 queries (e4m3), else one
    // without kernels.
    const int32_t bad_dtypes[] = {0, 3, 7, -1, INT32_MIN};
    const int dtype_kind = int(r.below(100));
    p.dtype = dtype_kind < 80   ? int32_t(1 + r.below(2))
              : dtype_kind < 92 ? int32_t(FLASHCORE_DTYPE_FP8_E4M3)
                                : r.pick(bad_dtypes);
    const bool fp8_queries = p.dtype == FLASHCORE_DTYPE_FP8_E4M3;
    p.batch_size = random_size(r);
    p.seqlen_q = random_size(r);
    p.seqlen_k = random_size(r);
    p.num_heads_q = random_size(r);
    p.num_heads_kv = r.chance(70) ? std::max(1, p.num_heads_q / int32_t(1 + r.below(3))) : random_size(r);
    const int32_t dims[] = {8, 16, 32, 64, 96, 128, 192, 256, 0, -8, 4, 60, 72, 100, 264, INT32_MAX};
    // fp8 queries mostly take the fp8 kernels' head dims (where the build
    // has them).
    const auto &listed_dims = fp8_queries && !g_fp8_head_dims.empty() ? g_fp8_head_dims : g_head_dims;
    const auto &listed = listed_dims[r.below(listed_dims.size())];
    p.head_dim = r.chance(80) ? listed.first : r.pick(dims);
    const int32_t dims_v[] = {8, 64, 128, -8, 264, 60};
    p.head_dim_v = r.chance(70) ? 0 : r.chance(50) ? listed.second : r.pick(dims_v);
    p.causal = int32_t(r.below(2));
    const float scales[] = {0.f,   0.125f,  1.f,     -1.f,    NAN,    INFINITY, -0.f,
                            3e38f, 2.3e38f, 2.4e38f, FLT_MIN, 1e-45f, 1e-30f};
    p.softmax_scale = r.chance(80) ? 0.f : r.pick(scales);
    // num_splits: mostly the library's choice; else none, 2 .. 128, or out
    // of range.
    const int32_t splits[] = {1, 2 + int32_t(r.below(FLASHCORE_MAX_NUM_SPLITS - 1)), 2, FLASHCORE_MAX_NUM_SPLITS,
                              FLASHCORE_MAX_NUM_SPLITS + 1, -1, INT32_MIN, INT32_MAX};
    p.num_splits = r.chance(80) ? 0 : r.pick(splits);
    // The window: mostly off, its bounds then garbage to be ignored; on with
    // any non-zero use_window.
    const int32_t use_windows[] = {1, 1, 1, 1, 2, -1, INT32_MIN, INT32_MAX};
    p.use_window = r.chance(65) ? 0 : r.pick(use_windows);
    p.window_left = random_window_bound(r);
    p.window_right = random_window_bound(r);
    // The softcap: mostly off; else normal, tiny (the scale's quotient may
    // overflow), huge (softcap * log2(e) may overflow, the quotient
    // underflow), or not finite and > 0.
    const float softcaps[] = {30.f,   50.f,    1.f,      0.5f,                         // normal
                              1e-30f, FLT_MIN, 1e-45f,                                 // tiny
                              1e30f,  2.3e38f, 2.4e38f,  FLT_MAX,                      // huge
                              -1.f,   -0.f,    -FLT_MIN, NAN,     -NAN, INFINITY, -INFINITY};
    p.softcap = r.chance(70) ? 0.f : r.pick(softcaps);
    // Variable-length batches: mostly not; with packed queries or keys,
    // their total_seqlen mostly a few rows, else from the edges; without,
    // now and then set anyway (refused). Their cu_seqlens are drawn below,
    // with the other arrays.
    const bool packed_q = r.chance(20), packed_k = r.chance(15);
    p.total_seqlen_q = packed_q || r.chance(3) ? random_rows(r) : 0;
    p.total_seqlen_k = packed_k || r.chance(3) ? random_rows(r) : 0;
    // A paged cache: mostly not; with one, mostly pages of a supported size,
    // a few of them, and table rows as far apart as a row's entries or a
    // little farther; without, now and then one of its sizes set anyway.
    const bool paged = r.chance(20);
    if (paged) {
        const int32_t page_sizes[] = {16, 32, 64, 256};
        const int32_t bad_page_sizes[] = {0, -16, -1, 8, 24, kMaxSeqlen, kMaxSeqlen + 16, INT32_MIN, INT32_MAX};
        p.page_size = r.chance(88) ? r.pick(page_sizes) : r.pick(bad_page_sizes);
        const int32_t bad_pages[] = {0, -1, INT32_MIN, INT32_MAX, 1 << 20};
        p.num_pages = r.chance(90) ? int32_t(1 + r.below(8)) : r.pick(bad_pages);
        const int64_t row =
            p.seqlen_k >= 0 && p.page_size >= 1 ? (int64_t(p.seqlen_k) + p.page_size - 1) / p.page_size : 1;
        const int64_t bad_strides[] = {0, -1, row - 1, int64_t(1) << 40, INT64_MAX, INT64_MIN};
        p.block_table_batch_stride = r.chance(80) ? row + int64_t(r.below(3)) : r.pick(bad_strides);
    } else if (r.chance(4)) {
        const int which = int(r.below(3));
        if (which == 0) p.page_size = 16;
        if (which == 1) p.num_pages = 1;
        if (which == 2) p.block_table_batch_stride = r.chance(50) ? 1 : -1;
    }
    // An fp8 K/V cache (0.8): mostly not; else mostly kv_dtype FP8_E4M3,
    // now and then dtype itself or a K/V dtype without kernels (the other
    // 16-bit one, fp32, unknown values; under fp8 queries a 16-bit one).
    // out_dtype: mostly 0, now and then out's type (q's, bf16 for fp8
    // queries), else one that is refused.
    const int32_t bad_kv_dtypes[] = {FLASHCORE_DTYPE_FP32, p.dtype == FLASHCORE_DTYPE_FP16 ? 2 : 1, 5, -1,
                                     INT32_MIN, INT32_MAX};
    const int kv_kind = int(r.below(100));
    if (kv_kind >= 70) {
        p.kv_dtype = kv_kind < 92 ? int32_t(FLASHCORE_DTYPE_FP8_E4M3) : kv_kind < 95 ? p.dtype : r.pick(bad_kv_dtypes);
    }
    const int32_t out_type = fp8_queries ? int32_t(FLASHCORE_DTYPE_BF16) : p.dtype;
    const int32_t bad_out_dtypes[] = {out_type == FLASHCORE_DTYPE_FP16 ? 2 : 1, FLASHCORE_DTYPE_FP32,
                                      FLASHCORE_DTYPE_FP8_E4M3, -1, 99};
    p.out_dtype = r.chance(92) ? 0 : r.chance(50) ? out_type : r.pick(bad_out_dtypes);
    p.attention_chunk = random_chunk(r);
    p.sm_margin = random_sm_margin(r);
    // Strides: packed in a random layout, then some perturbed. Packed q and
    // out are one batch of total_seqlen_q rows; packed k and v likewise, a
    // paged cache's num_pages batches of page_size rows.
    const int layout = int(r.below(2));
    flashcore_forward_params packed = p;
    if (set_contiguous_strides_of_int(&packed, layout) == FLASHCORE_STATUS_SUCCESS) p = packed;
    if (packed_q) {
        flashcore_forward_params rows = p;
        rows.batch_size = 1, rows.seqlen_q = p.total_seqlen_q;
        if (set_contiguous_strides_of_int(&rows, layout) == FLASHCORE_STATUS_SUCCESS) {
            p.q_batch_stride = rows.q_batch_stride, p.q_seq_stride = rows.q_seq_stride;
            p.q_head_stride = rows.q_head_stride, p.out_batch_stride = rows.out_batch_stride;
            p.out_seq_stride = rows.out_seq_stride, p.out_head_stride = rows.out_head_stride;
        }
    }
    if (packed_k || paged) {
        flashcore_forward_params rows = p;
        rows.batch_size = paged ? p.num_pages : 1, rows.seqlen_k = paged ? p.page_size : p.total_seqlen_k;
        if (set_contiguous_strides_of_int(&rows, layout) == FLASHCORE_STATUS_SUCCESS) {
            p.k_batch_stride = rows.k_batch_stride, p.k_seq_stride = rows.k_seq_stride;
            p.k_head_stride = rows.k_head_stride, p.v_batch_stride = rows.v_batch_stride;
            p.v_seq_stride = rows.v_seq_stride, p.v_head_stride = rows.v_head_stride;
        }
    }
    for (int64_t *st : {&p.q_batch_stride, &p.q_seq_stride, &p.q_head_stride, &p.k_batch_stride, &p.k_seq_stride,
                        &p.k_head_stride, &p.v_batch_stride, &p.v_seq_stride, &p.v_head_stride, &p.out_batch_stride,
                        &p.out_seq_stride, &p.out_head_stride})
        if (r.chance(4)) *st = random_stride(r, *st);
    std::vector<uintptr_t> placed;
    const void **slots[] = {&p.q, &p.k, &p.v};
    for (int i = 0; i < 3; ++i) {
        *slots[i] = random_pointer(r, i, placed);
        placed.push_back(reinterpret_cast<uintptr_t>(*slots[i]));
    }
    // MLA's latent cache: mostly v as k's view where its kernel covers the
    // head dims (else refused).
    const int32_t dv_of_call = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    if (covered_by_latent_cache(g_head_dims, p.head_dim, dv_of_call) && r.chance(70)) {
        p.v = p.k;
        p.v_batch_stride = p.k_batch_stride, p.v_seq_stride = p.k_seq_stride, p.v_head_stride = p.k_head_stride;
    }
    p.out = const_cast<void *>(random_pointer(r, 3, placed));
    placed.push_back(reinterpret_cast<uintptr_t>(p.out));
    if (r.chance(60)) {
        const void *lse = random_pointer(r, 4, placed);
        if (r.chance(5)) lse = static_cast<const char *>(lse) + 4;  // 4-byte aligned, not 16: fine for lse
        p.lse = static_cast<float *>(const_cast<void *>(lse));
        placed.push_back(reinterpret_cast<uintptr_t>(p.lse));
    }
    // seqused_k: mostly none; else an int32 array (random_array) of
    // batch_size values. Likewise cu_seqlens_q/_k of packed queries and keys
    // (batch_size + 1 values), and the block table of a paged cache (its
    // rows' entries). Sometimes NULL: the call is then neither.
    if (r.chance(30)) p.seqused_k = random_array(r, 5, placed, p.out, p.batch_size);
    if (packed_q) p.cu_seqlens_q = random_array(r, 6, placed, p.out, i128(p.batch_size) + 1);
    if (packed_k) p.cu_seqlens_k = random_array(r, 7, placed, p.out, i128(p.batch_size) + 1);
    if (paged) {
        const i128 entries = (i128(p.batch_size) - 1) * p.block_table_batch_stride +
                             (p.page_size >= 1 ? (i128(p.seqlen_k) + p.page_size - 1) / p.page_size : 0);
        p.block_table = random_array(r, 8, placed, p.out, entries);
    }
    // Sinks (0.9): mostly none; else num_heads_q floats (random_array),
    // now and then ending where out or lse begins, or one float into it.
    if (r.chance(30)) {
        p.sinks = random_array<float>(r, 12, placed, p.lse != nullptr && r.chance(50) ? p.lse : p.out, p.num_heads_q);
    }
    // Descale factors: with an fp8 cache or fp8 queries, each of k_descale
    // and v_descale mostly given, per tensor or per (batch, K/V head) either
    // way round, now and then with strides from the edges (negative, huge);
    // without, now and then given anyway (refused). q_descale likewise with
    // fp8 queries, now and then without (refused); strides of arrays not
    // given, now and then set.
    const auto random_descale_pointer = [&](int index) {
        const float *ptr = static_cast<const float *>(random_pointer(r, index, placed));
        if (ptr != nullptr && r.chance(10)) {
            const size_t offsets[] = {4, 12, 1, 2, 6};  // 4-byte aligned (fine), or not
            ptr = reinterpret_cast<const float *>(reinterpret_cast<uintptr_t>(ptr) + r.pick(offsets));
        }
        return ptr;
    };
    const auto random_descale_strides = [&](int64_t *batch_stride, int64_t *head_stride) {
        const int64_t edges[] = {-1, -4, INT64_MIN, INT64_MAX, int64_t(1) << 40, int64_t(1) << 61, 3, 0};
        switch (r.below(5)) {
        case 0: *batch_stride = 0, *head_stride = 0; break;  // per tensor
        case 1: *batch_stride = std::max(p.num_heads_kv, 0), *head_stride = 1; break;  // [batch][head]
        case 2: *batch_stride = 1, *head_stride = std::max(p.batch_size, 0); break;  // [head][batch]
        case 3: *batch_stride = 0, *head_stride = 1; break;  // per head
        default: *batch_stride = r.pick(edges), *head_stride = r.pick(edges); break;
        }
    };
    const bool fp8 = p.kv_dtype == FLASHCORE_DTYPE_FP8_E4M3 || fp8_queries;
    if (r.chance(fp8 ? 70 : 3)) {
        p.k_descale = random_descale_pointer(9);
        random_descale_strides(&p.k_descale_batch_stride, &p.k_descale_head_stride);
    }
    if (r.chance(fp8 ? 70 : 3)) {
        p.v_descale = random_descale_pointer(10);
        random_descale_strides(&p.v_descale_batch_stride, &p.v_descale_head_stride);
    }
    if (r.chance(fp8_queries ? 70 : 3)) {
        p.q_descale = random_descale_pointer(11);
        random_descale_strides(&p.q_descale_batch_stride, &p.q_descale_head_stride);
    }
    for (int64_t *st : {&p.q_descale_batch_stride, &p.q_descale_head_stride, &p.k_descale_batch_stride,
                        &p.k_descale_head_stride, &p.v_descale_batch_stride, &p.v_descale_head_stride})
        if (r.chance(1)) *st = r.chance(50) ? 1 : -1;
    constexpr size_t kOurs = sizeof(flashcore_forward_params);
    // Sizes: each released header's (its end and its sizeof), a newer
    // header's, and sizes of no header's: short of 0.1's, past 64 KiB, or
    // ending inside a field or between two fields of one version.
    const size_t older[] = {kEndV0_1,         kEndV0_2,         kEndV0_3,          kEndV0_4,
                            kEndV0_5,         padded(kEndV0_2), padded(kEndV0_3),  padded(kEndV0_4),
                            padded(kEndV0_5), kEndV0_6,         padded(kEndV0_6),  kEndV0_8,
                            padded(kEndV0_8)};
    const size_t newer[] = {kOurs + 4, kOurs + 8, kOurs + kNewerBytes};
    const size_t bad_sizes[] = {0, 12, kEndV0_1 - 1, kEndV0_1 + 1, kEndV0_2 + 1,
                                offsetof(flashcore_forward_params, softcap),
                                offsetof(flashcore_forward_params, seqused_k) + 4,
                                offsetof(flashcore_forward_params, cu_seqlens_k),
                                offsetof(flashcore_forward_params, num_pages), kEndV0_6 + 2,
                                offsetof(flashcore_forward_params, out_dtype),
                                offsetof(flashcore_forward_params, k_descale),
                                offsetof(flashcore_forward_params, v_descale_batch_stride) + 4, kEndV0_8 + 4,
                                offsetof(flashcore_forward_params, sinks),
                                offsetof(flashcore_forward_params, sinks) + 4,
                                offsetof(flashcore_forward_params, sm_margin), kEndV0_9, kOurs - 1, kMaxStructSize + 1,
                                size_t(1) << 40};
    const int kind = r.chance(88) ? 0 : int(1 + r.below(3));
    p.struct_size = kind == 0 ? kOurs : kind == 1 ? r.pick(older) : kind == 2 ? r.pick(newer) : r.pick(bad_sizes);
    fill_past_struct_size(r, &c, kEndV0_1, kKnownEnd);
    return c;
}

uint32_t float_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

void print_params(const CallerParams &c) {
    const flashcore_forward_params &p = c.p;
    std::fprintf(stderr,
                 "  struct_size %zu (ours %zu) dtype %d B %d Sq %d Sk %d Hq %d Hkv %d D %d Dv %d causal %d scale %g "
                 "(0x%08x) splits %d\n"
                 "  use_window %d window_left %d window_right %d softcap %g (0x%08x)\n"
                 "  q %p k %p v %p out %p lse %p seqused_k %p\n"
                 "  cu_seqlens_q %p cu_seqlens_k %p total_seqlen_q %d total_seqlen_k %d\n"
                 "  block_table %p block_table_batch_stride %" PRId64 " page_size %d num_pages %d\n"
                 "  attention_chunk %d sinks %p sm_margin %d\n",
                 p.struct_size, sizeof p, p.dtype, p.batch_size, p.seqlen_q, p.seqlen_k, p.num_heads_q,
                 p.num_heads_kv, p.head_dim, p.head_dim_v, p.causal, double(p.softmax_scale),
                 float_bits(p.softmax_scale), p.num_splits, p.use_window, p.window_left, p.window_right,
                 double(p.softcap), float_bits(p.softcap), p.q, p.k, p.v, p.out, static_cast<void *>(p.lse),
                 static_cast<const void *>(p.seqused_k),
                 static_cast<const void *>(p.cu_seqlens_q), static_cast<const void *>(p.cu_seqlens_k),
                 p.total_seqlen_q, p.total_seqlen_k, static_cast<const void *>(p.block_table),
                 p.block_table_batch_stride, p.page_size, p.num_pages, p.attention_chunk,
                 static_cast<const void *>(p.sinks), p.sm_margin);
    std::fprintf(stderr,
                 "  kv_dtype %d out_dtype %d q_descale %p (%" PRId64 " %" PRId64 ") k_descale %p (%" PRId64 " %" PRId64
                 ") v_descale %p (%" PRId64 " %" PRId64 ") (pointer, batch and head strides)\n",
                 p.kv_dtype, p.out_dtype, static_cast<const void *>(p.q_descale), p.q_descale_batch_stride,
                 p.q_descale_head_stride, static_cast<const void *>(p.k_descale), p.k_descale_batch_stride,
                 p.k_descale_head_stride, static_cast<const void *>(p.v_descale), p.v_descale_batch_stride,
                 p.v_descale_head_stride);
    std::fprintf(stderr, "  bytes after ours:");
    for (unsigned char b : c.newer) std::fprintf(stderr, " %02x", b);
    std::fprintf(stderr, "\n");
    std::fprintf(stderr,
                 "  strides q %" PRId64 " %" PRId64 " %" PRId64 "  k %" PRId64 " %" PRId64 " %" PRId64 "  v %" PRId64
                 " %" PRId64 " %" PRId64 "  out %" PRId64 " %" PRId64 " %" PRId64 " (batch seq head)\n",
                 p.q_batch_stride, p.q_seq_stride, p.q_head_stride, p.k_batch_stride, p.k_seq_stride, p.k_head_stride,
                 p.v_batch_stride, p.v_seq_stride, p.v_head_stride, p.out_batch_stride, p.out_seq_stride,
                 p.out_head_stride);
}

// Whether a check's result agrees with the model: one of the statuses it
// allows (or SUCCESS when it allows none; INVALID_ARGUMENT too where it could
// not tell self-overlap), a message exactly when it failed, its input
// unchanged. On disagreement, prints what was returned and allowed.
bool agrees(const Expected &e, flashcore_status got, const std::string &message, bool input_unchanged,
            const char *function, uint64_t call) {
    bool ok = input_unchanged;
    const bool open_refusal = e.maybe.count(int(got)) == 1 || (e.unsure && got == FLASHCORE_STATUS_INVALID_ARGUMENT);
    if (e.statuses.empty()) {
        ok &= got == FLASHCORE_STATUS_SUCCESS || open_refusal;
    } else {
        ok &= e.statuses.count(int(got)) == 1 || open_refusal;
    }
    ok &= (got == FLASHCORE_STATUS_SUCCESS) == message.empty();
    if (!ok) {
        std::string allowed, maybe;
        for (int st : e.statuses) allowed += std::string(allowed.empty() ? "" : ", ") + std::to_string(st);
        for (int st : e.maybe) maybe += std::string(maybe.empty() ? "" : ", ") + std::to_string(st);
        std::fprintf(stderr, "call %" PRIu64 ": %s returned %d (\"%s\"); the model allows {%s}%s%s%s%s\n", call,
                     function, int(got), message.c_str(), allowed.empty() ? "0" : allowed.c_str(),
                     maybe.empty() ? "" : " (or, flashcore.h leaving it open, {", maybe.c_str(),
                     maybe.empty() ? "" : "})",
                     e.unsure ? " (or 1: self-overlap not modelled at this size)" : "");
        if (!input_unchanged) std::fprintf(stderr, "  it wrote its const input\n");
    }
    return ok;
}

// The check again on a copy of the caller's struct in a heap block of
// exactly struct_size bytes (at least the struct_size field itself, which
// every call reads first; sizes past the caller's buffer are not copied):
// a read past what the caller declared faults under ASan, where the
// buffers above have room after the struct. Whether it returns `expected`.
template <typename Params>
bool same_from_exact_block(flashcore_status (*check)(const Params *), const void *caller, size_t caller_bytes,
                           flashcore_status expected, const char *function, uint64_t call) {
    size_t size = 0;
    std::memcpy(&size, caller, sizeof size);
    if (size > caller_bytes) return true;
    const size_t bytes = std::max(size, sizeof size);
    void *block = std::malloc(bytes);
    if (block == nullptr) return true;
    std::memcpy(block, caller, bytes);
    const flashcore_status got = check(static_cast<const Params *>(block));
    std::free(block);
    if (got == expected) return true;
    std::fprintf(stderr, "call %" PRIu64 ": %s of a struct in an exactly-sized block (%zu bytes) returned %d, not %d\n",
                 call, function, size, int(got), int(expected));
    return false;
}

// Whether flashcore_forward_check agrees with the model; *got: its status.
bool check_forward(const CallerParams &c, uint64_t call, flashcore_status *got_out) {
    CallerParams copy = c;
    const flashcore_status got = flashcore_forward_check(&copy.p);
    *got_out = got;
    bool ok = agrees(model_check(c), got, flashcore_last_error_message(), std::memcmp(&copy, &c, sizeof c) == 0,
                     "flashcore_forward_check", call);
    ok = ok && same_from_exact_block(flashcore_forward_check, &c, sizeof c, got, "flashcore_forward_check", call);
    if (!ok) print_params(c);
    return ok;
}

// The merge's rules (flashcore.h, "Merging partial attention results"),
// as the model of what flashcore_merge_check returns.
int32_t merge_element_bytes(int32_t dtype) { return dtype == FLASHCORE_DTYPE_FP32 ? 4 : 2; }

struct MergeTensor {
    const void *ptr;
    int32_t element_bytes;
    i128 extents[4];   // batch, seqlen, heads, states (1 for out)
    int64_t strides[4];
    i128 dim;
};

i128 merge_last_offset(const MergeTensor &t) {
    i128 last = t.dim - 1;
    for (int i = 0; i < 4; ++i) last += (t.extents[i] - 1) * t.strides[i];
    return last;
}

// Where the struct of 0.3 to 0.8 ended (it first appeared in 0.3), and
// where the last field of this header (sinks, 0.9) ends.
constexpr size_t kMergeEndV0_3 =
    offsetof(flashcore_merge_params, out_head_stride) + sizeof(flashcore_merge_params::out_head_stride);
constexpr size_t kMergeReleasedEnds[] = {kMergeEndV0_3};
constexpr size_t kMergeKnownEnd = offsetof(flashcore_merge_params, sinks) + sizeof(flashcore_merge_params::sinks);

Expected model_merge_check(const MergeCaller &caller) {
    Expected e;
    if (!released_size<flashcore_merge_params>(caller.p.struct_size, kMergeReleasedEnds)) {
        e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        return e;  // nothing else is read
    }
    if (sets_newer(caller, kMergeKnownEnd)) {
        e.add(FLASHCORE_STATUS_UNSUPPORTED);
        return e;  // nor is anything read
    }
    flashcore_merge_params p = caller.p;
    if (p.struct_size < kMergeKnownEnd) p.sinks = nullptr;  // an older caller's: none
    const auto dtype_ok = [](int32_t d) {
        return d == FLASHCORE_DTYPE_FP16 || d == FLASHCORE_DTYPE_BF16 || d == FLASHCORE_DTYPE_FP32;
    };
    if (!dtype_ok(p.partial_dtype) || !dtype_ok(p.out_dtype)) e.add(FLASHCORE_STATUS_UNSUPPORTED);
    // num_states 1 .. FLASHCORE_MERGE_MAX_NUM_STATES, head_dim 8 ..
    // FLASHCORE_MERGE_MAX_HEAD_DIM and a multiple of 8 (UNSUPPORTED, as the
    // forward's head_dim; one of 1 .. 7 breaks both).
    if (p.num_states < 1 || p.num_states > FLASHCORE_MERGE_MAX_NUM_STATES || p.batch_size < 0 || p.num_heads < 0 ||
        p.seqlen < 0 || p.head_dim < 8 || p.head_dim > FLASHCORE_MERGE_MAX_HEAD_DIM)
        e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    if (p.head_dim >= 1 && p.head_dim % 8 != 0) e.add(FLASHCORE_STATUS_UNSUPPORTED);
    const bool empty = p.batch_size == 0 || p.num_heads == 0 || p.seqlen == 0;
    if (empty || !e.statuses.empty()) return e;  // an empty merge's pointers and strides are not looked at

    const MergeTensor tensors[] = {
        {p.partial_out, merge_element_bytes(p.partial_dtype), {p.batch_size, p.seqlen, p.num_heads, p.num_states},
         {p.partial_batch_stride, p.partial_seq_stride, p.partial_head_stride, p.partial_state_stride}, p.head_dim},
        {p.out, merge_element_bytes(p.out_dtype), {p.batch_size, p.seqlen, p.num_heads, 1},
         {p.out_batch_stride, p.out_seq_stride, p.out_head_stride, 0}, p.head_dim},
    };
    for (const MergeTensor &t : tensors) {
        bool ok = t.ptr != nullptr;
        if (t.ptr == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (reinterpret_cast<uintptr_t>(t.ptr) % FLASHCORE_ALIGNMENT != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
        for (int64_t st : t.strides) {
            if (st < 0) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
            if (st % (FLASHCORE_ALIGNMENT / t.element_bytes) != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
            ok &= st >= 0;
        }
        if (ok && merge_last_offset(t) * t.element_bytes > i128(INT64_MAX)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    }
    if (!e.statuses.empty()) return e;
    const Tensor out_rows{"out", p.out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                          p.out_batch_stride, p.out_seq_stride, p.out_head_stride};
    const int overlap = self_overlap(out_rows);
    if (overlap == 1) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    e.unsure = overlap < 0;

    if (p.partial_lse == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    if (reinterpret_cast<uintptr_t>(p.partial_lse) % 4 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
    const struct {
        int64_t stride;
        i128 extent;
    } lse_dims[] = {{p.lse_state_stride, p.num_states},
                    {p.lse_batch_stride, p.batch_size},
                    {p.lse_head_stride, p.num_heads},
                    {p.lse_seq_stride, p.seqlen}};
    i128 last_lse = 0;
    bool lse_ok = p.partial_lse != nullptr;
    for (const auto &d : lse_dims) {
        if (d.stride < 0) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        lse_ok &= d.stride >= 0;
        last_lse += (d.extent - 1) * d.stride;
    }
    if (lse_ok && last_lse * 4 > i128(INT64_MAX)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    if (p.lse != nullptr && reinterpret_cast<uintptr_t>(p.lse) % 4 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
    if (p.sinks != nullptr && reinterpret_cast<uintptr_t>(p.sinks) % 4 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
    if (!e.statuses.empty() || !lse_ok) return e;

    // Aliasing: out and lse against everything, as byte ranges.
    std::vector<Range> ranges;
    for (int i = 0; i < 2; ++i) {
        const i128 begin = i128(reinterpret_cast<uintptr_t>(tensors[i].ptr));
        ranges.push_back({begin, begin + (merge_last_offset(tensors[i]) + 1) * tensors[i].element_bytes, i == 1});
    }
    const i128 lse_begin = i128(reinterpret_cast<uintptr_t>(p.partial_lse));
    ranges.push_back({lse_begin, lse_begin + (last_lse + 1) * 4, false});
    if (p.lse != nullptr) {
        const i128 begin = i128(reinterpret_cast<uintptr_t>(p.lse));
        ranges.push_back({begin, begin + i128(p.batch_size) * p.num_heads * p.seqlen * 4, true});
    }
    if (p.sinks != nullptr) {  // read: num_heads floats
        const i128 begin = i128(reinterpret_cast<uintptr_t>(p.sinks));
        ranges.push_back({begin, begin + i128(p.num_heads) * 4, false});
    }
    if (written_overlap(ranges)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    return e;
}

// Packed strides (in elements) of [outer..., inner] extents, inner first;
// false where they would not fit int64_t.
bool packed_strides(std::initializer_list<i128> inner_to_outer, int64_t *strides) {
    i128 stride = 1;
    int i = 0;
    for (i128 extent : inner_to_outer) {
        if (stride > i128(INT64_MAX)) return false;
        strides[i++] = int64_t(stride);
        stride *= std::max<i128>(extent, 1);
    }
    return true;
}

MergeCaller random_merge_params(Rng &r) {
    MergeCaller c;
    std::memset(c.newer, 0xAB, sizeof c.newer);
    flashcore_merge_params &p = c.p;
    flashcore_merge_params_init(&p, sizeof p);
    const int32_t bad_dtypes[] = {0, 4, 7, -1, INT32_MIN};
    p.partial_dtype = r.chance(93) ? int32_t(1 + r.below(3)) : r.pick(bad_dtypes);
    p.out_dtype = r.chance(93) ? int32_t(1 + r.below(3)) : r.pick(bad_dtypes);
    const int32_t states[] = {FLASHCORE_MERGE_MAX_NUM_STATES, FLASHCORE_MERGE_MAX_NUM_STATES + 1};
    p.num_states = r.chance(90) ? int32_t(1 + r.below(5)) : r.chance(80) ? random_size(r) : r.pick(states);
    p.batch_size = random_size(r);
    p.num_heads = random_size(r);
    p.seqlen = random_size(r);
    const int32_t dims[] = {8, 16, 64, 128, 256, 0, -8, 12, 60, INT32_MAX, 4, FLASHCORE_MERGE_MAX_HEAD_DIM,
                            FLASHCORE_MERGE_MAX_HEAD_DIM + 8};
    p.head_dim = r.chance(85) ? int32_t(8 * (1 + r.below(32))) : r.pick(dims);
    // Packed [state][batch][head][seq][dim] partials and [batch][head][seq][dim]
    // output, LSE [state][batch][head][seq]; then some strides perturbed.
    int64_t ps[5] = {}, os[4] = {}, ls[4] = {};
    const i128 d = p.head_dim, s = p.seqlen, h = p.num_heads, b = p.batch_size;
    if (packed_strides({d, s, h, b, p.num_states}, ps)) {
        p.partial_seq_stride = ps[1], p.partial_head_stride = ps[2], p.partial_batch_stride = ps[3];
        p.partial_state_stride = ps[4];
    }
    if (packed_strides({d, s, h, b}, os)) {
        p.out_seq_stride = os[1], p.out_head_stride = os[2], p.out_batch_stride = os[3];
    }
    if (packed_strides({s, h, b, p.num_states}, ls)) {
        p.lse_seq_stride = ls[0], p.lse_head_stride = ls[1], p.lse_batch_stride = ls[2], p.lse_state_stride = ls[3];
    }
    for (int64_t *st : {&p.partial_state_stride, &p.partial_batch_stride, &p.partial_seq_stride,
                        &p.partial_head_stride, &p.out_batch_stride, &p.out_seq_stride, &p.out_head_stride})
        if (r.chance(4)) *st = random_stride(r, *st);
    for (int64_t *st : {&p.lse_state_stride, &p.lse_batch_stride, &p.lse_seq_stride, &p.lse_head_stride}) {
        if (r.chance(3)) {
            const int64_t edges[] = {0, -1, 1, 3, int64_t(1) << 61, INT64_MAX, INT64_MIN};
            *st = r.pick(edges);
        }
    }
    std::vector<uintptr_t> placed;
    p.partial_out = random_pointer(r, 0, placed);
    placed.push_back(reinterpret_cast<uintptr_t>(p.partial_out));
    const void *partial_lse = random_pointer(r, 1, placed);
    if (r.chance(5)) partial_lse = static_cast<const char *>(partial_lse) + 4;  // 4-byte aligned: fine
    p.partial_lse = static_cast<const float *>(partial_lse);
    placed.push_back(reinterpret_cast<uintptr_t>(p.partial_lse));
    p.out = const_cast<void *>(random_pointer(r, 2, placed));
    placed.push_back(reinterpret_cast<uintptr_t>(p.out));
    if (r.chance(60)) {
        p.lse = static_cast<float *>(const_cast<void *>(random_pointer(r, 3, placed)));
        placed.push_back(reinterpret_cast<uintptr_t>(p.lse));
    }
    // Sinks (0.9): mostly none; else num_heads floats (random_array), now
    // and then ending where out or lse begins, or one float into it.
    if (r.chance(30)) p.sinks = random_array<float>(r, 4, placed, r.chance(50) ? p.lse : p.out, p.num_heads);
    // Sizes: ours, 0.3's (its sinks garbage), a newer header's (its fields
    // zero, or one byte set), or of no header's.
    constexpr size_t kOurs = sizeof(flashcore_merge_params);
    const size_t older[] = {kMergeEndV0_3, padded<flashcore_merge_params>(kMergeEndV0_3)};
    const size_t newer[] = {kOurs + 4, kOurs + 8, kOurs + kNewerBytes};
    const size_t bad_sizes[] = {0, 12, kMergeEndV0_3 - 1, kMergeEndV0_3 + 4, kOurs - 1, kMaxStructSize + 1,
                                size_t(1) << 40};
    const int kind = r.chance(88) ? 0 : int(1 + r.below(3));
    p.struct_size = kind == 0 ? kOurs : kind == 1 ? r.pick(older) : kind == 2 ? r.pick(newer) : r.pick(bad_sizes);
    fill_past_struct_size(r, &c, kMergeEndV0_3, kMergeKnownEnd);
    return c;
}

bool check_merge(const MergeCaller &c, uint64_t call, flashcore_status *got_out) {
    const flashcore_merge_params &p = c.p;
    MergeCaller copy = c;
    const flashcore_status got = flashcore_merge_check(&copy.p);
    *got_out = got;
    bool ok = agrees(model_merge_check(c), got, flashcore_last_error_message(),
                     std::memcmp(&copy, &c, sizeof c) == 0, "flashcore_merge_check", call);
    ok = ok && same_from_exact_block(flashcore_merge_check, &c, sizeof c, got, "flashcore_merge_check", call);
    if (!ok) {
        std::fprintf(stderr,
                     "  struct_size %zu (ours %zu) dtypes %d -> %d states %d B %d H %d S %d D %d\n"
                     "  partial_out %p partial_lse %p out %p lse %p sinks %p\n"
                     "  partial strides %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " (state batch seq head)"
                     "  lse %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "  out %" PRId64 " %" PRId64 " %" PRId64
                     "\n",
                     p.struct_size, sizeof p, p.partial_dtype, p.out_dtype, p.num_states, p.batch_size, p.num_heads,
                     p.seqlen, p.head_dim, p.partial_out, static_cast<const void *>(p.partial_lse), p.out,
                     static_cast<void *>(p.lse), static_cast<const void *>(p.sinks), p.partial_state_stride,
                     p.partial_batch_stride, p.partial_seq_stride, p.partial_head_stride, p.lse_state_stride,
                     p.lse_batch_stride, p.lse_seq_stride, p.lse_head_stride, p.out_batch_stride, p.out_seq_stride,
                     p.out_head_stride);
    }
    return ok;
}

// A tensor's shape and the strides a stride helper wrote for it.
struct WrittenStrides {
    i128 s, h, dim;
    int64_t batch, seq, head;
    i128 element_bytes = 2;  // 1: an fp8 cache's k or v
};

// Whether a packed tensor of each shape fits 2^63 bytes, as the stride
// helpers require.
template <size_t N>
bool packed_fit(const WrittenStrides (&tensors)[N], int32_t batch_size) {
    for (const WrittenStrides &w : tensors)
        if (w.h * w.s * w.dim * std::max<i128>(batch_size, 1) * w.element_bytes > i128(INT64_MAX)) return false;
    return true;
}

// Whether every tensor got the packed strides of `layout` (0: BHSD, 1: BSHD).
template <size_t N>
bool packed_written(const WrittenStrides (&tensors)[N], int layout) {
    bool ok = true;
    for (const WrittenStrides &w : tensors) {
        const i128 seq = layout == 0 ? w.dim : w.h * w.dim, head = layout == 0 ? w.s * w.dim : w.dim;
        ok &= w.batch == int64_t(w.h * w.s * w.dim) && w.seq == int64_t(seq) && w.head == int64_t(head);
    }
    return ok;
}

// flashcore_set_contiguous_strides: the packed strides, or nothing written.
bool check_strides(const CallerParams &caller, int layout, uint64_t call) {
    const flashcore_forward_params &in = caller.p;
    CallerParams written = caller;
    flashcore_forward_params &p = written.p;
    const flashcore_status got = set_contiguous_strides_of_int(&p, layout);
    // The layout, then the struct's size, then a newer header's fields
    // (UNSUPPORTED), then the sizes the strides are products of.
    bool expect_ok = (layout == 0 || layout == 1) && struct_size_ok(in.struct_size);
    const bool refused_as_newer = expect_ok && sets_newer_fields(caller);
    expect_ok &= !refused_as_newer;
    const int32_t dv_raw = in.struct_size < kEndV0_2 ? 0 : in.head_dim_v;
    // Empty as for flashcore_forward_check: packed queries of no rows too.
    const bool has_0_6_fields = in.struct_size >= kEndV0_6;
    const bool empty = in.batch_size == 0 || in.seqlen_q == 0 || in.num_heads_q == 0 ||
                       (has_0_6_fields && in.cu_seqlens_q != nullptr && in.total_seqlen_q == 0);
    for (int32_t v : {in.batch_size, in.seqlen_q, in.seqlen_k, in.num_heads_q, in.num_heads_kv}) expect_ok &= v >= 0;
    expect_ok &= in.head_dim >= 1 && dv_raw >= 0 && !(in.num_heads_kv == 0 && in.num_heads_q != 0) &&
                 !(in.seqlen_k == 0 && !empty);
    const i128 d = in.head_dim, dv = dv_raw == 0 ? in.head_dim : dv_raw;
    const WrittenStrides want[] = {
        {in.seqlen_q, in.num_heads_q, d, p.q_batch_stride, p.q_seq_stride, p.q_head_stride},
        {in.seqlen_k, in.num_heads_kv, d, p.k_batch_stride, p.k_seq_stride, p.k_head_stride},
        {in.seqlen_k, in.num_heads_kv, dv, p.v_batch_stride, p.v_seq_stride, p.v_head_stride},
        {in.seqlen_q, in.num_heads_q, dv, p.out_batch_stride, p.out_seq_stride, p.out_head_stride}};
    const bool fits = packed_fit(want, in.batch_size);
    // An fp8 cache's k and v take a byte an element: where that decides
    // whether they fit, either answer (flashcore.h says the helper reads the
    // sizes, and does not say whether kv_dtype counts).
    bool fits_as_fp8 = fits;
    if (in.struct_size >= kEndV0_8 && in.kv_dtype == FLASHCORE_DTYPE_FP8_E4M3) {
        WrittenStrides narrow[std::size(want)];
        std::copy(std::begin(want), std::end(want), narrow);
        narrow[1].element_bytes = narrow[2].element_bytes = 1;
        fits_as_fp8 = packed_fit(narrow, in.batch_size);
    }
    const bool either = expect_ok && fits != fits_as_fp8;
    expect_ok &= fits;
    bool ok = true;
    if ((expect_ok || either) && got == FLASHCORE_STATUS_SUCCESS) {
        ok &= packed_written(want, layout);
    } else {
        const flashcore_status refused =
            refused_as_newer ? FLASHCORE_STATUS_UNSUPPORTED : FLASHCORE_STATUS_INVALID_ARGUMENT;
        ok &= (!expect_ok || either) && got == refused && std::memcmp(&written, &caller, sizeof caller) == 0;
    }
    if (!ok) {
        std::fprintf(stderr, "call %" PRIu64 ": flashcore_set_contiguous_strides(layout %d) returned %d (\"%s\"), "
                     "the model expects %s\n", call, layout, int(got), flashcore_last_error_message(),
                     expect_ok          ? "the packed strides"
                     : refused_as_newer ? "UNSUPPORTED and nothing written"
                                        : "INVALID_ARGUMENT and nothing written");
        print_params(caller);
    }
    return ok;
}

// ---------------------------------------------------------------------------
// flashcore_backward_params (0.7): the same options, eight tensors.
// ---------------------------------------------------------------------------

// Where the struct of 0.7 and 0.8 ended (it first appeared in 0.7), and
// where the last field of this header (dsinks, 0.9) ends.
constexpr size_t kBackwardEndV0_7 =
    offsetof(flashcore_backward_params, total_seqlen_k) + sizeof(flashcore_backward_params::total_seqlen_k);
constexpr size_t kBackwardReleasedEnds[] = {kBackwardEndV0_7};
constexpr size_t kBackwardKnownEnd =
    offsetof(flashcore_backward_params, sm_margin) + sizeof(flashcore_backward_params::sm_margin);

bool backward_struct_size_ok(size_t size) {
    return released_size<flashcore_backward_params>(size, kBackwardReleasedEnds);
}

bool sets_newer_backward_fields(const BackwardCaller &c) { return sets_newer(c, kBackwardKnownEnd); }

// The backward struct as the library reads it: the 0.9 fields of a 0.7 or
// 0.8 caller's at their defaults.
flashcore_backward_params backward_as_read(const flashcore_backward_params &in) {
    flashcore_backward_params p = in;
    if (p.struct_size < kBackwardKnownEnd) {
        p.attention_chunk = 0;
        p.sinks = nullptr;
        p.dsinks = nullptr;
        p.sm_margin = 0;
    }
    return p;
}

// flashcore.h: batch_size or num_heads_q 0; a call without query rows is
// not empty (it writes dk and dv).
bool backward_empty(const flashcore_backward_params &p) { return p.batch_size == 0 || p.num_heads_q == 0; }

// The forward call a backward call is the gradient of: its sizes and
// options, as the shape rules see them.
flashcore_forward_params forward_of(const flashcore_backward_params &b) {
    flashcore_forward_params f;
    flashcore_forward_params_init(&f, sizeof f);
    f.dtype = b.dtype;
    f.batch_size = b.batch_size;
    f.seqlen_q = b.seqlen_q;
    f.seqlen_k = b.seqlen_k;
    f.num_heads_q = b.num_heads_q;
    f.num_heads_kv = b.num_heads_kv;
    f.head_dim = b.head_dim;
    f.head_dim_v = b.head_dim_v;
    f.causal = b.causal;
    f.softmax_scale = b.softmax_scale;
    f.use_window = b.use_window;
    f.window_left = b.window_left;
    f.window_right = b.window_right;
    f.softcap = b.softcap;
    f.seqused_k = b.seqused_k;
    f.cu_seqlens_q = b.cu_seqlens_q;
    f.cu_seqlens_k = b.cu_seqlens_k;
    f.total_seqlen_q = b.total_seqlen_q;
    f.total_seqlen_k = b.total_seqlen_k;
    f.attention_chunk = b.attention_chunk;
    f.sm_margin = b.sm_margin;
    return f;
}

// The backward call's eight tensors, the gradients last.
constexpr int kBackwardTensors = 8, kFirstGradient = 5;
void backward_tensors(const flashcore_backward_params &p, Tensor *t) {
    const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
    const i128 qb = packed_q ? 1 : p.batch_size, qr = packed_q ? p.total_seqlen_q : p.seqlen_q;
    const i128 kb = packed_k ? 1 : p.batch_size, kr = packed_k ? p.total_seqlen_k : p.seqlen_k;
    const i128 d = p.head_dim, dv = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    const auto bq = [&](int64_t s) { return packed_q ? 0 : s; };
    const auto bk = [&](int64_t s) { return packed_k ? 0 : s; };
    t[0] = {"q", p.q, qb, qr, p.num_heads_q, d, bq(p.q_batch_stride), p.q_seq_stride, p.q_head_stride};
    t[1] = {"k", p.k, kb, kr, p.num_heads_kv, d, bk(p.k_batch_stride), p.k_seq_stride, p.k_head_stride};
    t[2] = {"v", p.v, kb, kr, p.num_heads_kv, dv, bk(p.v_batch_stride), p.v_seq_stride, p.v_head_stride};
    t[3] = {"out", p.out, qb, qr, p.num_heads_q, dv, bq(p.out_batch_stride), p.out_seq_stride, p.out_head_stride};
    t[4] = {"dout", p.dout, qb, qr, p.num_heads_q, dv, bq(p.dout_batch_stride), p.dout_seq_stride,
            p.dout_head_stride};
    t[5] = {"dq", p.dq, qb, qr, p.num_heads_q, d, bq(p.dq_batch_stride), p.dq_seq_stride, p.dq_head_stride};
    t[6] = {"dk", p.dk, kb, kr, p.num_heads_kv, d, bk(p.dk_batch_stride), p.dk_seq_stride, p.dk_head_stride};
    t[7] = {"dv", p.dv, kb, kr, p.num_heads_kv, dv, bk(p.dv_batch_stride), p.dv_seq_stride, p.dv_head_stride};
}

// The model: what flashcore.h says flashcore_backward_check returns.
Expected model_backward_check(const BackwardCaller &caller) {
    const flashcore_backward_params p = backward_as_read(caller.p);
    Expected e;
    if (!backward_struct_size_ok(p.struct_size)) {
        e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        return e;
    }
    if (sets_newer_backward_fields(caller)) {
        e.add(FLASHCORE_STATUS_UNSUPPORTED);
        return e;
    }
    // The forward's rules, with the backward's emptiness: a call without
    // query rows still needs its keys; its head dims are the backward
    // kernels' (every forward pair up to 512). fp8 queries have no backward
    // pass.
    const bool empty = backward_empty(p);
    model_shapes(forward_of(p), empty, &e, true);
    if (p.dtype == FLASHCORE_DTYPE_FP8_E4M3) e.add(FLASHCORE_STATUS_UNSUPPORTED);
    if (empty || !e.statuses.empty()) return e;

    // Tensors of no rows (the query side of a call without queries) are
    // not looked at; lse is required where it has entries.
    Tensor tensors[kBackwardTensors];
    backward_tensors(p, tensors);
    const auto has_elements = [](const Tensor &t) { return t.batch > 0 && t.seqlen > 0 && t.heads > 0; };
    bool tensors_ok = true;
    for (const Tensor &t : tensors) {
        if (!has_elements(t)) continue;
        if (t.ptr == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        if (reinterpret_cast<uintptr_t>(t.ptr) % 16 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
        bool ok = t.ptr != nullptr;
        for (int64_t st : {t.bs, t.ss, t.hs}) {
            if (st < 0) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
            if (st % 8 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
            ok &= st >= 0;
        }
        if (ok && last_offset(t) * 2 > i128(INT64_MAX)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        tensors_ok &= ok;
    }
    if (!tensors_ok || !e.statuses.empty()) return e;  // the library stops at the first tensor's problem
    for (int i = kFirstGradient; i < kBackwardTensors; ++i) {
        if (!has_elements(tensors[i])) continue;
        const int overlap = self_overlap(tensors[i]);
        if (overlap == 1) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
        e.unsure |= overlap < 0;
    }
    const bool packed_q = p.cu_seqlens_q != nullptr;
    const i128 lse_entries =
        (packed_q ? i128(p.total_seqlen_q) : i128(p.batch_size) * p.seqlen_q) * p.num_heads_q;
    if (lse_entries > 0 && p.lse == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    // The arrays, each 4-byte aligned: lse, the sinks and their gradient
    // (0.9: num_heads_q floats each; dsinks written, and only with sinks)
    // and the int32 arrays.
    if (p.dsinks != nullptr && p.sinks == nullptr) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    const struct {
        const void *ptr;
        i128 bytes;
        bool written;
    } arrays[] = {
        {lse_entries > 0 ? p.lse : nullptr, lse_entries * 4, false},
        {p.sinks, i128(p.num_heads_q) * 4, false},
        {p.dsinks, i128(p.num_heads_q) * 4, true},
        {p.seqused_k, i128(p.batch_size) * 4, false},
        {p.cu_seqlens_q, (i128(p.batch_size) + 1) * 4, false},
        {p.cu_seqlens_k, (i128(p.batch_size) + 1) * 4, false},
    };
    for (const auto &a : arrays)
        if (a.ptr != nullptr && reinterpret_cast<uintptr_t>(a.ptr) % 4 != 0) e.add(FLASHCORE_STATUS_MISALIGNED);
    if (!e.statuses.empty()) return e;
    // Aliasing: the gradients against everything, as byte ranges; the
    // inputs (lse among them) may share memory.
    std::vector<Range> ranges;
    for (int i = 0; i < kBackwardTensors; ++i) {
        if (!has_elements(tensors[i])) continue;
        const i128 begin = i128(reinterpret_cast<uintptr_t>(tensors[i].ptr));
        ranges.push_back({begin, begin + (last_offset(tensors[i]) + 1) * 2, i >= kFirstGradient});
    }
    for (const auto &a : arrays) {
        if (a.ptr == nullptr) continue;
        const i128 begin = i128(reinterpret_cast<uintptr_t>(a.ptr));
        ranges.push_back({begin, begin + a.bytes, a.written});
    }
    if (written_overlap(ranges)) e.add(FLASHCORE_STATUS_INVALID_ARGUMENT);
    return e;
}

// Random backward parameters: the forward's random options and shapes
// (random_params), then eight tensors of their own, mostly apart, now and
// then on top of one another, NULL or misaligned; lse mostly given.
BackwardCaller random_backward_params(Rng &r) {
    const CallerParams forward = random_params(r);
    const flashcore_forward_params &f = forward.p;
    BackwardCaller c;
    std::memset(c.newer, 0xAB, sizeof c.newer);
    flashcore_backward_params &p = c.p;
    flashcore_backward_params_init(&p, sizeof p);
    p.dtype = f.dtype;
    p.batch_size = f.batch_size;
    p.seqlen_q = r.chance(10) ? 0 : f.seqlen_q;  // calls without query rows: not empty here
    p.seqlen_k = f.seqlen_k;
    p.num_heads_q = f.num_heads_q;
    p.num_heads_kv = f.num_heads_kv;
    p.head_dim = f.head_dim;
    p.head_dim_v = f.struct_size >= kEndV0_2 ? f.head_dim_v : 0;
    p.causal = f.causal;
    p.softmax_scale = f.softmax_scale;
    if (f.struct_size >= kEndV0_4) {
        p.use_window = f.use_window;
        p.window_left = f.window_left;
        p.window_right = f.window_right;
        p.softcap = f.softcap;
    }
    const int32_t deterministic[] = {0, 1, -1, INT32_MAX};
    p.deterministic = r.pick(deterministic);
    p.attention_chunk = random_chunk(r);
    p.sm_margin = random_sm_margin(r);
    const bool packed_q = r.chance(20), packed_k = r.chance(15);
    p.total_seqlen_q = packed_q || r.chance(3) ? random_rows(r) : 0;
    p.total_seqlen_k = packed_k || r.chance(3) ? random_rows(r) : 0;
    // Strides: packed in a random layout (packed tensors as one batch of
    // their rows), then some perturbed.
    const int layout = int(r.below(2));
    flashcore_backward_params packed = p;
    if (flashcore_backward_set_contiguous_strides(&packed, flashcore_layout(layout)) == FLASHCORE_STATUS_SUCCESS) {
        p = packed;
    }
    if (packed_q || packed_k) {
        flashcore_backward_params rows = p;
        rows.batch_size = 1;
        if (packed_q) rows.seqlen_q = p.total_seqlen_q;
        if (packed_k) rows.seqlen_k = p.total_seqlen_k;
        if (flashcore_backward_set_contiguous_strides(&rows, flashcore_layout(layout)) == FLASHCORE_STATUS_SUCCESS) {
            if (packed_q) {
                p.q_seq_stride = rows.q_seq_stride, p.q_head_stride = rows.q_head_stride;
                p.out_seq_stride = rows.out_seq_stride, p.out_head_stride = rows.out_head_stride;
                p.dout_seq_stride = rows.dout_seq_stride, p.dout_head_stride = rows.dout_head_stride;
                p.dq_seq_stride = rows.dq_seq_stride, p.dq_head_stride = rows.dq_head_stride;
            }
            if (packed_k) {
                p.k_seq_stride = rows.k_seq_stride, p.k_head_stride = rows.k_head_stride;
                p.v_seq_stride = rows.v_seq_stride, p.v_head_stride = rows.v_head_stride;
                p.dk_seq_stride = rows.dk_seq_stride, p.dk_head_stride = rows.dk_head_stride;
                p.dv_seq_stride = rows.dv_seq_stride, p.dv_head_stride = rows.dv_head_stride;
            }
        }
    }
    for (int64_t *st :
         {&p.q_batch_stride, &p.q_seq_stride, &p.q_head_stride, &p.k_batch_stride, &p.k_seq_stride, &p.k_head_stride,
          &p.v_batch_stride, &p.v_seq_stride, &p.v_head_stride, &p.out_batch_stride, &p.out_seq_stride,
          &p.out_head_stride, &p.dout_batch_stride, &p.dout_seq_stride, &p.dout_head_stride, &p.dq_batch_stride,
          &p.dq_seq_stride, &p.dq_head_stride, &p.dk_batch_stride, &p.dk_seq_stride, &p.dk_head_stride,
          &p.dv_batch_stride, &p.dv_seq_stride, &p.dv_head_stride})
        if (r.chance(3)) *st = random_stride(r, *st);
    std::vector<uintptr_t> placed;
    const auto place = [&](int index) {
        const void *ptr = random_pointer(r, index, placed);
        placed.push_back(reinterpret_cast<uintptr_t>(ptr));
        return ptr;
    };
    p.q = place(0);
    p.k = place(1);
    p.v = place(2);
    p.out = place(3);
    p.dout = place(4);
    if (r.chance(95)) {
        const void *lse = place(5);
        if (r.chance(5)) lse = static_cast<const char *>(lse) + 4;  // 4-byte aligned: fine for lse
        p.lse = static_cast<const float *>(lse);
    }
    p.dq = const_cast<void *>(place(6));
    p.dk = const_cast<void *>(place(7));
    p.dv = const_cast<void *>(place(8));
    if (r.chance(30)) p.seqused_k = random_array(r, 9, placed, p.dk, p.batch_size);
    if (packed_q) p.cu_seqlens_q = random_array(r, 10, placed, p.dq, i128(p.batch_size) + 1);
    if (packed_k) p.cu_seqlens_k = random_array(r, 11, placed, p.dv, i128(p.batch_size) + 1);
    // Sinks and their gradient (0.9): mostly neither; sinks as the
    // forward's, and with them mostly dsinks (num_heads_q floats, written:
    // apart, on top of another tensor, ending where dq, dk or sinks begins
    // or one float into it, NULL or misaligned); without them now and
    // then dsinks anyway (refused).
    if (r.chance(30)) p.sinks = random_array<float>(r, 12, placed, p.dk, p.num_heads_q);
    if (r.chance(p.sinks != nullptr ? 60 : 3)) {
        if (p.sinks != nullptr) placed.push_back(reinterpret_cast<uintptr_t>(p.sinks));
        const void *next_to[] = {p.dq, p.dk, p.sinks};
        p.dsinks = const_cast<float *>(random_array<float>(r, 13, placed, r.pick(next_to), p.num_heads_q));
    }
    // Sizes: ours, a released header's (0.7's, its 0.9 fields garbage), a
    // newer header's (its fields zero, or one byte set), or of no header's
    // (short of 0.7's, inside the 0.9 fields, past 64 KiB).
    constexpr size_t kOurs = sizeof(flashcore_backward_params);
    const size_t older[] = {kBackwardEndV0_7, padded<flashcore_backward_params>(kBackwardEndV0_7)};
    const size_t newer[] = {kOurs + 4, kOurs + 8, kOurs + kNewerBytes};
    const size_t bad_sizes[] = {0,
                                12,
                                offsetof(flashcore_backward_params, q),
                                kBackwardEndV0_7 - 4,
                                kBackwardEndV0_7 + 4,
                                offsetof(flashcore_backward_params, sinks),
                                offsetof(flashcore_backward_params, dsinks),
                                offsetof(flashcore_backward_params, sm_margin),
                                kBackwardKnownEnd,
                                kOurs - 1,
                                kMaxStructSize + 1,
                                size_t(1) << 40};
    const int kind = r.chance(88) ? 0 : int(1 + r.below(3));
    p.struct_size = kind == 0 ? kOurs : kind == 1 ? r.pick(older) : kind == 2 ? r.pick(newer) : r.pick(bad_sizes);
    fill_past_struct_size(r, &c, kBackwardEndV0_7, kBackwardKnownEnd);
    return c;
}

void print_backward_params(const BackwardCaller &c) {
    const flashcore_backward_params &p = c.p;
    std::fprintf(stderr,
                 "  struct_size %zu (ours %zu) dtype %d B %d Sq %d Sk %d Hq %d Hkv %d D %d Dv %d causal %d scale %g "
                 "(0x%08x) deterministic %d\n"
                 "  use_window %d window_left %d window_right %d softcap %g (0x%08x)\n"
                 "  q %p k %p v %p out %p dout %p lse %p dq %p dk %p dv %p\n"
                 "  seqused_k %p cu_seqlens_q %p cu_seqlens_k %p total_seqlen_q %d total_seqlen_k %d\n"
                 "  attention_chunk %d sinks %p dsinks %p sm_margin %d\n",
                 p.struct_size, sizeof p, p.dtype, p.batch_size, p.seqlen_q, p.seqlen_k, p.num_heads_q,
                 p.num_heads_kv, p.head_dim, p.head_dim_v, p.causal, double(p.softmax_scale),
                 float_bits(p.softmax_scale), p.deterministic, p.use_window, p.window_left, p.window_right,
                 double(p.softcap), float_bits(p.softcap), p.q, p.k, p.v, p.out, p.dout,
                 static_cast<const void *>(p.lse), p.dq, p.dk, p.dv, static_cast<const void *>(p.seqused_k),
                 static_cast<const void *>(p.cu_seqlens_q), static_cast<const void *>(p.cu_seqlens_k),
                 p.total_seqlen_q, p.total_seqlen_k, p.attention_chunk, static_cast<const void *>(p.sinks),
                 static_cast<void *>(p.dsinks), p.sm_margin);
    std::fprintf(stderr, "  bytes after ours:");
    for (unsigned char b : c.newer) std::fprintf(stderr, " %02x", b);
    std::fprintf(stderr, "\n  strides (batch seq head):");
    const struct {
        const char *name;
        int64_t b, s, h;
    } strides[] = {{"q", p.q_batch_stride, p.q_seq_stride, p.q_head_stride},
                   {"k", p.k_batch_stride, p.k_seq_stride, p.k_head_stride},
                   {"v", p.v_batch_stride, p.v_seq_stride, p.v_head_stride},
                   {"out", p.out_batch_stride, p.out_seq_stride, p.out_head_stride},
                   {"dout", p.dout_batch_stride, p.dout_seq_stride, p.dout_head_stride},
                   {"dq", p.dq_batch_stride, p.dq_seq_stride, p.dq_head_stride},
                   {"dk", p.dk_batch_stride, p.dk_seq_stride, p.dk_head_stride},
                   {"dv", p.dv_batch_stride, p.dv_seq_stride, p.dv_head_stride}};
    for (const auto &s : strides) std::fprintf(stderr, " %s %" PRId64 " %" PRId64 " %" PRId64, s.name, s.b, s.s, s.h);
    std::fprintf(stderr, "\n");
}

bool check_backward(const BackwardCaller &c, uint64_t call, flashcore_status *got_out) {
    BackwardCaller copy = c;
    const flashcore_status got = flashcore_backward_check(&copy.p);
    *got_out = got;
    bool ok = agrees(model_backward_check(c), got, flashcore_last_error_message(),
                     std::memcmp(&copy, &c, sizeof c) == 0, "flashcore_backward_check", call);
    ok = ok && same_from_exact_block(flashcore_backward_check, &c, sizeof c, got, "flashcore_backward_check", call);
    if (!ok) print_backward_params(c);
    return ok;
}

// flashcore_backward_set_contiguous_strides: the forward's packed strides
// for q, k, v, out and for dq, dk, dv, dout likewise, or nothing written.
bool check_backward_strides(const BackwardCaller &caller, int layout, uint64_t call) {
    const flashcore_backward_params &in = caller.p;
    BackwardCaller written = caller;
    flashcore_backward_params &p = written.p;
    // Layouts 0 and 1 only: an int outside the enumerators cannot be passed
    // from C++ (tests/enum_calls.c has no backward helper).
    const flashcore_status got = flashcore_backward_set_contiguous_strides(&p, flashcore_layout(layout));
    bool expect_ok = (layout == 0 || layout == 1) && backward_struct_size_ok(in.struct_size);
    const bool refused_as_newer = expect_ok && sets_newer_backward_fields(caller);
    expect_ok &= !refused_as_newer;
    for (int32_t v : {in.batch_size, in.seqlen_q, in.seqlen_k, in.num_heads_q, in.num_heads_kv}) expect_ok &= v >= 0;
    expect_ok &= in.head_dim >= 1 && in.head_dim_v >= 0 && !(in.num_heads_kv == 0 && in.num_heads_q != 0) &&
                 !(in.seqlen_k == 0 && !backward_empty(in));
    const i128 d = in.head_dim, dv = in.head_dim_v == 0 ? in.head_dim : in.head_dim_v;
    const WrittenStrides want[] = {
        {in.seqlen_q, in.num_heads_q, d, p.q_batch_stride, p.q_seq_stride, p.q_head_stride},
        {in.seqlen_q, in.num_heads_q, d, p.dq_batch_stride, p.dq_seq_stride, p.dq_head_stride},
        {in.seqlen_k, in.num_heads_kv, d, p.k_batch_stride, p.k_seq_stride, p.k_head_stride},
        {in.seqlen_k, in.num_heads_kv, d, p.dk_batch_stride, p.dk_seq_stride, p.dk_head_stride},
        {in.seqlen_k, in.num_heads_kv, dv, p.v_batch_stride, p.v_seq_stride, p.v_head_stride},
        {in.seqlen_k, in.num_heads_kv, dv, p.dv_batch_stride, p.dv_seq_stride, p.dv_head_stride},
        {in.seqlen_q, in.num_heads_q, dv, p.out_batch_stride, p.out_seq_stride, p.out_head_stride},
        {in.seqlen_q, in.num_heads_q, dv, p.dout_batch_stride, p.dout_seq_stride, p.dout_head_stride}};
    expect_ok &= packed_fit(want, in.batch_size);
    bool ok = true;
    if (expect_ok && got == FLASHCORE_STATUS_SUCCESS) {
        ok &= packed_written(want, layout);
        // Nothing but the strides (24 contiguous fields) is written.
        const size_t first = offsetof(flashcore_backward_params, q_batch_stride);
        const size_t last = offsetof(flashcore_backward_params, dv_head_stride) + sizeof(int64_t);
        ok &= std::memcmp(&written, &caller, first) == 0 &&
              std::memcmp(reinterpret_cast<const unsigned char *>(&written) + last,
                          reinterpret_cast<const unsigned char *>(&caller) + last, sizeof caller - last) == 0;
    } else {
        const flashcore_status refused =
            refused_as_newer ? FLASHCORE_STATUS_UNSUPPORTED : FLASHCORE_STATUS_INVALID_ARGUMENT;
        ok &= !expect_ok && got == refused && std::memcmp(&written, &caller, sizeof caller) == 0;
    }
    if (!ok) {
        std::fprintf(stderr, "call %" PRIu64 ": flashcore_backward_set_contiguous_strides(layout %d) returned %d "
                     "(\"%s\"), the model expects %s\n", call, layout, int(got), flashcore_last_error_message(),
                     expect_ok          ? "the packed strides, nothing else written"
                     : refused_as_newer ? "UNSUPPORTED and nothing written"
                                        : "INVALID_ARGUMENT and nothing written");
        print_backward_params(caller);
    }
    return ok;
}

// Handles that are not live: refused by every call that takes one.
bool check_handles(Rng &r, const flashcore_forward_params &p, const flashcore_backward_params &backward,
                   uint64_t call) {
    alignas(16) unsigned char fake[256];
    for (unsigned char &b : fake) b = static_cast<unsigned char>(r.next());
    const flashcore_handle handles[] = {nullptr, reinterpret_cast<flashcore_handle>(fake)};
    for (flashcore_handle h : handles) {
        size_t bytes = 0;
        const flashcore_status statuses[] = {
            flashcore_forward(h, &p, nullptr, size_t(r.next()), nullptr),
            flashcore_forward_workspace_size(h, &p, &bytes),
            flashcore_backward(h, &backward, nullptr, size_t(r.next()), nullptr),
            flashcore_backward_workspace_size(h, &backward, &bytes),
        };
        for (size_t i = 0; i < std::size(statuses); ++i) {
            if (statuses[i] != FLASHCORE_STATUS_INVALID_ARGUMENT) {
                std::fprintf(stderr, "call %" PRIu64 ": a %s handle was not refused by call %zu (forward, its "
                             "workspace size, backward, its workspace size): %d: %s\n",
                             call, h == nullptr ? "NULL" : "made-up", i, int(statuses[i]),
                             flashcore_last_error_message());
                return false;
            }
        }
    }
    return true;
}

// ---- planning on emulated GPUs ---------------------------------------------
// Handles for every GPU FLASHCORE_TEST_EMULATE_GPU takes: each accepted
// parameter set is planned on one of them in turn (its workspace query,
// then the call, which stops where it would launch). What the check
// accepted must plan: the call returns NO_DEVICE naming its plan (or
// SUCCESS, an empty call, which launches nothing); the only refusals a
// device may add are the documented ones, fp8 queries off the sm_90a
// kernels and a grid past its limit (UNSUPPORTED). Never INTERNAL.

struct EmulatedGpu {
    const char *name;
    int cc_major;
    size_t max_smem_per_block;  // what a block may opt in to
    int32_t num_sms;
    flashcore_handle handle = nullptr;
    std::atomic<uint64_t> planned{0};  // the threaded phase's threads share the handles
};
EmulatedGpu g_gpus[] = {
    {"a100", 8, 166912, 108}, {"a10", 8, 101376, 72}, {"l4", 8, 101376, 58}, {"h100", 9, 232448, 132},
    {"h200", 9, 232448, 132}};
// Past head dim 256 the backward has one kernel (512), whose tiles need more
// shared memory than sm_86's and sm_89's 99 KiB (flashcore.h: head_dim):
// refused there at the launch.
constexpr int32_t kMaxSmallSmemBackwardHeadDim = 256;
constexpr size_t kSmallSmemPerBlock = 101376;
// A workspace past every fuzzed tensor (each starts below 2^48 and spans at
// most 2^63 bytes), never dereferenced.
void *const kFakeWorkspace = reinterpret_cast<void *>(uintptr_t(0xC000000000000000ull));

bool create_emulated_handles() {
    for (EmulatedGpu &g : g_gpus) {
        setenv("FLASHCORE_TEST_EMULATE_GPU", g.name, 1);
        const flashcore_status status = flashcore_create(&g.handle);
        unsetenv("FLASHCORE_TEST_EMULATE_GPU");
        if (status != FLASHCORE_STATUS_SUCCESS) {
            std::fprintf(stderr, "fuzz_api: no emulated %s handle: %s\n", g.name, flashcore_last_error_message());
            return false;
        }
    }
    return true;
}

// Whether `status` (with the thread's message) is what an accepted call may
// return on emulated GPU g; fp8_queries: the call has them; asked_splits:
// it asks for a split (num_splits > 1), whose count the device's kernel
// clamps, and whose workspace may then pass the address space; sm_margin:
// the call's as the library reads it (INVALID_ARGUMENT where it leaves
// none of g's SMs).
bool planned_as_allowed(const EmulatedGpu &g, flashcore_status status, int32_t sm_margin, bool fp8_queries,
                        bool asked_splits = false) {
    const std::string message = flashcore_last_error_message();
    if (status == FLASHCORE_STATUS_SUCCESS) return true;  // empty: nothing to launch
    if (sm_margin >= g.num_sms) {
        return status == FLASHCORE_STATUS_INVALID_ARGUMENT &&
               message.find("sm_margin (" + std::to_string(sm_margin) + ") leaves none of device 0's " +
                            std::to_string(g.num_sms) + " SMs") == 0;
    }
    if (status == FLASHCORE_STATUS_NO_DEVICE) {
        return message.rfind(std::string("emulated ") + g.name + " (FLASHCORE_TEST_EMULATE_GPU): planned ", 0) == 0;
    }
    if (status != FLASHCORE_STATUS_UNSUPPORTED) return false;
    return message.find("exceeds the grid limit") != std::string::npos ||
           (fp8_queries && g.cc_major != 9 && message.find("fp8 queries") != std::string::npos) ||
           // fp8 queries run on the sm_90a kernels only, which read through
           // the TMA unit (flashcore.h: out_dtype).
           (fp8_queries && message.find("the TMA unit cannot describe") != std::string::npos) ||
           (asked_splits && message.find("would need a workspace larger than the address space") != std::string::npos);
}

// Whether an accepted call's `status` on g is allowed (planned_as_allowed),
// counting the planned ones; says which call did not plan. what: "forward
// call", "backward call" or "merge".
bool counted_as_planned(EmulatedGpu &g, flashcore_status status, const char *what, uint64_t call,
                        int32_t sm_margin = 0, bool fp8_queries = false, bool asked_splits = false) {
    if (planned_as_allowed(g, status, sm_margin, fp8_queries, asked_splits)) {
        g.planned += status == FLASHCORE_STATUS_NO_DEVICE;
        return true;
    }
    std::fprintf(stderr, "call %" PRIu64 ": an accepted %s did not plan on an emulated %s: %d (\"%s\")\n", call, what,
                 g.name, int(status), flashcore_last_error_message());
    return false;
}

bool plan_forward_on(EmulatedGpu &g, const flashcore_forward_params &p, uint64_t call) {
    size_t bytes = 0;
    const bool fp8_queries = p.dtype == FLASHCORE_DTYPE_FP8_E4M3;  // whatever header the caller has
    flashcore_status status = flashcore_forward_workspace_size(g.handle, &p, &bytes);
    if (status == FLASHCORE_STATUS_SUCCESS) status = flashcore_forward(g.handle, &p, kFakeWorkspace, bytes, nullptr);
    const bool asked_splits = p.struct_size >= kEndV0_3 && p.num_splits > 1;
    const int32_t sm_margin = p.struct_size >= kEndV0_9 ? p.sm_margin : 0;
    return counted_as_planned(g, status, "forward call", call, sm_margin, fp8_queries, asked_splits);
}

bool plan_backward_on(EmulatedGpu &g, const flashcore_backward_params &p, uint64_t call) {
    size_t bytes = 0;
    flashcore_status status = flashcore_backward_workspace_size(g.handle, &p, &bytes);
    if (status == FLASHCORE_STATUS_SUCCESS) status = flashcore_backward(g.handle, &p, kFakeWorkspace, bytes, nullptr);
    const int32_t head_dim_v = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    if (std::max(p.head_dim, head_dim_v) > kMaxSmallSmemBackwardHeadDim && g.max_smem_per_block == kSmallSmemPerBlock &&
        status == FLASHCORE_STATUS_UNSUPPORTED &&
        std::string(flashcore_last_error_message()).find("bytes of shared memory per block") != std::string::npos) {
        return true;
    }
    const int32_t sm_margin = p.struct_size >= kBackwardKnownEnd ? p.sm_margin : 0;
    return counted_as_planned(g, status, "backward call", call, sm_margin);
}

bool plan_merge_on(EmulatedGpu &g, const flashcore_merge_params &p, uint64_t call) {
    return counted_as_planned(g, flashcore_merge_states(g.handle, &p, nullptr), "merge", call);
}

EmulatedGpu &gpu_for(uint64_t call) { return g_gpus[call % std::size(g_gpus)]; }

// flashcore_supported_head_dims with random capacities and NULL arrays, in
// buffers with guard words after them: SUCCESS with *count the pairs and
// min(capacity, pairs) written, nothing past them; NULL count, or NULL
// arrays with a capacity, INVALID_ARGUMENT and nothing written. And
// flashcore_handle_device on the emulated handles (device 0) and with a
// NULL result pointer (INVALID_ARGUMENT).
bool check_small_functions(Rng &r, uint64_t call) {
    constexpr int32_t kGuard = 0x5A5A5A5A;
    const size_t pairs = g_head_dims.size();
    const size_t capacity = r.chance(30) ? 0 : size_t(r.below(pairs + 3));
    std::vector<int32_t> dims(capacity + 4, kGuard), dims_v(capacity + 4, kGuard);
    const bool null_dims = r.chance(10), null_dims_v = r.chance(10), null_count = r.chance(5);
    size_t count = 12345;
    const flashcore_status got = flashcore_supported_head_dims(null_dims ? nullptr : dims.data(),
                                                               null_dims_v ? nullptr : dims_v.data(), capacity,
                                                               null_count ? nullptr : &count);
    const bool refused = null_count || (capacity > 0 && (null_dims || null_dims_v));
    bool ok = got == (refused ? FLASHCORE_STATUS_INVALID_ARGUMENT : FLASHCORE_STATUS_SUCCESS);
    const size_t written = refused ? 0 : std::min(capacity, pairs);
    if (!refused) ok &= count == pairs;
    for (size_t i = 0; i < capacity + 4 && ok; ++i) {
        if (i < written) {
            ok &= dims[i] == g_head_dims[i].first && dims_v[i] == g_head_dims[i].second;
        } else {
            ok &= dims[i] == kGuard && dims_v[i] == kGuard;
        }
    }
    if (!ok) {
        std::fprintf(stderr, "call %" PRIu64 ": flashcore_supported_head_dims(capacity %zu%s%s%s) returned %d, count "
                     "%zu (%zu pairs): not as flashcore.h says (\"%s\")\n", call, capacity,
                     null_dims ? ", NULL head_dims" : "", null_dims_v ? ", NULL head_dims_v" : "",
                     null_count ? ", NULL count" : "", int(got), count, pairs, flashcore_last_error_message());
        return false;
    }
    for (const EmulatedGpu &g : g_gpus) {
        int device = -7;
        if (flashcore_handle_device(g.handle, &device) != FLASHCORE_STATUS_SUCCESS || device != 0 ||
            flashcore_handle_device(g.handle, nullptr) != FLASHCORE_STATUS_INVALID_ARGUMENT) {
            std::fprintf(stderr, "call %" PRIu64 ": flashcore_handle_device on an emulated %s: %s\n", call, g.name,
                         flashcore_last_error_message());
            return false;
        }
    }
    return true;
}

// Messages name what they refuse: one field of an accepted forward
// parameter set (of this header's size) made bad at a time, the call must
// be refused with a message that names that field (for a tensor's pointer,
// the tensor). A change the rules allow (a stride that happens to fit) is
// not counted.
struct FieldFault {
    const char *name;  // as the message must name it
    void (*apply)(flashcore_forward_params &p, Rng &r);
};
const FieldFault kFieldFaults[] = {
    {"batch_size", [](flashcore_forward_params &p, Rng &r) { p.batch_size = r.chance(50) ? -1 : INT32_MIN; }},
    {"seqlen_q", [](flashcore_forward_params &p, Rng &) { p.seqlen_q = -3; }},
    {"seqlen_k", [](flashcore_forward_params &p, Rng &) { p.seqlen_k = -3; }},
    {"num_heads_q", [](flashcore_forward_params &p, Rng &) { p.num_heads_q = -8; }},
    {"num_heads_kv", [](flashcore_forward_params &p, Rng &) { p.num_heads_kv = -1; }},
    {"head_dim", [](flashcore_forward_params &p, Rng &r) { p.head_dim = r.chance(50) ? -8 : 100; }},
    {"softcap", [](flashcore_forward_params &p, Rng &r) { p.softcap = r.chance(50) ? -1.f : NAN; }},
    {"softmax_scale", [](flashcore_forward_params &p, Rng &) { p.softmax_scale = -2.f; }},
    {"num_splits", [](flashcore_forward_params &p, Rng &) { p.num_splits = -2; }},
    {"q", [](flashcore_forward_params &p, Rng &r) {
         p.q = r.chance(50) ? nullptr : static_cast<const char *>(p.q) + 2;
     }},
    {"k", [](flashcore_forward_params &p, Rng &) { p.k = nullptr; }},
    {"v", [](flashcore_forward_params &p, Rng &) { p.v = static_cast<const char *>(p.v) + 6; }},
    {"out", [](flashcore_forward_params &p, Rng &) { p.out = nullptr; }},
    {"q_batch_stride", [](flashcore_forward_params &p, Rng &) { p.q_batch_stride = -8; }},
    {"k_seq_stride", [](flashcore_forward_params &p, Rng &) { p.k_seq_stride = -16; }},
    {"v_head_stride", [](flashcore_forward_params &p, Rng &) { p.v_head_stride = -8; }},
    {"out_seq_stride", [](flashcore_forward_params &p, Rng &) { p.out_seq_stride = -8; }},
    {"attention_chunk", [](flashcore_forward_params &p, Rng &r) { p.attention_chunk = r.chance(50) ? -1 : INT32_MIN; }},
    {"sm_margin", [](flashcore_forward_params &p, Rng &r) { p.sm_margin = r.chance(50) ? -1 : INT32_MIN; }},
    {"sinks", [](flashcore_forward_params &p, Rng &r) {
         p.sinks = reinterpret_cast<const float *>((uintptr_t(13) << 44) + 1 + r.below(3));
     }},
};

bool check_messages_name_fields(Rng &r, const flashcore_forward_params &accepted, uint64_t call,
                                uint64_t *named) {
    if (accepted.struct_size != sizeof accepted || forward_empty(accepted)) return true;
    const FieldFault &fault = kFieldFaults[r.below(std::size(kFieldFaults))];
    flashcore_forward_params p = accepted;
    fault.apply(p, r);
    const flashcore_status got = flashcore_forward_check(&p);
    if (got == FLASHCORE_STATUS_SUCCESS) return true;
    const std::string message = flashcore_last_error_message();
    // The name as a word of its own: "q (" or "q is NULL", not the q in "seqlen_q".
    const std::string name = fault.name;
    size_t at = message.find(name);
    bool found = false;
    while (at != std::string::npos && !found) {
        const bool starts = at == 0 || !(std::isalnum(static_cast<unsigned char>(message[at - 1])) ||
                                         message[at - 1] == '_');
        const size_t end = at + name.size();
        const bool ends = end == message.size() || !(std::isalnum(static_cast<unsigned char>(message[end])) ||
                                                     message[end] == '_');
        found = starts && ends;
        at = message.find(name, at + 1);
    }
    if (found) {
        ++*named;
        return true;
    }
    std::fprintf(stderr, "call %" PRIu64 ": %s made bad, flashcore_forward_check returned %d with a message that "
                 "does not name it: \"%s\"\n", call, fault.name, int(got), message.c_str());
    return false;
}

struct Counts {
    uint64_t calls = 0, successes = 0, merge_successes = 0;
    // Accepted forward parameter sets with the window on, the softcap on,
    // seqused_k, packed (variable-length) queries or keys, a paged cache,
    // and from a newer header's (larger) struct.
    uint64_t windowed_successes = 0, capped_successes = 0, seqused_successes = 0, newer_successes = 0;
    uint64_t varlen_successes = 0, paged_successes = 0;
    // ... on an fp8 cache (0.8), and among them with descale factors; with
    // fp8 queries; with chunks and with sinks (0.9); from a 0.8 caller.
    uint64_t fp8_successes = 0, descaled_successes = 0, fp8_q_successes = 0;
    uint64_t chunked_successes = 0, sinks_successes = 0, v0_8_successes = 0;
    // Accepted merges with sinks, from an older header's (0.3's) struct and
    // from a newer one's.
    uint64_t merge_sinks_successes = 0, merge_older_successes = 0, merge_newer_successes = 0;
    // Accepted backward parameter sets: all, without query rows (not
    // empty), variable-length, from a newer header's struct, from a 0.7
    // caller's, with chunks, with sinks and with dsinks.
    uint64_t backward_successes = 0, backward_rowless_successes = 0, backward_varlen_successes = 0;
    uint64_t backward_newer_successes = 0, backward_older_successes = 0, backward_chunked_successes = 0;
    uint64_t backward_sinks_successes = 0, backward_dsinks_successes = 0;
    // Refusals of one bad field whose message named it.
    uint64_t named_fields = 0;
};

bool run(uint64_t seed, uint64_t forward_calls, Counts *counts) {
    Rng r{std::mt19937_64(seed)};
    for (uint64_t i = 0; i < forward_calls; ++i) {
        const CallerParams c = random_params(r);
        const flashcore_forward_params &p = c.p;
        flashcore_status got;
        if (!check_forward(c, i, &got)) return false;
        ++counts->calls;
        if (got == FLASHCORE_STATUS_SUCCESS) {
            const bool has_0_4_fields = p.struct_size >= kEndV0_4, has_0_6_fields = p.struct_size >= kEndV0_6;
            ++counts->successes;
            counts->windowed_successes += has_0_4_fields && p.use_window != 0;
            counts->capped_successes += has_0_4_fields && p.softcap != 0.f;
            counts->seqused_successes += p.struct_size >= kEndV0_5 && p.seqused_k != nullptr;
            counts->varlen_successes += has_0_6_fields && (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr);
            counts->paged_successes += has_0_6_fields && p.block_table != nullptr;
            counts->newer_successes += p.struct_size > sizeof p;
            const bool fp8 = p.struct_size >= kEndV0_8 && fp8_kv(p) && !fp8_q(p);
            counts->fp8_successes += fp8;
            counts->descaled_successes += fp8 && (p.k_descale != nullptr || p.v_descale != nullptr);
            counts->fp8_q_successes += fp8_q(p);
            const bool has_0_9_fields = p.struct_size >= kEndV0_9;
            counts->chunked_successes += has_0_9_fields && p.attention_chunk > 0;
            counts->sinks_successes += has_0_9_fields && p.sinks != nullptr;
            counts->v0_8_successes += p.struct_size == kEndV0_8;
            if (!plan_forward_on(gpu_for(i), p, i)) {
                print_params(c);
                return false;
            }
            ++counts->calls;
            if (!check_messages_name_fields(r, p, i, &counts->named_fields)) {
                print_params(c);
                return false;
            }
            ++counts->calls;
        }
        const MergeCaller m = random_merge_params(r);
        if (!check_merge(m, i, &got)) return false;
        ++counts->calls;
        counts->merge_successes += got == FLASHCORE_STATUS_SUCCESS;
        if (got == FLASHCORE_STATUS_SUCCESS) {
            counts->merge_sinks_successes += m.p.struct_size >= kMergeKnownEnd && m.p.sinks != nullptr;
            counts->merge_older_successes += m.p.struct_size < sizeof m.p;
            counts->merge_newer_successes += m.p.struct_size > sizeof m.p;
            if (!plan_merge_on(gpu_for(i + 1), m.p, i)) return false;
            ++counts->calls;
        }
        const BackwardCaller b = random_backward_params(r);
        if (!check_backward(b, i, &got)) return false;
        ++counts->calls;
        if (got == FLASHCORE_STATUS_SUCCESS) {
            const bool rowless = b.p.seqlen_q == 0 || (b.p.cu_seqlens_q != nullptr && b.p.total_seqlen_q == 0);
            ++counts->backward_successes;
            counts->backward_rowless_successes += !backward_empty(b.p) && rowless;
            counts->backward_varlen_successes += b.p.cu_seqlens_q != nullptr || b.p.cu_seqlens_k != nullptr;
            counts->backward_newer_successes += b.p.struct_size > sizeof b.p;
            counts->backward_older_successes += b.p.struct_size < sizeof b.p;
            const flashcore_backward_params read = backward_as_read(b.p);
            counts->backward_chunked_successes += read.attention_chunk > 0;
            counts->backward_sinks_successes += read.sinks != nullptr;
            counts->backward_dsinks_successes += read.dsinks != nullptr;
            if (!plan_backward_on(gpu_for(i + 2), b.p, i)) {
                print_backward_params(b);
                return false;
            }
            ++counts->calls;
        }
        if (i % 4 == 0) {
            const int layouts[] = {0, 1, 0, 1, 2, -1, 7};
            if (!check_strides(c, r.pick(layouts), i)) return false;
            if (!check_backward_strides(b, int(r.below(2)), i)) return false;
            counts->calls += 2;
        }
        if (i % 64 == 0) {
            if (!check_handles(r, p, b.p, i)) return false;
            counts->calls += 8;
        }
        if (i % 16 == 0) {
            if (!check_small_functions(r, i)) return false;
            counts->calls += 1 + 2 * std::size(g_gpus);
        }
    }
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    uint64_t calls = 500000;
    uint64_t seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
    unsigned threads = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--calls") == 0) {
            calls = std::strtoull(argv[i + 1], nullptr, 10);
        } else if (std::strcmp(argv[i], "--seed") == 0) {
            seed = std::strtoull(argv[i + 1], nullptr, 10);
        } else if (std::strcmp(argv[i], "--threads") == 0) {
            threads = unsigned(std::max(1ul, std::strtoul(argv[i + 1], nullptr, 10)));
        } else {
            std::fprintf(stderr, "usage: %s [--calls N] [--seed S] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    size_t count = 0;
    flashcore_supported_head_dims(nullptr, nullptr, 0, &count);
    std::vector<int32_t> d(count), dv(count);
    flashcore_supported_head_dims(d.data(), dv.data(), count, &count);
    for (size_t i = 0; i < count; ++i) g_head_dims.emplace_back(d[i], dv[i]);

    if (!create_emulated_handles()) return 1;
    constexpr uint64_t kFixedSeed = 15;
    Counts counts;
    for (uint64_t s : {kFixedSeed, seed}) {
        std::printf("fuzz_api: seed %" PRIu64 "%s, %" PRIu64 " parameter sets\n", s,
                    s == kFixedSeed ? " (fixed)" : " (random; replay with --seed)", calls);
        std::fflush(stdout);
        if (!run(s, calls, &counts)) {
            std::printf("fuzz_api: FAILED with seed %" PRIu64 "\n", s);
            return 1;
        }
    }
    std::printf("fuzz_api: %" PRIu64 " API calls, %" PRIu64 " valid forward (%" PRIu64 " with a window, %" PRIu64
                " with a softcap, %" PRIu64 " with seqused_k, %" PRIu64 " variable-length, %" PRIu64
                " on a paged cache, %" PRIu64 " on an fp8 cache (%" PRIu64 " with descale factors), %" PRIu64
                " with fp8 queries, %" PRIu64 " chunked, %" PRIu64 " with sinks, %" PRIu64
                " from a 0.8 header, %" PRIu64 " from a newer header), %" PRIu64 " valid merge (%" PRIu64
                " with sinks, %" PRIu64 " from a 0.3 header, %" PRIu64 " from a newer header) and %" PRIu64
                " valid backward (%" PRIu64 " without query rows, %" PRIu64 " variable-length, %" PRIu64
                " chunked, %" PRIu64 " with sinks, %" PRIu64 " with dsinks, %" PRIu64 " from a 0.7 header, %" PRIu64
                " from a newer header) parameter sets accepted, all as the model says\n",
                counts.calls, counts.successes, counts.windowed_successes, counts.capped_successes,
                counts.seqused_successes, counts.varlen_successes, counts.paged_successes, counts.fp8_successes,
                counts.descaled_successes, counts.fp8_q_successes, counts.chunked_successes, counts.sinks_successes,
                counts.v0_8_successes, counts.newer_successes, counts.merge_successes, counts.merge_sinks_successes,
                counts.merge_older_successes, counts.merge_newer_successes, counts.backward_successes,
                counts.backward_rowless_successes, counts.backward_varlen_successes, counts.backward_chunked_successes,
                counts.backward_sinks_successes, counts.backward_dsinks_successes, counts.backward_older_successes,
                counts.backward_newer_successes);
    // The threaded phase: threads fuzz at once, each with its own seed,
    // sharing the emulated handles (every function is thread-safe; each
    // thread's messages are its own, which agrees() reads).
    const uint64_t per_thread = std::max<uint64_t>(calls / (4 * threads), 1);
    std::printf("fuzz_api: %u threads at once, %" PRIu64 " parameter sets each (seeds %" PRIu64 " + thread)\n",
                threads, per_thread, seed);
    std::fflush(stdout);
    std::vector<Counts> thread_counts(threads);
    std::vector<char> thread_ok(threads, 0);
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] { thread_ok[t] = run(seed + 1 + t, per_thread, &thread_counts[t]); });
    }
    for (std::thread &w : workers) w.join();
    for (unsigned t = 0; t < threads; ++t) {
        if (!thread_ok[t]) {
            std::printf("fuzz_api: FAILED in thread %u (seed %" PRIu64 ")\n", t, seed + 1 + t);
            return 1;
        }
        counts.calls += thread_counts[t].calls;
    }
    std::printf("fuzz_api: %" PRIu64 " API calls in all, all as the model says; %" PRIu64
                " refusals of one bad field named it\n", counts.calls, counts.named_fields);
    std::printf("fuzz_api: accepted calls planned on emulated GPUs (FLASHCORE_TEST_EMULATE_GPU):");
    for (EmulatedGpu &g : g_gpus) {
        std::printf(" %s %" PRIu64, g.name, g.planned.load());
        flashcore_destroy(g.handle);
    }
    std::printf("\n");
    return 0;
}
