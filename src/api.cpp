// The exported C functions. Each one clears the thread's error message,
// checks its arguments, and never lets a C++ exception cross the boundary.
#include <cuda_runtime_api.h>

#include <new>

#include "abi_enums.h"
#include "bwd/call.h"
#include "error.h"
#include "flashcore.h"
#include "fwd/call.h"
#include "fwd/forward_params.h"
#include "fwd/registry.h"
#include "fwd/validate.h"
#include "handle.h"
#include "merge/merge.h"

namespace flashcore {
namespace {

#define FLASHCORE_STR2(x) #x
#define FLASHCORE_STR(x) FLASHCORE_STR2(x)
constexpr const char kVersionString[] = FLASHCORE_STR(FLASHCORE_VERSION_MAJOR) "." FLASHCORE_STR(
    FLASHCORE_VERSION_MINOR) "." FLASHCORE_STR(FLASHCORE_VERSION_PATCH);

// Runs an API body with the thread's message cleared and exceptions mapped to
// statuses.
template <typename Body>
flashcore_status guarded(const char *function, Body &&body) noexcept {
    clear_error();
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(FLASHCORE_STATUS_OUT_OF_MEMORY, "%s: out of host memory", function);
    } catch (...) {
        return fail(FLASHCORE_STATUS_INTERNAL, "%s: unexpected internal exception", function);
    }
}

#define FLASHCORE_TRY(expr)                                       \
    do {                                                          \
        const flashcore_status status_ = (expr);                  \
        if (status_ != FLASHCORE_STATUS_SUCCESS) return status_;  \
    } while (0)

// A flashcore_layout passed as an int (abi_enums.h): one of its enumerators.
flashcore_status check_layout(int32_t layout) {
    if (layout == FLASHCORE_LAYOUT_BHSD || layout == FLASHCORE_LAYOUT_BSHD) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "layout %d is not one of FLASHCORE_LAYOUT_BHSD (0), FLASHCORE_LAYOUT_BSHD (1)", int(layout));
}

}  // namespace
}  // namespace flashcore

using namespace flashcore;

extern "C" {

unsigned flashcore_version_number(void) { return FLASHCORE_VERSION_NUMBER; }

const char *flashcore_version_string(void) { return kVersionString; }

int flashcore_cuda_runtime_version(void) { return CUDART_VERSION; }

// The functions that take an enum by value are defined in abi_enums.c:
// C reads any int there, where C++ must not load an enum outside its
// enumerators' range. They pass the value on as an int32_t.
const char *fcimpl_status_string(int32_t status) {
    switch (status) {
        case FLASHCORE_STATUS_SUCCESS: return "success";
        case FLASHCORE_STATUS_INVALID_ARGUMENT: return "invalid argument";
        case FLASHCORE_STATUS_UNSUPPORTED: return "unsupported";
        case FLASHCORE_STATUS_MISALIGNED: return "misaligned";
        case FLASHCORE_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
        case FLASHCORE_STATUS_NO_DEVICE: return "no CUDA device or driver";
        case FLASHCORE_STATUS_CUDA_ERROR: return "CUDA error";
        case FLASHCORE_STATUS_OUT_OF_MEMORY: return "out of memory";
        case FLASHCORE_STATUS_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *flashcore_last_error_message(void) { return last_error_message(); }

flashcore_status flashcore_create(flashcore_handle *handle) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        *handle = nullptr;
        int device = 0;
        const cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return create_handle(0, handle);  // reports the missing device or driver
        }
        return create_handle(device, handle);
    });
}

flashcore_status flashcore_create_for_device(flashcore_handle *handle, int device) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        *handle = nullptr;
        return create_handle(device, handle);
    });
}

flashcore_status flashcore_destroy(flashcore_handle handle) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return FLASHCORE_STATUS_SUCCESS;
        FLASHCORE_TRY(check_handle(handle));
        handle->magic = kHandleDestroyed;
        delete handle;
        return FLASHCORE_STATUS_SUCCESS;
    });
}

flashcore_status flashcore_handle_device(flashcore_handle handle, int *device) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        if (device == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "device is NULL");
        *device = handle->device;
        return FLASHCORE_STATUS_SUCCESS;
    });
}

