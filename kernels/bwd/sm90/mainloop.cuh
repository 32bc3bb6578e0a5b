// A consumer warpgroup's registers and the products of one step (a query
// block against the warpgroup's keys; config.cuh lists them), in the form
// split by keys: S^T and dP^T (issue_scores), the mask, P^T
// (probabilities), dS^T and the A fragments of P^T and dS^T
// (pack_gradients), dV and dK (issue_key_gradient), dS into shared memory
// for both warpgroups (store_ds); in both forms dQ = dS K (issue_dq) and its
// store into a dQ buffer (store_dq), and at the end dK and dV to their
// tensors (store_key_gradients). dK and dV accumulate in the registers
// (acc_dk, acc_dv: the consumer's kDkCols and kDvCols columns) across the steps. The
// order of a step, and its waits on the producer's warps, are the
// consumer's (consumer.cuh: BwdConsumer::run; column_split.cuh and
// transposed_split.cuh for the other forms).
#pragma once

#include <cmath>
#include <cstdint>

#include "bwd/dq_accumulator.cuh"
#include "bwd/params.h"
#include "bwd/sm90/config.cuh"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_bwd.cuh"

namespace flashcore::sm90 {

// Keeps A fragments in their registers until the wgmma reading them has
// been waited for (the compiler sees the issuing asm as their last use).
template <int kSteps>
__device__ __forceinline__ void fence_fragments(uint32_t (&frag)[kSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(frag[kk][r])::"memory");
    }
}

template <typename Traits>
struct BwdMainloop {
    using Element = typename Traits::Element;
    using Swizzle = typename Traits::Swizzle;
    using DsSwizzle = typename Traits::DsSwizzle;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    static constexpr int kSAtoms = kBlockM / kMmaN;    // n8 atoms of S^T, dP^T (queries)
    static constexpr int kQuerySteps = kBlockM / 16;   // k-steps of dV, dK (queries)
    static constexpr int kHeadSteps = Traits::kHeadDim / 16;    // k-steps of S^T / S
    static constexpr int kHeadStepsV = Traits::kHeadDimV / 16;  // of dP^T / dP
    static constexpr int kKeySteps = kBlockN / 16;     // k-steps of dQ (keys)
    static constexpr int kKAtoms = Traits::kDkAtoms;
    static constexpr int kVAtoms = Traits::kDvAtoms;
    static constexpr int kDqAtoms = Traits::kDqCols / kMmaN;
    static constexpr int kStepsPerPanel = Traits::kPanelCols / 16;    // k-steps of a head-dim panel
    static constexpr int kStepsPerDsPanel = Traits::kDsPanelKeys / 16;  // of a dS panel
    // A dQ consumer's columns of K (kDqCols of them: whole panels).
    static constexpr uint32_t kDqColsBytes = Traits::kDqCols / Traits::kPanelCols * Traits::kKVPanelBytes;
    using Fragments = uint32_t[kQuerySteps][4];
    using Layout = DqAccumLayout<Traits>;

    const BwdSm90Params &params;
    const BwdSmem<Traits> &sm;
    int consumer;  // 0 or 1 (config.cuh: its keys, or its columns)
    int tid;       // within the consumer warpgroup
    int lane;
    int warp;      // within the consumer warpgroup
    // dQ's B operand (issue_dq): the consumer's head-dim columns of K, a
    // wgmma operand (warp_uniform), worked out once. Worked out in
    // issue_dq, the shuffle was redone every step and the step's R2UR
    // waited on it (ncu, d128: 5% of the kernel's warp samples).
    uint32_t dq_k_cols;

    float acc_dk[kKAtoms][4];
    float acc_dv[kVAtoms][4];

