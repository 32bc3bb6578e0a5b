// The portable (sm_80+) backward kernel: the shell every portable kernel is
// (sm80/kernel_shell.cuh) with the backward's parts: KeyBlockScheduler (a
// key block of a (batch, K/V head)), BwdMainloop (the query blocks that see
// it: dK, dV in registers, dQ into the fp32 accumulator) and BwdEpilogue
// (dK, dV to their tensors).
#pragma once

#include "bwd/params.h"
#include "bwd/sm80/config.cuh"
#include "bwd/sm80/epilogue.cuh"
#include "bwd/sm80/mainloop.cuh"
#include "bwd/sm80/scheduler.cuh"
#include "sm80/kernel_shell.cuh"

namespace flashcore {
namespace sm80 {

template <typename Traits>
using BwdKernel = KernelShell<BwdMainloop<Traits>, BwdEpilogue<Traits>, KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>>;

}  // namespace sm80

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) __maxnreg__(Traits::kMaxRegisters)
    flash_bwd_kernel(const __grid_constant__ BwdKernelParams p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    sm80::BwdKernel<Traits>::run(p, smem_raw);
}

}  // namespace flashcore
