// The Hopper (sm_90a) backward kernel (config.cuh gives the products and
// the tiles). One CTA per key block of a (batch, K/V head), as the portable
// kernel's schedule (scheduler.cuh, bwd/scheduler.cuh: increasing key
// blocks, so that under a causal mask the longest work starts first;
// decreasing in the deterministic mode), in three warpgroups, which meet
// through the shared memory and barriers of pipeline.cuh:
//   warpgroup 0, the producer: gives up its registers (setmaxnreg); its
//     first warp loads K and V once, then for each step (a query block of
//     one query head of the group) Q and dO with TMA into a ring of
//     Traits::kStages stages (producer.cuh: bwd_load_tiles); its third and
//     fourth put the rows' lse and D = rowsum(dO * O) beside them
//     (bwd_load_row_stats); its second adds each step's dQ from shared
//     memory to the fp32 workspace with a bulk reduction (dq_writer.cuh:
//     bwd_write_dq).
//   warpgroups 1 and 2, the consumers, in one of config.cuh's forms
//     (consumer.cuh: 64 keys each; column_split.cuh: half the head-dim
//     columns each; transposed_split.cuh: 48 keys each, dK and dV
//     transposed): the products of config.cuh per step (mainloop.cuh), dK
//     and dV in registers across the steps, dQ into shared memory for the
//     writer, and at the end dK (times grad_scale) and dV to their tensors,
//     staged through shared memory.
#pragma once

#include <new>
#include <type_traits>

#include "bwd/sm90/column_split.cuh"
#include "bwd/sm90/config.cuh"
#include "bwd/sm90/consumer.cuh"
#include "bwd/sm90/dq_writer.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/producer.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "bwd/sm90/transposed_split.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdSm90Params params) {
    extern __shared__ unsigned char smem_raw[];
    // The swizzles repeat every 1024-byte atom; TMA and wgmma assume tiles
    // aligned to it (kSmemBytes includes the slack). Aligned by an offset
    // from smem_raw, not through an integer, so that the compiler still
    // knows the pointers derived from it are shared: the row stats and dQ
    // are then read and written with LDS/STS, where generic loads and stores
    // waited on the long scoreboard (ncu: a third of the consumers' stalls).
    const uint32_t misalignment = smem_address(smem_raw) % kSmemBaseAlignment;
    unsigned char *smem = smem_raw + (misalignment == 0 ? 0 : kSmemBaseAlignment - misalignment);
    const BwdSmem<Traits> sm{smem};
    // The CTA's work, worked out once into shared memory: the producer
    // warps read its fields where they use them (in their 24 registers
    // they could not hold it all), the consumers copy it.
    // Raw storage, constructed by thread 0: Work's members have default
    // initializers (KeyMask::chunk), which a __shared__ variable cannot run
    // (nvcc warning 20054).
    using Scheduler = sm80::KeyBlockScheduler<Traits::kBlockM, Traits::kBlockN>;
    using Work = typename Scheduler::Work;
    __shared__ alignas(Work) unsigned char shared_work_bytes[sizeof(Work)];
    static_assert(sizeof(Work) <= Traits::kStaticSmemBytes, "config.cuh's budget for static shared memory");
    static_assert(std::is_trivially_copyable_v<Work> && std::is_trivially_destructible_v<Work>,
                  "a Work lives in raw shared memory and is copied out of it");
    Work &shared_work = *reinterpret_cast<Work *>(shared_work_bytes);
    if (threadIdx.x == 0) {
        sm.init();
        new (shared_work_bytes) Work(Scheduler::work(params.bwd));
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    if (warpgroup == 0) {
        setmaxnreg_decrease<Traits::kProducerRegisters>();
        const auto &work = shared_work;
        if (!bwd_has_work(work)) return;
        const int warp = threadIdx.x / kWarpSize;
        const int lane = threadIdx.x % kWarpSize;
        if (warp == 0) {
            bwd_load_tiles<Traits>(params, sm, work, lane);
        } else if (warp == 1) {
            bwd_write_dq<Traits>(params.bwd, sm, work, lane);
        } else if (warp == 2) {
            bwd_load_row_stats<Traits, false>(params.bwd, sm, work, lane);
        } else {
            bwd_load_row_stats<Traits, true>(params.bwd, sm, work, lane);
        }
        return;
    }
    setmaxnreg_increase<Traits::kConsumerRegisters>();
    const auto work = shared_work;
    const bool has_work = bwd_has_work(work);
    const int consumer_tid = threadIdx.x - kWarpgroupThreads;
    // (The branch on a warp-uniform value: in code under a condition that
    // ptxas cannot tell is the warp's, it kept the wgmma operands' addresses
    // in vector registers: warp_uniform.)
    if constexpr (Traits::kForm != BwdSm90Form::kKeySplit) {
        using Consumer = std::conditional_t<Traits::kColumnSplit, BwdColumnSplitConsumer<Traits>,
                                            BwdTransposedConsumer<Traits>>;
        Consumer consumer(params, sm, warp_uniform(warpgroup) - 1, consumer_tid);
        if (has_work) consumer.run(work);
        consumer.store_key_gradients(work, consumer_tid, has_work);
    } else if (Traits::kDqConsumers == Traits::kConsumerWarpgroups || warp_uniform(warpgroup) == 1) {
        BwdConsumer<Traits> consumer(params, sm, warpgroup - 1, consumer_tid);
        if (has_work) consumer.run(work);
        consumer.store_key_gradients(work, consumer_tid, has_work);
    } else {
        // Head dim 96: the second consumer leaves dQ to the first.
        BwdConsumer<Traits, false> consumer(params, sm, warpgroup - 1, consumer_tid);
        if (has_work) consumer.run(work);
        consumer.store_key_gradients(work, consumer_tid, has_work);
    }
}

}  // namespace flashcore::sm90