    // The accumulators are left alone: run() zeroes them (value-initialized
    // by an aggregate initialization, ptxas kept them in local memory).
    __device__ __forceinline__ BwdMainloop(const BwdSm90Params &params_, const BwdSmem<Traits> &sm_, int consumer_,
                                           int consumer_tid)
        : params(params_),
          sm(sm_),
          consumer(consumer_),
          tid(consumer_tid % kWarpgroupThreads),
          lane(consumer_tid % kWarpSize),
          warp((consumer_tid % kWarpgroupThreads) / kWarpSize),
          dq_k_cols(warp_uniform(smem_address(sm_.k()) + (Traits::kDqSplitRows ? 0 : consumer_ * kDqColsBytes))) {}

    // The warp's first key row of dK and dV, and the consumer's first
    // column of dK and of dV.
    __device__ __forceinline__ int key_row0() const {
        return (Traits::kColumnSplit ? 0 : consumer * Traits::kKeysPerConsumer) + warp * kMmaM;
    }
    __device__ __forceinline__ int k_col0() const { return Traits::kColumnSplit ? consumer * Traits::kDkCols : 0; }
    __device__ __forceinline__ int v_col0() const { return Traits::kColumnSplit ? consumer * Traits::kDvCols : 0; }
    // The warp's dQ rows and columns within the block, and its index in the
    // accumulator's fragment order (DqAccumLayout: warps by m16 strip, then
    // column share).
    __device__ __forceinline__ int dq_row0() const {
        return (Traits::kDqSplitRows ? consumer * Traits::kDqRows : 0) + warp * kMmaM;
    }
    __device__ __forceinline__ int dq_col0() const { return Traits::kDqSplitRows ? 0 : consumer * Traits::kDqCols; }
    __device__ __forceinline__ int dq_warp() const {
        return (dq_row0() / kMmaM) * Traits::kWarpsDdQ + dq_col0() / Traits::kDqCols;
    }

