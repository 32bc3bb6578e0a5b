// The Hopper (sm_90a) fused attention forward kernel.
//
// One CTA computes kBlockM = 128 query rows of one (batch, head) with three
// warpgroups:
//   warpgroup 0, the producer: gives up most of its registers (setmaxnreg)
//     and has one thread issue the TMA copies of Q and of the K/V tiles into
//     a kStages-deep ring guarded by mbarriers (sm90_pipeline.cuh);
//   warpgroups 1 and 2, the consumers: each owns 64 query rows, takes the
//     registers the producer gave up, and per K/V tile runs
//     S = Q*K^T (wgmma) -> mask (boundary tiles only) -> online softmax
//     -> O += P*V (wgmma, P from registers), then releases the stage.
// Tiles are visited last to first, as in the portable kernel, so the tiles
// that need masking (partial last tile, causal diagonal) come first.
#pragma once

#include "mask.cuh"
#include "softmax.cuh"
#include "sm90_epilogue.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_pipeline.cuh"
#include "sm90_producer.cuh"
#include "sm90_traits.cuh"
#include "tile_scheduler.cuh"

namespace flashcore::sm90 {

template <typename Traits>
__device__ __forceinline__ void run_consumer(const FwdKernelParams &p, const Pipeline<Traits> &pipe,
                                             const FwdTile &tile, int num_n_blocks, int consumer, int wg_tid) {
    constexpr int kNAtomsS = Traits::kBlockN / 8;
    constexpr int kNAtomsO = Traits::kHeadDim / 8;
    const int lane = wg_tid % 32;
    const int warp_first_row = consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * 16;
    const int first_query = tile.m_block * Traits::kBlockM;
    const int shift = causal_shift(p);

    const uint32_t q_rows = smem_address(pipe.q_tile()) + consumer * Traits::kRowsPerConsumer * kPanelRowBytes;

    float acc_o[1][kNAtomsO][4];
#pragma unroll
    for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][n][e] = 0.f;
    }
    OnlineSoftmax<1> softmax;
    softmax.init();

    mbarrier_wait(pipe.q_full(), 0);
    for (int j = 0; j < num_n_blocks; ++j) {
        const int stage = Pipeline<Traits>::stage_of(j);
        const uint32_t phase = Pipeline<Traits>::phase_of(j);
        const int n_block = num_n_blocks - 1 - j;

        float scores[1][kNAtomsS][4];
        mbarrier_wait(pipe.k_full(stage), phase);
        gemm_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(stage)));
        if (tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(tile.m_block, n_block, p.seqlen_k, p.causal, shift)) {
            apply_mask(scores, first_query + warp_first_row, n_block * Traits::kBlockN, p.seqlen_k, p.causal, shift,
                       lane);
        }
        softmax.update(scores, acc_o, p.softmax_scale_log2);
        uint32_t p_frag[Traits::kBlockN / 16][4];
        probabilities_to_fragments<Traits>(scores[0], p_frag);

        mbarrier_wait(pipe.v_full(stage), phase);
        gemm_pv<Traits>(acc_o[0], p_frag, smem_address(pipe.v_tile(stage)));
        // This warp has read K and V of the stage (its wgmmas completed).
        if (lane == 0) mbarrier_arrive(pipe.kv_empty(stage));
    }

    float row_lse[2];
    softmax.finalize(acc_o, p.softmax_scale, row_lse);
    store_rows<typename Traits::Element, kNAtomsO>(p, tile, acc_o[0], row_lse, first_query + warp_first_row, lane);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) flash_fwd_sm90_kernel(const __grid_constant__ Sm90KernelParams params) {
    const FwdKernelParams &p = params.fwd;
    extern __shared__ unsigned char smem_raw[];
    // The 128-byte swizzle repeats every 1024 bytes; TMA and wgmma assume
    // tiles aligned to that (kSmemBytes includes the slack).
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));
    const Pipeline<Traits> pipe{smem};

    const FwdTile tile = fwd_tile_for_block<Traits::kBlockM>(p, blockIdx.x);
    const int num_n_blocks = fwd_num_n_blocks<Traits::kBlockM, Traits::kBlockN>(p, tile.m_block);
    if (num_n_blocks <= 0) {
        store_empty_rows<typename Traits::Element, Traits::kHeadDim>(p, tile, Traits::kBlockM, threadIdx.x,
                                                                    Traits::kNumThreads);
        return;
    }

    if (threadIdx.x == 0) pipe.init();
    __syncthreads();

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    if (warpgroup == 0) {
        setmaxnreg_decrease<Traits::kProducerRegisters>();
        if (threadIdx.x == 0) run_producer<Traits>(params, pipe, tile, num_n_blocks);
        return;
    }
    setmaxnreg_increase<Traits::kConsumerRegisters>();
    run_consumer<Traits>(p, pipe, tile, num_n_blocks, warpgroup - 1, threadIdx.x % kWarpgroupThreads);
}

}  // namespace flashcore::sm90
