#include "validate.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>

#include "error.h"
#include "kernel_registry.h"
#include "params.h"

namespace flashcore {
namespace {

constexpr size_t kLseAlignment = alignof(float);
constexpr size_t kElementBytes = 2;  // fp16 and bf16

flashcore_status check_pointer(const void *ptr, const char *name, size_t alignment) {
    if (ptr == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
        return fail(FLASHCORE_STATUS_MISALIGNED, "%s (%p) must be %zu-byte aligned", name, ptr, alignment);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

struct TensorDims {
    const char *name;
    const void *data;
    int32_t batch, seqlen, heads;
    int32_t dim;  // the contiguous last dimension: head_dim, or head_dim_v for v and out
    int64_t batch_stride, seq_stride, head_stride;
    size_t element_bytes = kElementBytes;
    // A fourth strided dimension (the merge's states); extent 1: none.
    int32_t states = 1;
    int64_t state_stride = 0;
    const char *state_stride_name = "state_stride";
    const char *stride_prefix = nullptr;  // strides are <prefix>_<dimension>_stride; nullptr: name
};

// Pointer, stride signs and alignment, and an addressable extent. Strides
// are named <name>_<dimension>_stride, as in the params structs.
flashcore_status check_tensor(const TensorDims &t) {
    flashcore_status status = check_pointer(t.data, t.name, FLASHCORE_ALIGNMENT);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const int64_t stride_multiple = int64_t(FLASHCORE_ALIGNMENT / t.element_bytes);
    const char *prefix = t.stride_prefix != nullptr ? t.stride_prefix : t.name;
    const struct {
        const char *suffix;
        int64_t stride;
        int32_t extent;
    } dims[4] = {{"batch_stride", t.batch_stride, t.batch},
                 {"seq_stride", t.seq_stride, t.seqlen},
                 {"head_stride", t.head_stride, t.heads},
                 {t.state_stride_name, t.state_stride, t.states}};
    // The largest element offset must be addressable in bytes: bounds the
    // kernels' 64-bit pointer arithmetic.
    __int128 last_offset = t.dim - 1;
    for (const auto &d : dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s_%s (%" PRId64 ") must be >= 0", prefix, d.suffix,
                        d.stride);
        }
        if (d.stride % stride_multiple != 0) {
            return fail(FLASHCORE_STATUS_MISALIGNED,
                        "%s_%s (%" PRId64 ") must be a multiple of %" PRId64
                        " elements (%d bytes); the head dimension must be the contiguous last dimension",
                        prefix, d.suffix, d.stride, stride_multiple, FLASHCORE_ALIGNMENT);
        }
        last_offset += __int128(d.extent - 1) * d.stride;
    }
    if (last_offset * __int128(t.element_bytes) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s strides address more than 2^63 bytes", t.name);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

// Sufficient condition for a strided tensor to give every element its own
// address: ordered by stride, each dimension steps over the whole extent of
// the ones below it (the head dimension being the innermost, contiguous one).
flashcore_status check_no_self_overlap(const TensorDims &t) {
    struct Dim {
        int64_t stride;
        int32_t extent;
    } dims[3] = {{t.batch_stride, t.batch}, {t.seq_stride, t.seqlen}, {t.head_stride, t.heads}};
    std::sort(std::begin(dims), std::end(dims), [](const Dim &a, const Dim &b) { return a.stride < b.stride; });
    __int128 span = t.dim;  // elements covered by the dimensions below
    for (const Dim &d : dims) {
        if (d.extent == 1) continue;
        if (__int128(d.stride) < span) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s strides (batch %" PRId64 ", seq %" PRId64 ", head %" PRId64
                        ") make elements overlap; the output needs a distinct address for each element",
                        t.name, t.batch_stride, t.seq_stride, t.head_stride);
        }
        span = __int128(d.stride) * d.extent;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

// Fails with UNSUPPORTED: `problem`, then the head dims this build has and
// the rule by which the others run.
flashcore_status unsupported_head_dims(const char *problem) {
    std::string pairs;
    for (const HeadDims &d : supported_head_dims()) {
        if (!pairs.empty()) pairs += ", ";
        pairs += "(" + std::to_string(d.head_dim) + ", " + std::to_string(d.head_dim_v) + ")";
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s; supported (head_dim, head_dim_v): %s, and any pair of multiples of %d that one of these "
                "covers (it runs on the first with both at least its own)",
                problem, pairs.c_str(), int(kHeadDimMultiple));
}

// The call's head dims have a kernel: multiples of kHeadDimMultiple that a
// pair of the registry covers.
flashcore_status check_head_dims(const flashcore_forward_params &p) {
    const HeadDims call{p.head_dim, effective_head_dim_v(p)};
    // Named as the caller set it: head_dim_v 0 stands for head_dim.
    const char *v_name = p.head_dim_v == 0 ? "head_dim_v (0, so head_dim)" : "head_dim_v";
    char problem[160];
    HeadDims kernel{};
    if (call.head_dim % kHeadDimMultiple != 0) {
        std::snprintf(problem, sizeof problem, "head_dim %d is not a multiple of %d", int(call.head_dim),
                      int(kHeadDimMultiple));
    } else if (call.head_dim_v % kHeadDimMultiple != 0) {
        std::snprintf(problem, sizeof problem, "%s %d is not a multiple of %d", v_name, int(call.head_dim_v),
                      int(kHeadDimMultiple));
    } else if (covering_head_dims(call, &kernel)) {
        return FLASHCORE_STATUS_SUCCESS;
    } else {
        // No pair covers the call: either head_dim exceeds every pair's, or
        // head_dim_v exceeds that of every pair wide enough for head_dim.
        int32_t max_head_dim = 0, max_head_dim_v = 0, max_head_dim_v_here = 0;
        for (const HeadDims &d : supported_head_dims()) {
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
    return unsupported_head_dims(problem);
}

}  // namespace

flashcore_status validate_sizes(const flashcore_forward_params &p) {
    const struct {
        int32_t value;
        const char *name;
    } sizes[] = {{p.batch_size, "batch_size"},   {p.seqlen_q, "seqlen_q"},         {p.seqlen_k, "seqlen_k"},
                 {p.num_heads_q, "num_heads_q"}, {p.num_heads_kv, "num_heads_kv"}, {p.head_dim, "head_dim"}};
    for (const auto &s : sizes) {
        if (s.value < 1) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be >= 1", s.name, int(s.value));
        }
    }
    if (p.head_dim_v < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim_v (%d) must be >= 1, or 0 for the same as head_dim",
                    int(p.head_dim_v));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_shapes(const flashcore_forward_params &p) {
    if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "dtype %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d)",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16));
    }
    flashcore_status status = validate_sizes(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.num_heads_q % p.num_heads_kv != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                    int(p.num_heads_q), int(p.num_heads_kv));
    }
    status = check_head_dims(p);
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
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_tensors(const flashcore_forward_params &p) {
    const int32_t d = p.head_dim;
    const int32_t dv = effective_head_dim_v(p);
    const TensorDims tensors[] = {
        {"q", p.q, p.batch_size, p.seqlen_q, p.num_heads_q, d, p.q_batch_stride, p.q_seq_stride, p.q_head_stride},
        {"k", p.k, p.batch_size, p.seqlen_k, p.num_heads_kv, d, p.k_batch_stride, p.k_seq_stride, p.k_head_stride},
        {"v", p.v, p.batch_size, p.seqlen_k, p.num_heads_kv, dv, p.v_batch_stride, p.v_seq_stride, p.v_head_stride},
        {"out", p.out, p.batch_size, p.seqlen_q, p.num_heads_q, dv, p.out_batch_stride, p.out_seq_stride,
         p.out_head_stride},
    };
    for (const TensorDims &t : tensors) {
        const flashcore_status status = check_tensor(t);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    flashcore_status status = check_no_self_overlap(tensors[3]);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

namespace {

size_t merge_element_bytes(int32_t dtype) { return dtype == FLASHCORE_DTYPE_FP32 ? 4 : 2; }

flashcore_status check_merge_dtype(int32_t dtype, const char *name) {
    if (dtype == FLASHCORE_DTYPE_FP16 || dtype == FLASHCORE_DTYPE_BF16 || dtype == FLASHCORE_DTYPE_FP32) {
        return FLASHCORE_STATUS_SUCCESS;
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d), "
                "FLASHCORE_DTYPE_FP32 (%d)",
                name, int(dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16), int(FLASHCORE_DTYPE_FP32));
}

}  // namespace

flashcore_status validate_merge(const flashcore_merge_params &p) {
    flashcore_status status = check_merge_dtype(p.partial_dtype, "partial_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_merge_dtype(p.out_dtype, "out_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const struct {
        int32_t value;
        const char *name;
    } sizes[] = {{p.num_states, "num_states"}, {p.batch_size, "batch_size"}, {p.num_heads, "num_heads"},
                 {p.seqlen, "seqlen"},         {p.head_dim, "head_dim"}};
    for (const auto &s : sizes) {
        if (s.value < 1) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be >= 1", s.name, int(s.value));
    }
    if (p.head_dim % kHeadDimMultiple != 0) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "head_dim %d is not a multiple of %d", int(p.head_dim),
                    int(kHeadDimMultiple));
    }
    TensorDims partial{"partial_out", p.partial_out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                       p.partial_batch_stride, p.partial_seq_stride, p.partial_head_stride};
    partial.element_bytes = merge_element_bytes(p.partial_dtype);
    partial.states = p.num_states;
    partial.state_stride = p.partial_state_stride;
    partial.stride_prefix = "partial";
    TensorDims out{"out", p.out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                   p.out_batch_stride, p.out_seq_stride, p.out_head_stride};
    out.element_bytes = merge_element_bytes(p.out_dtype);
    for (const TensorDims *t : {&partial, &out}) {
        status = check_tensor(*t);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = check_no_self_overlap(out);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;

    // The LSE values: 4-byte aligned, any non-negative strides.
    status = check_pointer(p.partial_lse, "partial_lse", kLseAlignment);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const struct {
        const char *name;
        int64_t stride;
        int32_t extent;
    } lse_dims[] = {{"lse_state_stride", p.lse_state_stride, p.num_states},
                    {"lse_batch_stride", p.lse_batch_stride, p.batch_size},
                    {"lse_head_stride", p.lse_head_stride, p.num_heads},
                    {"lse_seq_stride", p.lse_seq_stride, p.seqlen}};
    __int128 last_lse = 0;
    for (const auto &d : lse_dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%" PRId64 ") must be >= 0", d.name, d.stride);
        }
        last_lse += __int128(d.extent - 1) * d.stride;
    }
    if (last_lse * __int128(sizeof(float)) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "partial_lse strides address more than 2^63 bytes");
    }
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
