// The consumer warpgroup's mainloop: the key tiles of one query block.
//
// Per key tile j (visited last key block first, BlockKeyRange order):
//   S_j = Q * K_j^T      wgmma, both operands from shared memory (K-major);
//   P_j = softmax(S_j)   online softmax into 16-bit A fragments (masked on
//                        the tiles BlockKeyRange::needs_mask names);
//   O += P_j * V_j       wgmma, P from registers, V from shared memory
//                        (MN-major).
// On e4m3 inputs (Traits::kFp8) the products are fp8 wgmmas: P is packed to
// e4m3 (scaled by 2^kProbExponent) and V is read as the producer warps'
// transpose V^T (K-major, keys in the order P's fragments hold them:
// v_transpose.cuh).
// The GEMMs of neighbouring tiles overlap the softmax: while the tensor cores
// compute S_j and then O += P_{j-1} V_{j-1}, the warpgroup waits only for S_j
// and exponentiates it; it waits for the P*V product only to rescale O and to
// reuse P's registers. With two register sets of P (Traits::kPSets) P of
// consecutive tiles alternates between them, so P_j is packed to 16 bits
// while the product still reads P_{j-1}; with one set (where O fills the
// registers, head dim 256, and the freed registers buy a wider key tile) S_j
// is exponentiated in place and packed into the one set after the product.
// K and V are released (per warp, on their pipeline barriers) as soon as
// their GEMM is done.
//
// The block's last O += P * V is left to the caller (Consumer): it is issued
// together with the next block's first S, so the blocks overlap too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "fwd/sm90/pipeline.cuh"
#include "sm90/ptx.cuh"
#include "fwd/sm90/traits.cuh"
#include "fwd/sm90/v_tail.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_e4m3.cuh"

namespace flashcore::sm90 {

// Two code-shape choices measured per head dim (H100, bf16, compare.py, two
// rounds against the code before them; docs/log/hopper.md):
//  - kAdvanceDescriptors: a tile's wgmma descriptors as one 32-bit add from
//    its first (PanelSwizzle::Descriptor::at) instead of rebuilt from each
//    address, five uniform instructions fewer a wgmma. Kept from head dim
//    128 (8k causal +3-5%, d256 causal +3-4%); at 64 tput-2k full lost ~4%.
//  - kMaskScoresInPlace: on masked tiles without softcap, hidden scores set
//    to -inf once instead of asking the mask in both passes of the softmax
//    (a masked d128 tile: 845 -> 536 instructions a warp). Kept from head
//    dim 64 (tput-2k causal +6% at d64); at 32 it cost tput-8k full 9-12%
//    although no tile there is masked (the unmasked loop's schedule changed).
template <typename Traits>
constexpr bool kAdvanceDescriptors = Traits::kHeadDim >= 128;
template <typename Traits>
constexpr bool kMaskScoresInPlace = Traits::kHeadDim >= 64;

// D (+)= A * B of the traits' input type, A and B K-major in shared memory
// (ss), or A in registers (rs: B MN-major for 16-bit types, K-major for fp8).
template <typename Traits, int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    if constexpr (Traits::kFp8) {
        WgmmaSs<__nv_fp8_e4m3, __nv_fp8_e4m3, N, WgmmaMajor::kK, WgmmaMajor::kK>::mma(d, desc_a, desc_b, scale_d);
    } else {
        Wgmma<typename Traits::Element, N>::ss(d, desc_a, desc_b, scale_d);
    }
}
template <typename Traits, int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    if constexpr (Traits::kFp8) {
        WgmmaRs<__nv_fp8_e4m3, __nv_fp8_e4m3, N, WgmmaMajor::kK>::mma(d, a, desc_b, scale_d);
    } else {
        Wgmma<typename Traits::Element, N>::rs(d, a, desc_b, scale_d);
    }
}

