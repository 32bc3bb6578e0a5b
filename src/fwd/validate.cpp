#include "validate.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>

#include "error.h"
#include "fwd/forward_params.h"
#include "fwd/registry.h"

namespace flashcore {
namespace {

// A paged cache's pages hold a multiple of this many keys: the TMA boxes
// and the kernels' 16-row steps never straddle a page.
constexpr int32_t kPageSizeMultiple = 16;

// Entries a block-table row needs: pages for seqlen_k keys (page_size > 0).
int64_t pages_per_sequence(const flashcore_forward_params &p) {
    return (int64_t(p.seqlen_k) + p.page_size - 1) / p.page_size;
}
// Fails with UNSUPPORTED: `problem`, then the head dims this build has
// kernels for (`supported`) and the rule by which the others run.
flashcore_status unsupported_head_dims(const char *problem, int multiple, Span<HeadDims> supported) {
    std::string pairs;
    for (const HeadDims &d : supported) {
        if (!pairs.empty()) pairs += ", ";
        pairs += "(" + std::to_string(d.head_dim) + ", " + std::to_string(d.head_dim_v) + ")";
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s; supported (head_dim, head_dim_v): %s, and any pair of multiples of %d that one of these "
                "covers (it runs on the first with both at least its own)",
                problem, pairs.c_str(), multiple);
}

// The call's head dims have a kernel: multiples of a vector's elements
// (head_dim_multiple) that a pair of `supported` (a family's registry)
// covers. The dtype is valid.
flashcore_status check_head_dims(const flashcore_forward_params &p, Span<HeadDims> supported) {
    const HeadDims call{p.head_dim, effective_head_dim_v(p)};
    // Whole 16-byte vectors of q's type and of k's and v's.
    const int multiple = std::max(head_dim_multiple(DType(p.dtype)), head_dim_multiple(DType(effective_kv_dtype(p))));
    // Named as the caller set it: head_dim_v 0 stands for head_dim.
    const char *v_name = p.head_dim_v == 0 ? "head_dim_v (0, so head_dim)" : "head_dim_v";
    char problem[160];
    HeadDims kernel{};
    if (call.head_dim % multiple != 0) {
        std::snprintf(problem, sizeof problem, "head_dim %d is not a multiple of %d", int(call.head_dim), multiple);
    } else if (call.head_dim_v % multiple != 0) {
        std::snprintf(problem, sizeof problem, "%s %d is not a multiple of %d", v_name, int(call.head_dim_v),
                      multiple);
    } else if (covering_head_dims(supported, call, &kernel)) {
        return FLASHCORE_STATUS_SUCCESS;
    } else {
        // No pair covers the call: either head_dim exceeds every pair's, or
        // head_dim_v exceeds that of every pair wide enough for head_dim.
        int32_t max_head_dim = 0, max_head_dim_v = 0, max_head_dim_v_here = 0;
        for (const HeadDims &d : supported) {
            max_head_dim = std::max(max_head_dim, d.head_dim);
            max_head_dim_v = std::max(max_head_dim_v, d.head_dim_v);
            if (d.head_dim >= call.head_dim) max_head_dim_v_here = std::max(max_head_dim_v_here, d.head_dim_v);
        }
        if (call.head_dim > max_head_dim) {
            std::snprintf(problem, sizeof problem, "head_dim %d exceeds %d", int(call.head_dim), int(max_head_dim));
        } else if (max_head_dim_v_here == max_head_dim_v) {
            std::snprintf(problem, sizeof problem, "%s %d exceeds %d", v_name, int(call.head_dim_v),
                          int(max_head_dim_v));
        } else {
            std::snprintf(problem, sizeof problem, "%s %d exceeds %d, the largest with head_dim >= %d", v_name,
                          int(call.head_dim_v), int(max_head_dim_v_here), int(call.head_dim));
        }
    }
    return unsupported_head_dims(problem, multiple, supported);
}

// The element types of q, k/v and out: fp16 or bf16 queries, k and v of
// theirs or e4m3 (a quantized cache), out of theirs; or e4m3 q, k and v
// (fp8 prefill) with a bf16 out.
flashcore_status check_dtypes(const flashcore_forward_params &p) {
    if (p.dtype == FLASHCORE_DTYPE_FP8_E4M3) {
        if (p.kv_dtype != 0 && p.kv_dtype != FLASHCORE_DTYPE_FP8_E4M3) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "kv_dtype %d is not supported with fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3): k and v are "
                        "e4m3 too; pass 0 or FLASHCORE_DTYPE_FP8_E4M3 (%d)",
                        int(p.kv_dtype), int(FLASHCORE_DTYPE_FP8_E4M3));
        }
        if (p.out_dtype != 0 && p.out_dtype != FLASHCORE_DTYPE_BF16) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "out_dtype %d is not supported with fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3): out is "
                        "bf16; pass 0 or FLASHCORE_DTYPE_BF16 (%d)",
                        int(p.out_dtype), int(FLASHCORE_DTYPE_BF16));
        }
        if (p.softcap != 0.f) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "softcap (%g) is not supported with fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3); pass 0, or "
                        "fp16/bf16 queries",
                        double(p.softcap));
        }
        if (fwd_fp8_head_dims().size == 0) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3) run on the sm_90a kernels, and this library was "
                        "built without them (configure with an sm_90 target or -DFLASHCORE_ENABLE_SM90=ON)");
        }
        return FLASHCORE_STATUS_SUCCESS;
    }
    if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "dtype %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d), "
                    "FLASHCORE_DTYPE_FP8_E4M3 (%d, sm_90 GPUs)",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16),
                    int(FLASHCORE_DTYPE_FP8_E4M3));
    }
    if (p.kv_dtype != 0 && p.kv_dtype != p.dtype && p.kv_dtype != FLASHCORE_DTYPE_FP8_E4M3) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "kv_dtype %d is not supported with dtype %d; supported: 0 or dtype (k and v of q's type), "
                    "FLASHCORE_DTYPE_FP8_E4M3 (%d, a quantized K/V cache)",
                    int(p.kv_dtype), int(p.dtype), int(FLASHCORE_DTYPE_FP8_E4M3));
    }
    if (p.out_dtype != 0 && p.out_dtype != p.dtype) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "out_dtype %d is not supported with dtype %d; out is written in q's type: pass 0 or dtype",
                    int(p.out_dtype), int(p.dtype));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

