// Host-side launch of the portable forward kernel. Included only by the
// generated per-variant translation units (kernels/CMakeLists.txt), which
// instantiate run_flash_fwd for one (dtype, head_dim) each so the variants
// compile in parallel.
#pragma once

#include "flash_fwd_kernel.cuh"
#include "fwd_config.cuh"
#include "launch.h"

namespace flashcore {

// Above this, a kernel must opt in to more dynamic shared memory.
constexpr size_t kDefaultDynamicSmemLimit = 48 * 1024;

template <DType kDType, int kHeadDim, FwdVariant kVariant>
FwdKernelInfo flash_fwd_info() {
    using Traits = typename FwdConfig<kDType, kHeadDim, kVariant>::Traits;
    return {Traits::kSmemBytes, Traits::kBlockM};
}

template <DType kDType, int kHeadDim, FwdVariant kVariant>
cudaError_t run_flash_fwd(const FwdKernelParams &params, cudaStream_t stream) {
    using Traits = typename FwdConfig<kDType, kHeadDim, kVariant>::Traits;
    const auto kernel = flash_fwd_kernel<Traits>;
    constexpr size_t smem_bytes = Traits::kSmemBytes;
    if (smem_bytes > kDefaultDynamicSmemLimit) {
        // Idempotent and cheap; doing it per launch keeps the handle free of
        // per-kernel state and is safe from several threads.
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
        if (err != cudaSuccess) return err;
    }
    // The dispatcher has checked that this fits a one-dimensional grid.
    const int64_t num_blocks =
        fwd_num_ctas(params.batch_size, params.num_heads_q, params.seqlen_q, Traits::kBlockM);
    kernel<<<dim3(unsigned(num_blocks)), dim3(Traits::kNumThreads), smem_bytes, stream>>>(params);
    return cudaGetLastError();
}

}  // namespace flashcore
