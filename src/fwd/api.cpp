// The forward family's exported C functions (api_guard.h: how each runs).
#include "api_guard.h"
#include "fwd/abi_enums.h"
#include "fwd/call.h"
#include "fwd/forward_params.h"
#include "fwd/registry.h"
#include "fwd/validate.h"
#include "handle.h"
#include "struct_io.h"

using namespace flashcore;

extern "C" {

flashcore_status flashcore_forward_params_init(flashcore_forward_params *params, size_t struct_size) {
    return guarded(__func__, [&] { return init_struct(params, struct_size, check_struct_size, init_params); });
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

}  // extern "C"
