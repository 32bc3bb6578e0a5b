// The portable (sm_80+) fused attention forward kernel, composed of parts as
// the Hopper one is (fwd/sm90/kernel.cuh).
//
// The shell is KernelShell (sm80/kernel_shell.cuh), as every portable
// kernel's.
//
// The forward parts: one CTA computes one block of kBlockM query rows of
// one (batch, head group), or with split-KV (p.num_splits > 1, blockIdx.y)
// its part of the block's keys, whose fp32 rows and LSE go to the workspace
// for the merge kernel. Q is loaded once; K/V tiles stream through rings in
// shared memory, the CTA's warp groups (FwdTraits::kKeySplits) taking them
// in turn; their partial softmax states are merged at the end
// (key_split.cuh), then O is normalised and written with its log-sum-exp.
// GQA-packed tiles (p.packed_heads > 1) gather Q's rows from several heads
// and scatter the results back.
//
// The parts are inlined into one function, and the order in which their
// values and arrays come into being shows in the kernel's code: O and the
// softmax state are run()'s locals, handed to the epilogue through finish,
// because as members of Mainloop (or declared in the shell) they change
// ptxas's register allocation; likewise bind() before the emptiness test.
// The kernel's SASS is the same as the single function's it replaced.
#pragma once

#include "common/ptx.cuh"
#include "common/params.h"
#include "fwd/sm80/epilogue.cuh"
#include "fwd/sm80/mainloop.cuh"
#include "fwd/sm80/scheduler.cuh"
#include "fwd/sm80/traits.cuh"
#include "fwd/sm80/wide_epilogue.cuh"
#include "fwd/sm80/wide_mainloop.cuh"
#include "sm80/kernel_shell.cuh"

#include <type_traits>

namespace flashcore {
namespace sm80 {

// The forward kernel's parts: the row-split ones (FwdTraits), or the
// column-split ones of the wide kernel (WideTraits).
template <typename Traits, bool kRagged>
using FwdKernel = std::conditional_t<
    Traits::kSplitsColumns,
    KernelShell<WideMainloop<Traits, kRagged>,
                WideEpilogue<Traits, BlockScheduler<Traits::kBlockM, Traits::kBlockN, kRagged>>,
                BlockScheduler<Traits::kBlockM, Traits::kBlockN, kRagged>>,
    KernelShell<Mainloop<Traits, kRagged>, Epilogue<Traits, BlockScheduler<Traits::kBlockM, Traits::kBlockN, kRagged>>,
                BlockScheduler<Traits::kBlockM, Traits::kBlockN, kRagged>>>;

}  // namespace sm80

// kRagged: packed and paged tensors (common/params.h, fwd_batch_seqs).
template <typename Traits, bool kRagged>
__global__ void __launch_bounds__(Traits::kNumThreads) __maxnreg__(Traits::kMaxRegisters)
    flash_fwd_kernel(const __grid_constant__ FwdKernelParams p) {
    // A split call's merge kernel may launch as soon as every CTA is running
    // (it waits for this grid's results itself): common/ptx.cuh.
    launch_dependent_grids();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    sm80::FwdKernel<Traits, kRagged>::run(p, smem_raw);
}

}  // namespace flashcore
