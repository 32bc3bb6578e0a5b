// Host-side launch of the portable forward kernel. Included only by the
// generated per-variant translation units (kernels/CMakeLists.txt), which
// instantiate run_fwd_sm80 for one line of kernels/kernels.list and input
// dtype each, so the variants compile in parallel.
#pragma once

#include "common/dynamic_smem.cuh"
#include "fwd/entry_points.h"
#include "fwd/sm80/config.cuh"
#include "fwd/sm80/kernel.cuh"

namespace flashcore {

// The variants also compiled for ragged batches (packed or paged tensors,
// FwdKernelParams::ragged): the decode tiles (both), for paged decode and
// cache lengths (the dense call's tile for the same shape); the two-way
// key split, for small grids; and the large tiles, for grids that fill the
// GPU and wherever nothing else fits: they are the one variant within
// kMinSmemPerBlock at every head dim (config.cuh; from head dim 96 on sm_86
// and sm_89, and 256 on an A100, the others do not fit). Each ragged kernel
// is a second copy of its variant (the large tiles' adds 108-133 KB of
// machine code per unit and architecture, before compression); the
// four-way split has none, for the library's size. The wide tiles are the
// only kernels at their head dims, and serve both.
template <FwdVariant kVariant>
constexpr bool kServesRagged = kVariant == FwdVariant::kDecode || kVariant == FwdVariant::kDecodePair ||
                               kVariant == FwdVariant::kKeySplit ||
                               kVariant == FwdVariant::kLargeTiles || kVariant == FwdVariant::kWide ||
                               kVariant == FwdVariant::kWideDecode;

// Kernels on quantized K/V are built for ragged batches only, which serves
// dense calls too (their decode time is the cache's read, not the ragged
// kernel's extra registers): one copy, not two.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm80() {
    using Traits = typename FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, kVariant>::Traits;
    using RaggedTraits = typename FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, kVariant>::RaggedTraits;
    // The info below is the ragged kernel's too.
    static_assert(RaggedTraits::kSmemBytes == Traits::kSmemBytes && RaggedTraits::kBlockM == Traits::kBlockM &&
                      RaggedTraits::kBlockN == Traits::kBlockN && RaggedTraits::kKeySplits == Traits::kKeySplits &&
                      RaggedTraits::kNumThreads == Traits::kNumThreads &&
                      RaggedTraits::kMaxRegisters == Traits::kMaxRegisters,
                  "a ragged kernel differs from its variant's dense kernel in nothing the dispatcher plans by");
    FwdKernelInfo info{Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN * Traits::kKeySplits,
                       register_bound_ctas_per_sm(Traits::kNumThreads, Traits::kMaxRegisters),
                       kServesRagged<kVariant> || Traits::kQuantizedKV};
    info.v_in_k = Traits::kVInK;
    return info;
}

template <typename Traits, bool kRagged>
cudaError_t launch_fwd_sm80(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = sm80::BlockScheduler<Traits::kBlockM, Traits::kBlockN, kRagged>::grid(params);
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    static DynamicSmemOptIn opt_in;
    return launch_opted_in(opt_in, flash_fwd_kernel<Traits, kRagged>, config, options, params);
}

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm80(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    static_assert(kInput == kOutput, "the forward kernels write their input type (fwd/family.cmake)");
    using Config = FwdConfig<kInput, kKV, kOutput, kHeadDim, kHeadDimV, kVariant>;
    using Traits = typename Config::Traits;
    if constexpr (Traits::kQuantizedKV) {
        return launch_fwd_sm80<Traits, true>(params, options, stream);
    } else {
        if (!params.ragged) return launch_fwd_sm80<Traits, false>(params, options, stream);
        if constexpr (kServesRagged<kVariant>) {
            return launch_fwd_sm80<typename Config::RaggedTraits, true>(params, options, stream);
        } else {
            return launch_step(cudaErrorNotSupported, options, "a ragged call on a variant without a ragged kernel");
        }
    }
}

}  // namespace flashcore
