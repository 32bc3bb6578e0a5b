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

// The six sizes (batch, sequence lengths, head counts, head_dim) are >= 1 and
// head_dim_v >= 0: what the stride helper needs.
flashcore_status validate_sizes(const flashcore_forward_params &params);

// Dtype, sizes, head counts, head dims (against the kernels this build has),
// sequence lengths, scale: what the workspace query needs.
flashcore_status validate_shapes(const flashcore_forward_params &params);

// Pointers, alignment and strides: what the forward call needs in addition.
flashcore_status validate_tensors(const flashcore_forward_params &params);

// Everything about flashcore_merge_params: dtypes, sizes, pointers,
// alignment and strides.
flashcore_status validate_merge(const flashcore_merge_params &params);

}  // namespace flashcore