    // acc = (64 rows of a K-major tile from `a_rows`, panels a_panel_bytes
    // apart) * (kNAtoms * 8 rows of a K-major tile from `b_rows`)^T over
    // kSteps k-steps of the head dim (kHeadSteps, or kHeadStepsV for V and
    // dO): S^T = K_c Q^T, dP^T = V_c dO^T split by keys, S = Q K_c^T,
    // dP = dO V_c^T split by columns.
    template <int kSteps, int kNAtoms>
    __device__ __forceinline__ void issue_scores(float (&acc)[kNAtoms][4], uint32_t a_rows, uint32_t a_panel_bytes,
                                                 uint32_t b_rows, uint32_t b_panel_bytes) const {
        const auto desc_a = Swizzle::k_major(a_rows);
        const auto desc_b = Swizzle::k_major(b_rows);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
            const uint32_t step = (kk % kStepsPerPanel) * kKStepRowBytes;
            const uint32_t panel = kk / kStepsPerPanel;
            Wgmma<Element, kNAtoms * kMmaN>::ss(acc, desc_a.at(panel * a_panel_bytes + step),
                                                desc_b.at(panel * b_panel_bytes + step), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
    }

    // acc += A (registers: the 64 keys x kBlockM queries of P^T or dS^T) *
    // (kBlockM rows of an MN-major tile): dV += P^T dO, dK += dS^T Q.
    template <int kNAtoms>
    __device__ __forceinline__ void issue_key_gradient(float (&acc)[kNAtoms][4], const Fragments &a,
                                                       uint32_t b_tile) const {
        const auto desc_b = Swizzle::mn_major(b_tile, Traits::kQPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kQuerySteps; ++kk) {
            // 16 query rows: two swizzle atoms further down.
            Wgmma<Element, kNAtoms * kMmaN>::rs(acc, a[kk], desc_b.at(kk * 16 * Traits::kPanelRowBytes), 1);
        }
        wgmma_commit();
    }

    // acc = dS (this consumer's rows, K-major, keys along them; dS buffer s)
    // * K (its head-dim columns, MN-major) over the block's keys.
    __device__ __forceinline__ void issue_dq(float (&acc)[kDqAtoms][4], int s) const {
        const uint32_t ds_consumer_rows =
            Traits::kDqSplitRows ? consumer * Traits::kDqRows * Traits::kDsPanelRowBytes : 0;
        const uint32_t ds_rows = warp_uniform(smem_address(sm.ds(s)) + ds_consumer_rows);
        const uint32_t k_cols = dq_k_cols;
        const auto desc_a = DsSwizzle::k_major(ds_rows);
        const auto desc_b = Swizzle::mn_major(k_cols, Traits::kKVPanelBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKeySteps; ++kk) {
            const uint32_t a_offset =
                (kk / kStepsPerDsPanel) * Traits::kDsPanelBytes + (kk % kStepsPerDsPanel) * kKStepRowBytes;
            WgmmaSs<Element, Element, Traits::kDqCols, WgmmaMajor::kK, WgmmaMajor::kMN>::mma(
                acc, desc_a.at(a_offset), desc_b.at(kk * 16 * Traits::kPanelRowBytes), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
    }

    // Before the first step: dK and dV zeroed, K and V landed, and where the
    // block is partial (returned: its keys then need the mask) the
    // consumer's keys past the valid ones cleared (clear_key_tail) before
    // its own S^T / S and dP^T / dP read them.
    template <typename Work>
    __device__ __forceinline__ bool start(const Work &w) {
#pragma unroll
        for (int n = 0; n < kKAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[n][e] = 0.f;
        }
#pragma unroll
        for (int n = 0; n < kVAtoms; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dv[n][e] = 0.f;
        }
        mbarrier_wait(sm.kv_full(), 0);
        const bool partial_key_block = w.valid_keys < kBlockN;
        if (partial_key_block) {
            clear_key_tail(w.valid_keys);
            named_barrier_sync_id(kFirstConsumerBarrier + consumer, kWarpgroupThreads);
        }
        return partial_key_block;
    }

    // The consumer's rows of K or V (its keys of S^T / S), a wgmma operand:
    // warp_uniform.
    __device__ __forceinline__ uint32_t consumer_key_rows(const unsigned char *tile) const {
        return warp_uniform(smem_address(tile) + consumer * Traits::kKeysPerConsumer * Traits::kPanelRowBytes);
    }

    // Step j's dQ into its dQ buffer once the writer has read the last
    // step's there (dq_writer.cuh), which adds it to the workspace.
    template <typename Work>
    __device__ __forceinline__ void hand_over_dq(const Work &w, const BwdStep &step, int j,
                                                 const float (&acc_dq)[kDqAtoms][4]) const {
        const int b = j % Traits::kDqBuffers;
        named_barrier_sync_id(kDqEmptyBarrier + 2 * b, kDqWriterParticipants<Traits>);
        const DqBlock block = DqBlock::of<Traits>(params.bwd, w, step.head, step.m_block);
        store_dq(block, acc_dq, b);
        fence_shared_to_async_proxy();
        named_barrier_arrive_id(kDqFullBarrier + 2 * b, kDqWriterParticipants<Traits>);
    }

    // The consumer's keys past the block's valid ones, zeroed in K and V:
    // they may hold another sequence's rows or unused cache rows (with
    // seqused_k), whose values must not reach dQ (dS K) or dP (V dO^T).
    __device__ __forceinline__ void clear_key_tail(int valid_keys) const {
        const int first = max(valid_keys, consumer * Traits::kKeysPerConsumer);
        const int end = (consumer + 1) * Traits::kKeysPerConsumer;
        if (first >= end) return;
        constexpr int kChunks = Traits::kPanelRowBytes / 16;
        for (int i = tid; i < (end - first) * kChunks * Traits::kPanels; i += kWarpgroupThreads) {
            const int chunk = i % kChunks;
            const int row = first + (i / kChunks) % (end - first);
            const int panel = i / kChunks / (end - first);
            const uint32_t offset = panel * Traits::kKVPanelBytes + row * Traits::kPanelRowBytes + chunk * 16;
            *reinterpret_cast<uint4 *>(sm.k() + offset) = make_uint4(0u, 0u, 0u, 0u);
            // V has no more panels than K (config.cuh).
            if (Traits::kVPanels == Traits::kPanels || panel < Traits::kVPanels) {
                *reinterpret_cast<uint4 *>(sm.v() + offset) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        fence_shared_to_async_proxy();
    }

    // Scores of S^T a query does not see set to -inf (P = 0). Query q sees
    // key k iff k < seqlen_k and lowest <= k - q <= highest (KeyMask: the
    // window around q's diagonal q + seqlen_k - seqlen_q), i.e. iff q is in
    // [k - highest, k - lowest]: per key row one offset and one span, per
    // element one add and one unsigned compare. KeyMask::row per element
    // made the loop too long for the instruction cache (ncu: no_instruction
    // stalls), and a predicate per element spilled at head dim 64. The
    // bounds are clamped to what k - q can be (keys below seqlen_k, queries
    // from 0 to seqlen_q + kBlockM), which keeps every difference within
    // 32 bits. With chunks the run of queries is cut to those whose
    // diagonal lies in the key's chunk, so each key row has a span of its
    // own.
    template <typename Work>
    __device__ __forceinline__ void apply_mask(const Work &w, int m_block, float (&acc_s)[kSAtoms][4]) const {
        const KeyMask &mask = w.mask;
        const int lowest = max(mask.diagonal_shift() - mask.window_left, -(mask.seqlen_q + kBlockM));
        const int highest = min(mask.diagonal_shift() + mask.window_right, mask.seqlen_k);
        const int first_key = w.n_block * kBlockN + key_row0() + frag_row(lane);
        const int first_query = m_block * kBlockM + frag_col(lane);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = first_key + half * kFragRowHalf;
            // The queries that see the key: [first_seen, last_seen].
            int first_seen = key - highest;
            int last_seen = key - lowest;
            if (mask.chunk > 0) {
                // Diagonals in [start, end) of the key's chunk: queries
                // [start - shift, end - 1 - shift] (end capped at seqlen_k,
                // past every diagonal). key >= 0, so chunk_start's floor
                // is an unsigned remainder here, without its sign handling.
                const int start = key - int(uint32_t(key) % uint32_t(mask.chunk));
                first_seen = max(first_seen, start - mask.diagonal_shift());
                last_seen = min(last_seen, mask.chunk_end_below(start, mask.seqlen_k) - 1 - mask.diagonal_shift());
            }
            // first_query - first_seen: 0 for the first query the key is
            // visible to. A key past the sequence, or seen by no query: an
            // offset that no element brings within the span (< 2^31).
            const bool seen = key < mask.seqlen_k && last_seen >= first_seen;
            const uint32_t span = seen ? uint32_t(last_seen - first_seen) : 0u;
            const uint32_t offset = seen ? uint32_t(first_query - first_seen) : uint32_t(INT32_MIN);
#pragma unroll
            for (int n = 0; n < kSAtoms; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (offset + uint32_t(n * kMmaN + e) > span) acc_s[n][2 * half + e] = -INFINITY;
                }
            }
        }
    }

    // P^T = exp2(S^T * scale_log2 - lse_log2) in place of S^T, once S^T is
    // done (dP^T may still run).
    __device__ __forceinline__ void probabilities(int s, float (&acc_s)[kSAtoms][4]) const {
        const float scale_log2 = params.bwd.fwd.softmax_scale_log2;
        const float *lse_log2 = sm.lse_log2(s);
#pragma unroll
        for (int n = 0; n < kSAtoms; ++n) {
            const float2 lse = *reinterpret_cast<const float2 *>(lse_log2 + n * kMmaN + frag_col(lane));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc_s[n][e] = fast_exp2(fmaf(acc_s[n][e], scale_log2, -(e % 2 ? lse.y : lse.x)));
            }
        }
    }

    // dS^T = P^T (dP^T - D), and P^T and dS^T packed to A fragments (atoms
    // 2i, 2i + 1: k-step i).
    __device__ __forceinline__ void pack_gradients(int s, const float (&prob)[kSAtoms][4],
                                                   const float (&acc_dp)[kSAtoms][4], Fragments &p_frag,
                                                   Fragments &ds_frag) const {
        const float *row_dot = sm.row_dot(s);
#pragma unroll
        for (int n = 0; n < kSAtoms; ++n) {
            const float2 dot = *reinterpret_cast<const float2 *>(row_dot + n * kMmaN + frag_col(lane));
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) ds[e] = prob[n][e] * (acc_dp[n][e] - (e % 2 ? dot.y : dot.x));
            p_frag[n / 2][(n % 2) * 2] = pack2<Element>(prob[n][0], prob[n][1]);
            p_frag[n / 2][(n % 2) * 2 + 1] = pack2<Element>(prob[n][2], prob[n][3]);
            ds_frag[n / 2][(n % 2) * 2] = pack2<Element>(ds[0], ds[1]);
            ds_frag[n / 2][(n % 2) * 2 + 1] = pack2<Element>(ds[2], ds[3]);
        }
    }

    // dS (rows: queries, keys along them) into stage s's buffer, from the
    // fragments of dS^T: stmatrix, transposed, two atoms (16 queries) of
    // both 8-key halves of the warp's rows at a time.
    __device__ __forceinline__ void store_ds(const Fragments &ds_frag, int s) const {
        const int matrix = lane / 8;
        const int query_in_pair = (matrix / 2) * kMmaN + lane % 8;
        const int chunk = (warp * kMmaM + (matrix % 2) * kFragRowHalf) / 8;  // 8 keys: 16 bytes
        const uint32_t panel = smem_address(sm.ds(s)) + consumer * Traits::kDsPanelBytes;
#pragma unroll
        for (int kk = 0; kk < kQuerySteps; ++kk) {
            // A k-step's fragments are atoms 2kk (registers 0, 1: key rows
            // g, g + 8) and 2kk + 1 (registers 2, 3): the four matrices in
            // stmatrix's order (matrix m: atom 2kk + m / 2, half m % 2).
            stmatrix_x4_trans(panel + DsSwizzle::offset(kk * 16 + query_in_pair, chunk), ds_frag[kk]);
        }
    }

    // The warp's dQ fragments into the shared buffer, in the accumulator's
    // layout for the step's block (DqBlock): by fragment tile (a lane's
    // four values of a tile together, 16-byte stores), or row by row for the
    // rows and head-dim columns that exist.
    __device__ __forceinline__ void store_dq(const DqBlock &block, const float (&acc_dq)[kDqAtoms][4], int b) const {
        float *dq = sm.dq(b);
        if (block.by_fragment) {
            float *warp_base = dq + Layout::group(0, dq_warp(), 0, 0) + lane * Layout::kLaneStride;
#pragma unroll
            for (int n = 0; n < kDqAtoms; ++n) {
                *reinterpret_cast<float4 *>(warp_base + Layout::group(0, 0, 0, n)) =
                    make_float4(acc_dq[n][0], acc_dq[n][1], acc_dq[n][2], acc_dq[n][3]);
            }
            return;
        }
        const int head_dim = params.bwd.fwd.head_dim;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = dq_row0() + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
            for (int n = 0; n < kDqAtoms; ++n) {
                const int col = dq_col0() + n * kMmaN + frag_col(lane);
                if (row < block.valid_rows && col < head_dim) {
                    *reinterpret_cast<float2 *>(dq + row * head_dim + col) =
                        make_float2(acc_dq[n][2 * half], acc_dq[n][2 * half + 1]);
                }
            }
        }
    }

