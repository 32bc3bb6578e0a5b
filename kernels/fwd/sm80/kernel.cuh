// The portable (sm_80+) fused attention forward kernel.
//
// One CTA computes one block of kBlockM query rows of one (batch, head):
//   load Q once; for each key block of its BlockKeyRange
//   (common/key_range.cuh), last to first:
//     S = Q*K^T (tensor cores) -> mask (boundary tiles only) -> online softmax
//     -> O += P*V (tensor cores, P straight from registers)
//   normalise O, write O and the log-sum-exp.
//
// Copies overlap compute: K/V tiles are requested kStages - 1 tiles ahead
// into a ring of shared-memory slots, one barrier per tile. Walking the tiles
// last to first puts the tiles that need masking (the partial last tile, the
// causal diagonal) first, so later iterations run unmasked.
//
// With kKeySplits > 1 the CTA's warp groups take key tiles in turn, each
// with its own ring and barrier, and merge their partial softmax states at
// the end (key_split.cuh).
//
// Split-KV (p.num_splits > 1): blockIdx.y picks the CTA's part of the key
// blocks, and the CTA writes its fp32 rows and LSE to the workspace for the
// merge kernel. GQA-packed tiles (p.packed_heads > 1) gather Q's rows from
// several heads and scatter the results back (common/row_stores.cuh).
#pragma once

#include "fwd/params.h"
#include "common/key_range.cuh"
#include "common/online_softmax.cuh"
#include "common/softcap.cuh"
#include "fwd/output_block.cuh"
#include "fwd/row_stores.cuh"
#include "fwd/tile_coords.cuh"
#include "fwd/sm80/epilogue.cuh"
#include "fwd/sm80/traits.cuh"
#include "fwd/sm80/key_split.cuh"
#include "fwd/sm80/paged_kv.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"

namespace flashcore {

// kRagged: packed and paged tensors (fwd_params.h, fwd_batch_seqs).
template <typename Traits, bool kRagged>
__global__ void __launch_bounds__(Traits::kNumThreads) __maxnreg__(Traits::kMaxRegisters) flash_fwd_kernel(const __grid_constant__ FwdKernelParams p) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kSplits = Traits::kKeySplits;

    // A split call's merge kernel may launch as soon as every CTA is running
    // (it waits for this grid's results itself): common/ptx.cuh.
    launch_dependent_grids();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Element *smem_q = reinterpret_cast<Element *>(smem_raw);

    const int tid = threadIdx.x;
    const int lane = tid % kWarpSize;
    const int split = tid / Traits::kThreadsPerSplit;
    const int split_tid = tid % Traits::kThreadsPerSplit;
    const int warp_first_row = (split_tid / kWarpSize) * Traits::kRowsPerWarp;
    // This split's K/V ring: kStages slots of (K tile, V tile).
    Element *smem_kv = reinterpret_cast<Element *>(smem_raw + Traits::kSmemQBytes + split * Traits::kSmemRingBytes);

    const FwdTile tile = fwd_tile_for_block<kBlockM, kRagged>(p, blockIdx.x);
    const int first_query = tile.m_block * kBlockM;
    const int valid_rows = fwd_valid_rows(p, tile, kBlockM);
    const KeyMask mask = KeyMask::of(p, tile.seqs);
    const int kv_split = blockIdx.y;
    const BlockKeyRange<kBlockM, kBlockN> keys =
        BlockKeyRange<kBlockM, kBlockN>::of(mask, tile.m_block).split(kv_split, p.num_splits);

    // The (batch, head group)'s Q; a packed tile's rows gather from its heads.
    const Element *q_heads = static_cast<const Element *>(p.q) + fwd_q_offset(p, tile);
    const Element *k = static_cast<const Element *>(p.k) + fwd_k_offset<kRagged>(p, tile);
    const Element *v = static_cast<const Element *>(p.v) + fwd_v_offset<kRagged>(p, tile);

