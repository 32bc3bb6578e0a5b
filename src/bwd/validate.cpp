#include "bwd/validate.h"

#include <cstdint>

#include "bwd/backward_params.h"
#include "bwd/registry.h"
#include "error.h"
#include "fwd/forward_params.h"
#include "fwd/validate.h"

namespace flashcore {
namespace {

// seqlen_k where the call is not empty: the forward's size check takes a
// call without query rows for an empty one and lets it pass.
flashcore_status check_seqlen_k(const flashcore_backward_params &p) {
    if (p.seqlen_k != 0 || backward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "seqlen_k (0) must be >= 1 unless the call is empty (batch_size or num_heads_q 0; a backward call "
                "with seqlen_q %d is not empty: it writes dk and dv)",
                int(p.seqlen_q));
}

// The tensors of a call, in the order they are checked; the gradients last.
enum BackwardTensor { kQ, kK, kV, kOut, kDout, kDq, kDk, kDv, kBackwardTensors };

// Each tensor as strided [batch][seq][head][dim] extents: packed
// (variable-length) tensors are one batch of all their rows, their batch
// strides ignored.
void backward_tensors(const flashcore_backward_params &p, TensorDims *t) {
    struct Rows {
        bool packed;
        int32_t batches, rows;
    };
    const Rows q_rows = p.cu_seqlens_q != nullptr ? Rows{true, 1, p.total_seqlen_q}
                                                  : Rows{false, p.batch_size, p.seqlen_q};
    const Rows kv_rows = p.cu_seqlens_k != nullptr ? Rows{true, 1, p.total_seqlen_k}
                                                   : Rows{false, p.batch_size, p.seqlen_k};
    const int32_t d = p.head_dim;
    const int32_t dv = effective_head_dim_v(forward_view(p));
    const size_t bytes = dtype_bytes(DType(p.dtype));
    const auto tensor = [bytes](const char *name, const void *data, const Rows &rows, int32_t heads, int32_t dim,
                                int64_t batch_stride, int64_t seq_stride, int64_t head_stride) {
        return TensorDims{name,         data,       rows.batches, rows.rows, heads, dim, rows.packed ? 0 : batch_stride,
                          seq_stride, head_stride, bytes};
    };
    const int32_t hq = p.num_heads_q, hkv = p.num_heads_kv;
    t[kQ] = tensor("q", p.q, q_rows, hq, d, p.q_batch_stride, p.q_seq_stride, p.q_head_stride);
    t[kK] = tensor("k", p.k, kv_rows, hkv, d, p.k_batch_stride, p.k_seq_stride, p.k_head_stride);
    t[kV] = tensor("v", p.v, kv_rows, hkv, dv, p.v_batch_stride, p.v_seq_stride, p.v_head_stride);
    t[kOut] = tensor("out", p.out, q_rows, hq, dv, p.out_batch_stride, p.out_seq_stride, p.out_head_stride);
    t[kDout] = tensor("dout", p.dout, q_rows, hq, dv, p.dout_batch_stride, p.dout_seq_stride, p.dout_head_stride);
    t[kDq] = tensor("dq", p.dq, q_rows, hq, d, p.dq_batch_stride, p.dq_seq_stride, p.dq_head_stride);
    t[kDk] = tensor("dk", p.dk, kv_rows, hkv, d, p.dk_batch_stride, p.dk_seq_stride, p.dk_head_stride);
    t[kDv] = tensor("dv", p.dv, kv_rows, hkv, dv, p.dv_batch_stride, p.dv_seq_stride, p.dv_head_stride);
}

// A tensor of no rows (q, out, dout and dq of a call without query rows) is
// neither read nor written: its pointer and strides are not looked at, as
// an empty call's are not.
bool has_elements(const TensorDims &t) { return t.batch > 0 && t.seqlen > 0 && t.heads > 0; }

static_assert(kMaxBackwardRanges >= kBackwardTensors + 3 + kMaxInt32Arrays,
              "kMaxBackwardRanges: the tensors, lse, sinks, dsinks and the int32 arrays");

}  // namespace

bool backward_is_empty(const flashcore_backward_params &p) { return p.batch_size == 0 || p.num_heads_q == 0; }

namespace {

// The backward pass's element types, checked (with the shapes: the sizes
// and strides do not depend on them) before anything the forward's rules
// would check of the dtype: those admit e4m3 queries (fp8 prefill),
// which have no backward pass, and list them as supported.
flashcore_status check_backward_dtype(const flashcore_backward_params &p) {
    if (p.dtype == FLASHCORE_DTYPE_FP16 || p.dtype == FLASHCORE_DTYPE_BF16) return FLASHCORE_STATUS_SUCCESS;
    if (p.dtype == FLASHCORE_DTYPE_FP8_E4M3) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "dtype FLASHCORE_DTYPE_FP8_E4M3 (%d): the backward pass takes FLASHCORE_DTYPE_FP16 (%d) or "
                    "FLASHCORE_DTYPE_BF16 (%d); fp8 attention is forward only",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16));
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "dtype %d is not supported: the backward pass takes FLASHCORE_DTYPE_FP16 (%d) or "
                "FLASHCORE_DTYPE_BF16 (%d)",
                int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16));
}

}  // namespace

