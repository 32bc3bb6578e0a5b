#include "fwd/forward_params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "error.h"
#include "struct_io.h"

namespace flashcore {

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
    return check_released_size<flashcore_forward_params>(size, what, "flashcore_forward_params", kReleasedParamsEnds,
                                                         "0.1");
}

void init_params(flashcore_forward_params *params, size_t struct_size) {
    // head_dim_v 0 (same as head_dim) and num_splits 0 (the library's
    // choice) are defaults too.
    flashcore_forward_params defaults{};
    defaults.struct_size = struct_size;
    defaults.dtype = FLASHCORE_DTYPE_FP16;
    defaults.softmax_scale = FLASHCORE_SOFTMAX_SCALE_DEFAULT;
    write_defaults(params, struct_size, defaults);
}

flashcore_status read_params(const flashcore_forward_params *user, flashcore_forward_params *params) {
    return read_struct(user, params, check_struct_size, kParamsKnownEnd, init_params);
}

float effective_softmax_scale(const flashcore_forward_params &p) {
    return p.softmax_scale == FLASHCORE_SOFTMAX_SCALE_DEFAULT ? 1.f / std::sqrt(float(p.head_dim)) : p.softmax_scale;
}

float softmax_scale_log2(const flashcore_forward_params &p) { return effective_softmax_scale(p) * kLog2e; }

float softcap_prescale(const flashcore_forward_params &p) {
    return p.softcap > 0.f ? effective_softmax_scale(p) / p.softcap : 0.f;
}

int32_t effective_window_left(const flashcore_forward_params &p) {
    return p.use_window != 0 && p.window_left >= 0 ? p.window_left : kWindowUnbounded;
}

int32_t effective_window_right(const flashcore_forward_params &p) {
    if (p.causal != 0) return 0;
    return p.use_window != 0 && p.window_right >= 0 ? p.window_right : kWindowUnbounded;
}

bool is_ragged(const flashcore_forward_params &p) {
    return p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr || p.block_table != nullptr;
}

int32_t effective_head_dim_v(const flashcore_forward_params &p) {
    return p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
}

int32_t effective_kv_dtype(const flashcore_forward_params &p) { return p.kv_dtype == 0 ? p.dtype : p.kv_dtype; }

bool has_quantized_kv(const flashcore_forward_params &p) { return effective_kv_dtype(p) != p.dtype; }

bool has_fp8_queries(const flashcore_forward_params &p) { return p.dtype == FLASHCORE_DTYPE_FP8_E4M3; }

int32_t effective_out_dtype(const flashcore_forward_params &p) {
    if (p.out_dtype != 0) return p.out_dtype;
    return has_fp8_queries(p) ? FLASHCORE_DTYPE_BF16 : p.dtype;
}

