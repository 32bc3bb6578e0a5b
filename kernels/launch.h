// Entry points of the forward kernels, one explicit instantiation per
// (dtype, head_dim) in a generated translation unit (see kernels/CMakeLists.txt).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fwd_params.h"

namespace flashcore {

// Queues the forward kernel for `params` on `stream`. Returns the launch
// error (cudaSuccess when queued). `params` must already be validated.
template <DType kDType, int kHeadDim, FwdVariant kVariant>
cudaError_t run_flash_fwd(const FwdKernelParams &params, cudaStream_t stream);

// CTAs of a forward launch: one per (batch, query head, block of block_m
// query rows). 64-bit: the dispatcher checks it against the grid limit.
inline int64_t fwd_num_ctas(int batch_size, int num_heads_q, int seqlen_q, int block_m) {
    return int64_t((seqlen_q + block_m - 1) / block_m) * num_heads_q * batch_size;
}

// What the dispatcher checks against the device before a launch.
struct FwdKernelInfo {
    size_t smem_bytes;  // dynamic shared memory of one CTA
    int block_m;        // query rows per CTA: the grid is batch * heads * ceil(seqlen_q / block_m)
};

template <DType kDType, int kHeadDim, FwdVariant kVariant>
FwdKernelInfo flash_fwd_info();

// The Hopper kernel (kernels/hopper/), built for sm_90a when the build
// targets sm_90 (FLASHCORE_HAS_SM90). Returns cudaErrorNotSupported, having
// launched nothing, when the driver cannot describe a tensor to the TMA
// unit; the caller then uses the portable kernel.
template <DType kDType, int kHeadDim>
cudaError_t run_flash_fwd_sm90(const FwdKernelParams &params, cudaStream_t stream);

template <DType kDType, int kHeadDim>
FwdKernelInfo flash_fwd_sm90_info();

}  // namespace flashcore
