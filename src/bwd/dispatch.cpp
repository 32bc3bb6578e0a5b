#include "bwd/dispatch.h"

#include <climits>
#include <cstdint>
#include <cstdio>

#include "bwd/backward_params.h"
#include "bwd/registry.h"
#include "bwd/sm90/tensor_maps.h"
#include "bwd/validate.h"
#include "error.h"
#include "fwd/forward_params.h"
#include "handle.h"

namespace flashcore {
namespace {

// Bytes of the fp32 dQ accumulator: a float per query row, head and
// dimension of the call's head_dim, rounded up to FLASHCORE_ALIGNMENT.
// False where they would not fit half a size_t (no allocation that large
// can exist, and the caller's size arithmetic keeps room).
bool dq_accum_bytes(const flashcore_backward_params &p, size_t *bytes) {
    const unsigned __int128 rows = p.cu_seqlens_q != nullptr
                                       ? (unsigned __int128)unsigned(p.total_seqlen_q)
                                       : (unsigned __int128)unsigned(p.batch_size) * unsigned(p.seqlen_q);
    const unsigned __int128 raw = rows * unsigned(p.num_heads_q) * unsigned(p.head_dim) * sizeof(float);
    const unsigned __int128 aligned = (raw + FLASHCORE_ALIGNMENT - 1) / FLASHCORE_ALIGNMENT * FLASHCORE_ALIGNMENT;
    if (aligned > (unsigned __int128)(SIZE_MAX / 2)) return false;
    *bytes = size_t(aligned);
    return true;
}

}  // namespace

flashcore_status plan_backward(const flashcore_handle_s &handle, const flashcore_backward_params &p,
                               BackwardPlan *plan) {
    const HeadDims call{p.head_dim, effective_head_dim_v(forward_view(p))};
    HeadDims dims{};
    if (!bwd_covering_head_dims(call, &dims)) {
        return fail(FLASHCORE_STATUS_INTERNAL,
                    "no backward kernel covers head dims (%d, %d), which validation accepted", int(call.head_dim),
                    int(call.head_dim_v));
    }
    const flashcore_status margin = check_sm_margin(handle, p.sm_margin);
    if (margin != FLASHCORE_STATUS_SUCCESS) return margin;
    const BwdKernel *kernel =
        bwd_kernels().find(KernelPath::kSm80, DType(p.dtype), DType(p.dtype), dims, BwdVariant::kKvBlock);
    if (kernel == nullptr) {
        return fail(FLASHCORE_STATUS_INTERNAL, "no portable backward kernel for head dims (%d, %d) in the registry",
                    int(dims.head_dim), int(dims.head_dim_v));
    }
    // The sm_90a kernel where the handle may use it, one covers the call's
    // head dims (no softcap: its dS has no (1 - tanh^2) factor) and fits the
    // handle's shared memory, and the TMA unit can describe the tensors.
    HeadDims hopper_dims{};
    if (handle.env.settings(Family::bwd).use_hopper && p.softcap == 0.f &&
        bwd_hopper_covering_head_dims(call, &hopper_dims)) {
        const BwdKernel *sm90 =
            bwd_kernels().find(KernelPath::kSm90, kernel->input, kernel->kv, hopper_dims, BwdVariant::kHopper);
        if (sm90 != nullptr && sm90->info(handle.max_smem_per_block).smem_bytes <= handle.max_smem_per_block &&
            sm90::bwd_maps_describable(bwd_kernel_params(p, nullptr), sm90->input)) {
            kernel = sm90;
        }
    }
    size_t bytes = 0;
    if (!dq_accum_bytes(p, &bytes)) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "the dQ accumulator of %d query heads x head_dim %d over the call's query rows would need a "
                    "workspace larger than the address space",
                    int(p.num_heads_q), int(p.head_dim));
    }
    *plan = BackwardPlan{kernel, bytes};
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status backward_workspace_bytes(const flashcore_handle_s &handle, const flashcore_backward_params &p,
                                          size_t *bytes) {
    BackwardPlan plan;
    const flashcore_status status = plan_backward(handle, p, &plan);
    if (status == FLASHCORE_STATUS_SUCCESS) *bytes = plan.workspace_bytes;
    return status;
}

