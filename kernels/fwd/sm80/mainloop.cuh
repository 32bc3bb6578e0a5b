// The portable kernel's mainloop: one query block's key tiles, in a CTA's
// key splits (FwdTraits::kKeySplits warp groups that take the tiles in
// turn).
//
// Per key tile, last key block first (BlockKeyRange order):
//   S = Q*K^T (tensor cores) -> softcap -> mask (boundary tiles only) ->
//   online softmax -> O += P*V (tensor cores, P straight from registers).
// Walking the tiles last to first puts the tiles that need masking (the
// partial last tile, the causal diagonal) first, so later iterations run
// unmasked.
//
// Its parts:
//   load_q_async   Q's tile into shared memory, once (a GQA-packed tile
//                  gathers its rows from several heads);
//   KvRing         a split's ring of K/V tiles in shared memory, requested
//                  kStages - 1 tiles ahead with one barrier per tile (a
//                  paged cache's pages looked up a request ahead:
//                  paged_kv.cuh); a quantized cache's e4m3 tiles, which the
//                  products widen in registers (sm80/warp_gemm_e4m3.cuh);
//   Mainloop       the registers that outlive the loop (O, the softmax
//                  state) and the loop itself; merge_splits() folds the key
//                  splits' partial results into split 0's (key_split.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/element.cuh"
#include "common/fp8.cuh"
#include "common/key_range.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/softcap.cuh"
#include "common/params.h"
#include "fwd/sm80/key_split.cuh"
#include "fwd/sm80/paged_kv.cuh"
#include "fwd/sm80/traits.cuh"
#include "common/tile_coords.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"
#include "sm80/warp_gemm_e4m3.cuh"

namespace flashcore::sm80 {

// Starts copying the query block's kBlockM rows of Q (the first qk_vectors
// vectors of each; rows past valid_rows zero-filled) into smem_q, by the
// CTA's kNumThreads threads. q_heads: the (batch, head group)'s Q. Row r of a
// GQA-packed tile is query (first_query + r) / packed_heads of head
// head_q + that remainder.
template <typename Traits>
__device__ __forceinline__ void load_q_async(typename Traits::Element *smem_q, const FwdKernelParams &p,
                                             const typename Traits::Element *q_heads, int first_query, int valid_rows,
                                             int qk_vectors, int tid) {
    using Element = typename Traits::Element;
    if (p.packed_heads == 1) {
        load_tile_async<Element, Traits::kHeadDim, Traits::kBlockM, Traits::kNumThreads>(
            smem_q, q_heads + first_query * p.q_seq_stride, p.q_seq_stride, valid_rows, qk_vectors, tid);
    } else {
        const FastDivisor packed_heads = p.divisors.packed_heads;
        load_rows_async<Element, Traits::kHeadDim, Traits::kBlockM, Traits::kNumThreads>(
            smem_q, q_heads,
            [&](int row) { return packed_heads.strided(first_query + row, p.q_seq_stride, p.q_head_stride); },
            valid_rows, qk_vectors, tid);
    }
}

// The scales of the raw scores q.k: times score_scale_log2 before exp2,
// times lse_scale for the natural-log LSE, times softcap_prescale before a
// softcap's tanh (FwdKernelParams). A quantized cache's k_descale goes into
// the first two, or with a softcap into the third, whose output the other
// two then scale. Both portable mainloops' (this one's, wide_mainloop.cuh's).
template <typename Traits>
struct ScoreScales {
    __device__ __forceinline__ static float score_scale_log2(const FwdKernelParams &p, float k_descale) {
        if constexpr (Traits::kQuantizedKV) return p.softcap_prescale != 0.f ? p.softmax_scale_log2 : p.softmax_scale_log2 * k_descale;
        return p.softmax_scale_log2;
    }
    __device__ __forceinline__ static float lse_scale(const FwdKernelParams &p, float k_descale) {
        if constexpr (Traits::kQuantizedKV) return p.softcap_prescale != 0.f ? p.softmax_scale : p.softmax_scale * k_descale;
        return p.softmax_scale;
    }
    __device__ __forceinline__ static float softcap_prescale(const FwdKernelParams &p, float k_descale) {
        if constexpr (Traits::kQuantizedKV) return p.softcap_prescale * k_descale;
        return p.softcap_prescale;
    }
};

// A work item's operands, for both portable mainloops: the (batch, head
// group)'s Q (a packed tile's rows gather from its heads), its K/V head's K
// and V, a quantized cache's k_descale of that (batch, K/V head). Returns
// the item's key tiles.
template <typename Traits, bool kRagged, typename Work>
__device__ __forceinline__ int bind_block_operands(const FwdKernelParams &p, const Work &work,
                                                   const typename Traits::Element *&q_heads,
                                                   const typename Traits::ElementKV *&k,
                                                   const typename Traits::ElementKV *&v, float &k_descale) {
    using Element = typename Traits::Element;
    using ElementKV = typename Traits::ElementKV;
    q_heads = static_cast<const Element *>(p.q) + fwd_q_offset(p, work.tile);
    k = static_cast<const ElementKV *>(p.k) + fwd_k_offset<kRagged>(p, work.tile);
    v = static_cast<const ElementKV *>(p.v) + fwd_v_offset<kRagged>(p, work.tile);
    if constexpr (Traits::kQuantizedKV) {
        k_descale = fwd_descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, work.tile.batch,
                                work.tile.head_kv);
    }
    return work.keys.num_blocks();
}

