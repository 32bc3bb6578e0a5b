// The portable (sm_80+) backward kernel: the shell every portable kernel is
// (sm80/kernel_shell.cuh) with the backward's parts: KeyBlockScheduler (a
// key block of a (batch, K/V head)), BwdMainloop (the query blocks that see
// it: dK, dV in registers, dQ into the fp32 accumulator) and BwdEpilogue
// (dK, dV to their tensors).
#pragma once

#include <cstddef>

#include "bwd/params.h"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/epilogue.cuh"
#include "bwd/sm80/mainloop.cuh"
#include "bwd/scheduler.cuh"
#include "sm80/kernel_shell.cuh"

namespace flashcore {

// The dynamic shared memory an sm_80 block may opt in to (an A100's).
constexpr size_t kSm80MaxSmemPerBlock = 163 * 1024;

namespace sm80 {

template <typename Traits>
using BwdKernel = KernelShell<BwdMainloop<Traits>, BwdEpilogue<Traits>, KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>>;

}  // namespace sm80

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) __maxnreg__(Traits::kMaxRegisters)
    flash_bwd_kernel(const __grid_constant__ BwdKernelParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // A configuration sm_80 cannot launch (run_bwd_sm80 picks it by the
    // device's limit) gets no machine code there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
    constexpr bool kLaunchable = Traits::kSmemBytes <= kSm80MaxSmemPerBlock;
#else
    constexpr bool kLaunchable = true;
#endif
    if constexpr (kLaunchable) sm80::BwdKernel<Traits>::run(p, smem_raw);
}

}  // namespace flashcore
