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
//     only to rescale O and to reuse P's registers. A finished block is
//     normalised while the next block's first S = Q*K^T runs
//     (run_consumer), and its rows leave through shared memory and a TMA
//     store (sm90_epilogue.cuh) that drains while the next block computes.
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

// A consumer warpgroup walks the CTA's schedule, in step with the producer,
// computing its 64 rows of each query block.
//
// Neighbouring blocks overlap: block t's last O += P*V is issued, then
// block t + 1's S_0 = Q*K_0^T (its Q and first K tile were loaded ahead),
// and block t is normalised and stored while S_0 runs. (Issuing S_0 first,
// so that block t + 1's first softmax would overlap the P*V product, was
// slower: block t then cannot finish before block t + 1's first K lands.)
template <typename Traits>
__device__ __forceinline__ void run_consumer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe,
                                             int consumer, int wg_tid) {
    using Element = typename Traits::Element;
    using Fragments = uint32_t[Traits::kBlockN / 16][4];
    constexpr int kNAtomsS = Traits::kBlockN / 8;
    constexpr int kNAtomsO = Traits::kHeadDim / 8;
    const FwdKernelParams &p = params.fwd;
    const int lane = wg_tid % 32;
    const int warp_first_row = consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * 16;
    const int shift = causal_shift(p);

    float acc_o[1][kNAtomsO][4];
    OnlineSoftmax<1> softmax;
    float scores[1][kNAtomsS][4];
    // P of consecutive tiles alternates between two register sets: tile
    // j - 1's feeds the P*V wgmma while tile j's is computed.
    Fragments p_frag[2];
    float correction[2];

    // Tile j of a block (visited last key tile first): its probabilities,
    // straight from its scores into P fragments (masked on boundary tiles).
    // The scores are only read: writing them in place makes ptxas wait for
    // every wgmma in flight first, which would serialise this with the P*V
    // product of the previous tile. Returns whether O must be rescaled by
    // `correction`.
    const auto softmax_to_fragments = [&](const FwdTile &tile, int num_n_blocks, int j, Fragments &frag) {
        const int n_block = num_n_blocks - 1 - j;
        float pending = 0.f;
        const auto sink = [&](int, int n, int e, float prob) {
            if (e % 2 == 0) {
                pending = prob;
            } else {
                frag[n / 2][(n % 2) * 2 + e / 2] = pack2<Element>(pending, prob);
            }
        };
        if (tile_needs_mask<Traits::kBlockM, Traits::kBlockN>(tile.m_block, n_block, p.seqlen_k, p.causal, shift)) {
            const int row = tile.m_block * Traits::kBlockM + warp_first_row + frag_row(lane);
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
    // This warp has read K/V tile `kv` (counted over the CTA): the wgmmas
    // reading it completed.
    const auto release_k = [&](uint32_t kv) {
        if (lane == 0) mbarrier_arrive(pipe.k_empty(Pipeline<Traits>::stage_of(kv)));
    };
    const auto release_v = [&](uint32_t kv) {
        if (lane == 0) mbarrier_arrive(pipe.v_empty(Pipeline<Traits>::stage_of(kv)));
    };
    // This warp's last S = Q*K^T of a block completed: a later block's Q may
    // overwrite that buffer.
    const auto release_q = [&](int q_buffer) {
        if (lane == 0) mbarrier_arrive(pipe.q_empty(q_buffer));
    };

    // The block whose last P*V product is still to be issued. Its last
    // probabilities are always in p_frag[1], so that product has one issue
    // site whatever the block's tile count (a branch between two issue
    // sites makes ptxas serialise the wgmmas).
    bool pending = false;
    FwdTile pending_tile{};
    uint32_t pending_last_kv = 0;  // its last K/V tile
    const auto issue_pending_pv = [&] {
        const int stage = Pipeline<Traits>::stage_of(pending_last_kv);
        mbarrier_wait(pipe.v_full(stage), Pipeline<Traits>::phase_of(pending_last_kv));
        issue_pv<Traits>(acc_o[0], p_frag[1], smem_address(pipe.v_tile(stage)));
    };
    // After its last P*V product completed: normalise and store the pending
    // block, whose softmax state is `state`.
    const auto finish_pending = [&](OnlineSoftmax<1> &state) {
        fence_accumulators(acc_o[0]);
        release_v(pending_last_kv);
        float row_lse[2];
        state.finalize(acc_o, p.softmax_scale, row_lse);
        store_rows<Traits>(params, pending_tile, pipe.o_staging(consumer), consumer, acc_o[0], row_lse, wg_tid);
    };

    uint32_t kv_count = 0;  // K/V tiles consumed so far
    uint32_t q_count = 0;   // query blocks with keys computed so far
    PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(p).for_each_block(p, [&](const FwdTile &tile,
                                                                                    int num_n_blocks) {
        if (num_n_blocks <= 0) {
            store_empty_block<Element, Traits::kHeadDim>(OutputBlock<Element>::of(p, tile, Traits::kBlockM),
                                                         p.out_seq_stride, consumer * kWarpgroupThreads + wg_tid,
                                                         Traits::kConsumerWarpgroups * kWarpgroupThreads);
            return;
        }
        const uint32_t kv_base = kv_count;
        const int q_buffer = Pipeline<Traits>::q_buffer_of(q_count);
        const uint32_t q_rows =
            smem_address(pipe.q_tile(q_buffer)) + consumer * Traits::kRowsPerConsumer * kPanelRowBytes;

        // The pending block's last P*V product, then S_0 of this one: the
        // pending block is normalised and stored while S_0 runs. Without a
        // pending block an empty group takes the product's place, so both
        // paths wait for the same groups (ptxas tracks the wgmmas in flight
        // per group, not per path).
        if (pending) {
            issue_pending_pv();
        } else {
            wgmma_commit();
        }
        mbarrier_wait(pipe.q_full(q_buffer), Pipeline<Traits>::q_phase_of(q_count));
        const int first_stage = Pipeline<Traits>::stage_of(kv_base);
        mbarrier_wait(pipe.k_full(first_stage), Pipeline<Traits>::phase_of(kv_base));
        issue_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(first_stage)));
        wgmma_wait<1>();
        if (pending) finish_pending(softmax);
        softmax.init();
#pragma unroll
        for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][n][e] = 0.f;
        }

        wgmma_wait<0>();
        fence_accumulators(scores[0]);
        release_k(kv_base);
        if (num_n_blocks == 1) release_q(q_buffer);
        softmax_to_fragments(tile, num_n_blocks, 0, p_frag[0]);  // O is zero: nothing to rescale

        // One step: S_j = Q K_j^T and O += P_{j-1} V_{j-1} on the tensor
        // cores while P_j is computed from S_j.
        const auto step = [&](int j, Fragments &p_prev, Fragments &p_next) {
            const int stage = Pipeline<Traits>::stage_of(kv_base + j);
            const int prev_stage = Pipeline<Traits>::stage_of(kv_base + j - 1);
            mbarrier_wait(pipe.k_full(stage), Pipeline<Traits>::phase_of(kv_base + j));
            issue_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(stage)));
            mbarrier_wait(pipe.v_full(prev_stage), Pipeline<Traits>::phase_of(kv_base + j - 1));
            issue_pv<Traits>(acc_o[0], p_prev, smem_address(pipe.v_tile(prev_stage)));

            wgmma_wait<1>();  // S_j is done; P_{j-1} * V_{j-1} may still run
            fence_accumulators(scores[0]);
            release_k(kv_base + j);
            if (j == num_n_blocks - 1) release_q(q_buffer);
            const bool rescale = softmax_to_fragments(tile, num_n_blocks, j, p_next);

            wgmma_wait<0>();
            fence_accumulators(acc_o[0]);
            release_v(kv_base + j - 1);
            if (rescale) softmax.rescale(acc_o, correction);
        };
        int j = 1;
        for (; j + 1 < num_n_blocks; j += 2) {
            step(j, p_frag[0], p_frag[1]);
            step(j + 1, p_frag[1], p_frag[0]);
        }
        if (j < num_n_blocks) step(j, p_frag[0], p_frag[1]);

        // Tile j's probabilities are in p_frag[j % 2]; the last tile's go to
        // p_frag[1], where issue_pending_pv reads them.
        if ((num_n_blocks - 1) % 2 == 0) {
#pragma unroll
            for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
#pragma unroll
                for (int r = 0; r < 4; ++r) p_frag[1][kk][r] = p_frag[0][kk][r];
            }
        }
        pending = true;
        pending_tile = tile;
        pending_last_kv = kv_base + num_n_blocks - 1;
        kv_count += num_n_blocks;
        ++q_count;
    });
    if (pending) {
        issue_pending_pv();
        wgmma_wait<0>();
        finish_pending(softmax);
    }
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