// A descale array and its strides.
struct Descale {
    const char *name;
    const float *data;
    int64_t batch_stride, head_stride;
};
// q's, k's and v's.
std::array<Descale, 3> descales(const flashcore_forward_params &p) {
    return {{{"q_descale", p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride},
             {"k_descale", p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride},
             {"v_descale", p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride}}};
}

// The descale factors: strides >= 0 and only with their array; k and v's
// for e4m3 k and v only; q's for e4m3 queries only.
flashcore_status check_descales(const flashcore_forward_params &p) {
    const std::array<Descale, 3> all = descales(p);
    for (const Descale &d : all) {
        if (d.data == nullptr && (d.batch_stride != 0 || d.head_stride != 0)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s_batch_stride (%" PRId64 ") and %s_head_stride (%" PRId64 ") are set but %s is NULL; "
                        "they must be 0 without it",
                        d.name, d.batch_stride, d.name, d.head_stride, d.name);
        }
        if (d.batch_stride < 0 || d.head_stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s_batch_stride (%" PRId64 ") and %s_head_stride (%" PRId64 ") must be >= 0 (both 0: one "
                        "factor for the whole tensor)",
                        d.name, d.batch_stride, d.name, d.head_stride);
        }
        // The last factor read, of the last batch and K/V head, must be
        // addressable in bytes (as check_tensor bounds the tensors'): the
        // kernels' 64-bit offsets cannot wrap. (An empty call's strides are
        // not looked at.)
        const __int128 last = __int128(std::max<int64_t>(int64_t(p.batch_size) - 1, 0)) * d.batch_stride +
                              __int128(std::max<int64_t>(int64_t(p.num_heads_kv) - 1, 0)) * d.head_stride;
        if (d.data != nullptr && !forward_is_empty(p) && last * __int128(sizeof(float)) > __int128(INT64_MAX)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s_batch_stride (%" PRId64 ") and %s_head_stride (%" PRId64 ") address more than 2^63 "
                        "bytes over batch_size (%d) and num_heads_kv (%d)",
                        d.name, d.batch_stride, d.name, d.head_stride, int(p.batch_size), int(p.num_heads_kv));
        }
    }
    if (p.q_descale != nullptr && !has_fp8_queries(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "q_descale is set but q is not quantized (dtype %d); it is for dtype FLASHCORE_DTYPE_FP8_E4M3 "
                    "(%d)",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP8_E4M3));
    }
    if (!has_quantized_kv(p) && !has_fp8_queries(p)) {
        for (const Descale &d : {all[1], all[2]}) {
            if (d.data != nullptr) {
                return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                            "%s is set but k and v are not quantized (kv_dtype %d, dtype %d); descale factors are "
                            "for kv_dtype FLASHCORE_DTYPE_FP8_E4M3 (%d)",
                            d.name, int(p.kv_dtype), int(p.dtype), int(FLASHCORE_DTYPE_FP8_E4M3));
            }
        }
    }
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace

