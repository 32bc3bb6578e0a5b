// The backward call's steps behind the API's seam (call_steps.h).
#pragma once

#include "bwd/backward_params.h"
#include "bwd/dispatch.h"
#include "bwd/validate.h"
#include "call_steps.h"

namespace flashcore {

template <>
struct CallSteps<flashcore_backward_params> {
    static flashcore_status read(const flashcore_backward_params *user, flashcore_backward_params *params) {
        return read_backward_params(user, params);
    }
    static flashcore_status check_shapes(const flashcore_backward_params &p) { return validate_backward_shapes(p); }
    static flashcore_status check(const flashcore_backward_params &p) {
        const flashcore_status status = validate_backward_shapes(p);
        return status != FLASHCORE_STATUS_SUCCESS ? status : validate_backward_tensors(p);
    }
    static bool is_empty(const flashcore_backward_params &p) { return backward_is_empty(p); }
    // The workspace depends on the shapes only, not on the device.
    static flashcore_status workspace_bytes(const flashcore_handle_s &handle, const flashcore_backward_params &p,
                                            size_t *bytes) {
        return backward_workspace_bytes(handle, p, bytes);
    }
    static flashcore_status launch(const flashcore_handle_s &handle, const flashcore_backward_params &p,
                                   void *workspace, size_t workspace_bytes, void *stream) {
        return launch_backward(handle, p, workspace, workspace_bytes, stream);
    }
};

}  // namespace flashcore
