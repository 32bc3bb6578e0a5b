// flashcore_merge_params: reading the caller's struct, its checks, and the
// launch of the merge kernel (kernels/merge/), which the forward call's
// split-KV parts also go through (fwd/dispatch.cpp).
#pragma once

#include <cstddef>

#include "call_steps.h"
#include "common/types.h"
#include "flashcore.h"
#include "merge/params.h"

struct flashcore_handle_s;

namespace flashcore {

// Where each released header's flashcore_merge_params ended: it first
// appeared in 0.3, ending with out_head_stride (no smaller size exists);
// 0.9 added sinks (its end is our sizeof). As the forward struct's
// kReleasedParamsEnds.
constexpr size_t kMergeReleasedParamsEnds[] = {
    offsetof(flashcore_merge_params, out_head_stride) + sizeof(int64_t),  // 0.3 ... 0.8
};
constexpr size_t kMergeParamsKnownEnd = offsetof(flashcore_merge_params, sinks) + sizeof(flashcore_merge_params::sinks);

// Checks a caller's flashcore_merge_params struct_size.
flashcore_status check_merge_struct_size(size_t struct_size, const char *what);

// Writes the defaults into the caller's struct_size bytes at *params.
void init_merge_params(flashcore_merge_params *params, size_t struct_size);

// As read_params, for flashcore_merge_params.
flashcore_status read_merge_params(const flashcore_merge_params *user, flashcore_merge_params *params);

// Everything about flashcore_merge_params: dtypes, sizes, pointers,
// alignment, strides and aliasing.
flashcore_status validate_merge(const flashcore_merge_params &params);

// Whether a merge's output is empty (batch_size, num_heads or seqlen is 0).
bool merge_is_empty(const flashcore_merge_params &params);

// The merge kernel's parameters for validated flashcore_merge_params: the one
// place they are filled from a merge's description (the split-KV parts of a
// forward call describe theirs as flashcore_merge_params too).
MergeKernelParams merge_kernel_params(const flashcore_merge_params &params);

// Queues the merge of validated flashcore_merge_params.
flashcore_status launch_merge(const flashcore_handle_s &handle, const flashcore_merge_params &params, void *stream);

// The merge's steps behind the API's seam (call_steps.h): it has no workspace
// query, and takes no workspace.
template <>
struct CallSteps<flashcore_merge_params> {
    static flashcore_status read(const flashcore_merge_params *user, flashcore_merge_params *params) {
        return read_merge_params(user, params);
    }
    static flashcore_status check(const flashcore_merge_params &p) { return validate_merge(p); }
    static bool is_empty(const flashcore_merge_params &p) { return merge_is_empty(p); }
    static flashcore_status launch(const flashcore_handle_s &handle, const flashcore_merge_params &p, void *,
                                   size_t, void *stream) {
        return launch_merge(handle, p, stream);
    }
};

}  // namespace flashcore