    // The block's first key row of dK and of dV (its (batch, K/V head)).
    struct KeyGradientRows {
        Element *dk;
        Element *dv;
    };
    template <typename Work>
    __device__ __forceinline__ KeyGradientRows key_gradient_rows(const Work &w) const {
        const BwdKernelParams &p = params.bwd;
        const int64_t first_key = int64_t(w.tile.seqs.k_row0) + int64_t(w.n_block) * kBlockN;
        return {static_cast<Element *>(p.dk) + w.tile.batch * p.dk_batch_stride + first_key * p.dk_seq_stride +
                    int64_t(w.tile.head_kv) * p.dk_head_stride,
                static_cast<Element *>(p.dv) + w.tile.batch * p.dv_batch_stride + first_key * p.dv_seq_stride +
                    int64_t(w.tile.head_kv) * p.dv_head_stride};
    }

    // The end of a CTA's work: dK (times grad_scale) and dV to their
    // tensors, through the staging rows (config.cuh: kStagedDkOffset), which
    // `stage` fills from the registers (stage_key_gradients, or the
    // transposed form's own); without work only zeros (zero_key_gradients).
    template <typename Work, typename Stage>
    __device__ __forceinline__ void store_key_gradients_staged(const Work &w, int consumer_tid, bool has_work,
                                                               Stage &&stage) const {
        const KeyGradientRows rows = key_gradient_rows(w);
        if (!has_work) {
            zero_key_gradients(w, rows, consumer_tid);
            return;
        }
        // Both consumers are past their last step: K, V, Q and dO are read.
        // (From different instructions where they run different copies of
        // the loop, kDqConsumers 1.)
        if constexpr (Traits::kDqConsumers == Traits::kConsumerWarpgroups) {
            named_barrier_sync_id(kStagingFreeBarrier, Traits::kConsumerThreads);
        } else {
            named_barrier_sync_id_unaligned(kStagingFreeBarrier, Traits::kConsumerThreads);
        }
        stage();
        // The consumer's staged rows, each stored by one of its warps.
        named_barrier_sync_id(kFirstConsumerBarrier + consumer, kWarpgroupThreads);
        const BwdKernelParams &p = params.bwd;
        const int first_row = Traits::kColumnSplit ? 0 : consumer * Traits::kStagedRows;
        const int end_keys = min(w.stored_keys, kBlockN);
        copy_staged<Traits::kDkCols>(rows.dk, p.dk_seq_stride, p.fwd.head_dim, Traits::kStagedDkOffset,
                                     Traits::kStagedDkRowBytes, k_col0(), first_row, w.valid_keys, end_keys);
        copy_staged<Traits::kDvCols>(rows.dv, p.dv_seq_stride, p.fwd.head_dim_v, Traits::kStagedDvOffset,
                                     Traits::kStagedDvRowBytes, v_col0(), first_row, w.valid_keys, end_keys);
    }