bool forward_is_empty(const flashcore_forward_params &p) {
    return p.batch_size == 0 || p.seqlen_q == 0 || p.num_heads_q == 0 ||
           (p.cu_seqlens_q != nullptr && p.total_seqlen_q == 0);
}

flashcore_status validate_sizes(const flashcore_forward_params &p) {
    const struct {
        int32_t value;
        const char *name;
    } sizes[] = {{p.batch_size, "batch_size"},   {p.seqlen_q, "seqlen_q"},         {p.seqlen_k, "seqlen_k"},
                 {p.num_heads_q, "num_heads_q"}, {p.num_heads_kv, "num_heads_kv"}};
    for (const auto &s : sizes) {
        if (s.value < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s (%d) must be >= 0 (0 only where the output is empty: batch_size, seqlen_q or "
                        "num_heads_q 0)",
                        s.name, int(s.value));
        }
    }
    if (p.head_dim < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim (%d) must be >= 1", int(p.head_dim));
    }
    if (p.head_dim_v < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim_v (%d) must be >= 1, or 0 for the same as head_dim",
                    int(p.head_dim_v));
    }
    // Keys and K/V heads may be missing only where no output row needs them.
    if (p.num_heads_kv == 0 && p.num_heads_q != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "num_heads_kv (0) must be >= 1 where num_heads_q (%d) is not 0", int(p.num_heads_q));
    }
    if (p.seqlen_k == 0 && !forward_is_empty(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "seqlen_k (0) must be >= 1 where the output is not empty (batch_size %d, seqlen_q %d, "
                    "num_heads_q %d)",
                    int(p.batch_size), int(p.seqlen_q), int(p.num_heads_q));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_shapes(const flashcore_forward_params &p) {
    return validate_shapes(p, fwd_head_dims_for(p));
}

Span<HeadDims> fwd_head_dims_for(const flashcore_forward_params &p) {
    if (has_fp8_queries(p)) return fwd_fp8_head_dims();
    return has_quantized_kv(p) ? fwd_quantized_kv_head_dims() : fwd_supported_head_dims();
}

flashcore_status validate_shapes(const flashcore_forward_params &p, Span<HeadDims> supported) {
    flashcore_status status = check_dtypes(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_descales(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = validate_sizes(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.num_heads_kv != 0 && p.num_heads_q % p.num_heads_kv != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                    int(p.num_heads_q), int(p.num_heads_kv));
    }
    status = check_head_dims(p, supported);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "seqlen_q (%d) and seqlen_k (%d) must be at most %d",
                    int(p.seqlen_q), int(p.seqlen_k), int(kMaxSeqlen));
    }
    if (p.num_splits < 0 || p.num_splits > FLASHCORE_MAX_NUM_SPLITS) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "num_splits (%d) must be 0 (chosen per call), 1 (no split) or at most "
                    "FLASHCORE_MAX_NUM_SPLITS (%d)",
                    int(p.num_splits), int(FLASHCORE_MAX_NUM_SPLITS));
    }
    if (p.softmax_scale != FLASHCORE_SOFTMAX_SCALE_DEFAULT && !(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.f)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale (%g) must be finite and > 0, or FLASHCORE_SOFTMAX_SCALE_DEFAULT (0) for "
                    "1/sqrt(head_dim)",
                    double(p.softmax_scale));
    }
    // -0 compares equal to the default's +0, but a caller who passes it most
    // likely computed a negative scale that underflowed: refused, not taken
    // for 1/sqrt(head_dim).
    if (p.softmax_scale == 0.f && std::signbit(p.softmax_scale)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale is -0.0; it must be finite and > 0, or +0 (FLASHCORE_SOFTMAX_SCALE_DEFAULT) for "
                    "1/sqrt(head_dim)");
    }
    // The kernels exponentiate with exp2: the scale times log2(e) must be a
    // finite float too.
    if (!std::isfinite(softmax_scale_log2(p))) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale (%g) times log2(e) overflows a float; it must be at most %g",
                    double(p.softmax_scale), double(FLT_MAX) / double(kLog2e));
    }
    status = validate_window(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.attention_chunk < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "attention_chunk (%d) must be 0 (no chunks) or the chunk length in keys (> 0)",
                    int(p.attention_chunk));
    }
    // Whether it leaves an SM is the plan's check (plan_sms): the device's
    // SM count is the handle's.
    if (p.sm_margin < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "sm_margin (%d) must be >= 0: the SMs the call leaves to other streams (0: it uses every SM)",
                    int(p.sm_margin));
    }
    status = validate_packing(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    return validate_softcap(p);
}

