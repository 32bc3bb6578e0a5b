// The portable backward kernel's schedule: one CTA per block of kBlockN keys
// of one (batch, K/V head), nothing persistent. The grid is one-dimensional
// (batch * K/V heads is not bounded by gridDim.y), the key blocks of a head
// adjacent. By default in increasing order: under a causal mask the first
// key blocks are seen by the most query blocks, so the longest work starts
// first. In the deterministic mode in decreasing order, the order in which
// the key blocks add into a query block's dQ (mainloop.cuh): each waits
// only for key blocks that were launched before it (no deadlock, whatever
// fits on the GPU at once), and under a causal mask the later key blocks,
// which reach a query block first (they start nearer the diagonal), are the
// ones that add first, so none waits long.
#pragma once

#include <cuda_runtime.h>

#include "bwd/params.h"
#include "bwd/sm80/row_stats.cuh"
#include "common/key_range.cuh"
#include "fwd/tile_coords.cuh"

namespace flashcore::sm80 {

// Key blocks of kBlockN keys per (batch, K/V head): of the longest sequence.
template <int kBlockN>
FLASHCORE_HOST_DEVICE inline int bwd_num_key_blocks(const BwdKernelParams &p) {
    return (p.fwd.seqlen_k + kBlockN - 1) / kBlockN;
}

template <int kBlockM, int kBlockN>
struct KeyBlockScheduler {
    using QueryRange = QueryBlockRange<kBlockM, kBlockN>;

    // A CTA's work: its key block of one (batch, K/V head), and the query
    // blocks whose rows see a key of it (for every query head of the K/V
    // head's group).
    struct Work {
        FwdTile tile;     // batch, head_kv, the first query head of the group, the batch's sequences
        int n_block;
        int valid_keys;   // keys of the block below the batch's seqlen_k (<= 0: past its end)
        // Keys of the block that dk and dv hold rows for: valid_keys, or with
        // seqused_k those below the sequence's full length (its unused keys
        // get gradient 0).
        int stored_keys;
        KeyMask mask;
        QueryRange queries;
    };

    static dim3 grid(const BwdKernelParams &p) {
        return dim3(unsigned(bwd_num_key_blocks<kBlockN>(p) * p.fwd.batch_size * p.fwd.num_heads_kv));
    }

    __device__ __forceinline__ static Work work(const BwdKernelParams &p) {
        Work w;
        const int num_n_blocks = bwd_num_key_blocks<kBlockN>(p);
        const int bh = blockIdx.x / num_n_blocks;
        const int index = int(blockIdx.x % num_n_blocks);
        w.n_block = p.deterministic ? num_n_blocks - 1 - index : index;
        const int group = p.fwd.num_heads_q / p.fwd.num_heads_kv;
        // fwd_tile with packed_heads 1 over query heads: the group's first.
        w.tile = fwd_tile<true>(p.fwd, (bh / p.fwd.num_heads_kv) * p.fwd.num_heads_q + (bh % p.fwd.num_heads_kv) * group, 0);
        w.valid_keys = w.tile.seqs.seqlen_k - w.n_block * kBlockN;
        w.stored_keys = w.valid_keys;
        if (p.fwd.seqused_k != nullptr) {
            int stored_len = p.fwd.seqlen_k, row0 = 0;
            if (p.fwd.cu_seqlens_k != nullptr) {
                packed_rows(p.fwd.cu_seqlens_k, w.tile.batch, p.fwd.total_seqlen_k, p.fwd.seqlen_k, row0, stored_len);
            }
            w.stored_keys = stored_len - w.n_block * kBlockN;
        }
        w.mask = KeyMask::of(p.fwd, w.tile.seqs);
        w.queries = QueryRange::of(w.mask, w.n_block);
        return w;
    }
};

// A CTA's walk over its work, for both paths' main kernels. A step is a
// query block of one query head of the group; steps run over the blocks of
// the group's first head, then its second, ...; advanced by one, without
// dividing.
struct BwdStep {
    int head;
    int m_block;

    template <typename Work>
    __device__ __forceinline__ static BwdStep first(const Work &w) {
        return {w.tile.head_q, w.queries.m_block_min};
    }
    template <typename Work>
    __device__ __forceinline__ BwdStep next(const Work &w) const {
        return m_block + 1 < w.queries.m_block_max ? BwdStep{head, m_block + 1}
                                                   : BwdStep{head + 1, w.queries.m_block_min};
    }
};

template <typename Work>
__device__ __forceinline__ int bwd_num_steps(const BwdKernelParams &p, const Work &w) {
    return w.queries.num_blocks() * (p.fwd.num_heads_q / p.fwd.num_heads_kv);
}

// Whether the work's key block has keys a query sees (false: the CTA
// writes zeros for its keys, or nothing past the sequence's end).
template <typename Work>
__device__ __forceinline__ bool bwd_has_work(const Work &w) {
    return w.valid_keys > 0 && w.queries.num_blocks() > 0;
}

// The deterministic mode, for both paths' main kernels: the key blocks a
// query block sees, [n_block_min, n_block_max) (BlockKeyRange), add their
// dQ to it in decreasing order (the schedule's, above), so the work's key
// block comes at this rank among them; its counter (in dq's scratch words:
// row_stats.cuh) counts the additions made so far.
template <int kBlockM, int kBlockN, typename Work>
__device__ __forceinline__ int bwd_dq_rank(const Work &w, int m_block) {
    return BlockKeyRange<kBlockM, kBlockN>::of(w.mask, m_block).n_block_max - 1 - w.n_block;
}
template <int kBlockM, typename Work>
__device__ __forceinline__ int *bwd_dq_counter(const BwdKernelParams &p, const Work &w, int head, int m_block) {
    return bwd_block_counter(
        bwd_row_stats(p, w.tile.batch, head, int64_t(w.tile.seqs.q_row0) + int64_t(m_block) * kBlockM));
}

}  // namespace flashcore::sm80