// scores = (this warpgroup's 64 rows of Q) * K_tile^T. q_rows: shared address
// of the warpgroup's first Q row in panel 0.
template <typename Traits>
__device__ __forceinline__ void issue_qk(float (&scores)[Traits::kBlockN / 8][4], uint32_t q_rows, uint32_t k_tile) {
    constexpr int kKStepCols = int(kKStepRowBytes) / Traits::kElementBytes;
    constexpr int kKStepsPerPanel = Traits::kPanelCols / kKStepCols;
    using Swizzle = typename Traits::Swizzle;
    const auto desc_q = Swizzle::k_major(q_rows);
    const auto desc_k = Swizzle::k_major(k_tile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kHeadDim / kKStepCols; ++kk) {
        const uint32_t step = (kk % kKStepsPerPanel) * kKStepRowBytes;
        const uint32_t q_offset = (kk / kKStepsPerPanel) * Traits::kQPanelBytes + step;
        const uint32_t k_offset = (kk / kKStepsPerPanel) * Traits::kKVPanelBytes + step;
        const uint64_t desc_a =
            kAdvanceDescriptors<Traits> ? desc_q.at(q_offset) : Swizzle::k_major(q_rows + q_offset).at(0);
        const uint64_t desc_b =
            kAdvanceDescriptors<Traits> ? desc_k.at(k_offset) : Swizzle::k_major(k_tile + k_offset).at(0);
        mma_ss<Traits, Traits::kBlockN>(scores, desc_a, desc_b, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
}

// out += P * V_tile. v_tile: shared address of the tile's panel 0 (fp8: of
// its transpose V^T).
template <typename Traits>
__device__ __forceinline__ void issue_pv(float (&out)[Traits::kHeadDimV / 8][4],
                                        const uint32_t (&p)[Traits::kBlockN / Traits::kMmaKeys][4], uint32_t v_tile) {
    if constexpr (Traits::kFp8) {
        // V^T is K-major: a k-step is 32 keys, 32 bytes along its rows; the
        // steps' descriptors advance from the tile's first.
        using VtSwizzle = typename Traits::VtSwizzle;
        const auto desc_vt = VtSwizzle::k_major(v_tile);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Traits::kBlockN / Traits::kMmaKeys; ++kk) {
            const int key = kk * Traits::kMmaKeys;
            const uint32_t offset =
                (key / Traits::kVtPanelKeys) * Traits::kVtPanelBytes + key % Traits::kVtPanelKeys;
            mma_rs<Traits, Traits::kHeadDimV>(out, p[kk], desc_vt.at(offset), 1);
        }
        wgmma_commit();
        return;
    }
    using Swizzle = typename Traits::Swizzle;
    const auto desc_v = Swizzle::mn_major(v_tile, Traits::kKVPanelBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
        // 16 keys are 16 rows: two swizzle atoms further down.
        const uint32_t offset = kk * 16 * Traits::kPanelRowBytes;
        const uint64_t desc_b = kAdvanceDescriptors<Traits>
                                    ? desc_v.at(offset)
                                    : Swizzle::mn_major(v_tile + offset, Traits::kKVPanelBytes).at(0);
        mma_rs<Traits, Traits::kHeadDimV>(out, p[kk], desc_b, 1);
    }
    wgmma_commit();
}

// Turns of the consumer warpgroups at issuing GEMMs, where the traits ask
// for them (kIssueInTurns, two consumers): warpgroup w waits for its turn
// (its barrier: its own 128 threads and the other's 128 arrivals), issues,
// and hands the turn over. Both walk the same blocks and tiles, so their
// turns pair up; consumer 1 hands consumer 0 the first.
template <typename Traits>
struct IssueTurns {
    static constexpr bool kEnabled = Traits::kIssueInTurns && Traits::kConsumerWarpgroups == 2;
    static constexpr int kThreads = 2 * kWarpgroupThreads;
    int consumer;

    __device__ __forceinline__ void start() const {
        if constexpr (kEnabled) {
            if (consumer == 1) named_barrier_arrive_id(kFirstIssueTurnBarrier, kThreads);
        }
    }
    __device__ __forceinline__ void wait() const {
        if constexpr (kEnabled) named_barrier_sync_id(kFirstIssueTurnBarrier + consumer, kThreads);
    }
    __device__ __forceinline__ void pass() const {
        if constexpr (kEnabled) named_barrier_arrive_id(kFirstIssueTurnBarrier + (consumer ^ 1), kThreads);
    }
};

// The register state of a consumer warp while it walks a block's key tiles,
// and the steps of that walk.
template <typename Traits, typename Cap>
struct Mainloop {
    using Element = typename Traits::Element;
    static constexpr int kNAtomsS = Traits::kBlockN / kMmaN;
    static constexpr int kNAtomsO = Traits::kHeadDimV / kMmaN;
    // P's A fragments, one per k-step: 8 16-bit or 16 fp8 values a thread.
    static constexpr int kPSteps = Traits::kBlockN / Traits::kMmaKeys;
    using Fragments = uint32_t[kPSteps][4];
    using KeyRange = BlockKeyRange<Traits::kBlockM, Traits::kBlockN>;

    const Pipeline<Traits> &pipe;
    int lane;
    int warp_first_row;  // within the CTA's query block
    float scale_log2;    // softmax_scale * log2(e) (fp8: times the block's q and k descales)
    Cap cap;  // the softcap, or NoSoftcap
    IssueTurns<Traits> turns;

    float acc_o[1][kNAtomsO][4];
    OnlineSoftmax<1, Traits::kRowMaxChains, Traits::kProbExponent> softmax;
    float scores[1][kNAtomsS][4];
    // Two sets: tile j's probabilities are in p_frag[j % 2], the block's last
    // in p_frag[1] (see remaining_tiles). One set: all in p_frag[0].
    Fragments p_frag[Traits::kPSets];
    float correction[2];

    // This warp has read K/V tile `kv` (counted over the CTA): the wgmmas
    // reading it completed.
    __device__ __forceinline__ void release_k(KvPosition kv) const {
        if (lane == 0) mbarrier_arrive(pipe.k_empty(Pipeline<Traits>::stage_of(kv)));
    }
    __device__ __forceinline__ void release_v(KvPosition kv) const {
        const int stage = Pipeline<Traits>::stage_of(kv);
        if (lane == 0) mbarrier_arrive(Traits::kFp8 ? pipe.vt_empty(stage) : pipe.v_empty(stage));
    }
    // This warp's last S = Q*K^T of a block completed: a later block's Q may
    // overwrite that buffer.
    __device__ __forceinline__ void release_q(int q_buffer) const {
        if (lane == 0) mbarrier_arrive(pipe.q_empty(q_buffer));
    }

    // Where the block's last probabilities are, for the caller's last P*V.
    __device__ __forceinline__ const Fragments &last_p() const { return p_frag[Traits::kPSets - 1]; }

    __device__ __forceinline__ void zero_output() {
#pragma unroll
        for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][n][e] = 0.f;
        }
    }

    // S = Q * K^T of K/V tile `kv`, once it has landed.
    __device__ __forceinline__ void issue_scores(uint32_t q_rows, KvPosition kv) {
        const int stage = Pipeline<Traits>::stage_of(kv);
        mbarrier_wait(pipe.k_full(stage), Pipeline<Traits>::phase_of(kv));
        issue_qk<Traits>(scores[0], q_rows, smem_address(pipe.k_tile(stage)));
    }

    // O += P * V of K/V tile `kv`, once its V (fp8: V^T) has landed.
    __device__ __forceinline__ void issue_output(const Fragments &p, KvPosition kv) {
        const int stage = Pipeline<Traits>::stage_of(kv);
        if constexpr (Traits::kFp8) {
            mbarrier_wait(pipe.vt_full(stage), Pipeline<Traits>::phase_of(kv));
            issue_pv<Traits>(acc_o[0], p, smem_address(pipe.vt_tile(stage)));
        } else {
            mbarrier_wait(pipe.v_full(stage), Pipeline<Traits>::phase_of(kv));
            issue_pv<Traits>(acc_o[0], p, smem_address(pipe.v_tile(stage)));
        }
    }

    // Tile j's online-softmax update (masked on the tiles that need it): its
    // probabilities go to sink(m, n, e, prob). Returns whether O must be
    // rescaled by `correction`.
    template <typename Sink>
    __device__ __forceinline__ bool update_tile(const KeyMask &mask, const KeyRange &keys, int m_block, int j,
                                                Sink &&sink) {
        const int n_block = keys.n_block(j);
        const auto all_visible = [](int, int, int) { return true; };
        if (keys.needs_mask(n_block)) {
            const FragmentKeyMask<1> visible = FragmentKeyMask<1>::of(
                mask, m_block * Traits::kBlockM + warp_first_row, n_block * Traits::kBlockN, lane);
            if constexpr (kMaskScoresInPlace<Traits> && std::is_same_v<Cap, NoSoftcap>) {
                // Hidden scores set to -inf get probability exactly 0 and
                // leave the row maximum alone: one compare and select per
                // score, where asking visible() in both passes of the
                // softmax kept 64 predicates live (a masked tile cost ~2.7x
                // an unmasked one in instructions at 128 keys).
                visible.apply(scores);
                return softmax.update_scores_into(scores, scale_log2, correction, all_visible, sink, cap);
            } else {
                // A softcap maps -inf to -softcap, not -inf.
                return softmax.update_scores_into(
                    scores, scale_log2, correction,
                    [&](int m, int n, int e) { return visible.visible(m, n, e); }, sink, cap);
            }
        }
        return softmax.update_scores_into(scores, scale_log2, correction, all_visible, sink, cap);
    }

    // Two probabilities of accumulator atom n (its elements e - 1, e) into
    // their place in P's A fragments. 16-bit: atoms 2i, 2i+1 are k-step i's
    // 16 keys, the m16n8k16 A layout. fp8: atoms 4i .. 4i+3 are k-step i's
    // 32 keys; register 0 (1: rows g + 8) packs atoms 4i, 4i+1 as columns
    // 4t .. 4t+3, register 2 (3) atoms 4i+2, 4i+3 (the key order V^T takes:
    // v_transpose.cuh).
    __device__ __forceinline__ static void pack_pair(Fragments &frag, int n, int e, float first, float second) {
        if constexpr (Traits::kFp8) {
            const uint32_t pair = uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3));
            uint32_t &reg = frag[n / 4][((n % 4) / 2) * 2 + e / 2];
            reg = n % 2 == 0 ? pair : reg | (pair << 16);
        } else {
            frag[n / 2][(n % 2) * 2 + e / 2] = pack2<Element>(first, second);
        }
    }

    // Tile j's probabilities, straight from its scores into P's fragments,
    // packed while the previous tile's P*V product still reads the other
    // set.
    __device__ __forceinline__ bool probabilities(const KeyMask &mask, const KeyRange &keys, int m_block, int j,
                                                  Fragments &frag) {
        float pending = 0.f;
        return update_tile(mask, keys, m_block, j, [&](int, int n, int e, float prob) {
            if (e % 2 == 0) {
                pending = prob;
            } else {
                pack_pair(frag, n, e, pending, prob);
            }
        });
    }

    // probabilities() for one set of P fragments: the probabilities replace
    // the scores in their registers (fp32) while the previous tile's P*V
    // product still reads the one set; pack_scores moves them there after.
    __device__ __forceinline__ bool probabilities_in_place(const KeyMask &mask, const KeyRange &keys, int m_block,
                                                           int j) {
        return update_tile(mask, keys, m_block, j, [&](int, int n, int e, float prob) { scores[0][n][e] = prob; });
    }

    // The probabilities in the score registers, packed to A fragments.
    __device__ __forceinline__ void pack_scores(Fragments &frag) {
#pragma unroll
        for (int n = 0; n < kNAtomsS; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                pack_pair(frag, n, half * 2 + 1, scores[0][n][half * 2], scores[0][n][half * 2 + 1]);
            }
        }
    }

    // Tile 0 of a block, whose S the caller issued: once S_0 is done, P_0.
    // O is zero, so nothing to rescale.
    __device__ __forceinline__ void first_tile(const KeyMask &mask, const KeyRange &keys, int m_block,
                                               KvPosition kv_base, int q_buffer) {
        wgmma_wait<0>();
        fence_accumulators(scores[0]);
        release_k(kv_base);
        if (keys.num_blocks() == 1) release_q(q_buffer);
        probabilities(mask, keys, m_block, 0, p_frag[0]);
    }

    // The rows of the block's first V tile past the batch's keys, zeroed
    // where they may hold garbage (traits.cuh, v_tail_may_hold_garbage;
    // v_tail.cuh). consumer_tid: the thread's index among both consumers'
    // threads. Called where O's registers are free: inside first_tile it
    // made the d128 kernels spill.
    __device__ __forceinline__ void clear_v_tail(const KeyMask &mask, const KeyRange &keys, KvPosition kv_base,
                                                 bool tail_may_hold_garbage, int consumer_tid) {
        // fp8: the transposing warps zero them in V^T (v_transpose.cuh).
        if constexpr (Traits::kFp8) return;
        const int valid_rows = mask.seqlen_k - keys.n_block(0) * Traits::kBlockN;
        if (tail_may_hold_garbage && valid_rows < Traits::kBlockN) {
            const int stage = Pipeline<Traits>::stage_of(kv_base);
            mbarrier_wait(pipe.v_full(stage), Pipeline<Traits>::phase_of(kv_base));
            zero_v_rows<Traits>(pipe.v_tile(stage), valid_rows, consumer_tid);
        }
    }

    // One step: S_j = Q K_j^T and O += P_{j-1} V_{j-1} on the tensor cores
    // while P_j is computed from S_j. With one set of P fragments (FA3's
    // order; p_prev and p_next are then the one set) S_j is exponentiated in
    // place while the product runs, and packed into the set once the product
    // has finished reading it.
    __device__ __forceinline__ void step(const KeyMask &mask, const KeyRange &keys, int m_block, uint32_t q_rows,
                                         KvPosition kv_base, int q_buffer, int j, const Fragments &p_prev,
                                         Fragments &p_next) {
        turns.wait();
        issue_scores(q_rows, kv_base + j);
        issue_output(p_prev, kv_base + j - 1);
        turns.pass();

        wgmma_wait<1>();  // S_j is done; P_{j-1} * V_{j-1} may still run
        fence_accumulators(scores[0]);
        release_k(kv_base + j);
        if (j == keys.num_blocks() - 1) release_q(q_buffer);
        bool rescale;
        if constexpr (Traits::kPSets == 1) {
            rescale = probabilities_in_place(mask, keys, m_block, j);
        } else {
            rescale = probabilities(mask, keys, m_block, j, p_next);
        }

        wgmma_wait<0>();
        fence_accumulators(acc_o[0]);
        release_v(kv_base + j - 1);
        if (rescale) softmax.rescale(acc_o, correction);
        if constexpr (Traits::kPSets == 1) pack_scores(p_next);
    }

    // Tiles 1 .. num_blocks - 1 of a block. With two sets of P its last
    // probabilities are then moved to p_frag[1], where the caller's last P*V
    // reads them (one issue site whatever the block's tile count: a branch
    // between two issue sites makes ptxas serialise the wgmmas).
    __device__ __forceinline__ void remaining_tiles(const KeyMask &mask, const KeyRange &keys, int m_block,
                                                    uint32_t q_rows, KvPosition kv_base, int q_buffer) {
        const int num_blocks = keys.num_blocks();
        if constexpr (Traits::kPSets == 1) {
            for (int j = 1; j < num_blocks; ++j) {
                step(mask, keys, m_block, q_rows, kv_base, q_buffer, j, p_frag[0], p_frag[0]);
            }
        } else {
            int j = 1;
            for (; j + 1 < num_blocks; j += 2) {
                step(mask, keys, m_block, q_rows, kv_base, q_buffer, j, p_frag[0], p_frag[1]);
                step(mask, keys, m_block, q_rows, kv_base, q_buffer, j + 1, p_frag[1], p_frag[0]);
            }
            if (j < num_blocks) step(mask, keys, m_block, q_rows, kv_base, q_buffer, j, p_frag[0], p_frag[1]);
            if ((num_blocks - 1) % 2 == 0) {
#pragma unroll
                for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) p_frag[1][kk][r] = p_frag[0][kk][r];
                }
            }
        }
    }
};

}  // namespace flashcore::sm90