    // dK (times grad_scale) and dV of the consumer's registers (key_row0,
    // k_col0, v_col0) into the staging rows: stmatrix, an 8x8 matrix per
    // atom and half of the warp's 16 keys, four at a time.
    __device__ __forceinline__ void stage_key_gradients() const {
        const float scale = params.bwd.grad_scale;
        const int matrix = lane / 8;
        const uint32_t row = key_row0() + (matrix % 2) * kFragRowHalf + lane % 8;
        const uint32_t chunk = (matrix / 2) * 16;  // atom n + matrix / 2: 8 columns further
        stage_rows<kKAtoms>(smem_address(sm.base + Traits::kStagedDkOffset) + row * Traits::kStagedDkRowBytes +
                                k_col0() * uint32_t(sizeof(Element)) + chunk,
                            acc_dk, scale);
        stage_rows<kVAtoms>(smem_address(sm.base + Traits::kStagedDvOffset) + row * Traits::kStagedDvRowBytes +
                                v_col0() * uint32_t(sizeof(Element)) + chunk,
                            acc_dv, 1.f);
    }
    template <int kAtoms>
    __device__ __forceinline__ static void stage_rows(uint32_t lane_row, const float (&acc)[kAtoms][4], float scale) {
        static_assert(kAtoms % 2 == 0, "stmatrix stores two atoms at a time");
#pragma unroll
        for (int n = 0; n < kAtoms; n += 2) {
            const uint32_t frag[4] = {pack2<Element>(acc[n][0] * scale, acc[n][1] * scale),
                                      pack2<Element>(acc[n][2] * scale, acc[n][3] * scale),
                                      pack2<Element>(acc[n + 1][0] * scale, acc[n + 1][1] * scale),
                                      pack2<Element>(acc[n + 1][2] * scale, acc[n + 1][3] * scale)};
            stmatrix_x4(lane_row + n * 16, frag);
        }
    }