    const int num_n_blocks = keys.num_blocks();
    if (num_n_blocks <= 0) {
        if (p.num_splits > 1) {
            store_empty_rows(split_destination(p, tile, kBlockM, kv_split), p.head_dim_v, tid, Traits::kNumThreads);
        } else if (p.packed_heads > 1) {
            store_empty_rows(output_destination<Element>(p, tile, kBlockM), p.head_dim_v, tid, Traits::kNumThreads);
        } else {
            store_empty_block(OutputBlock<Element>::of(p, tile, kBlockM), p.out_seq_stride, p.head_dim_v, tid,
                              Traits::kNumThreads);
        }
        return;
    }
    // This split visits tiles t = split, split + kSplits, ... (the t-th
    // visited overall is key block keys.n_block(t)); j counts its own tiles.
    const int num_split_tiles = (num_n_blocks - split + kSplits - 1) / kSplits;
    // Vectors of each row that exist (the call's head dims may be smaller
    // than the kernel's): the rest load as zeros and are never stored.
    const int qk_vectors = p.head_dim / kElemsPerVector;
    const int v_vectors = p.head_dim_v / kElemsPerVector;

    // K and V tiles stream through the split's ring: its tile j lives in slot
    // j % kStages and is requested kStages - 1 iterations before it is used,
    // so a whole iteration of compute or more hides each load's latency.
    // Every request commits exactly one cp.async group (empty past the last
    // tile), which keeps the wait counts below constant.
    //
    // A paged cache's tiles: their pages are looked up one request ahead
    // (paged_kv.cuh), `pages` holding those of the next request's tile.
    const bool paged = kRagged && p.block_table != nullptr;
    const auto split_first_key = [&](int j) { return keys.n_block(j * kSplits + split) * kBlockN; };
    TilePages<kBlockN> pages;
    if (paged && num_split_tiles > 0) pages.look_up(p, tile.batch, split_first_key(0), mask.seqlen_k);
    const auto load_kv_tile = [&](int j) {
        if (j < num_split_tiles) {
            const int first_key = split_first_key(j);
            Element *slot_k = smem_kv + (j % Traits::kStages) * Traits::kSmemSlotElems;
            if (paged) {
                load_paged_kv_tile<Traits>(p, tile.batch, pages, mask.seqlen_k - first_key, slot_k, k, v, qk_vectors,
                                           v_vectors, split_tid);
                if (j + 1 < num_split_tiles) pages.look_up(p, tile.batch, split_first_key(j + 1), mask.seqlen_k);
                cp_async_commit();
                return;
            }
            load_tile_async<Element, Traits::kHeadDim, kBlockN, Traits::kThreadsPerSplit>(
                slot_k, k + int64_t(first_key) * p.k_seq_stride, p.k_seq_stride, mask.seqlen_k - first_key, qk_vectors,
                split_tid);
            load_tile_async<Element, Traits::kHeadDimV, kBlockN, Traits::kThreadsPerSplit>(
                slot_k + Traits::kSmemKElems, v + int64_t(first_key) * p.v_seq_stride, p.v_seq_stride,
                mask.seqlen_k - first_key, v_vectors, split_tid);
        }
        cp_async_commit();
    };

    if (p.packed_heads == 1) {
        load_tile_async<Element, Traits::kHeadDim, kBlockM, Traits::kNumThreads>(
            smem_q, q_heads + first_query * p.q_seq_stride, p.q_seq_stride, valid_rows, qk_vectors, tid);
    } else {
        const int packed_heads = p.packed_heads;
        load_rows_async<Element, Traits::kHeadDim, kBlockM, Traits::kNumThreads>(
            smem_q, q_heads,
            [&](int row) {
                const int r = first_query + row;
                return int64_t(r / packed_heads) * p.q_seq_stride + int64_t(r % packed_heads) * p.q_head_stride;
            },
            valid_rows, qk_vectors, tid);
    }
    cp_async_commit();
#pragma unroll
    for (int j = 0; j < Traits::kStages - 1; ++j) load_kv_tile(j);
    cp_async_wait<Traits::kStages - 1>();  // Q has landed; the K/V tiles may still be in flight
    __syncthreads();

    QFragments<Traits> q_frag;
    q_frag.init(smem_q, warp_first_row, lane);

    const uint32_t smem_kv_addr = smem_address(smem_kv);
    const SwizzledRowSteps<Traits::kHeadDim> k_rows = k_fragment_rows<Traits>(lane);
    const SwizzledRowSteps<Traits::kHeadDimV> v_rows = v_fragment_rows<Traits>(lane);

