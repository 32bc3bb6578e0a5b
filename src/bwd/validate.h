// Checks of flashcore_backward_params (read by read_backward_params):
// everything that can be checked without a GPU. The options and shapes are
// the forward's and go through the forward's checks (fwd/validate.h) on the
// forward view of the call, the head dims against the backward kernels;
// what differs is checked here: which calls are empty, the keys a call
// without query rows still needs, the required lse, and the eight tensors
// with the gradients as the written ones. Each check fails with its specific
// status and a message that says what was wrong and what is supported.
#pragma once

#include <cstddef>

#include "flashcore.h"
#include "tensor_checks.h"

namespace flashcore {

// Whether the call computes nothing (batch_size or num_heads_q 0): it then
// succeeds having read and written nothing, launched nothing, its pointers
// and strides not looked at. A call without query rows (seqlen_q 0, or
// total_seqlen_q 0 with cu_seqlens_q) is not empty: dk and dv are written,
// as zeros.
bool backward_is_empty(const flashcore_backward_params &params);

// The sizes are >= 0, head_dim >= 1, and the zeros allowed: what the stride
// helper needs.
flashcore_status validate_backward_sizes(const flashcore_backward_params &params);

// Dtype, sizes, head counts, head dims (against the backward kernels this
// build has), sequence lengths, scale, window, softcap and packing: what the
// workspace query needs.
flashcore_status validate_backward_shapes(const flashcore_backward_params &params);

// Pointers, alignment, strides, the gradients' self-overlap, lse, the int32
// arrays, and no overlap of a gradient with another tensor.
flashcore_status validate_backward_tensors(const flashcore_backward_params &params);

// The address ranges of the tensors of validated, non-empty parameters that
// have elements (q, k, v, out, dout, lse, sinks and the int32 arrays read;
// dq, dk, dv and dsinks written); returns how many it wrote (at most kMaxBackwardRanges).
constexpr size_t kMaxBackwardRanges = 15;
size_t backward_ranges(const flashcore_backward_params &params, ByteRange *ranges);

}  // namespace flashcore
