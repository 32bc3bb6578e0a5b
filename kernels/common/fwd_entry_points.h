// Entry points of the forward kernels: one explicit instantiation per line of
// kernels/fwd_variants.list and dtype, in a generated translation unit (see
// kernels/CMakeLists.txt). Host code reaches them through the generated
// table (src/kernel_registry.cpp), never by name.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/fwd_params.h"

namespace flashcore {

// Launch settings that are not kernel arguments.
struct FwdLaunchOptions {
    // A persistent kernel launches at most this many CTAs: one per SM, or
    // fewer where a test asks (FLASHCORE_PERSISTENT_CTAS).
    int max_persistent_ctas;
};

// What the dispatcher checks against the device before a launch.
struct FwdKernelInfo {
    size_t smem_bytes;  // dynamic shared memory of one CTA
    int block_m;        // query rows per block: blocks = batch * heads * ceil(seqlen_q / block_m)
};

// Blocks of block_m query rows in a forward call: one per (batch, query
// head, block). 64-bit: the dispatcher checks it against the grid limit.
inline int64_t fwd_num_blocks(int batch_size, int num_heads_q, int seqlen_q, int block_m) {
    return int64_t((seqlen_q + block_m - 1) / block_m) * num_heads_q * batch_size;
}

// Queues the forward kernel for `params` on `stream`. Returns the launch
// error (cudaSuccess when queued). `params` must already be validated, with
// head dims at most the kernel's.
template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm80(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm80();

// The sm_90a kernel. Returns cudaErrorNotSupported, having launched nothing,
// when the driver cannot describe a tensor to the TMA unit; the caller then
// uses the portable kernel.
template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kDType, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90();

}  // namespace flashcore