flashcore_status launch_backward(const flashcore_handle_s &handle, const flashcore_backward_params &p,
                                 void *workspace, size_t workspace_bytes, void *stream) {
    BackwardPlan plan;
    flashcore_status status = plan_backward(handle, p, &plan);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    ByteRange ranges[kMaxBackwardRanges + 1];
    status = check_workspace(workspace, workspace_bytes, plan.workspace_bytes, "flashcore_backward_workspace_size",
                             "the fp32 dQ accumulator", ranges, backward_ranges(p, ranges));
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const BwdKernel *kernel = plan.kernel;
    // The configuration the launch runs on this device (its limit picks it:
    // LaunchOptions::max_smem_per_block below).
    const BwdKernelInfo info = kernel->info(handle.max_smem_per_block);
    char kernel_name[64];
    std::snprintf(kernel_name, sizeof kernel_name, "backward %s", bwd_tile_name(kernel->tile));
    status = check_kernel_smem(handle, kernel_name, kernel->dims.head_dim, kernel->dims.head_dim_v, info.smem_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // The 1-D grids: the main kernel's, a CTA per block of keys of each
    // (batch, K/V head); the convert kernel's, a CTA per block of queries
    // of each (batch, query head).
    const auto grid_blocks = [&p](int32_t seqlen, int block_rows, int32_t heads) {
        return (__int128(seqlen) + block_rows - 1) / block_rows * p.batch_size * heads;
    };
    const __int128 key_ctas = grid_blocks(p.seqlen_k, info.block_n, p.num_heads_kv);
    if (key_ctas > INT_MAX) {
        return fail_grid_limit("num_heads_kv", "seqlen_k", info.block_n, static_cast<long long>(key_ctas));
    }
    const __int128 query_ctas = grid_blocks(p.seqlen_q, info.block_m, p.num_heads_q);
    if (query_ctas > INT_MAX) {
        return fail_grid_limit("num_heads_q", "seqlen_q", info.block_m, static_cast<long long>(query_ctas));
    }

    if (handle.emulated != nullptr) {
        return emulated_launch(handle,
                               "the %s %s kernel for head dims (%d, %d) with %zu bytes of shared memory "
                               "(%d-row query blocks, %d-row key blocks), on %d of %d SMs",
                               kernel->path == KernelPath::kSm90 ? "sm_90a" : "portable", kernel_name,
                               int(kernel->dims.head_dim), int(kernel->dims.head_dim_v), info.smem_bytes,
                               info.block_m, info.block_n, call_sms(handle, p.sm_margin), handle.num_sms);
    }
    DeviceGuard guard(handle.device);
    if (guard.status() != FLASHCORE_STATUS_SUCCESS) return guard.status();
    const BwdKernelParams kparams = bwd_kernel_params(p, workspace);
    const char *failed_call = "the launch";
    const LaunchOptions options{persistent_ctas(handle, p.sm_margin), &failed_call, 0, handle.device,
                                handle.max_smem_per_block, handle.env.fail_opt_in};
    const cudaError_t err = kernel->run(kparams, options, static_cast<cudaStream_t>(stream));
    if (err == cudaErrorNotSupported && kernel->path == KernelPath::kSm90) {
        // Planning found the tensors describable (bwd_maps_describable): the
        // driver disagrees. Nothing was launched.
        return fail(FLASHCORE_STATUS_INTERNAL,
                    "the driver refused a TMA descriptor of q, dout, k or v that planning found describable "
                    "(cuTensorMapEncodeTiled); nothing was launched");
    }
    if (err != cudaSuccess) {
        char operation[160];
        std::snprintf(operation, sizeof operation, "launching the backward kernels (%s)", failed_call);
        return fail_cuda(err, operation);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
