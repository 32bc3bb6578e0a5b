// Chooses, for validated forward parameters on a handle's device, the kernel
// of the registry (kernel_registry.h) that runs the call, and launches it.
#pragma once

#include <cstddef>

#include "flashcore.h"

namespace flashcore {

flashcore_status forward_workspace_bytes(const flashcore_handle_s &handle, const flashcore_forward_params &params,
                                         size_t *bytes);

flashcore_status launch_forward(const flashcore_handle_s &handle, const flashcore_forward_params &params,
                                void *workspace, size_t workspace_bytes, void *stream);

}  // namespace flashcore