    float acc_o[Traits::kMAtoms][Traits::kNAtomsO][4];
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
    const Softcap softcap{p.softcap_prescale};

    for (int j = 0; j < num_split_tiles; ++j) {
        const int n_block = keys.n_block(j * kSplits + split);
        // Tile j has landed (only the kStages - 2 newer requests may still be
        // in flight), and every warp of the split is done with tile j - 1,
        // whose slot the next request refills.
        cp_async_wait<Traits::kStages - 2>();
        sync_key_split<Traits>(split);
        load_kv_tile(j + Traits::kStages - 1);

        const uint32_t slot_k_addr =
            smem_kv_addr + uint32_t((j % Traits::kStages) * Traits::kSmemSlotElems * sizeof(Element));
        const uint32_t slot_v_addr = slot_k_addr + uint32_t(Traits::kSmemKElems * sizeof(Element));

        float scores[Traits::kMAtoms][Traits::kNAtomsS][4];
        gemm_qk<Traits>(scores, q_frag, slot_k_addr, k_rows);
        // Capped before the mask, whose -inf the cap would turn into -1.
        if (softcap.enabled()) softcap.apply(scores);
        if (keys.needs_mask(n_block)) {
            FragmentKeyMask<Traits::kMAtoms>::of(mask, first_query + warp_first_row, n_block * kBlockN, lane)
                .apply(scores);
        }
        softmax.update(scores, acc_o, p.softmax_scale_log2);
        gemm_pv<Traits>(acc_o, scores, slot_v_addr, v_rows);
    }
    // Drain the (empty) trailing requests: the rings are reused below.
    cp_async_wait<0>();

    // Recomputed rather than kept: values live across the tile loop but used
    // only here would take registers the loop needs (ptxas spills them).
    const int epi_tid = opaque_thread_index();
    const int epi_split = epi_tid / Traits::kThreadsPerSplit;
    const int epi_lane = epi_tid % kWarpSize;
    const int epi_warp_first_row = ((epi_tid % Traits::kThreadsPerSplit) / kWarpSize) * Traits::kRowsPerWarp;
    if constexpr (kSplits > 1) {
        const int split0_tiles = (num_n_blocks + kSplits - 1) / kSplits;
        merge_key_splits<Traits>(softmax, acc_o, smem_raw + Traits::kSmemQBytes, epi_split,
                                 epi_tid % Traits::kThreadsPerSplit, split0_tiles - num_split_tiles,
                                 p.softmax_scale_log2);
    }

    float row_lse[Traits::kMAtoms * 2];
    softmax.finalize(acc_o, p.softmax_scale, row_lse);
    const FwdTile epi_tile = fwd_tile_for_block<kBlockM, kRagged>(p, opaque_block_index());
    // After a merge only split 0 holds the result.
    const bool holds_result = epi_split == 0;
    if (p.num_splits > 1 || p.packed_heads > 1) {
        if (!holds_result) return;
        if (p.num_splits > 1) {
            store_fragment_rows(split_destination(p, epi_tile, kBlockM, blockIdx.y), acc_o, row_lse,
                                epi_warp_first_row, epi_lane, p.head_dim_v);
        } else {
            store_fragment_rows(output_destination<Element>(p, epi_tile, kBlockM), acc_o, row_lse,
                                epi_warp_first_row, epi_lane, p.head_dim_v);
        }
        return;
    }
    const OutputBlock<Element> dst = OutputBlock<Element>::of(p, epi_tile, kBlockM);
    if (holds_result && dst.lse != nullptr) {
        store_lse(row_lse, dst.lse, dst.valid_rows, epi_warp_first_row, epi_lane);
    }
    // Each warp of split 0 reuses only its own rows of Q's shared memory for
    // the output tile; every warp that read those rows is past the last
    // barrier of the tile loop (the merge) or is the writer itself.
    store_output<Traits>(acc_o, holds_result, smem_q, dst.out, p.out_seq_stride, dst.valid_rows,
                         p.head_dim_v / kElemsPerVector, epi_warp_first_row, epi_lane, epi_tid);
}

}  // namespace flashcore