flashcore_status flashcore_forward_params_init(flashcore_forward_params *params, size_t struct_size) {
    return guarded(__func__, [&] {
        if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
        FLASHCORE_TRY(check_struct_size(struct_size, "struct_size"));
        init_params(params, struct_size);
        return FLASHCORE_STATUS_SUCCESS;
    });
}

int32_t fcimpl_set_contiguous_strides(flashcore_forward_params *params, int32_t layout) {
    return guarded("flashcore_set_contiguous_strides", [&] {
        if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
        FLASHCORE_TRY(check_layout(layout));
        // Shapes must be valid first: the strides are products of them.
        flashcore_forward_params p;
        FLASHCORE_TRY(read_params(params, &p));
        FLASHCORE_TRY(validate_sizes(p));
        return set_contiguous_strides(params, p, layout);
    });
}

flashcore_status flashcore_supported_head_dims(int32_t *head_dims, int32_t *head_dims_v, size_t capacity,
                                               size_t *count) {
    return guarded(__func__, [&] {
        if (count == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "count is NULL");
        if (capacity > 0 && (head_dims == nullptr || head_dims_v == nullptr)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s is NULL but capacity is %zu",
                        head_dims == nullptr ? "head_dims" : "head_dims_v", capacity);
        }
        const Span<HeadDims> supported = fwd_supported_head_dims();
        for (size_t i = 0; i < supported.size && i < capacity; ++i) {
            head_dims[i] = supported.data[i].head_dim;
            head_dims_v[i] = supported.data[i].head_dim_v;
        }
        *count = supported.size;
        return FLASHCORE_STATUS_SUCCESS;
    });
}

flashcore_status flashcore_forward_check(const flashcore_forward_params *params) {
    return guarded(__func__, [&] {
        return check_call(params);
    });
}

flashcore_status flashcore_forward_workspace_size(flashcore_handle handle, const flashcore_forward_params *params,
                                                  size_t *workspace_bytes) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return call_workspace_bytes(*handle, params, workspace_bytes);
    });
}

flashcore_status flashcore_forward(flashcore_handle handle, const flashcore_forward_params *params, void *workspace,
                                   size_t workspace_bytes, void *stream) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return run_call(*handle, params, workspace, workspace_bytes, stream);
    });
}

flashcore_status flashcore_merge_params_init(flashcore_merge_params *params, size_t struct_size) {
    return guarded(__func__, [&] {
        if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
        FLASHCORE_TRY(check_merge_struct_size(struct_size, "struct_size"));
        init_merge_params(params, struct_size);
        return FLASHCORE_STATUS_SUCCESS;
    });
}

flashcore_status flashcore_merge_check(const flashcore_merge_params *params) {
    return guarded(__func__, [&] {
        return check_call(params);
    });
}

flashcore_status flashcore_merge_states(flashcore_handle handle, const flashcore_merge_params *params, void *stream) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return run_call(*handle, params, nullptr, 0, stream);
    });
}

flashcore_status flashcore_backward_params_init(flashcore_backward_params *params, size_t struct_size) {
    return guarded(__func__, [&] {
        if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
        FLASHCORE_TRY(check_backward_struct_size(struct_size, "struct_size"));
        init_backward_params(params, struct_size);
        return FLASHCORE_STATUS_SUCCESS;
    });
}

int32_t fcimpl_backward_set_contiguous_strides(flashcore_backward_params *params, int32_t layout) {
    return guarded("flashcore_backward_set_contiguous_strides", [&] {
        if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
        FLASHCORE_TRY(check_layout(layout));
        // Shapes must be valid first: the strides are products of them.
        flashcore_backward_params p;
        FLASHCORE_TRY(read_backward_params(params, &p));
        FLASHCORE_TRY(validate_backward_sizes(p));
        return set_backward_contiguous_strides(params, p, layout);
    });
}

flashcore_status flashcore_backward_check(const flashcore_backward_params *params) {
    return guarded(__func__, [&] {
        return check_call(params);
    });
}

flashcore_status flashcore_backward_workspace_size(flashcore_handle handle, const flashcore_backward_params *params,
                                                   size_t *workspace_bytes) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return call_workspace_bytes(*handle, params, workspace_bytes);
    });
}

flashcore_status flashcore_backward(flashcore_handle handle, const flashcore_backward_params *params, void *workspace,
                                    size_t workspace_bytes, void *stream) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return run_call(*handle, params, workspace, workspace_bytes, stream);
    });
}

}  // extern "C"
