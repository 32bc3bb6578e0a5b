// The portable backward kernel's mainloop: one key block's K and V in shared
// memory, the query blocks that see it streaming through (BwdTraits, in
// config.cuh, gives the products and the warps' tilings).
//
// Per step (a query block of one query head; with GQA the steps run over
// every query head of the K/V head's group, so dK and dV are summed over
// the group in registers and need no workspace):
//   S = Q K^T, dP = dO V^T -> softcap -> mask (QueryBlockRange: only the
//   blocks that need it, and a partial key block) -> P = exp2(S *
//   scale_log2 - lse * log2(e)), dS = P * (dP - D) [* (1 - tanh^2)] ->
//   P, dS to shared memory -> dV += P^T dO, dK += dS^T Q, dQ = dS K added
//   into the fp32 accumulator.
// Query rows past the sequence load as zeros and take lse = +inf (P = 0);
// rows whose forward saw no key have lse = -inf and take +inf as well.
#pragma once

#include <cmath>
#include <cstdint>

#include "bwd/params.h"
#include "bwd/sm80/config.cuh"
#include "bwd/dq_accumulator.cuh"
#include "bwd/row_stats.cuh"
#include "bwd/scheduler.cuh"
#include "common/element.cuh"
#include "common/key_range.cuh"
#include "common/ptx.cuh"
#include "common/softcap.cuh"
#include "common/tile_coords.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"

namespace flashcore::sm80 {

template <typename Traits>
struct BwdMainloop {
    using Element = typename Traits::Element;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    using DkAccumulators = float[Traits::kdKVMTiles][Traits::kdKNTiles][4];
    using DvAccumulators = float[Traits::kdKVMTiles][Traits::kdVNTiles][4];

    Element *smem_k;
    Element *smem_v;
    unsigned char *smem_stages;
    Element *smem_p;
    Element *smem_ds;
    int tid;
    int lane;
    int warp;

    // The work's operands (bind): the batch's Q, dO rows of the group's
    // first query head, its K and V rows of the key block.
    const Element *k_block;
    const Element *v_block;
    int num_m_blocks;

    __device__ __forceinline__ explicit BwdMainloop(unsigned char *smem)
        : smem_k(reinterpret_cast<Element *>(smem + Traits::kSmemKOffset)),
          smem_v(reinterpret_cast<Element *>(smem + Traits::kSmemVOffset)),
          smem_stages(smem + Traits::kSmemStagesOffset),
          smem_p(reinterpret_cast<Element *>(smem + Traits::kSmemPOffset)),
          smem_ds(reinterpret_cast<Element *>(smem + Traits::kSmemDsOffset)),
          tid(threadIdx.x),
          lane(threadIdx.x % kWarpSize),
          warp(threadIdx.x / kWarpSize) {}

    __device__ __forceinline__ Element *stage_q(int step) const {
        return reinterpret_cast<Element *>(smem_stages + (step % Traits::kStages) * Traits::kSmemStageBytes);
    }
    __device__ __forceinline__ Element *stage_do(int step) const {
        return reinterpret_cast<Element *>(smem_stages + (step % Traits::kStages) * Traits::kSmemStageBytes +
                                           Traits::kSmemQBytes);
    }
    // The stage's rows' lse (as the forward wrote it) and D.
    __device__ __forceinline__ float *stage_lse(int step) const {
        return reinterpret_cast<float *>(smem_stages + (step % Traits::kStages) * Traits::kSmemStageBytes +
                                         Traits::kSmemQBytes + Traits::kSmemDoBytes);
    }
    __device__ __forceinline__ float *stage_row_dot(int step) const {
        return stage_lse(step) + kBlockM;
    }

    // Whether the key block has keys that a query sees (false: the epilogue
    // writes zeros for its keys, or nothing past the sequence's end).
    template <typename Work>
    __device__ __forceinline__ bool bind(const BwdKernelParams &p, const Work &w) {
        k_block = static_cast<const Element *>(p.fwd.k) + fwd_k_offset<true>(p.fwd, w.tile) +
                  int64_t(w.n_block) * kBlockN * p.fwd.k_seq_stride;
        v_block = static_cast<const Element *>(p.fwd.v) + fwd_v_offset<true>(p.fwd, w.tile) +
                  int64_t(w.n_block) * kBlockN * p.fwd.v_seq_stride;
        num_m_blocks = w.queries.num_blocks();
        return w.valid_keys > 0 && num_m_blocks > 0;
    }

