// Checks of flashcore_forward_params (read by read_params): everything that
// can be checked without a GPU and is particular to the forward call (what
// every call checks of its tensors is in tensor_checks.h). Each check fails with its specific status and
// a message that says what was wrong and what is supported.
#pragma once

#include <cstdint>

#include "flashcore.h"
#include "kernel_registry.h"
#include "tensor_checks.h"

namespace flashcore {

// Sequence lengths beyond this would overflow the kernels' 32-bit tile
// arithmetic (block index * block size + causal offset).
constexpr int32_t kMaxSeqlen = 1 << 30;

// The sizes are >= 0, head_dim >= 1, and the zeros allowed (see
// forward_is_empty): what the stride helper needs.
flashcore_status validate_sizes(const flashcore_forward_params &params);

// Whether the call's output is empty (batch_size, seqlen_q or num_heads_q is
// 0): it then succeeds having read and written nothing, launched nothing,
// its pointers and strides not looked at.
bool forward_is_empty(const flashcore_forward_params &params);

// Dtype, sizes, head counts, head dims (against the kernels this build has),
// sequence lengths, scale, window and softcap: what the workspace query
// needs.
flashcore_status validate_shapes(const flashcore_forward_params &params);

// The head dims the forward kernels of the call's K/V type have
// (fwd/registry.h): the 16-bit kernels', or the quantized cache's.
Span<HeadDims> fwd_head_dims_for(const flashcore_forward_params &params);

// The same checks with the head dims against `supported` (sorted, as a
// family's registry lists them): what a family whose call carries the
// forward's options (the backward pass) checks of them, against its own
// kernels.
flashcore_status validate_shapes(const flashcore_forward_params &params, Span<HeadDims> supported);

// The sliding window's bounds (use_window, window_left, window_right) and
// their combination with causal.
flashcore_status validate_window(const flashcore_forward_params &params);

// Variable-length batches (cu_seqlens_q/_k, total_seqlen_q/_k) and the
// paged cache (block_table, its stride, page_size, num_pages): their sizes
// and combinations.
flashcore_status validate_packing(const flashcore_forward_params &params);

// softcap: 0, or finite and > 0 with softcap * log2(e) and
// softmax_scale / softcap finite floats > 0.
flashcore_status validate_softcap(const flashcore_forward_params &params);

// Pointers, alignment, strides, and no overlap of an output with another
// tensor: what the forward call needs in addition.
flashcore_status validate_tensors(const flashcore_forward_params &params);

// Entries of lse: [batch_size][num_heads_q][seqlen_q], or with
// cu_seqlens_q [num_heads_q][total_seqlen_q].
__int128 lse_entries(const flashcore_forward_params &params);

// The int32 arrays the kernels read (seqused_k, cu_seqlens_q/_k,
// block_table): their pointers, 4-byte aligned; and their address ranges,
// written to `ranges` (returns how many: at most kMaxInt32Arrays). What
// every family whose call carries these arrays checks of them.
constexpr size_t kMaxInt32Arrays = 4;
flashcore_status check_int32_arrays(const flashcore_forward_params &params);
size_t int32_array_ranges(const flashcore_forward_params &params, ByteRange *ranges);

// The learnable sinks (when given): their pointer, 4-byte aligned; and their
// address range (num_heads_q floats, read), written to `ranges` (returns
// how many: 0 or 1). What the forward and the backward check of them.
flashcore_status check_sinks(const flashcore_forward_params &params);
size_t sinks_ranges(const flashcore_forward_params &params, ByteRange *ranges);

// The ranges of q, k, v, out and (when given) lse of validated, non-empty
// parameters, and of the int32 arrays; returns how many it wrote (at most
// kMaxForwardRanges): q, k, v, out, lse, 3 descale arrays, sinks, 4 int32
// arrays.
constexpr size_t kMaxForwardRanges = 13;
size_t forward_ranges(const flashcore_forward_params &params, ByteRange *ranges);

}  // namespace flashcore
