#include "dispatch.h"

#include <climits>
#include <cmath>

#include "error.h"
#include "handle.h"
#include "launch.h"
#include "validate.h"

namespace flashcore {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct KernelEntry {
    cudaError_t (*run)(const FwdKernelParams &, cudaStream_t);
    FwdKernelInfo (*info)();
};

template <DType kDType, int kHeadDim, FwdVariant kVariant>
constexpr KernelEntry entry() {
    return {&run_flash_fwd<kDType, kHeadDim, kVariant>, &flash_fwd_info<kDType, kHeadDim, kVariant>};
}

template <DType kDType, int kHeadDim>
KernelEntry entry_for(FwdVariant variant) {
    return variant == FwdVariant::kLargeTiles ? entry<kDType, kHeadDim, FwdVariant::kLargeTiles>()
                                              : entry<kDType, kHeadDim, FwdVariant::kKeySplit>();
}

// How many large-tile CTAs an SM holds at once (registers: 128 threads x
// 230-255 each).
constexpr int kLargeTileCtasPerSm = 2;

template <DType kDType, int kHeadDim>
KernelEntry select_for(const flashcore_handle_s &handle, const flashcore_forward_params &p) {
    if (handle.forced_fwd_variant >= 0) return entry_for<kDType, kHeadDim>(FwdVariant(handle.forced_fwd_variant));
    // Large tiles do the most work per byte read from shared memory, but a
    // CTA walks its key tiles one after another: when the grid does not fill
    // every SM's CTA slots once, finishing sooner matters more than
    // efficiency, and the key-split variant (half the serial chain per warp)
    // wins. Measured crossovers are in docs/perf-notes.md.
    // Where the key-split variant needs more shared memory than the device
    // offers, the large tiles serve every size.
    const KernelEntry large = entry<kDType, kHeadDim, FwdVariant::kLargeTiles>();
    const KernelEntry key_split = entry<kDType, kHeadDim, FwdVariant::kKeySplit>();
    const int64_t large_ctas = fwd_num_ctas(p.batch_size, p.num_heads_q, p.seqlen_q, large.info().block_m);
    if (large_ctas >= int64_t(handle.num_sms) * kLargeTileCtasPerSm) return large;
    return key_split.info().smem_bytes <= handle.max_smem_per_block ? key_split : large;
}

static_assert(sizeof(kFwdVariantNames) / sizeof(kFwdVariantNames[0]) == kNumFwdVariants,
              "one FLASHCORE_FWD_VARIANT name per variant");

#ifdef FLASHCORE_HAS_SM90
// The sm_90a kernel serves a call (unless forced) when its grid gives every
// SM at least this many CTAs.
constexpr int kSm90MinCtasPerSm = 1;

template <DType kDType, int kHeadDim>
constexpr KernelEntry sm90_entry() {
    return {&run_flash_fwd_sm90<kDType, kHeadDim>, &flash_fwd_sm90_info<kDType, kHeadDim>};
}

KernelEntry select_sm90_kernel(const flashcore_forward_params &p) {
    const bool bf16 = p.dtype == FLASHCORE_DTYPE_BF16;
    if (p.head_dim == 64) return bf16 ? sm90_entry<DType::kBf16, 64>() : sm90_entry<DType::kFp16, 64>();
    return bf16 ? sm90_entry<DType::kBf16, 128>() : sm90_entry<DType::kFp16, 128>();
}
#endif

KernelEntry select_kernel(const flashcore_handle_s &handle, const flashcore_forward_params &p) {
    const bool bf16 = p.dtype == FLASHCORE_DTYPE_BF16;
    if (p.head_dim == 64) {
        return bf16 ? select_for<DType::kBf16, 64>(handle, p) : select_for<DType::kFp16, 64>(handle, p);
    }
    return bf16 ? select_for<DType::kBf16, 128>(handle, p) : select_for<DType::kFp16, 128>(handle, p);
}

FwdKernelParams kernel_params(const flashcore_handle_s &handle, const flashcore_forward_params &p) {
    FwdKernelParams k{};
    k.q = p.q;
    k.k = p.k;
    k.v = p.v;
    k.out = p.out;
    k.lse = p.lse;
    k.q_batch_stride = p.q_batch_stride;
    k.q_seq_stride = p.q_seq_stride;
    k.q_head_stride = p.q_head_stride;
    k.k_batch_stride = p.k_batch_stride;
    k.k_seq_stride = p.k_seq_stride;
    k.k_head_stride = p.k_head_stride;
    k.v_batch_stride = p.v_batch_stride;
    k.v_seq_stride = p.v_seq_stride;
    k.v_head_stride = p.v_head_stride;
    k.out_batch_stride = p.out_batch_stride;
    k.out_seq_stride = p.out_seq_stride;
    k.out_head_stride = p.out_head_stride;
    k.batch_size = p.batch_size;
    k.seqlen_q = p.seqlen_q;
    k.seqlen_k = p.seqlen_k;
    k.num_heads_q = p.num_heads_q;
    k.num_heads_kv = p.num_heads_kv;
    k.head_dim = p.head_dim;
    k.max_persistent_ctas = handle.persistent_ctas;
    k.softmax_scale = effective_softmax_scale(p);
    k.softmax_scale_log2 = k.softmax_scale * kLog2e;
    k.causal = p.causal != 0;
    return k;
}

}  // namespace

