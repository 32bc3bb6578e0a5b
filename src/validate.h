// Validation of flashcore_forward_params: everything that can be checked
// without a GPU. Each check fails with its specific status and a message that
// says what was wrong and what is supported.
#pragma once

#include "flashcore.h"

namespace flashcore {

// Head dims this version has kernels for.
constexpr int kSupportedHeadDims[] = {64, 128};
// Sequence lengths beyond this would overflow the kernels' 32-bit tile
// arithmetic (block index * block size + causal offset).
constexpr int32_t kMaxSeqlen = 1 << 30;

// Size of flashcore_forward_params as version 0.1 defined it: the smallest a
// caller may pass. When fields are appended this stays the offset of the
// first new one, and read_params gives older callers the new fields' defaults.
constexpr size_t kParamsSizeV0_1 = sizeof(flashcore_forward_params);
// A struct_size beyond this is not a flashcore_forward_params from any
// header version, but an uninitialised field.
constexpr size_t kMaxPlausibleStructSize = 64 * 1024;

// Checks a caller's struct_size against the sizes this library accepts.
flashcore_status check_struct_size(size_t struct_size, const char *what);

// Writes the defaults into the caller's struct_size bytes at *params.
void init_params(flashcore_forward_params *params, size_t struct_size);

// Copies the caller's struct into *params whatever header version it was
// built with (see the ABI policy in flashcore.h).
flashcore_status read_params(const flashcore_forward_params *user, flashcore_forward_params *params);

// The six sizes (batch, sequence lengths, head counts, head_dim) are >= 1.
flashcore_status validate_sizes(const flashcore_forward_params &params);

// Dtype, sizes, head counts, head_dim, scale: what the workspace query needs.
flashcore_status validate_shapes(const flashcore_forward_params &params);

// Pointers, alignment and strides: what the forward call needs in addition.
flashcore_status validate_tensors(const flashcore_forward_params &params);

// The softmax scale the kernels use: the caller's, or 1/sqrt(head_dim).
float effective_softmax_scale(const flashcore_forward_params &params);

}  // namespace flashcore
