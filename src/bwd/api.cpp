// The backward family's exported C functions (api_guard.h: how each runs).
#include "api_guard.h"
#include "bwd/abi_enums.h"
#include "bwd/call.h"
#include "handle.h"
#include "struct_io.h"

using namespace flashcore;

extern "C" {

flashcore_status flashcore_backward_params_init(flashcore_backward_params *params, size_t struct_size) {
    return guarded(__func__, [&] { return init_struct(params, struct_size, check_backward_struct_size, init_backward_params); });
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
