// The launches of a backward pass, in stream order, for either path's
// main kernel: the preprocess (row_kernels.cuh), the main kernel (a CTA per
// key block of each (batch, K/V head): scheduler.cuh), and the convert
// kernel (convert.cuh), which reads the dQ accumulator in the fragment order
// of Traits (both paths' main kernels add it in DqAccumLayout<Traits>) and
// sums each block's share of dsinks; with dsinks, a fourth sums the heads'.
// Host code of the generated translation units only.
#pragma once

#include <cuda_runtime.h>

#include "bwd/params.h"
#include "bwd/convert.cuh"
#include "bwd/row_kernels.cuh"
#include "bwd/scheduler.cuh"
#include "common/dynamic_smem.cuh"
#include "common/launch_options.h"

namespace flashcore {

// The rotated walk needs a head's key blocks on the GPU together: any of
// them may wait for any other (bwd/scheduler.cuh). CTAs are
// dispatched in grid order, so a call has at most one head part launched,
// and its launched key blocks may wait for the rest. It is taken where a
// head's key blocks number at most the SMs over this many calls, so that
// as many deterministic calls running at once (on several streams, or MPS
// clients) cannot hold every SM with such CTAs: each holds fewer than its
// share.
constexpr int kDeterministicCallsAtOnce = 2;

// Threads of the dsinks kernel's CTA (one a head), which sums a float per
// query block of the head.
constexpr int kDsinksThreads = 256;

// params with the schedule's flag (BwdKernelParams::rotated_walk) for
// Traits' blocks on the launch's GPU.
template <typename Traits>
BwdKernelParams bwd_schedule_params(const BwdKernelParams &params, const LaunchOptions &options) {
    BwdKernelParams scheduled = params;
    const FwdKernelParams &f = params.fwd;
    const int64_t key_blocks = sm80::bwd_num_key_blocks<Traits::kBlockN>(params);
    // Every query sees every key (causal is window_right 0).
    const bool every_key = fwd_sees_every_key(f);
    const int64_t walk_steps = int64_t(f.num_heads_q / f.num_heads_kv) * ceil_div(f.seqlen_q, Traits::kBlockM);
    scheduled.rotated_walk = Traits::kRotatedWalk && params.deterministic && every_key &&
                             key_blocks * kDeterministicCallsAtOnce <= options.max_persistent_ctas &&
                             walk_steps * key_blocks < (int64_t(1) << 31);
    return scheduled;
}

// `kernel` is the main kernel of Traits, launched with `kernel_params` (its
// own parameter block, which embeds `params`). Returns the first launch
// error; options.failed_call names the launch that failed.
template <typename Traits, typename KernelParams>
cudaError_t run_bwd_passes(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream,
                           void (*kernel)(KernelParams), const KernelParams &kernel_params) {
    using Element = typename Traits::Element;
    // The main kernel's shared-memory opt-in first: the preprocess writes
    // each query row's stats into dq (row_stats.cuh), and an opt-in that
    // failed after it would leave a failed call with dq written. What can
    // still fail after the first launch is a launch itself (a CUDA error,
    // which flashcore.h says may leave the outputs and workspace written).
    static DynamicSmemOptIn opt_in;
    cudaError_t err = ensure_opted_in(opt_in, kernel, Traits::kSmemBytes, options);
    if (err != cudaSuccess) return err;
    // With dsinks, the preprocess by query block leaves each block's share of
    // them, which the convert kernel carries and bwd_dsinks_kernel sums (0
    // for a call without query blocks).
    const int64_t query_blocks =
        bwd_query_blocks(params, Traits::kBlockM) * params.fwd.batch_size * params.fwd.num_heads_q;
    if (params.dsinks == nullptr) {
        const int rows_per_warp =
            kWarpSize / bwd_preprocess_lanes_per_row(params.fwd.head_dim_v, kElemsPerVector<Element>);
        err = launch_row_kernel(bwd_preprocess_kernel<Element>, params, rows_per_warp, options, stream,
                                "cudaLaunchKernelEx (the backward preprocess)");
    } else if (query_blocks > 0) {
        cudaLaunchConfig_t preprocess = {};
        preprocess.gridDim = dim3(unsigned(query_blocks));
        preprocess.blockDim = dim3(kRowKernelThreads);
        preprocess.stream = stream;
        err = launch_step(cudaLaunchKernelEx(&preprocess, bwd_preprocess_sinks_kernel<Element, Traits::kBlockM>, params),
                          options, "cudaLaunchKernelEx (the backward preprocess)");
    }
    if (err != cudaSuccess) return err;
    cudaLaunchConfig_t config = {};
    config.gridDim = sm80::KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>::grid(params);
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    err = launch_opted_in(opt_in, kernel, config, options, kernel_params);
    if (err != cudaSuccess) return err;
    // The convert kernel: a CTA per query block of each (batch, query head)
    // (dispatch.cpp keeps the count within the grid's limit).
    if (query_blocks > 0) {
        cudaLaunchConfig_t convert = {};
        convert.gridDim = dim3(unsigned(query_blocks));
        convert.blockDim = dim3(Traits::kNumThreads);
        convert.stream = stream;
        err = launch_step(cudaLaunchKernelEx(&convert, bwd_convert_kernel<Traits>, params), options,
                          "cudaLaunchKernelEx (the backward postprocess)");
    }
    if (err != cudaSuccess || params.dsinks == nullptr) return err;
    cudaLaunchConfig_t dsinks = {};
    dsinks.gridDim = dim3(unsigned(params.fwd.num_heads_q));
    dsinks.blockDim = dim3(kDsinksThreads);
    dsinks.stream = stream;
    return launch_step(cudaLaunchKernelEx(&dsinks, bwd_dsinks_kernel<Traits::kBlockM, kDsinksThreads>, params), options,
                       "cudaLaunchKernelEx (the backward's dsinks)");
}

}  // namespace flashcore
