// The Hopper (sm_90a) fused attention forward kernel.
//
// The kernel is persistent (sm90_tile_scheduler.cuh): each CTA computes a
// sequence of 128-row query blocks. It has three warpgroups:
//   warpgroup 0, the producer: gives up most of its registers (setmaxnreg)
//     and has one thread issue the TMA copies of Q and of the K/V tiles into
//     a kStages-deep ring guarded by mbarriers (sm90_pipeline.cuh);
//   warpgroups 1 and 2, the consumers: each owns 64 query rows, takes the
//     registers the producer gave up, and per K/V tile runs
//     S = Q*K^T (wgmma) -> mask (boundary tiles only) -> online softmax
//     -> O += P*V (wgmma, P from registers), releasing K and V as soon as
//     their GEMM is done.
//     The two GEMMs of neighbouring tiles overlap the softmax: while the
//     tensor cores compute S_j and then O += P_{j-1} V_{j-1}, the warpgroup
//     waits only for S_j and exponentiates it; it waits for the P*V product
//     only to rescale O and to reuse P's registers. Finished rows leave
//     through shared memory and a TMA store (sm90_epilogue.cuh) that drains
//     while the next block starts.
// Tiles are visited last to first, as in the portable kernel, so the tiles
// that need masking (partial last tile, causal diagonal) come first.
#pragma once

#include "mask.cuh"
#include "softmax.cuh"
#include "sm90_epilogue.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_pipeline.cuh"
#include "sm90_producer.cuh"
#include "sm90_tile_scheduler.cuh"
#include "sm90_traits.cuh"
#include "tile_scheduler.cuh"

namespace flashcore::sm90 {

// One query block: the consumer's 64 rows of it. kv_base: K/V tiles the CTA
// consumed before this block (the ring's stage and phase); q_count: query
// blocks it computed before (the Q buffer and phase).
template <typename Traits>
__device__ __forceinline__ void consume_block(const Sm90KernelParams &params, const Pipeline<Traits> &pipe,
                                              const FwdTile &tile, int num_n_blocks, uint32_t kv_base,
                                              uint32_t q_count, int consumer, int wg_tid) {
    const FwdKernelParams &p = params.fwd;
    constexpr int kNAtomsS = Traits::kBlockN / 8;
    constexpr int kNAtomsO = Traits::kHeadDim / 8;
    const int lane = wg_tid % 32;
    const int warp_first_row = consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * 16;
    const int first_query = tile.m_block * Traits::kBlockM;
    const int shift = causal_shift(p);

    const int q_buffer = Pipeline<Traits>::q_buffer_of(q_count);
    const uint32_t q_rows =
        smem_address(pipe.q_tile(q_buffer)) + consumer * Traits::kRowsPerConsumer * kPanelRowBytes;

    float acc_o[1][kNAtomsO][4];
#pragma unroll
    for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][n][e] = 0.f;
    }
    OnlineSoftmax<1> softmax;
    softmax.init();

    // Tile j's probabilities, straight from its scores into P fragments
    // (masked on boundary tiles). The scores are only read: writing them in
    // place makes ptxas wait for every wgmma in flight first, which would
    // serialise this with the P*V product of the previous tile. Returns
    // whether O must be rescaled by `correction`.
    using Fragments = uint32_t[Traits::kBlockN / 16][4];
    const auto softmax_to_fragments = [&](const float (&scores)[1][kNAtomsS][4], int j, float (&correction)[2],
                                          Fragments &frag) {
        const int n_block = num_n_blocks - 1 - j;
        float pending = 0.f;
        const auto sink = [&](int, int n, int e, float prob) {
            if (e % 2 == 0) {
                pending = prob;
            } else {
                frag[n / 2][(n % 2) * 2 + e / 2] = pack2<typename Traits::Element>(pending, prob);
            }
        };
        if (tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(tile.m_block, n_block, p.seqlen_k, p.causal, shift)) {
            const int row = first_query + warp_first_row + frag_row(lane);
            const int first_col = n_block * Traits::kBlockN + frag_col(lane);
            const int visible_end[2] = {visible_key_end(row, p.seqlen_k, p.causal, shift),
                                        visible_key_end(row + kFragRowHalf, p.seqlen_k, p.causal, shift)};
            return softmax.update_scores_into(
                scores, p.softmax_scale_log2, correction,
                [&](int, int n, int e) { return first_col + n * kMmaN + e % 2 < visible_end[e / 2]; }, sink);
        }
        return softmax.update_scores_into(
            scores, p.softmax_scale_log2, correction, [](int, int, int) { return true; }, sink);
    };
    // This warp has read tile j's K (V): the wgmmas reading it completed.
    const auto release_k = [&](int j) {
        if (lane == 0) mbarrier_arrive(pipe.k_empty(Pipeline<Traits>::stage_of(kv_base + j)));
    };
    const auto release_v = [&](int j) {
        if (lane == 0) mbarrier_arrive(pipe.v_empty(Pipeline<Traits>::stage_of(kv_base + j)));
    };
    // This warp's last S = Q*K^T of the block completed: a later block's Q
    // may overwrite this one.
    const auto release_q = [&] {
        if (lane == 0) mbarrier_arrive(pipe.q_empty(q_buffer));
    };

    float scores[1][kNAtomsS][4];
    // P of consecutive tiles alternates between two register sets: tile
    // j - 1's feeds the P*V wgmma while tile j's is computed.
    Fragments p_frag[2];
    float correction[2];

    mbarrier_wait(pipe.q_full(q_buffer), Pipeline<Traits>::q_phase_of(q_count));
    const int first_stage = Pipeline<Traits>::stage_of(kv_base);
    mbarrier_wait(pipe.k_full(first_stage), Pipeline<Traits>::phase_of(kv_base));
    issue_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(first_stage)));
    wgmma_wait<0>();
    fence_accumulators(scores[0]);
    release_k(0);
    if (num_n_blocks == 1) release_q();
    softmax_to_fragments(scores, 0, correction, p_frag[0]);  // O is still zero: nothing to rescale

    // One step: S_j = Q K_j^T and O += P_{j-1} V_{j-1} on the tensor cores
    // while P_j is computed from S_j.
    const auto step = [&](int j, Fragments &p_prev, Fragments &p_next) {
        const int stage = Pipeline<Traits>::stage_of(kv_base + j);
        const int prev_stage = Pipeline<Traits>::stage_of(kv_base + j - 1);
        mbarrier_wait(pipe.k_full(stage), Pipeline<Traits>::phase_of(kv_base + j));
        issue_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(stage)));
        mbarrier_wait(pipe.v_full(prev_stage), Pipeline<Traits>::phase_of(kv_base + j - 1));
        issue_pv<Traits>(acc_o[0], p_prev, smem_address(pipe.v_tile(prev_stage)));

        wgmma_wait<1>();  // S_j is done; P_{j-1} * V_{j-1} may still run
        fence_accumulators(scores[0]);
        release_k(j);
        if (j == num_n_blocks - 1) release_q();
        const bool rescale = softmax_to_fragments(scores, j, correction, p_next);

        wgmma_wait<0>();
        fence_accumulators(acc_o[0]);
        release_v(j - 1);
        if (rescale) softmax.rescale(acc_o, correction);
    };
    int j = 1;
    for (; j + 1 < num_n_blocks; j += 2) {
        step(j, p_frag[0], p_frag[1]);
        step(j + 1, p_frag[1], p_frag[0]);
    }
    if (j < num_n_blocks) step(j, p_frag[0], p_frag[1]);
    // The last tile's P is in set (num_n_blocks - 1) % 2.
    const int last = num_n_blocks - 1;
    const int last_stage = Pipeline<Traits>::stage_of(kv_base + last);
    mbarrier_wait(pipe.v_full(last_stage), Pipeline<Traits>::phase_of(kv_base + last));
    if (last % 2 == 0) {
        issue_pv<Traits>(acc_o[0], p_frag[0], smem_address(pipe.v_tile(last_stage)));
    } else {
        issue_pv<Traits>(acc_o[0], p_frag[1], smem_address(pipe.v_tile(last_stage)));
    }
    wgmma_wait<0>();
    fence_accumulators(acc_o[0]);
    release_v(last);

    float row_lse[2];
    softmax.finalize(acc_o, p.softmax_scale, row_lse);
    store_rows<Traits>(params, tile, pipe.o_staging(consumer), consumer, acc_o[0], row_lse, wg_tid);
}