flashcore_status validate_packing(const flashcore_forward_params &p) {
    const struct {
        const int32_t *cu_seqlens;
        int32_t total;
        const char *side;
    } packed[] = {{p.cu_seqlens_q, p.total_seqlen_q, "q"}, {p.cu_seqlens_k, p.total_seqlen_k, "k"}};
    for (const auto &t : packed) {
        if (t.cu_seqlens == nullptr && t.total != 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "total_seqlen_%s (%d) is set but cu_seqlens_%s is NULL; total_seqlen_%s counts the rows of "
                        "packed (variable-length) tensors and must be 0 without them",
                        t.side, int(t.total), t.side, t.side);
        }
        if (t.cu_seqlens != nullptr && (t.total < 0 || t.total > kMaxSeqlen)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "total_seqlen_%s (%d) must be in [0, %d]: the rows of the packed tensors (cu_seqlens_%s[batch_size])",
                        t.side, int(t.total), int(kMaxSeqlen), t.side);
        }
    }
    if (p.cu_seqlens_k != nullptr && p.total_seqlen_k == 0 && !forward_is_empty(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "total_seqlen_k (0) must be >= 1 where the output is not empty: k and v hold no rows");
    }
    if (p.block_table == nullptr) {
        if (p.page_size != 0 || p.num_pages != 0 || p.block_table_batch_stride != 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "page_size (%d), num_pages (%d) and block_table_batch_stride (%" PRId64
                        ") describe a paged K/V cache and must be 0 without a block_table",
                        int(p.page_size), int(p.num_pages), p.block_table_batch_stride);
        }
        return FLASHCORE_STATUS_SUCCESS;
    }
    if (p.cu_seqlens_k != nullptr) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "cu_seqlens_k and block_table cannot be combined: a paged cache's key counts come from seqused_k "
                    "(cu_seqlens_q with a block_table is supported)");
    }
    // A page of no keys is wrong whatever the GPU (a size <= 0); other
    // sizes are what the kernels do not implement.
    if (p.page_size < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "page_size (%d) must be >= 1 with a block_table; pages must hold a multiple of %d keys", int(p.page_size),
                    int(kPageSizeMultiple));
    }
    if (p.page_size % kPageSizeMultiple != 0 || p.page_size > kMaxSeqlen) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "page_size (%d) is not supported; pages must hold a multiple of %d keys, at most %d",
                    int(p.page_size), int(kPageSizeMultiple), int(kMaxSeqlen));
    }
    if (p.num_pages < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_pages (%d) must be >= 1 with a block_table",
                    int(p.num_pages));
    }
    // An empty call's strides are not looked at (flashcore.h, "Empty calls").
    if (forward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    const int64_t pages_per_seq = pages_per_sequence(p);
    if (p.block_table_batch_stride < pages_per_seq && p.batch_size > 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "block_table_batch_stride (%" PRId64 ") must be at least ceil(seqlen_k / page_size) = %" PRId64
                    ": each row of the table lists the pages of a sequence of up to seqlen_k (%d) keys",
                    p.block_table_batch_stride, pages_per_seq, int(p.seqlen_k));
    }
    if (p.block_table_batch_stride < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "block_table_batch_stride (%" PRId64 ") must be >= 0",
                    p.block_table_batch_stride);
    }
    // The last entry read must be addressable in bytes (as check_tensor
    // bounds the tensors'): the kernels' 64-bit offsets cannot wrap.
    const __int128 last_entry = __int128(int64_t(p.batch_size) - 1) * p.block_table_batch_stride + pages_per_seq - 1;
    if (last_entry * __int128(sizeof(int32_t)) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "block_table_batch_stride (%" PRId64 ") addresses more than 2^63 bytes over batch_size (%d)",
                    p.block_table_batch_stride, int(p.batch_size));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_window(const flashcore_forward_params &p) {
    if (p.use_window == 0) return FLASHCORE_STATUS_SUCCESS;
    const struct {
        int32_t value;
        const char *name;
    } bounds[] = {{p.window_left, "window_left"}, {p.window_right, "window_right"}};
    for (const auto &b : bounds) {
        if (b.value < -1) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s (%d) must be -1 (unbounded) or >= 0 (keys seen on that side of the diagonal)", b.name,
                        int(b.value));
        }
    }
    if (p.causal != 0 && p.window_right > 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "window_right (%d) must be -1 or 0 with causal, which is window_right 0; for a window reaching "
                    "%d keys past the diagonal pass causal 0",
                    int(p.window_right), int(p.window_right));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_softcap(const flashcore_forward_params &p) {
    if (p.softcap == 0.f) return FLASHCORE_STATUS_SUCCESS;
    if (!(std::isfinite(p.softcap) && p.softcap > 0.f)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "softcap (%g) must be finite and > 0, or 0 for none",
                    double(p.softcap));
    }
    if (!std::isfinite(p.softcap * kLog2e)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softcap (%g) times log2(e) overflows a float; it must be at most %g", double(p.softcap),
                    double(FLT_MAX) / double(kLog2e));
    }
    // The kernels scale the raw scores by softmax_scale / softcap before the
    // tanh; a quotient of 0 would read as "no softcap".
    const float prescale = softcap_prescale(p);
    if (!(prescale > 0.f) || !std::isfinite(prescale)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale / softcap (%g / %g) is not a finite float > 0; a softcap this far from the "
                    "scale caps nothing",
                    double(effective_softmax_scale(p)), double(p.softcap));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

