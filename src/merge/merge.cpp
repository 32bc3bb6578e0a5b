#include "merge/merge.h"

#include <cinttypes>
#include <climits>

#include "error.h"
#include "handle.h"
#include "struct_io.h"
#include "tensor_checks.h"

namespace flashcore {
namespace {

// The merge kernel's rows are multiples of the forward kernels' 16-byte
// vectors of 2-byte elements, the rows of the split-KV parts it merges.
constexpr int32_t kMergeHeadDimMultiple = head_dim_multiple(DType::kFp16);

}  // namespace

flashcore_status check_merge_struct_size(size_t size, const char *what) {
    return check_released_size<flashcore_merge_params>(size, what, "flashcore_merge_params", kMergeReleasedParamsEnds,
                                                       "0.3");
}

void init_merge_params(flashcore_merge_params *params, size_t struct_size) {
    flashcore_merge_params defaults{};
    defaults.struct_size = struct_size;
    defaults.partial_dtype = FLASHCORE_DTYPE_FP16;
    defaults.out_dtype = FLASHCORE_DTYPE_FP16;
    write_defaults(params, struct_size, defaults);
}

flashcore_status read_merge_params(const flashcore_merge_params *user, flashcore_merge_params *params) {
    return read_struct(user, params, check_merge_struct_size, kMergeParamsKnownEnd, init_merge_params);
}

namespace {

size_t merge_element_bytes(int32_t dtype) {
    return dtype == FLASHCORE_DTYPE_FP32 ? sizeof(float) : dtype_bytes(DType(dtype));
}

flashcore_status check_merge_dtype(int32_t dtype, const char *name) {
    if (dtype == FLASHCORE_DTYPE_FP16 || dtype == FLASHCORE_DTYPE_BF16 || dtype == FLASHCORE_DTYPE_FP32) {
        return FLASHCORE_STATUS_SUCCESS;
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d), "
                "FLASHCORE_DTYPE_FP32 (%d)",
                name, int(dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16), int(FLASHCORE_DTYPE_FP32));
}

}  // namespace

