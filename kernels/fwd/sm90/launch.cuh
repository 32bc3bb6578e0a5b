// Host-side launch of the sm90 kernel: the configuration for the call
// (config.cuh), the TMA descriptors of Q, K, V and O (tensor_maps.h), then
// the launch. Included only by the generated sm_90a translation units
// (kernels/CMakeLists.txt).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <numeric>

#include "common/dynamic_smem.cuh"
#include "fwd/entry_points.h"
#include "fwd/sm90/config.cuh"
#include "fwd/sm90/kernel.cuh"
#include "fwd/sm90/tensor_maps.h"
#include "fwd/sm90/wide_kernel.cuh"
#include "sm90/tensor_map.cuh"

namespace flashcore::sm90 {

// The output types of the sm90 kernels: the input's, or bf16 for e4m3
// inputs (FA3's; fwd/family.cmake).
constexpr bool sm90_writes(DType input, DType output) {
    return input == output || (input == DType::kE4m3 && output == DType::kBf16);
}

template <typename Traits, typename Cap, bool kRagged>
cudaError_t launch(const Sm90KernelParams &p, int64_t num_ctas, const FwdLaunchOptions &options, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(num_ctas));
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    static DynamicSmemOptIn opt_in;
    return launch_opted_in(opt_in, flash_fwd_sm90_kernel<Traits, Cap, kRagged>, config, options, p);
}

}  // namespace flashcore::sm90

namespace flashcore {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV>
FwdKernelInfo persistent_info_sm90() {
    using Traits = typename sm90::Sm90Config<kInput, kOutput, kHeadDim, kHeadDimV>::Traits;
    // One CTA per SM: __launch_bounds__(threads, 1), and the consumers take
    // the registers the producer gives up.
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN, 1, true,
            Traits::kOutputPath == sm90::OutputPath::kTmaStore};
}

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90() {
    static_assert(kVariant == FwdVariant::kPersistent || kVariant == FwdVariant::kWideWgmma,
                  "the sm90 variants: the persistent kernel and the wide one");
    static_assert(kKV == kInput || kVariant == FwdVariant::kWideWgmma,
                  "the sm90 kernels read K/V of their input type, but the wide one e4m3 caches (fwd/family.cmake)");
    static_assert(sm90::sm90_writes(kInput, kOutput), "the sm90 kernels write their input type, or bf16 for e4m3");
    if constexpr (kVariant == FwdVariant::kWideWgmma) {
        return sm90::wide_info<sm90::WideTraitsOf<kInput, kKV, kOutput, kHeadDim, kHeadDimV>>();
    } else {
        return persistent_info_sm90<kInput, kOutput, kHeadDim, kHeadDimV>();
    }
}

namespace sm90 {

// The call on the kernel of Traits with Cap (Softcap or NoSoftcap): the TMA
// descriptors of Q, K, V and O for the call (tensor_maps.h), the schedule,
// then the launch. kServesRagged: whether the kernel for ragged batches is
// built (not for configurations that dense calls alone choose).
template <DType kInput, DType kOutput, typename Traits, typename Cap, bool kServesRagged = true>
cudaError_t run_with_traits(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    constexpr int kCols = Traits::kPanelCols;
    Sm90KernelParams p{};
    p.fwd = params;
    p.first_kv_position = options.first_kv_position;
    const bool paged = params.block_table != nullptr;
    p.kv_box_rows = paged ? std::gcd(params.page_size, Traits::kBlockN) : Traits::kBlockN;
    const FwdMapGeometries maps = fwd_map_geometries(
        params, kInput, kOutput,
        {kCols, Traits::kBlockM, p.kv_box_rows, Traits::kOutPanelCols, Traits::kRowsPerConsumer});
    // Planning checked that the driver can describe these
    // (fwd_maps_describable): a refusal here is the launch's error.
    const bool encoded = tensor_map(&p.tma_q, maps.q, params.q) && tensor_map(&p.tma_k, maps.k, params.k) &&
                         tensor_map(&p.tma_v, maps.v, params.v) &&
                         // O leaves through TMA only from staging (OutputPath::kTmaStore).
                         (Traits::kOutputPath != OutputPath::kTmaStore || tensor_map(&p.tma_o, maps.out, params.out));
    if (!encoded) return cudaErrorNotSupported;

    // Persistent: one CTA per SM at most, each walking its share of the
    // schedule.
    const auto schedule = PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(params);
    p.schedule = schedule;
    const int64_t num_items = schedule.num_items(params);
    const int64_t num_ctas = num_items < options.max_persistent_ctas ? num_items : options.max_persistent_ctas;
    if constexpr (kServesRagged) {
        if (params.ragged) return launch<Traits, Cap, true>(p, num_ctas, options, stream);
    }
    return launch<Traits, Cap, false>(p, num_ctas, options, stream);
}

}  // namespace sm90

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV>
cudaError_t run_persistent_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    using Config = sm90::Sm90Config<kInput, kOutput, kHeadDim, kHeadDimV>;
    using Traits = typename Config::Traits;
    if constexpr (Config::kHasWide) {
        static_assert(Config::WideTraits::kOutputPath == Traits::kOutputPath,
                      "fwd_info_sm90's stores_out_by_tma stands for both configurations");
        // The dispatcher planned by the two-warpgroup configuration, which
        // fits the handle's shared memory; the wide one may not, under
        // FLASHCORE_TEST_SMEM_PER_BLOCK (options.max_smem_per_block).
        const bool wide_smem_fits =
            options.max_smem_per_block == 0 || Config::WideTraits::kSmemBytes <= options.max_smem_per_block;
        if (wide_smem_fits && sm90::wide_fits<Traits, typename Config::WideTraits>(params, options.max_persistent_ctas)) {
            return sm90::run_with_traits<kInput, kOutput, typename Config::WideTraits, NoSoftcap,
                                         /*kServesRagged=*/false>(params, options, stream);
        }
    }
    // e4m3 inputs: no softcap (validation refuses it; one kernel fewer of
    // each, for the library's size).
    if constexpr (Traits::kFp8) {
        if (params.softcap_prescale != 0.f) return cudaErrorNotSupported;
        return sm90::run_with_traits<kInput, kOutput, Traits, NoSoftcap>(params, options, stream);
    } else {
        return params.softcap_prescale != 0.f
                   ? sm90::run_with_traits<kInput, kOutput, Traits, Softcap>(params, options, stream)
                   : sm90::run_with_traits<kInput, kOutput, Traits, NoSoftcap>(params, options, stream);
    }
}

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    static_assert(sm90::sm90_writes(kInput, kOutput), "the sm90 kernels write their input type, or bf16 for e4m3");
    static_assert(kKV == kInput || kVariant == FwdVariant::kWideWgmma,
                  "the sm90 kernels read K/V of their input type, but the wide one e4m3 caches (fwd/family.cmake)");
    if constexpr (kVariant == FwdVariant::kWideWgmma) {
        static_assert(kInput == kOutput && kInput != DType::kE4m3, "the wide sm90 kernel reads and writes 16 bits");
        return sm90::run_wide<sm90::WideTraitsOf<kInput, kKV, kOutput, kHeadDim, kHeadDimV>>(params, options, stream);
    } else {
        return run_persistent_sm90<kInput, kOutput, kHeadDim, kHeadDimV>(params, options, stream);
    }
}

}  // namespace flashcore