flashcore_status validate_backward_sizes(const flashcore_backward_params &p) {
    const flashcore_status status = validate_sizes(forward_view(p));
    return status != FLASHCORE_STATUS_SUCCESS ? status : check_seqlen_k(p);
}

flashcore_status validate_backward_shapes(const flashcore_backward_params &p) {
    flashcore_status status = check_backward_dtype(p);
    if (status == FLASHCORE_STATUS_SUCCESS) status = validate_shapes(forward_view(p), bwd_supported_head_dims());
    if (status == FLASHCORE_STATUS_SUCCESS) status = check_seqlen_k(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // Likewise the packed keys' rows (validate_packing).
    if (p.cu_seqlens_k != nullptr && p.total_seqlen_k == 0 && !backward_is_empty(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "total_seqlen_k (0) must be >= 1 unless the call is empty (batch_size or num_heads_q 0): k, v, "
                    "dk and dv hold no rows");
    }
    return FLASHCORE_STATUS_SUCCESS;
}

size_t backward_ranges(const flashcore_backward_params &p, ByteRange *ranges) {
    TensorDims tensors[kBackwardTensors];
    backward_tensors(p, tensors);
    size_t n = 0;
    for (int i = 0; i < kBackwardTensors; ++i) {
        if (has_elements(tensors[i])) ranges[n++] = tensor_range(tensors[i], i >= kDq);
    }
    const flashcore_forward_params view = forward_view(p);
    if (lse_entries(view) > 0) {
        ranges[n] = lse_range(p.lse, lse_entries(view));
        ranges[n++].written = false;  // the forward's output, read here
    }
    n += sinks_ranges(view, ranges + n);
    if (p.dsinks != nullptr) {
        ranges[n] = float_range("dsinks", p.dsinks, p.num_heads_q);
        ranges[n++].written = true;
    }
    return n + int32_array_ranges(view, ranges + n);
}

flashcore_status validate_backward_tensors(const flashcore_backward_params &p) {
    if (backward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    TensorDims tensors[kBackwardTensors];
    backward_tensors(p, tensors);
    flashcore_status status = FLASHCORE_STATUS_SUCCESS;
    for (const TensorDims &t : tensors) {
        if (has_elements(t)) status = check_tensor(t);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    for (int i = kDq; i < kBackwardTensors; ++i) {
        if (has_elements(tensors[i])) status = check_no_self_overlap(tensors[i]);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    const flashcore_forward_params view = forward_view(p);
    if (lse_entries(view) > 0) {
        if (p.lse == nullptr) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "lse is NULL: the backward pass needs the forward's log-sum-exp (pass the lse the forward "
                        "call wrote)");
        }
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = check_int32_arrays(view);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_sinks(view);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.dsinks != nullptr) {
        if (p.sinks == nullptr) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "dsinks is set but sinks is NULL: dsinks is the gradient of the sinks the forward call "
                        "took (pass them, or dsinks NULL)");
        }
        status = check_pointer(p.dsinks, "dsinks", alignof(float));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    ByteRange ranges[kMaxBackwardRanges];
    return check_no_aliasing(ranges, backward_ranges(p, ranges));
}

}  // namespace flashcore
