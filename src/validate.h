// Checks of flashcore_forward_params (read by read_params): everything that
// can be checked without a GPU. Each check fails with its specific status and
// a message that says what was wrong and what is supported.
#pragma once

#include <cstdint>

#include "flashcore.h"

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

// A tensor's bytes as an address range [begin, end), for the aliasing rule.
struct ByteRange {
    const char *name;
    unsigned __int128 begin, end;
    bool written;  // out, lse, the workspace: must overlap nothing else
};

// The ranges of q, k, v, out and (when given) lse of validated, non-empty
// parameters; returns how many it wrote (at most kMaxForwardRanges).
constexpr size_t kMaxForwardRanges = 9;
size_t forward_ranges(const flashcore_forward_params &params, ByteRange *ranges);

// INVALID_ARGUMENT, naming both, where a written range overlaps another
// range (read-only ranges may overlap one another: q, k and v may alias).
flashcore_status check_no_aliasing(const ByteRange *ranges, size_t count);

// Everything about flashcore_merge_params: dtypes, sizes, pointers,
// alignment, strides and aliasing.
flashcore_status validate_merge(const flashcore_merge_params &params);

// Whether a merge's output is empty (batch_size, num_heads or seqlen is 0).
bool merge_is_empty(const flashcore_merge_params &params);

}  // namespace flashcore