// One key split's K/V tiles streaming through its ring of shared memory:
// its tile j lives in slot j % kStages and is requested kStages - 1
// iterations before it is used, so a whole iteration of compute or more
// hides each load's latency. Every request commits exactly one cp.async
// group (empty past the last tile), which keeps the loop's wait counts
// constant.
//
// The split visits tiles t = split, split + kKeySplits, ... of the block's
// BlockKeyRange (the t-th visited overall is key block keys.n_block(t)).
template <typename Traits, bool kRagged>
struct KvRing {
    using Element = typename Traits::Element;
    using ElementKV = typename Traits::ElementKV;
    using KeyRange = BlockKeyRange<Traits::kBlockM, Traits::kBlockN>;

    const FwdKernelParams &p;
    const KeyRange &keys;
    ElementKV *slots;        // the ring: kStages slots of (K tile, V tile)
    const ElementKV *k, *v;  // the tile's K/V head (in page 0 of a paged cache)
    int batch;
    int seqlen_k;
    int split;
    int split_tid;              // the thread's index within its split
    int num_tiles;              // tiles this split visits
    int qk_vectors, v_vectors;  // vectors of each K and V row that exist; the rest load as zeros
    // A paged cache (kRagged only): the pages of the next request's tile
    // (paged_kv.cuh).
    bool paged;
    TilePages<Traits::kBlockN> &pages;  // looked up before they are read

    __device__ __forceinline__ KvRing(const FwdKernelParams &p_, const KeyRange &keys_, ElementKV *slots_,
                                      const ElementKV *k_, const ElementKV *v_, int batch_, int seqlen_k_, int split_,
                                      int split_tid_, int num_tiles_, int qk_vectors_, int v_vectors_, bool paged_,
                                      TilePages<Traits::kBlockN> &pages_)
        : p(p_),
          keys(keys_),
          slots(slots_),
          k(k_),
          v(v_),
          batch(batch_),
          seqlen_k(seqlen_k_),
          split(split_),
          split_tid(split_tid_),
          num_tiles(num_tiles_),
          qk_vectors(qk_vectors_),
          v_vectors(v_vectors_),
          paged(paged_),
          pages(pages_) {}

    __device__ __forceinline__ int first_key(int j) const {
        return keys.n_block(j * Traits::kKeySplits + split) * Traits::kBlockN;
    }

    // Before the first request: tile 0's pages.
    __device__ __forceinline__ void start() {
        if constexpr (kRagged) {
            if (paged && num_tiles > 0) pages.look_up(p, batch, first_key(0), seqlen_k);
        }
    }

    // Requests tile j (nothing past the last tile), and commits its group.
    __device__ __forceinline__ void request(int j) {
        if (j < num_tiles) {
            const int key = first_key(j);
            ElementKV *slot_k = slots + (j % Traits::kStages) * Traits::kSmemSlotElems;
            if constexpr (kRagged) {
                if (paged) {
                    load_paged_kv_tile<Traits>(p, batch, pages, seqlen_k - key, slot_k, k, v, qk_vectors, v_vectors,
                                               split_tid);
                    if (j + 1 < num_tiles) pages.look_up(p, batch, first_key(j + 1), seqlen_k);
                    cp_async_commit();
                    return;
                }
            }
            load_tile_async<ElementKV, Traits::kHeadDim, Traits::kBlockN, Traits::kThreadsPerSplit>(
                slot_k, k + int64_t(key) * p.k_seq_stride, p.k_seq_stride, seqlen_k - key, qk_vectors, split_tid);
            // V in K's tile (WideTraits::kVInK) has no copy of its own.
            if constexpr (!Traits::kVInK) {
                load_tile_async<ElementKV, Traits::kHeadDimV, Traits::kBlockN, Traits::kThreadsPerSplit>(
                    slot_k + Traits::kSmemKElems, v + int64_t(key) * p.v_seq_stride, p.v_seq_stride, seqlen_k - key,
                    v_vectors, split_tid);
            }
        }
        cp_async_commit();
    }

