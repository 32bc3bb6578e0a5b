// Entry points of the backward kernels: one explicit instantiation per line
// of kernels/kernels.list and input type, in a generated translation unit
// (kernels/CMakeLists.txt). Host code reaches them through the generated
// table (src/bwd/registry.cpp), never by name.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "bwd/params.h"
#include "common/launch_options.h"

namespace flashcore {

// What the dispatcher checks against the device before a launch.
struct BwdKernelInfo {
    size_t smem_bytes;  // dynamic shared memory of one CTA of the main kernel
    int block_m;        // query rows per step of the main kernel
    int block_n;        // keys per CTA of the main kernel
};

// Queues the whole backward pass for validated `params` on `stream`: the
// preprocess (row sums D = rowsum(dO * O) into dq's scratch words, the dQ
// accumulator and the deterministic counters zeroed), the main kernel, and
// the postprocess (dq = grad_scale * dq_accum in the input type). Launches
// nothing for the first and last where there are no query rows. Returns the
// first launch error (cudaSuccess when all are queued); options.failed_call
// names the launch that failed.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm80(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream);

// The info of the configuration a device that lets a block opt in to
// max_smem_per_block bytes of shared memory runs (LaunchOptions::
// max_smem_per_block picks the same one); where none fits, the smallest,
// whose smem_bytes the dispatcher then refuses.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm80(size_t max_smem_per_block);

// The same on the sm_90a kernel (bwd/sm90/). Planning chooses it only for
// tensors the driver can describe to the TMA unit (bwd/sm90/tensor_maps.h);
// should the driver refuse one anyway, it returns cudaErrorNotSupported,
// launching nothing.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm90(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream);

// (It has one configuration, whatever the limit.)
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm90(size_t max_smem_per_block);

}  // namespace flashcore