flashcore_status validate_merge(const flashcore_merge_params &p) {
    flashcore_status status = check_merge_dtype(p.partial_dtype, "partial_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_merge_dtype(p.out_dtype, "out_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // Batches, heads and rows may be 0 (nothing to merge); states and
    // head_dim may not. The kernel counts states and columns in 32-bit ints,
    // stepping past the last by up to a warp's worth: their documented
    // bounds keep that far from 2^31.
    const struct {
        int32_t value;
        const char *name;
        int32_t min;
        const char *max_name;  // nullptr: no bound but int32_t's
        int32_t max;
    } sizes[] = {
        {p.num_states, "num_states", 1, "FLASHCORE_MERGE_MAX_NUM_STATES", FLASHCORE_MERGE_MAX_NUM_STATES},
        {p.batch_size, "batch_size", 0, nullptr, INT32_MAX},
        {p.num_heads, "num_heads", 0, nullptr, INT32_MAX},
        {p.seqlen, "seqlen", 0, nullptr, INT32_MAX},
        // The header's range, 8 to the maximum: below 8 is out of range
        // (INVALID_ARGUMENT), not a head dim of another multiple.
        {p.head_dim, "head_dim", kMergeHeadDimMultiple, "FLASHCORE_MERGE_MAX_HEAD_DIM", FLASHCORE_MERGE_MAX_HEAD_DIM},
    };
    for (const auto &s : sizes) {
        if (s.value < s.min) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be >= %d", s.name, int(s.value), int(s.min));
        }
        if (s.value > s.max) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be at most %s (%d)", s.name, int(s.value),
                        s.max_name, int(s.max));
        }
    }
    if (p.head_dim % kMergeHeadDimMultiple != 0) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "head_dim %d is not a multiple of %d", int(p.head_dim),
                    int(kMergeHeadDimMultiple));
    }
    if (merge_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    TensorDims partial{"partial_out", p.partial_out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                       p.partial_batch_stride, p.partial_seq_stride, p.partial_head_stride,
                       merge_element_bytes(p.partial_dtype)};
    partial.states = p.num_states;
    partial.state_stride = p.partial_state_stride;
    partial.stride_prefix = "partial";
    TensorDims out{"out", p.out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                   p.out_batch_stride, p.out_seq_stride, p.out_head_stride, merge_element_bytes(p.out_dtype)};
    for (const TensorDims *t : {&partial, &out}) {
        status = check_tensor(*t);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = check_no_self_overlap(out);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;

    // The LSE values: 4-byte aligned, any non-negative strides.
    status = check_pointer(p.partial_lse, "partial_lse", kLseAlignment);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const struct {
        const char *name;
        int64_t stride;
        int32_t extent;
    } lse_dims[] = {{"lse_state_stride", p.lse_state_stride, p.num_states},
                    {"lse_batch_stride", p.lse_batch_stride, p.batch_size},
                    {"lse_head_stride", p.lse_head_stride, p.num_heads},
                    {"lse_seq_stride", p.lse_seq_stride, p.seqlen}};
    __int128 last_lse = 0;
    for (const auto &d : lse_dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%" PRId64 ") must be >= 0", d.name, d.stride);
        }
        last_lse += __int128(d.extent - 1) * d.stride;
    }
    if (last_lse * __int128(sizeof(float)) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "partial_lse strides address more than 2^63 bytes");
    }
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    if (p.sinks != nullptr) {
        status = check_pointer(p.sinks, "sinks", alignof(float));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    const unsigned __int128 partial_lse_begin = reinterpret_cast<uintptr_t>(p.partial_lse);
    ByteRange ranges[5] = {
        tensor_range(partial, false),
        {"partial_lse", partial_lse_begin, partial_lse_begin + (unsigned __int128)(last_lse + 1) * sizeof(float),
         false},
        tensor_range(out, true),
    };
    size_t count = 3;
    if (p.lse != nullptr) ranges[count++] = lse_range(p.lse, __int128(p.batch_size) * p.num_heads * p.seqlen);
    if (p.sinks != nullptr) ranges[count++] = float_range("sinks", p.sinks, p.num_heads);
    return check_no_aliasing(ranges, count);
}

bool merge_is_empty(const flashcore_merge_params &p) {
    return p.batch_size == 0 || p.num_heads == 0 || p.seqlen == 0;
}

MergeKernelParams merge_kernel_params(const flashcore_merge_params &p) {
    MergeKernelParams m{};
    m.partial_out = p.partial_out;
    m.partial_lse = p.partial_lse;
    m.out = p.out;
    m.lse = p.lse;
    m.num_states = p.num_states;
    m.batch_size = p.batch_size;
    m.num_heads = p.num_heads;
    m.seqlen = p.seqlen;
    m.head_dim = p.head_dim;
    m.partial_state_stride = p.partial_state_stride;
    m.partial_batch_stride = p.partial_batch_stride;
    m.partial_seq_stride = p.partial_seq_stride;
    m.partial_head_stride = p.partial_head_stride;
    m.lse_state_stride = p.lse_state_stride;
    m.lse_batch_stride = p.lse_batch_stride;
    m.lse_seq_stride = p.lse_seq_stride;
    m.lse_head_stride = p.lse_head_stride;
    m.out_batch_stride = p.out_batch_stride;
    m.out_seq_stride = p.out_seq_stride;
    m.out_head_stride = p.out_head_stride;
    m.sinks = p.sinks;
    return m;
}

flashcore_status launch_merge(const flashcore_handle_s &handle, const flashcore_merge_params &p, void *stream) {
    const MergeKernelParams m = merge_kernel_params(p);
    if (handle.emulated != nullptr) return emulated_launch(handle, "the merge of %d states", int(p.num_states));
    DeviceGuard guard(handle.device);
    if (guard.status() != FLASHCORE_STATUS_SUCCESS) return guard.status();
    const cudaError_t err = cleared(run_merge_states(MergeType(p.partial_dtype), MergeType(p.out_dtype), m,
                                                     static_cast<cudaStream_t>(stream)));
    if (err != cudaSuccess) return fail_cuda(err, "launching the merge kernel (cudaLaunchKernelEx)");
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
