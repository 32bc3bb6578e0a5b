#include "validate.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <iterator>

#include "error.h"

namespace flashcore {
namespace {

constexpr size_t kLseAlignment = alignof(float);
constexpr size_t kElementBytes = 2;  // fp16 and bf16
constexpr int64_t kStrideMultiple = FLASHCORE_ALIGNMENT / kElementBytes;

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
    int64_t batch_stride, seq_stride, head_stride;
};

flashcore_status check_tensor(const TensorDims &t, int32_t head_dim) {
    flashcore_status status = check_pointer(t.data, t.name, FLASHCORE_ALIGNMENT);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const struct {
        const char *suffix;
        int64_t stride;
        int32_t extent;
    } dims[3] = {{"batch_stride", t.batch_stride, t.batch},
                 {"seq_stride", t.seq_stride, t.seqlen},
                 {"head_stride", t.head_stride, t.heads}};
    // The largest element offset must be addressable in bytes: bounds the
    // kernels' 64-bit pointer arithmetic.
    __int128 last_offset = head_dim - 1;
    for (const auto &d : dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s_%s (%" PRId64 ") must be >= 0", t.name, d.suffix,
                        d.stride);
        }
        if (d.stride % kStrideMultiple != 0) {
            return fail(FLASHCORE_STATUS_MISALIGNED,
                        "%s_%s (%" PRId64 ") must be a multiple of %" PRId64
                        " elements (%d bytes); head_dim must be the contiguous last dimension",
                        t.name, d.suffix, d.stride, kStrideMultiple, FLASHCORE_ALIGNMENT);
        }
        last_offset += __int128(d.extent - 1) * d.stride;
    }
    if (last_offset * __int128(kElementBytes) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s strides address more than 2^63 bytes", t.name);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

// Sufficient condition for a strided tensor to give every element its own
// address: ordered by stride, each dimension steps over the whole extent of
// the ones below it (head_dim being the innermost, contiguous one).
flashcore_status check_no_self_overlap(const TensorDims &t, int32_t head_dim) {
    struct Dim {
        int64_t stride;
        int32_t extent;
    } dims[3] = {{t.batch_stride, t.batch}, {t.seq_stride, t.seqlen}, {t.head_stride, t.heads}};
    std::sort(std::begin(dims), std::end(dims), [](const Dim &a, const Dim &b) { return a.stride < b.stride; });
    __int128 span = head_dim;  // elements covered by the dimensions below
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

}  // namespace

flashcore_status check_struct_size(size_t size, const char *what) {
    if (size < kParamsSizeV0_1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "%s (%zu) is smaller than flashcore_forward_params of version 0.1 (%zu bytes); pass "
                    "sizeof(flashcore_forward_params) to flashcore_forward_params_init",
                    what, size, kParamsSizeV0_1);
    }
    if (size > kMaxPlausibleStructSize) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "%s (%zu) is not a valid size; pass sizeof(flashcore_forward_params) to "
                    "flashcore_forward_params_init",
                    what, size);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

void init_params(flashcore_forward_params *params, size_t struct_size) {
    // Fields this library does not know (a newer caller's) are zero: their
    // documented default.
    std::memset(static_cast<void *>(params), 0, struct_size);
    flashcore_forward_params defaults{};
    defaults.struct_size = struct_size;
    defaults.dtype = FLASHCORE_DTYPE_FP16;
    defaults.softmax_scale = FLASHCORE_SOFTMAX_SCALE_DEFAULT;
    std::memcpy(static_cast<void *>(params), &defaults, std::min(struct_size, sizeof defaults));
}

flashcore_status read_params(const flashcore_forward_params *user, flashcore_forward_params *params) {
    if (user == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
    const size_t size = user->struct_size;
    const flashcore_status status = check_struct_size(size, "params->struct_size");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // A struct from a newer header: fine as long as it uses nothing we lack.
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(user);
    for (size_t i = sizeof(flashcore_forward_params); i < size; ++i) {
        if (bytes[i] != 0) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "params sets fields beyond the %zu bytes this library (version %s) knows; it was "
                        "built against a newer flashcore.h",
                        sizeof(flashcore_forward_params), flashcore_version_string());
        }
    }
    // A struct from an older header keeps the defaults of the fields it lacks.
    init_params(params, sizeof(flashcore_forward_params));
    std::memcpy(static_cast<void *>(params), user, std::min(size, sizeof(flashcore_forward_params)));
    return FLASHCORE_STATUS_SUCCESS;
}

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
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_shapes(const flashcore_forward_params &p) {
    if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "dtype %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d)",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16));
    }
    const flashcore_status status = validate_sizes(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.num_heads_q % p.num_heads_kv != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                    int(p.num_heads_q), int(p.num_heads_kv));
    }
    if (std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), p.head_dim) ==
        std::end(kSupportedHeadDims)) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "head_dim %d is not supported; supported head dims: 64, 128",
                    int(p.head_dim));
    }
    if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "seqlen_q (%d) and seqlen_k (%d) must be at most %d",
                    int(p.seqlen_q), int(p.seqlen_k), int(kMaxSeqlen));
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
    const TensorDims tensors[] = {
        {"q", p.q, p.batch_size, p.seqlen_q, p.num_heads_q, p.q_batch_stride, p.q_seq_stride, p.q_head_stride},
        {"k", p.k, p.batch_size, p.seqlen_k, p.num_heads_kv, p.k_batch_stride, p.k_seq_stride, p.k_head_stride},
        {"v", p.v, p.batch_size, p.seqlen_k, p.num_heads_kv, p.v_batch_stride, p.v_seq_stride, p.v_head_stride},
        {"out", p.out, p.batch_size, p.seqlen_q, p.num_heads_q, p.out_batch_stride, p.out_seq_stride,
         p.out_head_stride},
    };
    for (const TensorDims &t : tensors) {
        const flashcore_status status = check_tensor(t, p.head_dim);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    flashcore_status status = check_no_self_overlap(tensors[3], p.head_dim);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    return FLASHCORE_STATUS_SUCCESS;
}

float effective_softmax_scale(const flashcore_forward_params &p) {
    return p.softmax_scale == FLASHCORE_SOFTMAX_SCALE_DEFAULT ? 1.f / std::sqrt(float(p.head_dim)) : p.softmax_scale;
}

}  // namespace flashcore