flashcore_status set_contiguous_strides(flashcore_forward_params *strides, const flashcore_forward_params &p,
                                        int32_t layout) {
    struct Packed {
        const char *name;
        int32_t batch, seqlen, heads, dim;
        int64_t *batch_stride, *seq_stride, *head_stride;
        int64_t batch_value, seq_value, head_value;
    };
    const int32_t d = p.head_dim;
    const int32_t dv = effective_head_dim_v(p);
    Packed tensors[] = {
        {"q", p.batch_size, p.seqlen_q, p.num_heads_q, d, &strides->q_batch_stride, &strides->q_seq_stride,
         &strides->q_head_stride, 0, 0, 0},
        {"k", p.batch_size, p.seqlen_k, p.num_heads_kv, d, &strides->k_batch_stride, &strides->k_seq_stride,
         &strides->k_head_stride, 0, 0, 0},
        {"v", p.batch_size, p.seqlen_k, p.num_heads_kv, dv, &strides->v_batch_stride, &strides->v_seq_stride,
         &strides->v_head_stride, 0, 0, 0},
        {"out", p.batch_size, p.seqlen_q, p.num_heads_q, dv, &strides->out_batch_stride, &strides->out_seq_stride,
         &strides->out_head_stride, 0, 0, 0},
    };
    // Every product first, in 128 bits (each size < 2^31): nothing is
    // written unless all four tensors fit.
    // The dtype is not validated yet: an unknown one counts as the widest.
    // e4m3 queries write a two-byte out: the widest counts.
    const size_t dtype_size = dtype_bytes(DType(p.dtype)) == 1 ? kWidestDTypeBytes : dtype_bytes(DType(p.dtype));
    const __int128 element_bytes = dtype_size != 0 ? dtype_size : kWidestDTypeBytes;
    for (Packed &t : tensors) {
        const __int128 seq = layout == FLASHCORE_LAYOUT_BHSD ? __int128(t.dim) : __int128(t.heads) * t.dim;
        const __int128 head = layout == FLASHCORE_LAYOUT_BHSD ? __int128(t.seqlen) * t.dim : __int128(t.dim);
        const __int128 batch = __int128(t.heads) * t.seqlen * t.dim;
        if (batch * std::max<int32_t>(t.batch, 1) * element_bytes > __int128(INT64_MAX)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "packed %s of batch_size %d x %d heads x seqlen %d x %d would span more than 2^63 bytes",
                        t.name, int(t.batch), int(t.heads), int(t.seqlen), int(t.dim));
        }
        t.batch_value = int64_t(batch);
        t.seq_value = int64_t(seq);
        t.head_value = int64_t(head);
    }
    for (const Packed &t : tensors) {
        *t.batch_stride = t.batch_value;
        *t.seq_stride = t.seq_value;
        *t.head_stride = t.head_value;
    }
    return FLASHCORE_STATUS_SUCCESS;
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
    // With a softcap the kernels cap t = tanh(q.k * scale / softcap) and
    // exponentiate softcap * t: softcap takes the scale's place.
    const bool capped = p.softcap > 0.f;
    k.softmax_scale = capped ? p.softcap : effective_softmax_scale(p);
    k.softmax_scale_log2 = k.softmax_scale * kLog2e;
    k.softcap_prescale = softcap_prescale(p);
    k.causal = p.causal != 0;
    // A left bound of seqlen_k (a right one of seqlen_q - 1) already shows
    // every key on that side to every query; clamped there, the kernels'
    // position + bound sums stay below 2^31 (KeyMask). With INT32_MAX
    // standing for "unbounded" and comparisons written to avoid the
    // overflowing sums, calls with seqlen_q > seqlen_k still came out wrong
    // on the GPU (every path) while the same KeyMask was right on the host:
    // a signed overflow is undefined, and the compiler may fold such a
    // comparison and select into a min() of the sum.
    k.window_left = std::min(effective_window_left(p), p.seqlen_k);
    k.window_right = std::min(effective_window_right(p), std::max(p.seqlen_q - 1, 0));
    k.attention_chunk = p.attention_chunk;
    k.sinks = p.sinks;
    k.seqused_k = p.seqused_k;
    // Packed tensors: every address is batch * batch_stride + row *
    // seq_stride, the row from cu_seqlens, so their batch strides are 0.
    k.cu_seqlens_q = p.cu_seqlens_q;
    k.cu_seqlens_k = p.cu_seqlens_k;
    k.ragged = is_ragged(p);
    k.total_seqlen_q = p.cu_seqlens_q != nullptr ? p.total_seqlen_q : p.seqlen_q;
    k.total_seqlen_k = p.cu_seqlens_k != nullptr ? p.total_seqlen_k : p.seqlen_k;
    if (p.cu_seqlens_q != nullptr) {
        k.q_batch_stride = 0;
        k.out_batch_stride = 0;
        k.lse_batch_stride = 0;
        k.lse_head_stride = p.total_seqlen_q;
    } else {
        k.lse_batch_stride = int64_t(p.num_heads_q) * p.seqlen_q;
        k.lse_head_stride = p.seqlen_q;
    }
    if (p.cu_seqlens_k != nullptr) {
        k.k_batch_stride = 0;
        k.v_batch_stride = 0;
    }
    k.block_table = p.block_table;
    k.block_table_batch_stride = p.block_table_batch_stride;
    k.page_size = p.page_size;
    k.num_pages = p.num_pages;
    k.page_shift = -1;
    if (p.page_size > 0 && (p.page_size & (p.page_size - 1)) == 0) {
        k.page_shift = 0;
        while ((1 << k.page_shift) < p.page_size) ++k.page_shift;
    }
    k.packed_heads = 1;
    k.num_splits = 1;
    k.k_descale = p.k_descale;
    k.v_descale = p.v_descale;
    k.k_descale_batch_stride = p.k_descale_batch_stride;
    k.k_descale_head_stride = p.k_descale_head_stride;
    k.v_descale_batch_stride = p.v_descale_batch_stride;
    k.v_descale_head_stride = p.v_descale_head_stride;
    k.q_descale = p.q_descale;
    k.q_descale_batch_stride = p.q_descale_batch_stride;
    k.q_descale_head_stride = p.q_descale_head_stride;
    return k;
}

}  // namespace flashcore
