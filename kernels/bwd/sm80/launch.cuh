// Host-side launch of the portable backward pass: its three kernels in
// stream order. Included only by the generated per-line translation units
// (kernels/CMakeLists.txt from bwd/sm80/instantiation.cu.in).
#pragma once

#include <type_traits>

#include "bwd/entry_points.h"
#include "bwd/passes.cuh"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/kernel.cuh"

namespace flashcore {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm80() {
    using Traits = typename BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>::Traits;
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN};
}

// The three kernels of one configuration (BwdTraits).
template <typename Traits>
cudaError_t run_bwd_traits(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
    const BwdKernelParams scheduled = bwd_schedule_params<Traits>(params, options);
    return run_bwd_passes<Traits>(scheduled, options, stream, flash_bwd_kernel<Traits>, scheduled);
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