flashcore_status forward_workspace_bytes(const flashcore_handle_s &, const flashcore_forward_params &,
                                         size_t *bytes) {
    // The portable kernels keep all state on chip.
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

    DeviceGuard guard(handle.device);
    if (guard.status() != FLASHCORE_STATUS_SUCCESS) return guard.status();
    const FwdKernelParams kparams = kernel_params(handle, p);
#ifdef FLASHCORE_HAS_SM90
    if (handle.use_sm90) {
        // With fewer 128-row blocks than SMs the sm_90a kernel leaves SMs
        // idle and its per-block latency decides; the portable key-split
        // variant is faster there (mission shape: 8.0 vs 10.4 us,
        // docs/hopper-notes.md). Its shared memory fits every sm_90 part
        // (227 KB per block). A grid over the limit, or tensors the TMA unit
        // cannot describe (cudaErrorNotSupported), go to the portable
        // kernel, which reports what it cannot do.
        const KernelEntry sm90 = select_sm90_kernel(p);
        const int64_t sm90_ctas = fwd_num_ctas(p.batch_size, p.num_heads_q, p.seqlen_q, sm90.info().block_m);
        if (sm90_ctas <= INT_MAX && (handle.sm90_forced || sm90_ctas >= int64_t(handle.num_sms) * kSm90MinCtasPerSm)) {
            const cudaError_t err = sm90.run(kparams, static_cast<cudaStream_t>(stream));
            if (err == cudaSuccess) return FLASHCORE_STATUS_SUCCESS;
            if (err != cudaErrorNotSupported) return fail_cuda(err, "launching the sm_90a attention kernel");
        }
    }
#endif
    const KernelEntry kernel = select_kernel(handle, p);
    const FwdKernelInfo info = kernel.info();
    if (info.smem_bytes > handle.max_smem_per_block) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "head_dim %d needs %zu bytes of shared memory per block; device %d (sm_%d%d) allows %zu",
                    int(p.head_dim), info.smem_bytes, handle.device, handle.cc_major, handle.cc_minor,
                    handle.max_smem_per_block);
    }
    const int64_t num_blocks = fwd_num_ctas(p.batch_size, p.num_heads_q, p.seqlen_q, info.block_m);
    if (num_blocks > INT_MAX) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "batch_size * num_heads_q * ceil(seqlen_q / %d) = %lld thread blocks exceeds the grid limit "
                    "(%d)",
                    info.block_m, static_cast<long long>(num_blocks), INT_MAX);
    }

    const cudaError_t err = kernel.run(kparams, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return fail_cuda(err, "launching the attention kernel");
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
