// Host-side launch of the sm90 kernel: encodes the TMA descriptors of Q, K,
// V and O for the call, then launches. Included only by the generated sm_90a
// translation units (kernels/CMakeLists.txt).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <numeric>

#include "common/fwd_entry_points.h"
#include "sm90/fwd_config.cuh"
#include "sm90/kernel.cuh"

namespace flashcore::sm90 {

// cuTensorMapEncodeTiled from the driver, found once through the runtime so
// the library needs no link-time dependency on libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            fn = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return encoder;
}

// A 4-d map (head_dim, seq, head, batch) of 2-byte elements, accessed in
// boxes of one panel (box_cols columns) x box_rows rows with the panel's
// swizzle. head_dim is the call's: columns past it, like rows past seqlen,
// read as zeros and are not written. Returns false where the driver cannot
// describe the tensor.
inline bool encode_tensor_map(CUtensorMap *map, CUtensorMapDataType type, const void *base, int head_dim,
                              int seqlen, int heads, int batch, int64_t seq_stride, int64_t head_stride,
                              int64_t batch_stride, int box_cols, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    constexpr int64_t kElementBytes = 2;
    const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(seqlen), cuuint64_t(heads), cuuint64_t(batch)};
    const cuuint64_t strides[3] = {cuuint64_t(seq_stride * kElementBytes), cuuint64_t(head_stride * kElementBytes),
                                   cuuint64_t(batch_stride * kElementBytes)};
    const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUtensorMapSwizzle swizzle = box_cols * kElementBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                                                       : CU_TENSOR_MAP_SWIZZLE_64B;
    return encode(map, type, 4, const_cast<void *>(base), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace flashcore::sm90

namespace flashcore {

template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90() {
    static_assert(kVariant == FwdVariant::kPersistent, "the sm90 kernel has one variant");
    using Traits = typename sm90::Sm90Config<kDType, kHeadDim, kHeadDimV>::Traits;
    // One CTA per SM: __launch_bounds__(threads, 1), and the consumers take
    // the registers the producer gives up.
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN, 1, true};
}

template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    static_assert(kVariant == FwdVariant::kPersistent, "the sm90 kernel has one variant");
    using Traits = typename sm90::Sm90Config<kDType, kHeadDim, kHeadDimV>::Traits;
    constexpr CUtensorMapDataType kType =
        kDType == DType::kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    constexpr int kCols = Traits::kPanelCols;
    sm90::Sm90KernelParams p{};
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
        sm90::encode_tensor_map(&p.tma_q, kType, params.q, params.head_dim, q_rows, params.num_heads_q, q_batches,
                                params.q_seq_stride, params.q_head_stride, q_batch_stride, kCols,
                                Traits::kBlockM) &&
        sm90::encode_tensor_map(&p.tma_k, kType, params.k, params.head_dim, kv_rows, params.num_heads_kv, kv_batches,
                                params.k_seq_stride, params.k_head_stride, k_batch_stride, kCols,
                                p.kv_box_rows) &&
        sm90::encode_tensor_map(&p.tma_v, kType, params.v, params.head_dim_v, kv_rows, params.num_heads_kv,
                                kv_batches, params.v_seq_stride, params.v_head_stride, v_batch_stride, kCols,
                                p.kv_box_rows) &&
        sm90::encode_tensor_map(&p.tma_o, kType, params.out, params.head_dim_v, q_rows, params.num_heads_q, q_batches,
                                params.out_seq_stride, params.out_head_stride, out_batch_stride, kCols,
                                Traits::kRowsPerConsumer);
    // The dispatcher falls back to the portable kernel.
    if (!encoded) return cudaErrorNotSupported;

    const bool capped = params.softcap_prescale != 0.f;
    const auto kernel = params.ragged ? (capped ? sm90::flash_fwd_sm90_kernel<Traits, Softcap, true>
                                                : sm90::flash_fwd_sm90_kernel<Traits, NoSoftcap, true>)
                                      : (capped ? sm90::flash_fwd_sm90_kernel<Traits, Softcap, false>
                                                : sm90::flash_fwd_sm90_kernel<Traits, NoSoftcap, false>);
    const cudaError_t err = launch_step(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Traits::kSmemBytes)), options,
        "cudaFuncSetAttribute (the kernel's dynamic shared memory)");
    if (err != cudaSuccess) return err;
    // Persistent: one CTA per SM at most, each walking its share of the
    // schedule.
    const int64_t num_items = sm90::PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(params).num_items(params);
    const int64_t num_ctas = num_items < options.max_persistent_ctas ? num_items : options.max_persistent_ctas;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(num_ctas));
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    return launch_step(cudaLaunchKernelEx(&config, kernel, p), options, "cudaLaunchKernelEx");
}

}  // namespace flashcore