    using Step = BwdStep;

    // Starts loading step j's (its buffer's) Q and dO rows, and commits
    // them as one group.
    template <typename Work>
    __device__ __forceinline__ void request(const BwdKernelParams &p, const Work &w, int j, Step step) const {
        const int head = step.head;
        const int first_row = step.m_block * kBlockM;
        const int64_t row = int64_t(w.tile.seqs.q_row0) + first_row;
        const int valid_rows = w.tile.seqs.seqlen_q - first_row;
        const Element *q = static_cast<const Element *>(p.fwd.q) + w.tile.batch * p.fwd.q_batch_stride +
                           row * p.fwd.q_seq_stride + int64_t(head) * p.fwd.q_head_stride;
        const Element *dout = static_cast<const Element *>(p.dout) + w.tile.batch * p.dout_batch_stride +
                              row * p.dout_seq_stride + int64_t(head) * p.dout_head_stride;
        load_tile_async<Element, Traits::kHeadDim, kBlockM, Traits::kNumThreads>(
            stage_q(j), q, p.fwd.q_seq_stride, valid_rows, p.fwd.head_dim / kElemsPerVector<Element>, tid);
        load_tile_async<Element, Traits::kHeadDimV, kBlockM, Traits::kNumThreads>(
            stage_do(j), dout, p.dout_seq_stride, valid_rows, p.fwd.head_dim_v / kElemsPerVector<Element>, tid);
        // The rows' lse and D (bwd/row_stats.cuh), one value per thread; rows
        // past the sequence read nothing (the step gives them P = 0).
        if (tid < 2 * kBlockM) {
            const int r = tid % kBlockM;
            const bool valid = r < valid_rows;
            if (tid < kBlockM) {
                const float *lse = p.fwd.lse + w.tile.batch * p.fwd.lse_batch_stride +
                                   int64_t(head) * p.fwd.lse_head_stride + row + r;
                cp_async_4(smem_address(stage_lse(j) + r), valid ? lse : p.fwd.lse, valid);
            } else {
                const float *dot = valid ? bwd_row_stats(p, w.tile.batch, head, row + r) : p.fwd.lse;
                cp_async_4(smem_address(stage_row_dot(j) + r), dot, valid);
            }
        }
        cp_async_commit();
    }

