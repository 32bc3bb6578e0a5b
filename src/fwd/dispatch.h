// Chooses, for validated forward parameters on a handle's device, the kernel
// of the registry (kernel_registry.h) that runs the call, and launches it.
#pragma once

#include <cstddef>

#include "flashcore.h"

namespace flashcore {

struct FwdFamily;
template <typename Family>
struct KernelEntry;

// How a call runs: the kernel, into how many parts its keys are split (1:
// none), how many query heads share a tile's rows (1: none), and the
// workspace that takes: the parts' fp32 rows from its start, their LSE
// values from partial_lse_offset.
struct ForwardPlan {
    const KernelEntry<FwdFamily> *kernel = nullptr;
    int num_splits = 1;
    int packed_heads = 1;
    size_t workspace_bytes = 0;
    size_t partial_lse_offset = 0;
    int split_min_keys = 0;  // FwdKernelParams::split_min_keys
};

// The plan for validated parameters on the handle's device. The same
// parameters and handle always give the same plan.
flashcore_status plan_forward(const flashcore_handle_s &handle, const flashcore_forward_params &params,
                              ForwardPlan *plan);

flashcore_status forward_workspace_bytes(const flashcore_handle_s &handle, const flashcore_forward_params &params,
                                         size_t *bytes);

flashcore_status launch_forward(const flashcore_handle_s &handle, const flashcore_forward_params &params,
                                void *workspace, size_t workspace_bytes, void *stream);

}  // namespace flashcore
