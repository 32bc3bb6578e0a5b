#include "dispatch.h"

#include <climits>
#include <cstdint>

#include "error.h"
#include "handle.h"
#include "kernel_registry.h"
#include "params.h"

namespace flashcore {
namespace {

// How many large-tile CTAs an SM holds at once (registers: 128 threads x
// 230-255 each).
constexpr int kLargeTileCtasPerSm = 2;
// The sm_90a kernel serves a call (unless forced) when its grid gives every
// SM at least this many CTAs.
constexpr int kSm90MinCtasPerSm = 1;

const char *variant_name(FwdVariant variant) {
    switch (variant) {
        case FwdVariant::kLargeTiles: return "large";
        case FwdVariant::kKeySplit: return "keysplit";
        case FwdVariant::kPersistent: return "persistent";
    }
    return "unknown";
}

int64_t num_blocks(const flashcore_forward_params &p, const KernelEntry &kernel) {
    return fwd_num_blocks(p.batch_size, p.num_heads_q, p.seqlen_q, kernel.info().block_m);
}

// The portable kernel for the call: the pinned variant where the environment
// asks for one and the build has it for these head dims (not every head dim
// has every variant: kernels/fwd_variants.list), else by grid size. Large
// tiles do the most work per byte read from shared memory, but a CTA walks
// its key tiles one after another: when the grid does not fill every SM's CTA
// slots once, finishing sooner matters more than efficiency, and the
// key-split variant (half the serial chain per warp) wins. Measured
// crossovers are in docs/perf-notes.md. Where the key-split variant needs
// more shared memory than the device offers, the large tiles serve every
// size.
flashcore_status choose_sm80(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype,
                             HeadDims dims, const KernelEntry **chosen) {
    if (handle.env.forced_variant) {
        *chosen = find_kernel(KernelPath::kSm80, dtype, dims, *handle.env.forced_variant);
        if (*chosen != nullptr) return FLASHCORE_STATUS_SUCCESS;
    }
    const KernelEntry *large = find_kernel(KernelPath::kSm80, dtype, dims, FwdVariant::kLargeTiles);
    const KernelEntry *key_split = find_kernel(KernelPath::kSm80, dtype, dims, FwdVariant::kKeySplit);
    if (large != nullptr && num_blocks(p, *large) >= int64_t(handle.num_sms) * kLargeTileCtasPerSm) {
        *chosen = large;
    } else if (key_split != nullptr &&
               (large == nullptr || key_split->info().smem_bytes <= handle.max_smem_per_block)) {
        *chosen = key_split;
    } else {
        *chosen = large;
    }
    if (*chosen != nullptr) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INTERNAL, "no portable kernel for head dims (%d, %d) in the kernel registry",
                int(dims.head_dim), int(dims.head_dim_v));
}

// The sm_90a kernel for the call, or nullptr where the portable kernel should
// serve it. With fewer 128-row blocks than SMs the sm_90a kernel leaves SMs
// idle and its per-block latency decides; the portable key-split variant is
// faster there (mission shape: 8.0 vs 10.4 us, docs/hopper-notes.md). Its
// shared memory fits every sm_90 part (227 KB per block). A grid over the
// limit goes to the portable kernel, which reports what it cannot do.
const KernelEntry *choose_sm90(const flashcore_handle_s &handle, const flashcore_forward_params &p, DType dtype,
                               HeadDims dims) {
    if (!handle.env.use_sm90) return nullptr;
    const KernelEntry *sm90 = find_kernel(KernelPath::kSm90, dtype, dims, FwdVariant::kPersistent);
    if (sm90 == nullptr) return nullptr;
    const int64_t blocks = num_blocks(p, *sm90);
    if (blocks > INT_MAX) return nullptr;
    if (!handle.env.sm90_forced && blocks < int64_t(handle.num_sms) * kSm90MinCtasPerSm) return nullptr;
    return sm90;
}

}  // namespace

flashcore_status forward_workspace_bytes(const flashcore_handle_s &, const flashcore_forward_params &,
                                         size_t *bytes) {
    // Every kernel keeps all state on chip.
    *bytes = 0;
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status launch_forward(const flashcore_handle_s &handle, const flashcore_forward_params &p,
                                void *workspace, size_t workspace_bytes, void *stream) {
    size_t needed = 0;
    flashcore_status status = forward_workspace_bytes(handle, p, &needed);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (workspace_bytes < needed) {
        return fail(FLASHCORE_STATUS_WORKSPACE_TOO_SMALL,
                    "workspace_bytes (%zu) is smaller than the %zu bytes flashcore_forward_workspace_size asks for",
                    workspace_bytes, needed);
    }
    if (workspace_bytes > 0 && workspace == nullptr) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "workspace is NULL but workspace_bytes is %zu",
                    workspace_bytes);
    }
    if (reinterpret_cast<uintptr_t>(workspace) % FLASHCORE_ALIGNMENT != 0) {
        return fail(FLASHCORE_STATUS_MISALIGNED, "workspace (%p) must be %d-byte aligned", workspace,
                    FLASHCORE_ALIGNMENT);
    }
    HeadDims dims{};
    if (!covering_head_dims({p.head_dim, effective_head_dim_v(p)}, &dims)) {
        return fail(FLASHCORE_STATUS_INTERNAL, "no kernel covers head dims (%d, %d), which validation accepted",
                    int(p.head_dim), int(effective_head_dim_v(p)));
    }
    const DType dtype = DType(p.dtype);

    DeviceGuard guard(handle.device);
    if (guard.status() != FLASHCORE_STATUS_SUCCESS) return guard.status();
    const FwdKernelParams kparams = kernel_params(p);
    const FwdLaunchOptions options{handle.env.persistent_ctas};
    const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
    if (const KernelEntry *sm90 = choose_sm90(handle, p, dtype, dims)) {
        // cudaErrorNotSupported: tensors the TMA unit cannot describe,
        // nothing launched; the portable kernel serves them.
        const cudaError_t err = sm90->run(kparams, options, cuda_stream);
        if (err == cudaSuccess) return FLASHCORE_STATUS_SUCCESS;
        if (err != cudaErrorNotSupported) return fail_cuda(err, "launching the sm_90a attention kernel");
    }
    const KernelEntry *kernel = nullptr;
    status = choose_sm80(handle, p, dtype, dims, &kernel);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const FwdKernelInfo info = kernel->info();
    if (info.smem_bytes > handle.max_smem_per_block) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "the %s kernel for head dims (%d, %d) needs %zu bytes of shared memory per block; device %d "
                    "(sm_%d%d) allows %zu",
                    variant_name(kernel->variant), int(dims.head_dim), int(dims.head_dim_v), info.smem_bytes,
                    handle.device, handle.cc_major, handle.cc_minor, handle.max_smem_per_block);
    }
    const int64_t blocks = num_blocks(p, *kernel);
    if (blocks > INT_MAX) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "batch_size * num_heads_q * ceil(seqlen_q / %d) = %lld thread blocks exceeds the grid limit "
                    "(%d)",
                    info.block_m, static_cast<long long>(blocks), INT_MAX);
    }
    const cudaError_t err = kernel->run(kparams, options, cuda_stream);
    if (err != cudaSuccess) return fail_cuda(err, "launching the attention kernel");
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
