// Host-side launch of the sm90 kernel: the configuration for the call
// (config.cuh), the TMA descriptors of Q, K, V and O (tensor_map.cuh), then
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

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90() {
    static_assert(kVariant == FwdVariant::kPersistent, "the sm90 kernel has one variant");
    static_assert(kKV == kInput, "the sm90 kernel reads K/V of its input type (fwd/family.cmake)");
    static_assert(sm90::sm90_writes(kInput, kOutput), "the sm90 kernels write their input type, or bf16 for e4m3");
    using Traits = typename sm90::Sm90Config<kInput, kOutput, kHeadDim, kHeadDimV>::Traits;
    // One CTA per SM: __launch_bounds__(threads, 1), and the consumers take
    // the registers the producer gives up.
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN, 1, true};
}

namespace sm90 {

// The call on the kernel of Traits with Cap (Softcap or NoSoftcap): the TMA
// descriptors of Q, K, V and O for the call (tensor_map.cuh), the schedule,
// then the launch. kServesRagged: whether the kernel for ragged batches is
// built (not for configurations that dense calls alone choose).
template <DType kInput, DType kOutput, typename Traits, typename Cap, bool kServesRagged = true>
cudaError_t run_with_traits(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    constexpr int kCols = Traits::kPanelCols;
    Sm90KernelParams p{};
    p.fwd = params;
    p.first_kv_position = options.first_kv_position;
    // The maps' (seq, batch) extents: packed tensors are one batch of all
    // their rows, a paged pool is num_pages batches of page_size rows read a
    // page's share of a tile per box.
    const bool packed_q = params.cu_seqlens_q != nullptr;
    const int q_rows = packed_q ? params.total_seqlen_q : params.seqlen_q;
    const int q_batches = packed_q ? 1 : params.batch_size;
    const bool paged = params.block_table != nullptr;
    const bool packed_kv = params.cu_seqlens_k != nullptr;
    const int kv_rows = paged ? params.page_size : packed_kv ? params.total_seqlen_k : params.seqlen_k;
    const int kv_batches = paged ? params.num_pages : packed_kv ? 1 : params.batch_size;
    // The batch dimension of a packed map has extent 1; its stride is
    // unused but must be one the driver accepts.
    const int64_t q_batch_stride = packed_q ? params.q_seq_stride : params.q_batch_stride;
    const int64_t out_batch_stride = packed_q ? params.out_seq_stride : params.out_batch_stride;
    const int64_t k_batch_stride = packed_kv ? params.k_seq_stride : params.k_batch_stride;
    const int64_t v_batch_stride = packed_kv ? params.v_seq_stride : params.v_batch_stride;
    p.kv_box_rows = paged ? std::gcd(params.page_size, Traits::kBlockN) : Traits::kBlockN;
    const bool encoded =
        tensor_map(&p.tma_q,
                   tensor_geometry(TensorRole::kQ, kInput, params.head_dim, q_rows, params.num_heads_q, q_batches,
                                   params.q_seq_stride, params.q_head_stride, q_batch_stride, kCols,
                                   Traits::kBlockM),
                   params.q) &&
        tensor_map(&p.tma_k,
                   tensor_geometry(TensorRole::kK, kInput, params.head_dim, kv_rows, params.num_heads_kv,
                                   kv_batches, params.k_seq_stride, params.k_head_stride, k_batch_stride, kCols,
                                   p.kv_box_rows),
                   params.k) &&
        tensor_map(&p.tma_v,
                   tensor_geometry(TensorRole::kV, kInput, params.head_dim_v, kv_rows, params.num_heads_kv,
                                   kv_batches, params.v_seq_stride, params.v_head_stride, v_batch_stride, kCols,
                                   p.kv_box_rows),
                   params.v) &&
        // O leaves through TMA only from staging (OutputPath::kTmaStore).
        (Traits::kOutputPath != OutputPath::kTmaStore ||
         tensor_map(&p.tma_o,
                    tensor_geometry(TensorRole::kO, kOutput, params.head_dim_v, q_rows, params.num_heads_q,
                                    q_batches, params.out_seq_stride, params.out_head_stride, out_batch_stride,
                                    Traits::kOutPanelCols, Traits::kRowsPerConsumer),
                    params.out));
    // The dispatcher falls back to the portable kernel.
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

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    static_assert(sm90::sm90_writes(kInput, kOutput), "the sm90 kernels write their input type, or bf16 for e4m3");
    static_assert(kKV == kInput, "the sm90 kernel reads K/V of its input type (fwd/family.cmake)");
    static_assert(kVariant == FwdVariant::kPersistent, "the sm90 kernel has one variant");
    using Config = sm90::Sm90Config<kInput, kOutput, kHeadDim, kHeadDimV>;
    using Traits = typename Config::Traits;
    if constexpr (Config::kHasWide) {
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

}  // namespace flashcore
