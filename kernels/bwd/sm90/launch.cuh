// Host-side launch of the Hopper backward pass: the portable path's
// preprocess, the sm90 main kernel with its TMA descriptors, and the
// portable path's convert kernel, which reads the dQ accumulator in the
// fragment order this kernel adds it in (config.cuh: the same
// DqAccumLayout). Included only by the generated sm_90a translation units
// (kernels/CMakeLists.txt from bwd/sm90/instantiation.cu.in).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "bwd/entry_points.h"
#include "bwd/passes.cuh"
#include "bwd/sm90/config.cuh"
#include "bwd/sm90/kernel.cuh"
#include "sm90/tensor_map.cuh"

namespace flashcore {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm90(size_t /*max_smem_per_block: one configuration*/) {
    static_assert(kHeadDim == kHeadDimV, "the sm90 backward has one head dim");
    using Traits = typename sm90::BwdSm90Config<kInput, kHeadDim>::Traits;
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN};
}

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm90(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
    static_assert(kInput == kOutput && kHeadDim == kHeadDimV && kVariant == BwdVariant::kHopper,
                  "the sm90 backward writes its input type, at one head dim (bwd/family.cmake)");
    using Traits = typename sm90::BwdSm90Config<kInput, kHeadDim>::Traits;
    const FwdKernelParams &f = params.fwd;
    sm90::BwdSm90Params p{};
    p.bwd = bwd_schedule_params<Traits>(params, options);
    // The maps' (seq, batch) extents: packed tensors are one batch of all
    // their rows (a packed map's batch stride is unused but must be one the
    // driver accepts).
    const bool packed_q = f.cu_seqlens_q != nullptr;
    const bool packed_kv = f.cu_seqlens_k != nullptr;
    const int q_rows = packed_q ? f.total_seqlen_q : f.seqlen_q;
    const int q_batches = packed_q ? 1 : f.batch_size;
    const int kv_rows = packed_kv ? f.total_seqlen_k : f.seqlen_k;
    const int kv_batches = packed_kv ? 1 : f.batch_size;
    using sm90::TensorRole;
    using sm90::tensor_geometry;
    using sm90::tensor_map;
    // Without query rows (dk and dv are zeros) the kernel reads no Q or dO,
    // and a map of no rows cannot be encoded.
    const bool encoded =
        (q_rows == 0 || tensor_map(&p.tma_q,
                   tensor_geometry(TensorRole::kQ, kInput, f.head_dim, q_rows, f.num_heads_q, q_batches,
                                   f.q_seq_stride, f.q_head_stride, packed_q ? f.q_seq_stride : f.q_batch_stride,
                                   Traits::kPanelCols, Traits::kBlockM),
                   f.q)) &&
        (q_rows == 0 || tensor_map(&p.tma_dout,
                   tensor_geometry(TensorRole::kDout, kInput, f.head_dim_v, q_rows, f.num_heads_q, q_batches,
                                   params.dout_seq_stride, params.dout_head_stride,
                                   packed_q ? params.dout_seq_stride : params.dout_batch_stride, Traits::kPanelCols,
                                   Traits::kBlockM),
                   params.dout)) &&
        tensor_map(&p.tma_k,
                   tensor_geometry(TensorRole::kK, kInput, f.head_dim, kv_rows, f.num_heads_kv, kv_batches,
                                   f.k_seq_stride, f.k_head_stride, packed_kv ? f.k_seq_stride : f.k_batch_stride,
                                   Traits::kPanelCols, Traits::kBlockN),
                   f.k) &&
        tensor_map(&p.tma_v,
                   tensor_geometry(TensorRole::kV, kInput, f.head_dim_v, kv_rows, f.num_heads_kv, kv_batches,
                                   f.v_seq_stride, f.v_head_stride, packed_kv ? f.v_seq_stride : f.v_batch_stride,
                                   Traits::kPanelCols, Traits::kBlockN),
                   f.v);
    // The dispatcher falls back to the portable kernel.
    if (!encoded) return cudaErrorNotSupported;

    return run_bwd_passes<Traits>(p.bwd, options, stream, sm90::flash_bwd_sm90_kernel<Traits>, p);
}

}  // namespace flashcore