namespace {

// q, k, v or out as strided [batch][seq][head][dim] extents: packed
// (variable-length) tensors are one batch of all their rows, their batch
// strides ignored; a paged cache is num_pages batches of page_size rows.
TensorDims forward_tensor(const flashcore_forward_params &p, int index) {
    const int32_t d = p.head_dim;
    const int32_t dv = effective_head_dim_v(p);
    const bool packed_q = p.cu_seqlens_q != nullptr;
    const int32_t q_batches = packed_q ? 1 : p.batch_size;
    const int32_t q_rows = packed_q ? p.total_seqlen_q : p.seqlen_q;
    int32_t kv_batches = p.batch_size, kv_rows = p.seqlen_k;
    if (p.cu_seqlens_k != nullptr) kv_batches = 1, kv_rows = p.total_seqlen_k;
    if (p.block_table != nullptr) kv_batches = p.num_pages, kv_rows = p.page_size;
    const bool packed_kv = p.cu_seqlens_k != nullptr;
    const size_t bytes = dtype_bytes(DType(p.dtype));
    const size_t kv_bytes = dtype_bytes(DType(effective_kv_dtype(p)));
    const size_t out_bytes = dtype_bytes(DType(effective_out_dtype(p)));
    switch (index) {
        case 0:
            return {"q", p.q, q_batches, q_rows, p.num_heads_q, d, packed_q ? 0 : p.q_batch_stride, p.q_seq_stride,
                    p.q_head_stride, bytes};
        case 1:
            return {"k", p.k, kv_batches, kv_rows, p.num_heads_kv, d, packed_kv ? 0 : p.k_batch_stride,
                    p.k_seq_stride, p.k_head_stride, kv_bytes};
        case 2:
            return {"v", p.v, kv_batches, kv_rows, p.num_heads_kv, dv, packed_kv ? 0 : p.v_batch_stride,
                    p.v_seq_stride, p.v_head_stride, kv_bytes};
        default:
            return {"out", p.out, q_batches, q_rows, p.num_heads_q, dv, packed_q ? 0 : p.out_batch_stride,
                    p.out_seq_stride, p.out_head_stride, out_bytes};
    }
}
constexpr int kForwardTensors = 4;  // q, k, v, out
constexpr int kForwardOut = 3;

// The entries of the block table the kernels may read: every row's first
// ceil(seqlen_k / page_size).
__int128 block_table_entries(const flashcore_forward_params &p) {
    return __int128(p.batch_size - 1) * p.block_table_batch_stride + pages_per_sequence(p);
}

// The int32 arrays of a call, with the entries each holds.
struct Int32Array {
    const char *name;
    const int32_t *data;
    __int128 count;
};
size_t int32_arrays(const flashcore_forward_params &p, Int32Array *arrays) {
    size_t n = 0;
    if (p.seqused_k != nullptr) arrays[n++] = {"seqused_k", p.seqused_k, p.batch_size};
    if (p.cu_seqlens_q != nullptr) arrays[n++] = {"cu_seqlens_q", p.cu_seqlens_q, __int128(p.batch_size) + 1};
    if (p.cu_seqlens_k != nullptr) arrays[n++] = {"cu_seqlens_k", p.cu_seqlens_k, __int128(p.batch_size) + 1};
    if (p.block_table != nullptr) arrays[n++] = {"block_table", p.block_table, block_table_entries(p)};
    return n;
}

}  // namespace

