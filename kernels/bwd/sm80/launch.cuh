// Host-side launch of the portable backward pass: its three kernels in
// stream order. Included only by the generated per-line translation units
// (kernels/CMakeLists.txt from bwd/sm80/instantiation.cu.in).
#pragma once

#include <cstddef>

#include "bwd/entry_points.h"
#include "bwd/passes.cuh"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/kernel.cuh"

namespace flashcore {

// The configuration a device with max_smem_per_block bytes per block runs
// (BwdTiers::index_for: the one run_bwd_sm80 launches there).
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm80(size_t max_smem_per_block) {
    using Tiers = typename BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>::Tiers;
    const int tier = Tiers::index_for(max_smem_per_block);
    return {Tiers::kSmemBytes[tier], Tiers::kBlockM[tier], Tiers::kBlockN[tier]};
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
    // The configuration of the device's limit, the one bwd_info_sm80 gave
    // the dispatcher.
    using Tiers = typename BwdConfig<kInput, kHeadDim, kHeadDimV, kVariant>::Tiers;
    return Tiers::visit(Tiers::index_for(options.max_smem_per_block), [&](auto tier) {
        return run_bwd_traits<typename decltype(tier)::Traits>(params, options, stream);
    });
}

}  // namespace flashcore