    // The consumer's staged rows [first_row, first_row + kStagedRows) and
    // columns [col0, col0 + kCols) to the tensor `out`, 16 bytes a thread at
    // a time, consecutive threads along a row: those below the call's head
    // dim and end_keys, and zeros for the keys in [valid_keys, end_keys)
    // (past seqused_k; their gradients in the registers are 0 too).
    template <int kCols>
    __device__ __forceinline__ void copy_staged(Element *out, int64_t seq_stride, int head_dim, uint32_t staged_offset,
                                                uint32_t row_bytes, int col0, int first_row, int valid_keys,
                                                int end_keys) const {
        constexpr int kElems = kElemsPerVector<Element>;
        constexpr int kChunks = kCols / kElems;
        constexpr int kPieces = Traits::kStagedRows * kChunks;
        static_assert(kCols % kElems == 0 && kPieces % kWarpgroupThreads == 0, "whole rows over the warpgroup");
        const unsigned char *staged = sm.base + staged_offset;
#pragma unroll
        for (int i = 0; i < kPieces / kWarpgroupThreads; ++i) {
            const int piece = tid + i * kWarpgroupThreads;
            const int row = first_row + piece / kChunks;
            const int col = col0 + (piece % kChunks) * kElems;
            if (row >= end_keys || col >= head_dim) continue;
            const uint4 value = row < valid_keys
                                    ? *reinterpret_cast<const uint4 *>(staged + row * row_bytes + col * sizeof(Element))
                                    : make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4 *>(out + row * seq_stride + col) = value;
        }
    }

