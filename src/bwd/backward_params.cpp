#include "bwd/backward_params.h"

#include "error.h"
#include "fwd/forward_params.h"
#include "struct_io.h"

namespace flashcore {

flashcore_status check_backward_struct_size(size_t size, const char *what) {
    return check_released_size<flashcore_backward_params>(size, what, "flashcore_backward_params",
                                                          kBackwardReleasedParamsEnds, "0.7");
}

void init_backward_params(flashcore_backward_params *params, size_t struct_size) {
    // head_dim_v 0 (same as head_dim), no window, no softcap and not
    // deterministic are defaults too.
    flashcore_backward_params defaults{};
    defaults.struct_size = struct_size;
    defaults.dtype = FLASHCORE_DTYPE_FP16;
    defaults.softmax_scale = FLASHCORE_SOFTMAX_SCALE_DEFAULT;
    write_defaults(params, struct_size, defaults);
}

flashcore_status read_backward_params(const flashcore_backward_params *user, flashcore_backward_params *params) {
    return read_struct(user, params, check_backward_struct_size, kBackwardParamsKnownEnd, init_backward_params);
}

flashcore_forward_params forward_view(const flashcore_backward_params &p) {
    flashcore_forward_params f{};
    f.struct_size = sizeof f;
    f.dtype = p.dtype;
    f.batch_size = p.batch_size;
    f.seqlen_q = p.seqlen_q;
    f.seqlen_k = p.seqlen_k;
    f.num_heads_q = p.num_heads_q;
    f.num_heads_kv = p.num_heads_kv;
    f.head_dim = p.head_dim;
    f.head_dim_v = p.head_dim_v;
    f.causal = p.causal;
    f.softmax_scale = p.softmax_scale;
    f.use_window = p.use_window;
    f.window_left = p.window_left;
    f.window_right = p.window_right;
    f.softcap = p.softcap;
    f.num_splits = 1;
    f.q = p.q;
    f.k = p.k;
    f.v = p.v;
    // The forward writes out and lse; the backward pass only reads them
    // (BwdKernelParams::fwd), and no check of the view writes through them.
    f.out = const_cast<void *>(p.out);
    f.lse = const_cast<float *>(p.lse);
    f.q_batch_stride = p.q_batch_stride;
    f.q_seq_stride = p.q_seq_stride;
    f.q_head_stride = p.q_head_stride;
    f.k_batch_stride = p.k_batch_stride;
    f.k_seq_stride = p.k_seq_stride;
    f.k_head_stride = p.k_head_stride;
    f.v_batch_stride = p.v_batch_stride;
    f.v_seq_stride = p.v_seq_stride;
    f.v_head_stride = p.v_head_stride;
    f.out_batch_stride = p.out_batch_stride;
    f.out_seq_stride = p.out_seq_stride;
    f.out_head_stride = p.out_head_stride;
    f.seqused_k = p.seqused_k;
    f.cu_seqlens_q = p.cu_seqlens_q;
    f.cu_seqlens_k = p.cu_seqlens_k;
    f.total_seqlen_q = p.total_seqlen_q;
    f.total_seqlen_k = p.total_seqlen_k;
    f.attention_chunk = p.attention_chunk;
    f.sinks = p.sinks;
    f.sm_margin = p.sm_margin;
    return f;
}

flashcore_status set_backward_contiguous_strides(flashcore_backward_params *strides,
                                                 const flashcore_backward_params &shapes, int32_t layout) {
    // Each gradient has the shape of the tensor it is the gradient of, and
    // dout that of out: the forward's four packed tensors give all eight.
    const flashcore_forward_params view = forward_view(shapes);
    flashcore_forward_params packed = view;
    const flashcore_status status = set_contiguous_strides(&packed, view, layout);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    flashcore_backward_params &s = *strides;
    s.q_batch_stride = s.dq_batch_stride = packed.q_batch_stride;
    s.q_seq_stride = s.dq_seq_stride = packed.q_seq_stride;
    s.q_head_stride = s.dq_head_stride = packed.q_head_stride;
    s.k_batch_stride = s.dk_batch_stride = packed.k_batch_stride;
    s.k_seq_stride = s.dk_seq_stride = packed.k_seq_stride;
    s.k_head_stride = s.dk_head_stride = packed.k_head_stride;
    s.v_batch_stride = s.dv_batch_stride = packed.v_batch_stride;
    s.v_seq_stride = s.dv_seq_stride = packed.v_seq_stride;
    s.v_head_stride = s.dv_head_stride = packed.v_head_stride;
    s.out_batch_stride = s.dout_batch_stride = packed.out_batch_stride;
    s.out_seq_stride = s.dout_seq_stride = packed.out_seq_stride;
    s.out_head_stride = s.dout_head_stride = packed.out_head_stride;
    return FLASHCORE_STATUS_SUCCESS;
}

int64_t dq_accum_rows_per_head(const flashcore_backward_params &p) {
    return p.cu_seqlens_q != nullptr ? p.total_seqlen_q : p.seqlen_q;
}

BwdKernelParams bwd_kernel_params(const flashcore_backward_params &p, void *workspace) {
    const flashcore_forward_params view = forward_view(p);
    BwdKernelParams k{};
    k.fwd = kernel_params(view);
    k.fwd.divisors = fwd_divisors(k.fwd, /*block_m=*/1);
    k.dout = p.dout;
    k.dq = p.dq;
    k.dk = p.dk;
    k.dv = p.dv;
    k.dout_batch_stride = p.dout_batch_stride;
    k.dout_seq_stride = p.dout_seq_stride;
    k.dout_head_stride = p.dout_head_stride;
    k.dq_batch_stride = p.dq_batch_stride;
    k.dq_seq_stride = p.dq_seq_stride;
    k.dq_head_stride = p.dq_head_stride;
    k.dk_batch_stride = p.dk_batch_stride;
    k.dk_seq_stride = p.dk_seq_stride;
    k.dk_head_stride = p.dk_head_stride;
    k.dv_batch_stride = p.dv_batch_stride;
    k.dv_seq_stride = p.dv_seq_stride;
    k.dv_head_stride = p.dv_head_stride;
    // Packed tensors: rows come from cu_seqlens, as in kernel_params.
    if (p.cu_seqlens_q != nullptr) {
        k.dout_batch_stride = 0;
        k.dq_batch_stride = 0;
    }
    if (p.cu_seqlens_k != nullptr) {
        k.dk_batch_stride = 0;
        k.dv_batch_stride = 0;
    }
    // The accumulator is laid out as lse is, each entry a row of head_dim
    // floats (BwdKernelParams::dq_accum); the workspace check bounds these
    // products.
    const int64_t head_elements = dq_accum_rows_per_head(p) * p.head_dim;
    k.dq_accum = static_cast<float *>(workspace);
    k.dq_accum_head_stride = head_elements;
    k.dq_accum_batch_stride = p.cu_seqlens_q != nullptr ? 0 : int64_t(p.num_heads_q) * head_elements;
    // The user's scale, softcap or not (BwdKernelParams::grad_scale).
    k.grad_scale = effective_softmax_scale(view);
    k.deterministic = p.deterministic != 0;
    k.dsinks = p.dsinks;
    return k;
}

}  // namespace flashcore
