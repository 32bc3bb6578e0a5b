// Entry points of the forward kernels: one explicit instantiation per line of
// kernels/fwd_variants.list and dtype, in a generated translation unit (see
// kernels/CMakeLists.txt). Host code reaches them through the generated
// table (src/kernel_registry.cpp), never by name.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fwd/params.h"

namespace flashcore {

// Launch settings that are not kernel arguments.
struct FwdLaunchOptions {
    // A persistent kernel launches at most this many CTAs: one per SM, or
    // fewer where a test asks (FLASHCORE_PERSISTENT_CTAS).
    int max_persistent_ctas;
    // Where a launcher names the runtime call that failed (when not null;
    // written only on failure), for the caller's message.
    const char **failed_call = nullptr;
    // Where a persistent kernel's count of K/V tiles starts: 0, or where a
    // test asks (FLASHCORE_TEST_KV_POSITION) to cross 2^32 within one call.
    uint64_t first_kv_position = 0;
    // The device the launch is on (current while it runs): what a kernel's
    // shared-memory opt-in is remembered for (dynamic_smem.cuh). -1: unknown,
    // opted in on every launch.
    int device = -1;
};

// A launcher's runtime call `call` returned `err`: on failure, the error is
// cleared from the thread's last-error state (it is reported once, through
// the return value) and the call named in options.failed_call.
inline cudaError_t launch_step(cudaError_t err, const FwdLaunchOptions &options, const char *call) {
    if (err != cudaSuccess) {
        cudaGetLastError();
        if (options.failed_call != nullptr) *options.failed_call = call;
    }
    return err;
}

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

// Queues the forward kernel for `params` on `stream`. Returns the launch
// error (cudaSuccess when queued). `params` must already be validated, with
// head dims at most the kernel's.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm80(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm80();

// The sm_90a kernel. Returns cudaErrorNotSupported, having launched nothing,
// when the driver cannot describe a tensor to the TMA unit; the caller then
// uses the portable kernel.
template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
cudaError_t run_fwd_sm90(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream);

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, FwdVariant kVariant>
FwdKernelInfo fwd_info_sm90();

}  // namespace flashcore
