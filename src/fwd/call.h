// The forward call's steps behind the API's seam (call_steps.h).
#pragma once

#include "call_steps.h"
#include "fwd/dispatch.h"
#include "fwd/forward_params.h"
#include "fwd/validate.h"

namespace flashcore {

template <>
struct CallSteps<flashcore_forward_params> {
    static flashcore_status read(const flashcore_forward_params *user, flashcore_forward_params *params) {
        return read_params(user, params);
    }
    static flashcore_status check_shapes(const flashcore_forward_params &p) { return validate_shapes(p); }
    static flashcore_status check(const flashcore_forward_params &p) {
        const flashcore_status status = validate_shapes(p);
        return status != FLASHCORE_STATUS_SUCCESS ? status : validate_tensors(p);
    }
    static bool is_empty(const flashcore_forward_params &p) { return forward_is_empty(p); }
    static flashcore_status workspace_bytes(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                                            size_t *bytes) {
        return forward_workspace_bytes(handle, p, bytes);
    }
    static flashcore_status launch(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                                   void *workspace, size_t workspace_bytes, void *stream) {
        return launch_forward(handle, p, workspace, workspace_bytes, stream);
    }
};

}  // namespace flashcore
