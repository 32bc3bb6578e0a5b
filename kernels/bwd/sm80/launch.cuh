// Host-side launch of the portable backward pass: its three kernels in
// stream order. Included only by the generated per-line translation units
// (kernels/CMakeLists.txt from bwd/sm80/instantiation.cu.in).
#pragma once

#include <type_traits>

#include "bwd/entry_points.h"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/convert.cuh"
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

// The three kernels of one configuration (BwdTraits).
template <typename Traits>
cudaError_t run_bwd_traits(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
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
    // The convert kernel: a CTA per query block of each (batch, query head)
    // (dispatch.cpp keeps the count within the grid's limit).
    const int64_t query_blocks =
        bwd_query_blocks(params, Traits::kBlockM) * params.fwd.batch_size * params.fwd.num_heads_q;
    if (query_blocks == 0) return cudaSuccess;
    cudaLaunchConfig_t convert = {};
    convert.gridDim = dim3(unsigned(query_blocks));
    convert.blockDim = dim3(Traits::kNumThreads);
    convert.stream = stream;
    return launch_step(cudaLaunchKernelEx(&convert, bwd_convert_kernel<Traits>, params), options,
                       "cudaLaunchKernelEx (the backward postprocess)");
}

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm80(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
    static_assert(kInput == kOutput, "the backward kernels write their input type (bwd/family.cmake)");
    using Config = BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>;
    if constexpr (!std::is_same_v<typename Config::Traits, typename Config::LargeSmemTraits>) {
        if (options.max_smem_per_block >= Config::LargeSmemTraits::kSmemBytes) {
            return run_bwd_traits<typename Config::LargeSmemTraits>(params, options, stream);
        }
    }
    return run_bwd_traits<typename Config::Traits>(params, options, stream);
}

}  // namespace flashcore
