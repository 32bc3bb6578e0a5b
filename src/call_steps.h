// The seam between the C API and a family's call: every call the API takes
// (a forward pass, a merge, and the families to come) reads the caller's
// struct, checks it, does nothing where its output is empty, and otherwise
// plans and launches, in that order. A family says how each step is done for
// its parameter struct by specializing CallSteps (fwd/call.h, merge/merge.h);
// its plan type stays behind its own launch. The C functions in api.cpp are
// then one line each.
#pragma once

#include <cstddef>

#include "error.h"
#include "flashcore.h"

struct flashcore_handle_s;

namespace flashcore {

// Specialized per parameter struct:
//   static flashcore_status read(const Params *user, Params *params);
//     the caller's struct of any header version (struct_io.h);
//   static flashcore_status check_shapes(const Params &);
//     what the workspace query needs (no pointers);
//   static flashcore_status check(const Params &);
//     everything (check_shapes, then the tensors);
//   static bool is_empty(const Params &);
//   static flashcore_status workspace_bytes(const flashcore_handle_s &, const Params &, size_t *);
//     of validated, non-empty parameters;
//   static flashcore_status launch(const flashcore_handle_s &, const Params &, void *workspace, size_t bytes,
//                                  void *stream);
//     of validated, non-empty parameters.
template <typename Params>
struct CallSteps;

// flashcore_<family>_check: everything that can be checked without a GPU.
template <typename Params>
flashcore_status check_call(const Params *user) {
    using Steps = CallSteps<Params>;
    Params params;
    const flashcore_status status = Steps::read(user, &params);
    return status != FLASHCORE_STATUS_SUCCESS ? status : Steps::check(params);
}

// flashcore_<family>_workspace_size: 0 for an empty call.
template <typename Params>
flashcore_status call_workspace_bytes(const flashcore_handle_s &handle, const Params *user, size_t *bytes) {
    using Steps = CallSteps<Params>;
    if (bytes == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "workspace_bytes is NULL");
    Params params;
    flashcore_status status = Steps::read(user, &params);
    if (status == FLASHCORE_STATUS_SUCCESS) status = Steps::check_shapes(params);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (Steps::is_empty(params)) {
        *bytes = 0;
        return FLASHCORE_STATUS_SUCCESS;
    }
    return Steps::workspace_bytes(handle, params, bytes);
}

// flashcore_<family>: checked, then launched unless there is nothing to
// compute.
template <typename Params>
flashcore_status run_call(const flashcore_handle_s &handle, const Params *user, void *workspace,
                          size_t workspace_bytes, void *stream) {
    using Steps = CallSteps<Params>;
    Params params;
    flashcore_status status = Steps::read(user, &params);
    if (status == FLASHCORE_STATUS_SUCCESS) status = Steps::check(params);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (Steps::is_empty(params)) return FLASHCORE_STATUS_SUCCESS;  // nothing to compute
    return Steps::launch(handle, params, workspace, workspace_bytes, stream);
}

}  // namespace flashcore