    // dK and dV of the forms whose registers hold them untransposed.
    template <typename Work>
    __device__ __forceinline__ void store_key_gradients(const Work &w, int consumer_tid, bool has_work) const {
        store_key_gradients_staged(w, consumer_tid, has_work, [this] { stage_key_gradients(); });
    }

    // A block without work (no query sees its keys, or it is past the
    // sequence's end): zeros for its keys below stored_keys (seqused_k),
    // over both consumers' threads (consumer_tid).
    template <typename Work>
    __device__ __forceinline__ void zero_key_gradients(const Work &w, const KeyGradientRows &rows,
                                                       int consumer_tid) const {
        const BwdKernelParams &p = params.bwd;
        // 16-byte stores.
        const int end = min(w.stored_keys, kBlockN);
        constexpr int kElems = kElemsPerVector<Element>;
        constexpr int kVectors = (Traits::kHeadDim > Traits::kHeadDimV ? Traits::kHeadDim : Traits::kHeadDimV) / kElems;
        for (int idx = consumer_tid; idx < kBlockN * kVectors; idx += Traits::kConsumerThreads) {
            const int row = idx / kVectors;
            const int col = (idx % kVectors) * kElems;
            if (row >= end) continue;
            if (col < p.fwd.head_dim) {
                *reinterpret_cast<uint4 *>(rows.dk + row * p.dk_seq_stride + col) = make_uint4(0u, 0u, 0u, 0u);
            }
            if (col < p.fwd.head_dim_v) {
                *reinterpret_cast<uint4 *>(rows.dv + row * p.dv_seq_stride + col) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
};

}  // namespace flashcore::sm90
