// The Hopper (sm_90a) fused attention forward kernel.
//
// The kernel is persistent (tile_scheduler.cuh): each CTA computes a
// sequence of query blocks of 64 rows per consumer warpgroup. It has one
// producer and two or three consumer warpgroups (config.cuh says how many
// per head dim and call):
//   warpgroup 0, the producer (producer.cuh): gives up most of its registers
//     (setmaxnreg) and has one thread issue the TMA copies of Q and of the
//     K/V tiles into a kStages-deep ring guarded by mbarriers (pipeline.cuh);
//     on e4m3 inputs its other warps transpose V for the fp8 P*V product
//     (v_transpose.cuh);
//   warpgroups 1.., the consumers (consumer.cuh): each owns 64 query
//     rows, takes the registers the producer gave up, and runs the mainloop
//     (mainloop.cuh: S = Q*K^T, online softmax, O += P*V on wgmma, the
//     softmax overlapped with the tensor cores) over each block's key tiles;
//     a finished block is normalised while the next block's first
//     S = Q*K^T runs, and its rows leave through the epilogue
//     (epilogue.cuh).
// Which key tiles a block visits, and which need masking, comes from its
// BlockKeyRange (common/key_range.cuh), last tile first, as in the portable
// kernel.
#pragma once

#include "fwd/sm90/consumer.cuh"
#include "fwd/sm90/pipeline.cuh"
#include "fwd/sm90/producer.cuh"
#include "fwd/sm90/traits.cuh"
#include "fwd/sm90/v_transpose.cuh"

namespace flashcore::sm90 {

// Cap: Softcap or NoSoftcap (common/softcap.cuh). Two kernels rather than a
// run-time choice: a branch on the softcap at each tile (both softmaxes
// inlined into the mainloop) made uncapped calls 2.5-5% slower, and one
// kernel holding both consumers, chosen once per CTA, spilled registers.
// kRagged: packed and paged tensors (common/params.h, fwd_batch_seqs),
// likewise a kernel of its own.
template <typename Traits, typename Cap, bool kRagged>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ Sm90KernelParams params) {
    // A split call's merge kernel may launch as soon as every CTA is running
    // (it waits for this grid's results itself): common/ptx.cuh.
    launch_dependent_grids();
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = aligned_smem_base(smem_raw);
    const Pipeline<Traits> pipe{smem};

    if (threadIdx.x == 0) pipe.init();
    __syncthreads();

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    if (warpgroup == 0) {
        setmaxnreg_decrease<Traits::kProducerRegisters>();
        const int warp = threadIdx.x / 32;
        if (warp == 0) {
            run_producer<Traits, kRagged>(params, pipe, threadIdx.x == 0);
        } else if constexpr (Traits::kFp8) {
            if (warp > 0) run_v_transpose<Traits>(params, pipe, warp - 1, threadIdx.x % 32);
        }
        return;
    }
    setmaxnreg_increase<Traits::kConsumerRegisters>();
    Consumer<Traits, Cap, kRagged>(params, pipe, warpgroup - 1, threadIdx.x % kWarpgroupThreads).run();
}

}  // namespace flashcore::sm90
