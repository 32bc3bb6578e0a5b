// flashcore_backward_params as the library reads it: the caller's struct of
// any header version, its defaults, the forward call it is the gradient of,
// the strides of packed tensors, and the kernels' parameter block.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bwd/params.h"
#include "flashcore.h"

namespace flashcore {

// Where each released header's flashcore_backward_params ended: it first
// appeared in 0.7, ending with total_seqlen_k (no smaller size exists);
// 0.9 added attention_chunk, sinks, dsinks and sm_margin (its end, padded,
// is our sizeof). As the forward struct's kReleasedParamsEnds.
constexpr size_t kBackwardReleasedParamsEnds[] = {
    offsetof(flashcore_backward_params, total_seqlen_k) + sizeof(int32_t),  // 0.7, 0.8
};
// Where the last field this library knows ends: bytes of a caller's struct
// past it belong to fields of a newer header.
constexpr size_t kBackwardParamsKnownEnd =
    offsetof(flashcore_backward_params, sm_margin) + sizeof(flashcore_backward_params::sm_margin);

// Checks a caller's flashcore_backward_params struct_size.
flashcore_status check_backward_struct_size(size_t struct_size, const char *what);

// Writes the defaults into the caller's struct_size bytes at *params.
void init_backward_params(flashcore_backward_params *params, size_t struct_size);

// As read_params (fwd/forward_params.h), for flashcore_backward_params.
flashcore_status read_backward_params(const flashcore_backward_params *user, flashcore_backward_params *params);

// The forward call whose gradients the backward call computes: its sizes,
// options, q, k, v, out, lse (here inputs, hence the casts), their strides
// and its ragged batches, never split. The forward's checks and derived
// values (effective scale, window, kernel_params) then serve both calls.
flashcore_forward_params forward_view(const flashcore_backward_params &params);

// Writes the 24 strides of densely packed tensors in `layout` into *strides
// (only those fields), from the shapes in `shapes` (sizes validated): dq as
// q, dk as k, dv as v and dout as out, with the forward's arithmetic
// (set_contiguous_strides). Nothing is written on failure.
flashcore_status set_backward_contiguous_strides(flashcore_backward_params *strides,
                                                 const flashcore_backward_params &shapes, int32_t layout);

// Rows of the dQ accumulator per query head: seqlen_q, or total_seqlen_q
// with cu_seqlens_q (the accumulator is laid out as lse, times head_dim).
int64_t dq_accum_rows_per_head(const flashcore_backward_params &params);

// The kernels' parameter block for validated, non-empty parameters, with
// `workspace` as the fp32 dQ accumulator.
BwdKernelParams bwd_kernel_params(const flashcore_backward_params &params, void *workspace);

}  // namespace flashcore