__int128 lse_entries(const flashcore_forward_params &p) {
    return p.cu_seqlens_q != nullptr ? __int128(p.num_heads_q) * p.total_seqlen_q
                                     : __int128(p.batch_size) * p.num_heads_q * p.seqlen_q;
}

flashcore_status check_int32_arrays(const flashcore_forward_params &p) {
    Int32Array arrays[kMaxInt32Arrays];
    const size_t count = int32_arrays(p, arrays);
    for (size_t i = 0; i < count; ++i) {
        const flashcore_status status = check_pointer(arrays[i].data, arrays[i].name, alignof(int32_t));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

size_t int32_array_ranges(const flashcore_forward_params &p, ByteRange *ranges) {
    Int32Array arrays[kMaxInt32Arrays];
    const size_t count = int32_arrays(p, arrays);
    for (size_t i = 0; i < count; ++i) ranges[i] = int32_range(arrays[i].name, arrays[i].data, arrays[i].count);
    return count;
}

flashcore_status check_sinks(const flashcore_forward_params &p) {
    return p.sinks != nullptr ? check_pointer(p.sinks, "sinks", alignof(float)) : FLASHCORE_STATUS_SUCCESS;
}

size_t sinks_ranges(const flashcore_forward_params &p, ByteRange *ranges) {
    if (p.sinks == nullptr) return 0;
    ranges[0] = float_range("sinks", p.sinks, p.num_heads_q);
    return 1;
}

size_t forward_ranges(const flashcore_forward_params &p, ByteRange *ranges) {
    size_t n = 0;
    for (int i = 0; i < kForwardTensors; ++i) ranges[n++] = tensor_range(forward_tensor(p, i), i == kForwardOut);
    if (p.lse != nullptr) ranges[n++] = lse_range(p.lse, lse_entries(p));
    const std::array<Descale, 3> all = descales(p);
    for (const Descale &d : all) {
        if (d.data == nullptr) continue;
        // The last factor the kernels may read, of the last batch and K/V head.
        const __int128 count = __int128(p.batch_size - 1) * d.batch_stride +
                               __int128(p.num_heads_kv - 1) * d.head_stride + 1;
        ranges[n++] = float_range(d.name, d.data, count);
    }
    n += sinks_ranges(p, ranges + n);
    return n + int32_array_ranges(p, ranges + n);
}

namespace {

// Whether v is the first head_dim_v columns of k's rows: the same pointer
// and strides (MLA's latent cache, where V is a view of the cache K is).
bool v_is_k_view(const flashcore_forward_params &p) {
    return p.v == p.k && p.v_batch_stride == p.k_batch_stride && p.v_seq_stride == p.k_seq_stride &&
           p.v_head_stride == p.k_head_stride && effective_head_dim_v(p) <= p.head_dim;
}

// Head dims whose kernel reads V from K's rows (MLA's latent cache: the
// registry's v_in_k) take only a v that is k's view.
flashcore_status check_v_view(const flashcore_forward_params &p) {
    HeadDims dims{};
    if (!covering_head_dims(fwd_head_dims_for(p), {p.head_dim, effective_head_dim_v(p)}, &dims)) {
        return FLASHCORE_STATUS_SUCCESS;  // validate_shapes' to refuse
    }
    if (!fwd_head_dims_read_v_from_k(dims) || v_is_k_view(p)) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "head dims (%d, %d) run on the kernel for (%d, %d), DeepSeek MLA's latent cache, which reads v as the "
                "first head_dim_v columns of k's rows: pass v = k with k's strides, or head dims that another kernel "
                "covers (flashcore_supported_head_dims)",
                int(p.head_dim), int(effective_head_dim_v(p)), int(dims.head_dim), int(dims.head_dim_v));
}

}  // namespace

flashcore_status validate_tensors(const flashcore_forward_params &p) {
    if (forward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    for (int i = 0; i < kForwardTensors; ++i) {
        const flashcore_status status = check_tensor(forward_tensor(p, i));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    flashcore_status status = check_no_self_overlap(forward_tensor(p, kForwardOut));
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = check_int32_arrays(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_sinks(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const std::array<Descale, 3> all = descales(p);
    for (const Descale &d : all) {
        if (d.data == nullptr) continue;
        status = check_pointer(d.data, d.name, alignof(float));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    // After each tensor's own checks, whose messages name a bad field (a bad
    // k stride would otherwise read as v not being k's view).
    status = check_v_view(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    ByteRange ranges[kMaxForwardRanges];
    return check_no_aliasing(ranges, forward_ranges(p, ranges));
}

}  // namespace flashcore