// A consumer warpgroup walks the CTA's schedule, in step with the producer.
template <typename Traits>
__device__ __forceinline__ void run_consumer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe,
                                             int consumer, int wg_tid) {
    const FwdKernelParams &p = params.fwd;
    uint32_t kv_count = 0;  // K/V tiles consumed so far
    uint32_t q_count = 0;   // query blocks with keys computed so far
    PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(p).for_each_block(
        p, [&](const FwdTile &tile, int num_n_blocks) {
            if (num_n_blocks <= 0) {
                store_empty_block<typename Traits::Element, Traits::kHeadDim>(
                    OutputBlock<typename Traits::Element>::of(p, tile, Traits::kBlockM), p.out_seq_stride,
                    consumer * kWarpgroupThreads + wg_tid, Traits::kConsumerWarpgroups * kWarpgroupThreads);
                return;
            }
            consume_block<Traits>(params, pipe, tile, num_n_blocks, kv_count, q_count, consumer, wg_tid);
            kv_count += num_n_blocks;
            ++q_count;
        });
    // The staging buffers live in this CTA's shared memory: the last stores
    // must be done with them before the CTA exits.
    if (wg_tid == 0) bulk_wait_group_all();
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ Sm90KernelParams params) {
    extern __shared__ unsigned char smem_raw[];
    // The 128-byte swizzle repeats every 1024 bytes; TMA and wgmma assume
    // tiles aligned to that (kSmemBytes includes the slack).
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));
    const Pipeline<Traits> pipe{smem};

    if (threadIdx.x == 0) pipe.init();
    __syncthreads();

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    if (warpgroup == 0) {
        setmaxnreg_decrease<Traits::kProducerRegisters>();
        if (threadIdx.x == 0) run_producer<Traits>(params, pipe);
        return;
    }
    setmaxnreg_increase<Traits::kConsumerRegisters>();
    run_consumer<Traits>(params, pipe, warpgroup - 1, threadIdx.x % kWarpgroupThreads);
}

}  // namespace flashcore::sm90