    // Shared addresses of tile j's K and V (ring_addr: the ring's).
    __device__ __forceinline__ static uint32_t k_address(uint32_t ring_addr, int j) {
        return ring_addr + uint32_t((j % Traits::kStages) * Traits::kSmemSlotBytes);
    }
    __device__ __forceinline__ static uint32_t v_address(uint32_t k_addr) {
        return k_addr + uint32_t(Traits::kSmemKElems * sizeof(ElementKV));
    }
};

// The mainloop of one CTA: bound to the thread's place in the CTA at
// construction, to the CTA's work by bind(), then run(): the block's key
// tiles, after which the key splits' partial results are merged and
// normalised and handed, with their log-sum-exp, to the epilogue.
template <typename Traits, bool kRagged>
struct Mainloop {
    using Element = typename Traits::Element;
    using ElementKV = typename Traits::ElementKV;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    static constexpr int kSplits = Traits::kKeySplits;
    using KeyRange = BlockKeyRange<kBlockM, kBlockN>;
    // O's accumulators: the thread's fragments of its warp's rows.
    using Accumulators = float[Traits::kMAtoms][Traits::kNAtomsO][4];
    using RowValues = float[Traits::kMAtoms * 2];  // one per row of the thread's fragments
    using Softmax = OnlineSoftmax<Traits::kMAtoms>;

    // The thread's place in the CTA: its key split, its warp's band of
    // query rows; Q's tile and the split's K/V ring in shared memory.
    Element *smem_q;
    int tid;
    int lane;
    int split;
    int split_tid;  // within the split
    int warp_first_row;
    ElementKV *smem_kv;  // kStages slots of (K tile, V tile)

    // The work's operands (bind): the (batch, head group)'s Q (a packed
    // tile's rows gather from its heads) and its K/V head's K and V; its key
    // tiles, all splits', and this thread's split's share (run).
    const Element *q_heads;
    const ElementKV *k;
    const ElementKV *v;
    int num_n_blocks;
    int num_split_tiles;
    // A quantized cache's k_descale of the work's (batch, K/V head), which
    // the scores are scaled by (ScoreScales).
    float k_descale;

    // smem: Q's tile, then each split's ring (FwdTraits::kSmemBytes).
    __device__ __forceinline__ explicit Mainloop(unsigned char *smem)
        : smem_q(reinterpret_cast<Element *>(smem)),
          tid(threadIdx.x),
          lane(tid % kWarpSize),
          split(tid / Traits::kThreadsPerSplit),
          split_tid(tid % Traits::kThreadsPerSplit),
          warp_first_row((split_tid / kWarpSize) * Traits::kRowsPerWarp),
          smem_kv(reinterpret_cast<ElementKV *>(smem + Traits::kSmemQBytes + split * Traits::kSmemRingBytes)) {}

    __device__ __forceinline__ float score_scale_log2(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::score_scale_log2(p, k_descale);
    }
    __device__ __forceinline__ float lse_scale(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::lse_scale(p, k_descale);
    }
    __device__ __forceinline__ float softcap_prescale(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::softcap_prescale(p, k_descale);
    }

    // Returns whether the work has key tiles to visit (false: no row of the
    // block sees a key of its part).
    template <typename Work>
    __device__ __forceinline__ bool bind(const FwdKernelParams &p, const Work &work) {
        num_n_blocks = bind_block_operands<Traits, kRagged>(p, work, q_heads, k, v, k_descale);
        return num_n_blocks > 0;
    }