    template <typename Work, typename Finish>
    __device__ __forceinline__ void run(const BwdKernelParams &p, const Work &w, Finish &&finish) {
        const int qk_vectors = p.fwd.head_dim / kElemsPerVector<Element>;
        const int v_vectors = p.fwd.head_dim_v / kElemsPerVector<Element>;
        load_tile_async<Element, Traits::kHeadDim, kBlockN, Traits::kNumThreads>(smem_k, k_block, p.fwd.k_seq_stride,
                                                                                w.valid_keys, qk_vectors, tid);
        load_tile_async<Element, Traits::kHeadDimV, kBlockN, Traits::kNumThreads>(smem_v, v_block, p.fwd.v_seq_stride,
                                                                                 w.valid_keys, v_vectors, tid);
        const int num_steps = num_m_blocks * (p.fwd.num_heads_q / p.fwd.num_heads_kv);
        Step step = Step::first(w);
        request(p, w, 0, step);

        DkAccumulators acc_dk;
        DvAccumulators acc_dv;
        zero_fragments(acc_dk);
        zero_fragments(acc_dv);

        // The warps' places in each product's tiling (config.cuh).
        const int sdp_row0 = (warp / Traits::kWarpsNSdP) * (kBlockM / Traits::kWarpsMSdP);
        const int sdp_col0 = (warp % Traits::kWarpsNSdP) * (kBlockN / Traits::kWarpsNSdP);
        const int dkv_row0 = (warp / Traits::kWarpsDdKV) * (kBlockN / Traits::kWarpsNdKV);
        const int dk_col0 = (warp % Traits::kWarpsDdKV) * (Traits::kHeadDim / Traits::kWarpsDdKV);
        const int dv_col0 = (warp % Traits::kWarpsDdKV) * (Traits::kHeadDimV / Traits::kWarpsDdKV);
        const int dq_row0 = (warp / Traits::kWarpsDdQ) * (kBlockM / Traits::kWarpsMdQ);
        const int dq_col0 = (warp % Traits::kWarpsDdQ) * (Traits::kHeadDim / Traits::kWarpsDdQ);

        const Softcap softcap{p.fwd.softcap_prescale};
        const bool partial_key_block = w.valid_keys < kBlockN;
        const int first_key = w.n_block * kBlockN;

        for (int j = 0; j < num_steps; ++j) {
            // Step j's rows have landed, and every warp is done with step
            // j - 1 (whose Q/dO buffer the next request refills, and whose P
            // and dS this step overwrites).
            cp_async_wait<0>();
            __syncthreads();
            const Step following = step.next(w);
            if (Traits::kStages == 2 && j + 1 < num_steps) request(p, w, j + 1, following);

            const int head = step.head;
            const int m_block = step.m_block;
            const int first_row = m_block * kBlockM;
            const Element *q_tile = stage_q(j);
            const Element *do_tile = stage_do(j);
            // The lane read afresh each step: the fragment addresses derived
            // from it are then recomputed per step rather than all hoisted
            // out of the loop, which would hold hundreds of them in
            // registers beside dK and dV.
            const int lane = opaque_thread_index() % kWarpSize;

            float acc_s[Traits::kSdPMTiles][Traits::kSdPNTiles][4];
            float acc_dp[Traits::kSdPMTiles][Traits::kSdPNTiles][4];
            zero_fragments(acc_s);
            zero_fragments(acc_dp);
            warp_mma<Element, Traits::kSdPMTiles, Traits::kSdPNTiles, Traits::kHeadDim / kMmaK>(
                acc_s, SmemOperand<Element, Traits::kHeadDim, true>::a_of(q_tile, lane), sdp_row0,
                SmemOperand<Element, Traits::kHeadDim, true>::b_of(smem_k, lane), sdp_col0);
            warp_mma<Element, Traits::kSdPMTiles, Traits::kSdPNTiles, Traits::kHeadDimV / kMmaK>(
                acc_dp, SmemOperand<Element, Traits::kHeadDimV, true>::a_of(do_tile, lane), sdp_row0,
                SmemOperand<Element, Traits::kHeadDimV, true>::b_of(smem_v, lane), sdp_col0);

            if (softcap.enabled()) softcap.apply(acc_s);
            if (partial_key_block || w.queries.needs_mask(m_block)) {
                FragmentKeyMask<Traits::kSdPMTiles>::of(w.mask, first_row + sdp_row0, first_key + sdp_col0, lane)
                    .apply(acc_s);
            }
            // Two copies of the loop, so that calls without a softcap
            // issue none of its instructions (predicated off, they would
            // still take issue slots).
            if (softcap.enabled()) {
                probabilities_and_ds<true>(p, w, j, first_row, sdp_row0, lane, acc_s, acc_dp);
            } else {
                probabilities_and_ds<false>(p, w, j, first_row, sdp_row0, lane, acc_s, acc_dp);
            }
            store_fragments<Element, kBlockN>(smem_p, acc_s, sdp_row0, sdp_col0, lane);
            store_fragments<Element, kBlockN>(smem_ds, acc_dp, sdp_row0, sdp_col0, lane);
            __syncthreads();

            warp_mma<Element, Traits::kdKVMTiles, Traits::kdVNTiles, kBlockM / kMmaK>(
                acc_dv, SmemOperand<Element, kBlockN, false>::a_of(smem_p, lane), dkv_row0,
                SmemOperand<Element, Traits::kHeadDimV, false>::b_of(do_tile, lane), dv_col0);

            // dQ before dK: its reductions then drain while the dK product
            // runs, rather than queueing at the end of the step (and in the
            // deterministic mode the next key block is let in sooner). Past
            // head dim 192 (dQ in passes) the other order keeps the
            // registers within the budget.
            const auto dk_product = [&] {
                warp_mma<Element, Traits::kdKVMTiles, Traits::kdKNTiles, kBlockM / kMmaK>(
                    acc_dk, SmemOperand<Element, kBlockN, false>::a_of(smem_ds, lane), dkv_row0,
                    SmemOperand<Element, Traits::kHeadDim, false>::b_of(q_tile, lane), dk_col0);
            };
            constexpr bool kDkFirst = Traits::kdQPasses > 2;
            if constexpr (kDkFirst) dk_product();
            // The deterministic mode's turn is awaited after the first dQ
            // product, so that only the additions are serialized (before
            // it past head dim 192, for the registers).
            if constexpr (kDkFirst) begin_dq(p, w, head, m_block);
#pragma unroll
            for (int pass = 0; pass < Traits::kdQPasses; ++pass) {
                const int col0 = dq_col0 + pass * Traits::kdQNTiles * kMmaN;
                float acc_dq[Traits::kdQMTiles][Traits::kdQNTiles][4];
                zero_fragments(acc_dq);
                warp_mma<Element, Traits::kdQMTiles, Traits::kdQNTiles, kBlockN / kMmaK>(
                    acc_dq, SmemOperand<Element, kBlockN, true>::a_of(smem_ds, lane), dq_row0,
                    SmemOperand<Element, Traits::kHeadDim, false>::b_of(smem_k, lane), col0);
                if (!kDkFirst && pass == 0) begin_dq(p, w, head, m_block);
                add_dq(p, w, head, m_block, acc_dq, pass, dq_row0, col0, lane);
            }
            // The deterministic mode's count after the dK product where
            // the registers allow (sm_80's scalar reductions leave one
            // register too few at head dim 128).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
            constexpr bool kCountAfterDk = false;
#else
            constexpr bool kCountAfterDk = true;
#endif
            if constexpr (!kCountAfterDk) end_dq(p, w, head, m_block);
            if constexpr (!kDkFirst) dk_product();
            if constexpr (kCountAfterDk) end_dq(p, w, head, m_block);

            if (Traits::kStages == 1) {
                // Every warp is done with Q and dO before they are reloaded.
                __syncthreads();
                if (j + 1 < num_steps) request(p, w, j + 1, following);
            }
            step = following;
        }
        finish(w, acc_dk, acc_dv);
    }

