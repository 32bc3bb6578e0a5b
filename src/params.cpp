#include "params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "error.h"

namespace flashcore {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

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
    // documented default. So is head_dim_v (0: same as head_dim).
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
    // A struct larger than ours is from a newer header: fine as long as it
    // sets nothing past the fields we know (a new field may sit in what is
    // padding to us). A struct of our size or less is from our header or an
    // older one, whose padding is not looked at.
    if (size > sizeof(flashcore_forward_params)) {
        const unsigned char *bytes = reinterpret_cast<const unsigned char *>(user);
        for (size_t i = kParamsKnownEnd; i < size; ++i) {
            if (bytes[i] != 0) {
                return fail(FLASHCORE_STATUS_UNSUPPORTED,
                            "params sets fields beyond the %zu bytes this library (version %s) knows; it was "
                            "built against a newer flashcore.h",
                            kParamsKnownEnd, flashcore_version_string());
            }
        }
    }
    // A struct from an older header keeps the defaults of the fields it lacks.
    init_params(params, sizeof(flashcore_forward_params));
    std::memcpy(static_cast<void *>(params), user, std::min(size, kParamsKnownEnd));
    return FLASHCORE_STATUS_SUCCESS;
}

float effective_softmax_scale(const flashcore_forward_params &p) {
    return p.softmax_scale == FLASHCORE_SOFTMAX_SCALE_DEFAULT ? 1.f / std::sqrt(float(p.head_dim)) : p.softmax_scale;
}

int32_t effective_head_dim_v(const flashcore_forward_params &p) {
    return p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
}

void set_contiguous_strides(flashcore_forward_params *strides, const flashcore_forward_params &p,
                            flashcore_layout layout) {
    auto set = [&](int64_t seqlen, int64_t heads, int64_t dim, int64_t *batch_stride, int64_t *seq_stride,
                   int64_t *head_stride) {
        if (layout == FLASHCORE_LAYOUT_BHSD) {
            *seq_stride = dim;
            *head_stride = seqlen * dim;
        } else {
            *head_stride = dim;
            *seq_stride = heads * dim;
        }
        *batch_stride = heads * seqlen * dim;
    };
    const int64_t d = p.head_dim;
    const int64_t dv = effective_head_dim_v(p);
    set(p.seqlen_q, p.num_heads_q, d, &strides->q_batch_stride, &strides->q_seq_stride, &strides->q_head_stride);
    set(p.seqlen_k, p.num_heads_kv, d, &strides->k_batch_stride, &strides->k_seq_stride, &strides->k_head_stride);
    set(p.seqlen_k, p.num_heads_kv, dv, &strides->v_batch_stride, &strides->v_seq_stride, &strides->v_head_stride);
    set(p.seqlen_q, p.num_heads_q, dv, &strides->out_batch_stride, &strides->out_seq_stride,
        &strides->out_head_stride);
}

FwdKernelParams kernel_params(const flashcore_forward_params &p) {
    FwdKernelParams k{};
    k.q = p.q;
    k.k = p.k;
    k.v = p.v;
    k.out = p.out;
    k.lse = p.lse;
    k.q_batch_stride = p.q_batch_stride;
    k.q_seq_stride = p.q_seq_stride;
    k.q_head_stride = p.q_head_stride;
    k.k_batch_stride = p.k_batch_stride;
    k.k_seq_stride = p.k_seq_stride;
    k.k_head_stride = p.k_head_stride;
    k.v_batch_stride = p.v_batch_stride;
    k.v_seq_stride = p.v_seq_stride;
    k.v_head_stride = p.v_head_stride;
    k.out_batch_stride = p.out_batch_stride;
    k.out_seq_stride = p.out_seq_stride;
    k.out_head_stride = p.out_head_stride;
    k.batch_size = p.batch_size;
    k.seqlen_q = p.seqlen_q;
    k.seqlen_k = p.seqlen_k;
    k.num_heads_q = p.num_heads_q;
    k.num_heads_kv = p.num_heads_kv;
    k.head_dim = p.head_dim;
    k.head_dim_v = effective_head_dim_v(p);
    k.softmax_scale = effective_softmax_scale(p);
    k.softmax_scale_log2 = k.softmax_scale * kLog2e;
    k.causal = p.causal != 0;
    return k;
}

}  // namespace flashcore
