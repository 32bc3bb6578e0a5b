// Host-side launch of the portable backward pass: its three kernels in
// stream order. Included only by the generated per-line translation units
// (kernels/CMakeLists.txt from bwd/sm80/instantiation.cu.in).
#pragma once

#include "bwd/entry_points.h"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/kernel.cuh"
#include "bwd/sm80/row_kernels.cuh"
#include "common/dynamic_smem.cuh"

namespace flashcore {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm80() {
    using Traits = typename BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>::Traits;
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN};
}

// One row kernel over every query row (none: nothing launched).
inline cudaError_t launch_row_kernel(void (*kernel)(BwdKernelParams), const BwdKernelParams &params,
                              const LaunchOptions &options, cudaStream_t stream, const char *name) {
    const int64_t rows = bwd_row_kernel_rows(params);
    if (rows == 0) return cudaSuccess;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((rows + kRowKernelWarps - 1) / kRowKernelWarps));
    config.blockDim = dim3(kRowKernelThreads);
    config.stream = stream;
    return launch_step(cudaLaunchKernelEx(&config, kernel, params), options, name);
}

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm80(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
    static_assert(kInput == kOutput, "the backward kernels write their input type (bwd/family.cmake)");
    using Traits = typename BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>::Traits;
    using Element = typename Traits::Element;
    cudaError_t err = launch_row_kernel(bwd_preprocess_kernel<Element>, params, options, stream,
                                                 "cudaLaunchKernelEx (the backward preprocess)");
    if (err != cudaSuccess) return err;
    cudaLaunchConfig_t config = {};
    config.gridDim = sm80::KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>::grid(params);
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    static DynamicSmemOptIn opt_in;
    err = launch_opted_in(opt_in, flash_bwd_kernel<Traits>, config, options, params);
    if (err != cudaSuccess) return err;
    return launch_row_kernel(bwd_convert_kernel<Element>, params, options, stream,
                                      "cudaLaunchKernelEx (the backward postprocess)");
}

}  // namespace flashcore
