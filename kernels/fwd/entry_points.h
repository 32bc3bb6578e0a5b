// Entry points of the forward kernels: one explicit instantiation per line of
// kernels/kernels.list and input type, in a generated translation unit (see
// kernels/CMakeLists.txt). Host code reaches them through the generated
// table (src/fwd/registry.cpp), never by name.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/launch_options.h"
#include "fwd/params.h"

namespace flashcore {

// The launch settings of every family (common/launch_options.h).
using FwdLaunchOptions = LaunchOptions;

// What the dispatcher checks against the device before a launch.
struct FwdKernelInfo {
    size_t smem_bytes;  // dynamic shared memory of one CTA
    int block_m;        // query rows per block: blocks = batch * heads * ceil(seqlen_q / block_m)
    // Keys a CTA consumes per step of its pipeline (a key tile, times the
    // warp groups that take tiles in turn): a split needs at least one.
    int keys_per_step;
    // CTAs an SM holds at once as far as registers and threads go (shared
    // memory, which depends on the GPU, is for the dispatcher to add).
    int ctas_per_sm;
    // Whether the variant has a kernel for ragged batches (packed or paged
    // tensors: FwdKernelParams::ragged).
    bool serves_ragged;
    // Whether the kernel stores O through TMA (the sm90 kernels up to head
    // dim 128): planning then checks that the driver can describe out too
    // (fwd/sm90/tensor_maps.h).
    bool stores_out_by_tma = false;
    // Whether the kernel reads V as the first head_dim_v columns of K's rows
    // (the wide kernel at MLA's 576 / 512): validation takes only calls
    // whose v is such a view of k (src/fwd/validate.cpp).
    bool v_in_k = false;
};

// Registers of one SM (every GPU from sm_80 on) and the granularity in
// which they are given to a thread.
constexpr int kRegistersPerSm = 64 * 1024;
constexpr int kRegisterAllocationUnit = 8;

constexpr int register_bound_ctas_per_sm(int threads, int max_registers) {
    return kRegistersPerSm /
           (threads * ((max_registers + kRegisterAllocationUnit - 1) / kRegisterAllocationUnit * kRegisterAllocationUnit));
}

// Blocks of block_m query rows in a forward call: one per (batch, head
// group, block), before any split of the keys. 64-bit: the dispatcher
// checks it against the grid limit.
// Computed in 128 bits from sizes that may each be up to 2^31 and saturated
// at INT64_MAX (the workspace query sees sizes no tensor was checked for).
inline int64_t fwd_num_blocks(const FwdKernelParams &p, int block_m) {
    const __int128 blocks = __int128((int64_t(p.seqlen_q) * p.packed_heads + block_m - 1) / block_m) *
                            (p.num_heads_q / p.packed_heads) * p.batch_size;
    return blocks > __int128(INT64_MAX) ? INT64_MAX : int64_t(blocks);
}

// Queues the forward kernel for `params` on `stream`. kInput: the element
// type of Q (and of K and V where kKV is the same); kKV: of K and V. Returns the launch
// error (cudaSuccess when queued). `params` must already be validated, with
// head dims at most the kernel's.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm80(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm80();

// The sm_90a kernel. Planning chooses it only for tensors the driver can
// describe to the TMA unit (fwd/sm90/tensor_maps.h); should the driver
// refuse one anyway, it returns cudaErrorNotSupported, having launched
// nothing.
template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90();

}  // namespace flashcore
