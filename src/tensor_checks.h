// Checks of caller tensors that every kind of call shares (forward, merge,
// and the families to come): a pointer's alignment, a strided tensor's
// strides and extent, an output whose elements overlap, and aliasing of
// outputs with anything else. Each fails with its specific status and a
// message naming the tensor and the stride.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashcore.h"

namespace flashcore {

// LSE arrays are float32.
constexpr size_t kLseAlignment = alignof(float);

// ptr is not NULL and is `alignment`-byte aligned.
flashcore_status check_pointer(const void *ptr, const char *name, size_t alignment);

// A tensor as strided [batch][seq][head][dim] extents (and, for the merge, a
// fourth strided dimension of states).
struct TensorDims {
    const char *name;
    const void *data;
    int32_t batch, seqlen, heads;
    int32_t dim;  // the contiguous last dimension: head_dim, or head_dim_v for v and out
    int64_t batch_stride, seq_stride, head_stride;
    size_t element_bytes;  // of one element
    // A fourth strided dimension (the merge's states); extent 1: none.
    int32_t states = 1;
    int64_t state_stride = 0;
    const char *state_stride_name = "state_stride";
    const char *stride_prefix = nullptr;  // strides are <prefix>_<dimension>_stride; nullptr: name
};

// Pointer, stride signs and alignment, and an addressable extent. Strides
// are named <name>_<dimension>_stride, as in the params structs.
flashcore_status check_tensor(const TensorDims &t);

// The output gives each element its own address.
flashcore_status check_no_self_overlap(const TensorDims &t);

// A tensor's bytes as an address range [begin, end), for the aliasing rule.
struct ByteRange {
    const char *name;
    unsigned __int128 begin, end;
    bool written;  // out, lse, the workspace: must overlap nothing else
};

ByteRange tensor_range(const TensorDims &t, bool written);

// A contiguous float32 LSE of `rows` values (written).
ByteRange lse_range(const float *lse, __int128 rows);

// An int32 array the kernels read (seqused_k, cu_seqlens_q/_k, block_table).
ByteRange int32_range(const char *name, const int32_t *array, __int128 count);

// A float32 array the kernels read (the descale factors).
ByteRange float_range(const char *name, const float *array, __int128 count);

// A call's workspace: at least `needed` bytes (WORKSPACE_TOO_SMALL naming
// `size_function` and `what` the workspace holds), not NULL where bytes are
// given, FLASHCORE_ALIGNMENT aligned; and where `needed` > 0, the bytes the
// call writes overlap none of the call's `count` ranges (`ranges` has room
// for one more, the workspace's).
flashcore_status check_workspace(void *workspace, size_t bytes, size_t needed, const char *size_function,
                                 const char *what, ByteRange *ranges, size_t count);

// INVALID_ARGUMENT, naming both, where a written range overlaps another
// range (read-only ranges may overlap one another: q, k and v may alias).
flashcore_status check_no_aliasing(const ByteRange *ranges, size_t count);

}  // namespace flashcore
