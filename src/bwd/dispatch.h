// Chooses, for validated backward parameters, the kernel of the backward
// registry (bwd/registry.h) that runs the call, and launches it.
#pragma once

#include <cstddef>

#include "flashcore.h"

namespace flashcore {

struct BwdFamily;
template <typename Family>
struct KernelEntry;

// How a call runs: the kernel (its run queues the preprocess, main kernel
// and postprocess) and the workspace it takes, the fp32 dQ accumulator.
struct BackwardPlan {
    const KernelEntry<BwdFamily> *kernel = nullptr;
    size_t workspace_bytes = 0;
};

// The plan for validated, non-empty parameters on the handle's device,
// final before anything launches: the sm_90a kernel where the handle may
// use it, it has the call's head dims, fits the handle's shared memory and
// the TMA unit can describe the tensors; else the portable one. Its
// workspace depends only on the shapes (flashcore_backward_workspace_size's
// promise), whichever kernel it chose.
flashcore_status plan_backward(const flashcore_handle_s &handle, const flashcore_backward_params &params,
                               BackwardPlan *plan);

flashcore_status backward_workspace_bytes(const flashcore_handle_s &handle, const flashcore_backward_params &params,
                                          size_t *bytes);

flashcore_status launch_backward(const flashcore_handle_s &handle, const flashcore_backward_params &params,
                                 void *workspace, size_t workspace_bytes, void *stream);

}  // namespace flashcore
