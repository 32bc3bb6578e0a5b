// The portable backward kernel's schedule: one CTA per block of kBlockN keys
// of one (batch, K/V head), nothing persistent. The grid is one-dimensional
// (batch * K/V heads is not bounded by gridDim.y), the key blocks of a head
// adjacent. By default in increasing order: under a causal mask the first
// key blocks are seen by the most query blocks, so the longest work starts
// first.
//
// The deterministic mode adds each query block's dQ from its key blocks in
// a fixed order, each key block waiting for the ones before it (a counter
// per query block: bwd_dq_rank). By default the order is decreasing key
// blocks, and so is the launch: each waits only for key blocks that were
// launched before it (no deadlock, whatever fits on the GPU at once), and
// under a causal mask the later key blocks, which reach a query block
// first (they start nearer the diagonal), are the ones that add first, so
// none waits long.
//
// Where every query sees every key, every key block's walk would reach
// query block 0 at once and queue there, each behind the one before. So
// where a head's key blocks also fit on the GPU at once (at most half the
// SMs: BwdKernelParams::rotated_walk, passes.cuh's
// kDeterministicCallsAtOnce), each starts its walk at its own place, kRotatedWalkStagger steps after the one below it
// (bwd_walk_start), goes round, and adds in the order the walks reach a
// query block (bwd_rotated_rank): every few steps one, none waiting. Any
// of them may then wait for any other, which needs them all on the GPU at
// once; the launch keeps the default order.
#pragma once

#include <cuda_runtime.h>

#include "bwd/params.h"
#include "bwd/row_stats.cuh"
#include "common/key_range.cuh"
#include "common/tile_coords.cuh"

namespace flashcore::sm80 {

// Key blocks of kBlockN keys per (batch, K/V head): of the longest sequence.
template <int kBlockN>
FLASHCORE_HOST_DEVICE inline int bwd_num_key_blocks(const BwdKernelParams &p) {
    return (p.fwd.seqlen_k + kBlockN - 1) / kBlockN;
}

// The rotated walk (KeyBlockScheduler). A walk has T steps (the query blocks
// of every query head of the group) and the batch N key blocks. Key block
// n starts at step floor(n * S / N), where the span S is T or, if shorter,
// kRotatedWalkStagger steps per key block: the starts increase with n and
// are at most a few steps apart, so the walks stay near each other (the Q
// and dO blocks they read stay in L2). S * N is below 2^31 (the host's
// condition for the walk).
constexpr int kRotatedWalkStagger = 2;
__host__ __device__ inline int bwd_walk_span(int num_steps, int num_key_blocks) {
    return num_steps / kRotatedWalkStagger < num_key_blocks ? num_steps : num_key_blocks * kRotatedWalkStagger;
}
__host__ __device__ inline int bwd_walk_start(int num_steps, int num_key_blocks, int n_block) {
    return int(unsigned(n_block) * unsigned(bwd_walk_span(num_steps, num_key_blocks)) / unsigned(num_key_blocks));
}
// Whether the sm90 dQ writer may release a rotated walk's counts two steps
// at once (the first step's count held until the second's reduction has
// landed): where the walk has more steps than there are key blocks. A key
// block waits for the one that reached the query block before it, whose
// count comes at the latest with its next step's; so a wait at step t is
// for a release at step t only where that walk started one place after
// this one's, and a circle of such waits needs as many walks as places.
// (In the launch order each waits only for key blocks launched before it,
// held counts or not.)
__host__ __device__ inline bool bwd_rotated_walk_releases_in_pairs(int num_steps, int num_key_blocks) {
    return num_steps > num_key_blocks;
}
// The key blocks' order of addition into the query block at step `place` of
// the walk: the order in which their walks reach it. The first is the last
// key block that starts at or before it, n0 = max{n : start(n) <= place};
// the others follow as they started earlier, down to 0, then from N - 1
// down to n0 + 1 (the walks that reach it after going round). So key
// block n's rank is (n0 - n) mod N. start(n) <= place iff n * S < (place +
// 1) * N, so n0 = ((place + 1) * N - 1) / S, at most N - 1.
__host__ __device__ inline int bwd_rotated_rank(int num_steps, int num_key_blocks, int n_block, int place) {
    const int span = bwd_walk_span(num_steps, num_key_blocks);
    const int last_start = span - 1 < place ? span - 1 : place;  // places past the span: as its last
    const unsigned first = (unsigned(last_start + 1) * unsigned(num_key_blocks) - 1u) / unsigned(span);
    const int n0 = int(first) < num_key_blocks ? int(first) : num_key_blocks - 1;
    return n0 >= n_block ? n0 - n_block : n0 - n_block + num_key_blocks;
}

// A work's walk: its steps (each a query block of one query head of the
// group), and the batch's key blocks.
template <typename Work>
__device__ __forceinline__ int bwd_walk_steps(const Work &w) {
    return w.queries.num_blocks() * (w.end_head - w.tile.head_q);
}
template <int kBlockN, typename Work>
__device__ __forceinline__ int bwd_batch_key_blocks(const Work &w) {
    return ceil_div(w.mask.seqlen_k, kBlockN);
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
        // One past the group's last query head.
        int end_head;
        // The walk's first step, as a place in it (BwdStep): 0, or with a
        // rotated walk the key block's own (bwd_walk_start).
        int walk_start;
    };