    // P = exp2(S * scale_log2 - lse_log2) into acc_s and dS = P * (dP - D)
    // [* (1 - tanh^2) with a softcap] into acc_dp, row by row of the
    // thread's fragments: each row's lse (in log2 units) and D are read from
    // step j's stage where they are used, so only one row's are live at a
    // time.
    template <bool kSoftcap, typename Work>
    __device__ __forceinline__ void probabilities_and_ds(
        const BwdKernelParams &p, const Work &w, int j, int first_row, int sdp_row0, int lane,
        float (&acc_s)[Traits::kSdPMTiles][Traits::kSdPNTiles][4],
        float (&acc_dp)[Traits::kSdPMTiles][Traits::kSdPNTiles][4]) const {
        const float *stage_lse_values = stage_lse(j);
        const float *stage_dots = stage_row_dot(j);
#pragma unroll
        for (int m = 0; m < Traits::kSdPMTiles; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = sdp_row0 + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                const float lse = stage_lse_values[r];
                // Rows past the sequence, and rows that saw no key (lse
                // -inf), have P = 0.
                const float lse_log2 =
                    first_row + r >= w.tile.seqs.seqlen_q || lse == -INFINITY ? INFINITY : lse * kLog2e;
                const float row_dot = stage_dots[r];
#pragma unroll
                for (int n = 0; n < Traits::kSdPNTiles; ++n) {
#pragma unroll
                    for (int e = 2 * half; e < 2 * half + 2; ++e) {
                        const float score = acc_s[m][n][e];
                        const float prob = fast_exp2(fmaf(score, p.fwd.softmax_scale_log2, -lse_log2));
                        float ds = prob * (acc_dp[m][n][e] - row_dot);
                        // The capped logit's derivative: 1 - tanh^2 (a
                        // masked score is -inf: 0 there, as prob is).
                        if constexpr (kSoftcap) ds *= fmaxf(1.f - score * score, 0.f);
                        acc_s[m][n][e] = prob;
                        acc_dp[m][n][e] = ds;
                    }
                }
            }
        }
    }