    // The block's key tiles; then finish(acc_o, softmax, row_lse) with O's
    // accumulators and the softmax state of the thread's rows, and room for
    // their log-sum-exp values: the epilogue, which merges the key splits
    // (merge_splits), normalises and stores.
    template <typename Work, typename Finish>
    __device__ __forceinline__ void run(const FwdKernelParams &p, const Work &work, Finish &&finish) {
        const FwdTile &tile = work.tile;
        const int first_query = tile.m_block * kBlockM;
        const KeyMask &mask = work.mask;
        const KeyRange &keys = work.keys;

        // This split visits tiles t = split, split + kSplits, ... (the t-th
        // visited overall is key block keys.n_block(t)); j counts its own
        // tiles.
        const int num_split_tiles = (num_n_blocks - split + kSplits - 1) / kSplits;
        this->num_split_tiles = num_split_tiles;
        // Vectors of each row that exist (the call's head dims may be
        // smaller than the kernel's): the rest load as zeros and are never
        // stored.
        const int q_vectors = p.head_dim / kElemsPerVector<Element>;
        const int qk_vectors = p.head_dim / kElemsPerVector<ElementKV>;
        const int v_vectors = p.head_dim_v / kElemsPerVector<ElementKV>;
        // A paged cache's pages are looked up one request ahead (paged_kv.cuh).
        const bool paged = kRagged && p.block_table != nullptr;
        TilePages<kBlockN> pages;
        KvRing<Traits, kRagged> ring(p, keys, smem_kv, k, v, tile.batch, mask.seqlen_k, split, split_tid,
                                     num_split_tiles, qk_vectors, v_vectors, paged, pages);
        ring.start();

        load_q_async<Traits>(smem_q, p, q_heads, first_query, work.valid_rows, q_vectors, tid);
        cp_async_commit();
#pragma unroll
        for (int j = 0; j < Traits::kStages - 1; ++j) ring.request(j);
        cp_async_wait<Traits::kStages - 1>();  // Q has landed; the K/V tiles may still be in flight
        __syncthreads();

        // A quantized cache's products take Q in their own order (warp_gemm_e4m3.cuh).
        std::conditional_t<Traits::kQuantizedKV, QFragmentsE4m3<Traits>, QFragments<Traits>> q_frag;
        q_frag.init(smem_q, warp_first_row, lane);

        const uint32_t ring_addr = smem_address(smem_kv);
        const QKRowSteps<Traits> k_rows = k_fragment_rows<Traits>(lane);
        const VRowSteps<Traits> v_rows = v_fragment_rows<Traits>(lane);

        // Declared here, not kept as members: where O and the softmax state
        // live decides the order ptxas sees their registers in (and so the
        // kernel's register allocation).
        Accumulators acc_o;
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < Traits::kNAtomsO; ++n) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc_o[m][n][j] = 0.f;
            }
        }
        OnlineSoftmax<Traits::kMAtoms> softmax;
        softmax.init();
        const Softcap softcap{softcap_prescale(p)};
        const float scale_log2 = score_scale_log2(p);

        for (int j = 0; j < num_split_tiles; ++j) {
            const int n_block = keys.n_block(j * kSplits + split);
            // Tile j has landed (only the kStages - 2 newer requests may
            // still be in flight), and every warp of the split is done with
            // tile j - 1, whose slot the next request refills.
            cp_async_wait<Traits::kStages - 2>();
            sync_key_split<Traits>(split);
            ring.request(j + Traits::kStages - 1);

            const uint32_t slot_k_addr = KvRing<Traits, kRagged>::k_address(ring_addr, j);
            const uint32_t slot_v_addr = KvRing<Traits, kRagged>::v_address(slot_k_addr);

            float scores[Traits::kMAtoms][Traits::kNAtomsS][4];
            if constexpr (Traits::kQuantizedKV) {
                gemm_qk_e4m3<Traits>(scores, q_frag, slot_k_addr, lane);
            } else {
                gemm_qk<Traits>(scores, q_frag, slot_k_addr, k_rows);
            }
            // Capped before the mask, whose -inf the cap would turn into -1.
            if (softcap.enabled()) softcap.apply(scores);
            if (keys.needs_mask(n_block)) {
                FragmentKeyMask<Traits::kMAtoms>::of(mask, first_query + warp_first_row, n_block * kBlockN, lane)
                    .apply(scores);
            }
            softmax.update(scores, acc_o, scale_log2);
            if constexpr (Traits::kQuantizedKV) {
                gemm_pv_e4m3<Traits>(acc_o, scores, slot_v_addr, lane);
            } else {
                gemm_pv<Traits>(acc_o, scores, slot_v_addr, v_rows);
            }
        }
        if constexpr (Traits::kQuantizedKV) unpermute_output<Traits>(acc_o, lane);
        // Drain the (empty) trailing requests: the rings are reused after.
        cp_async_wait<0>();

        RowValues row_lse;
        finish(acc_o, softmax, row_lse);
    }

    // With several key splits, folds the other splits' partial results into
    // split 0's threads, which then hold the block's (key_split.cuh). split
    // and split_tid as the thread's, recomputed by the caller.
    __device__ __forceinline__ void merge_splits(Accumulators &acc_o, OnlineSoftmax<Traits::kMAtoms> &softmax,
                                                 unsigned char *smem, int split, int split_tid,
                                                 const FwdKernelParams &p) const {
        if constexpr (kSplits > 1) {
            const int split0_tiles = (num_n_blocks + kSplits - 1) / kSplits;
            merge_key_splits<Traits>(softmax, acc_o, smem + Traits::kSmemQBytes, split, split_tid,
                                     split0_tiles - num_split_tiles, score_scale_log2(p));
        }
    }
};

}  // namespace flashcore::sm80
