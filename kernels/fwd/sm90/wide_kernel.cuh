// The sm_90a wide kernel: head dims past 256 (d512; MLA's latent cache, 576
// / 512) on wgmma, in the portable kernels' shell (sm80/kernel_shell.cuh: one
// CTA per query block and split-KV part, BlockScheduler's grid), with its
// own mainloop (wide_mainloop.cuh) and epilogue (wide_epilogue.cuh). Built
// for ragged batches only, which serves dense calls too (one kernel, not
// two: a decode's time is the cache's read).
#pragma once

#include <cuda_runtime.h>

#include "common/dynamic_smem.cuh"
#include "common/ptx.cuh"
#include "fwd/entry_points.h"
#include "fwd/sm80/scheduler.cuh"
#include "fwd/sm90/wide_epilogue.cuh"
#include "fwd/sm90/wide_mainloop.cuh"
#include "fwd/sm90/wide_traits.cuh"
#include "sm80/kernel_shell.cuh"

namespace flashcore::sm90 {

template <typename Traits>
using WideScheduler = sm80::BlockScheduler<Traits::kBlockM, Traits::kBlockN, /*kRagged=*/true>;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_sm90_wide_kernel(const __grid_constant__ FwdKernelParams p) {
    // A split call's merge kernel may launch as soon as every CTA is running
    // (it waits for this grid's results itself): common/ptx.cuh.
    launch_dependent_grids();
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = aligned_smem_base(smem_raw);
    sm80::KernelShell<WideMainloop<Traits, true>, WideEpilogue<Traits, WideScheduler<Traits>>,
                      WideScheduler<Traits>>::run(p, smem);
}

template <DType kInput, DType kKV, DType kOutput, int kHeadDim, int kHeadDimV>
using WideTraitsOf = Sm90WideTraits<ElementType<kInput>, ElementType<kOutput>, kHeadDim, kHeadDimV, ElementType<kKV>>;

// What the dispatcher plans by: 64-row blocks, a pair of key tiles a step,
// one CTA an SM (its shared memory), a kernel for ragged batches.
template <typename Traits>
FwdKernelInfo wide_info() {
    FwdKernelInfo info{Traits::kSmemBytes, Traits::kBlockM, Traits::kPairKeys, 1, true};
    info.v_in_k = Traits::kVInK;
    return info;
}

template <typename Traits>
cudaError_t run_wide(const FwdKernelParams &params, const FwdLaunchOptions &options, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = WideScheduler<Traits>::grid(params);
    config.blockDim = dim3(Traits::kNumThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    static DynamicSmemOptIn opt_in;
    return launch_opted_in(opt_in, flash_fwd_sm90_wide_kernel<Traits>, config, options, params);
}

}  // namespace flashcore::sm90