    static dim3 grid(const BwdKernelParams &p) {
        return dim3(unsigned(bwd_num_key_blocks<kBlockN>(p) * p.fwd.batch_size * p.fwd.num_heads_kv));
    }

    __device__ __forceinline__ static Work work(const BwdKernelParams &p) {
        Work w;
        const int num_n_blocks = bwd_num_key_blocks<kBlockN>(p);
        const int bh = blockIdx.x / num_n_blocks;
        const int index = int(blockIdx.x % num_n_blocks);
        w.n_block = p.deterministic && !p.rotated_walk ? num_n_blocks - 1 - index : index;
        const int group = p.fwd.num_heads_q / p.fwd.num_heads_kv;
        w.tile = fwd_kv_head_tile<true>(p.fwd, bh / p.fwd.num_heads_kv, bh % p.fwd.num_heads_kv, group);
        w.valid_keys = w.tile.seqs.seqlen_k - w.n_block * kBlockN;
        w.stored_keys = w.valid_keys;
        if (p.fwd.seqused_k != nullptr) {
            int stored_len = p.fwd.seqlen_k, row0 = 0;
            if (p.fwd.cu_seqlens_k != nullptr) {
                packed_rows(p.fwd.cu_seqlens_k, w.tile.batch, p.fwd.total_seqlen_k, p.fwd.seqlen_k, row0, stored_len);
            }
            w.stored_keys = stored_len - w.n_block * kBlockN;
        }
        w.mask = KeyMask::of_unpacked(p.fwd, w.tile.seqs);
        w.queries = QueryRange::of(w.mask, w.n_block);
        w.end_head = w.tile.head_q + group;
        w.walk_start = 0;
        if (p.rotated_walk && w.valid_keys > 0 && w.queries.num_blocks() > 0) {
            w.walk_start = bwd_walk_start(bwd_walk_steps(w), bwd_batch_key_blocks<kBlockN>(w), w.n_block);
        }
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
        if (w.walk_start == 0) return {w.tile.head_q, w.queries.m_block_min};
        const int blocks = w.queries.num_blocks();
        return {w.tile.head_q + w.walk_start / blocks, w.queries.m_block_min + w.walk_start % blocks};
    }
    // After the group's last query block, a rotated walk goes round to its
    // first.
    template <typename Work>
    __device__ __forceinline__ BwdStep next(const Work &w) const {
        if (m_block + 1 < w.queries.m_block_max) return BwdStep{head, m_block + 1};
        return BwdStep{head + 1 < w.end_head ? head + 1 : w.tile.head_q, w.queries.m_block_min};
    }
    // The step's place in the walk from the group's first query block.
    template <typename Work>
    __device__ __forceinline__ int place(const Work &w) const {
        return (head - w.tile.head_q) * w.queries.num_blocks() + (m_block - w.queries.m_block_min);
    }
};

// Whether the work's key block has keys a query sees (false: the CTA
// writes zeros for its keys, or nothing past the sequence's end).
template <typename Work>
__device__ __forceinline__ bool bwd_has_work(const Work &w) {
    return w.valid_keys > 0 && w.queries.num_blocks() > 0;
}

// The deterministic mode, for both paths' main kernels: the work's key
// block's rank among those that add their dQ to the step's query block
// (the order above: of a rotated walk, bwd_rotated_rank; otherwise the
// key blocks it sees, [n_block_min, n_block_max) of BlockKeyRange, in
// decreasing order). Its counter (in dq's scratch words: row_stats.cuh)
// counts the additions made so far.
template <typename Traits, typename Work>
__device__ __forceinline__ int bwd_dq_rank(const BwdKernelParams &p, const Work &w, const BwdStep &step) {
    constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
    if (Traits::kRotatedWalk && p.rotated_walk) {
        return bwd_rotated_rank(bwd_walk_steps(w), bwd_batch_key_blocks<kBlockN>(w), w.n_block, step.place(w));
    }
    // BlockKeyRange's n_block_max of the step's query block: the walk visits
    // it, so its rows see a key and that is its last row's key_end over
    // kBlockN, without the first row's key_begin that BlockKeyRange checks
    // it against (with chunks, arithmetic the Hopper dQ writer's 24
    // registers do not hold beside the rest: it spilled at head dim 128).
    const int last_row = min((step.m_block + 1) * kBlockM, w.mask.num_rows()) - 1;
    return ceil_div(w.mask.key_end(last_row), kBlockN) - 1 - w.n_block;
}
template <int kBlockM, typename Work>
__device__ __forceinline__ int *bwd_dq_counter(const BwdKernelParams &p, const Work &w, int head, int m_block) {
    return bwd_block_counter(
        bwd_row_stats(p, w.tile.batch, head, int64_t(w.tile.seqs.q_row0) + int64_t(m_block) * kBlockM));
}

}  // namespace flashcore::sm80