    // Before the warp's dQ additions of a step, in the deterministic mode:
    // waits until the key blocks after this one that the query block sees
    // have added theirs. They are [n_block_min, n_block_max)
    // (BlockKeyRange), added in decreasing order (bwd/scheduler.cuh says why),
    // and each of their warps counts its own additions (end_dq), so this
    // key block's turn comes at rank * kNumWarps. Warps wait and count on
    // their own: no barrier across the CTA, and a warp's release waits only
    // for its own reductions.
    template <typename Work>
    __device__ __forceinline__ void begin_dq(const BwdKernelParams &p, const Work &w, int head, int m_block) const {
        if (!p.deterministic) return;
        const int rank = bwd_dq_rank<Traits>(p, w, BwdStep{head, m_block});
        if (tid % kWarpSize == 0) {
            // At least: this CTA's faster warps may have counted already.
            const int *counter = bwd_dq_counter<kBlockM>(p, w, head, m_block);
            while (load_acquire(counter) < rank * Traits::kNumWarps) {
            }
        }
        __syncwarp();
    }

    // After them (as late as the step allows, so that the reductions have
    // landed and the release does not stall the warp): the warp's additions
    // are ordered before its count. __syncwarp orders the lanes' additions
    // before lane 0's release (cumulativity: the PTX memory model's release
    // covers what the releasing thread has observed through the barrier).
    template <typename Work>
    __device__ __forceinline__ void end_dq(const BwdKernelParams &p, const Work &w, int head, int m_block) const {
        if (!p.deterministic) return;
        __syncwarp();
        if (tid % kWarpSize == 0) add_release(bwd_dq_counter<kBlockM>(p, w, head, m_block), 1);
    }

    // Adds the warp's dQ fragments (rows from dq_row0, columns from col0) of
    // query block m_block of `head` into the fp32 accumulator.
    template <typename Work>
    __device__ __forceinline__ void add_dq(const BwdKernelParams &p, const Work &w, int head, int m_block,
                                           const float (&acc_dq)[Traits::kdQMTiles][Traits::kdQNTiles][4],
                                           int pass, int dq_row0, int col0, int lane) const {
        const int first_row = m_block * kBlockM;
        float *accumulator = p.dq_accum + w.tile.batch * p.dq_accum_batch_stride + head * p.dq_accum_head_stride +
                             (int64_t(w.tile.seqs.q_row0) + first_row) * p.fwd.head_dim;
        const int valid_rows = w.tile.seqs.seqlen_q - first_row;
        if (DqAccumLayout<Traits>::by_fragment(valid_rows, p.fwd.head_dim)) {
            // A whole block at the kernel's head dim (the common case):
            // stored by fragment tile (bwd/dq_accumulator.cuh), each tile's
            // reduction one run of contiguous lines.
            float *warp_base = accumulator + DqAccumLayout<Traits>::group(pass, warp, 0, 0) +
                               lane * DqAccumLayout<Traits>::kLaneStride;
#pragma unroll
            for (int m = 0; m < Traits::kdQMTiles; ++m) {
#pragma unroll
                for (int n = 0; n < Traits::kdQNTiles; ++n) DqAccumLayout<Traits>::add(warp_base, m, n, acc_dq[m][n]);
            }
            return;
        }
#pragma unroll
        for (int m = 0; m < Traits::kdQMTiles; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = dq_row0 + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                float *dst_row = accumulator + int64_t(row) * p.fwd.head_dim;
#pragma unroll
                for (int n = 0; n < Traits::kdQNTiles; ++n) {
                    const int col = col0 + n * kMmaN + frag_col(lane);
                    if (row < valid_rows && col < p.fwd.head_dim) {
                        red_add2(dst_row + col, acc_dq[m][n][2 * half], acc_dq[m][n][2 * half + 1]);
                    }
                }
            }
        }
    }
};

}  // namespace flashcore::sm80
