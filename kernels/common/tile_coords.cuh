// Decodes a query block's coordinates: (batch, query head, key/value head,
// query block) from a linear block or pair index.
//
// The portable grid is one-dimensional, so batch * heads is not bounded by
// gridDim.y/z. Blocks of the same (batch, head) are adjacent, so they share
// K/V in L2, and within a head the query blocks run last-to-first: under a
// causal mask the last blocks see the most keys, and starting the longest
// work first evens out the tail of the launch.
#pragma once

#include "common/params.h"
#include "common/fast_divisor.h"
#include "common/key_range.cuh"

namespace flashcore {

struct FwdTile {
    int batch;
    int head_q;
    int head_kv;
    int m_block;
    BatchSeqs seqs;  // the batch's rows and lengths
};

// Query block m_block of the bh-th (batch, head group) pair, groups of a
// batch adjacent. head_q is the group's first query head (the only one
// unless GQA-packed: common/params.h). By divisors the host worked out
// (FwdTileDivisors, common/params.h), which the forward's launches carry.
template <bool kRagged>
__device__ __forceinline__ FwdTile fwd_tile(const FwdKernelParams &p, int bh, int m_block,
                                            const FwdTileDivisors &divisors) {
    FwdTile t;
    t.m_block = m_block;
    const FastDivisor::Division group = divisors.head_groups.divide(bh);
    t.batch = group.quotient;
    t.head_q = group.remainder * p.packed_heads;
    t.head_kv = divisors.query_heads_per_kv.quotient(t.head_q);
    t.seqs = fwd_batch_seqs<kRagged>(p, t.batch);
    return t;
}

// The tile of K/V head head_kv of batch `batch`, whose first query head it
// names (head_q; group: query heads per K/V head): the backward's key
// blocks (bwd/scheduler.cuh), each of a K/V head's keys, walking every
// query head of its group.
template <bool kRagged>
__device__ __forceinline__ FwdTile fwd_kv_head_tile(const FwdKernelParams &p, int batch, int head_kv, int group) {
    FwdTile t;
    t.m_block = 0;
    t.batch = batch;
    t.head_kv = head_kv;
    t.head_q = head_kv * group;
    t.seqs = fwd_batch_seqs<kRagged>(p, batch);
    return t;
}

// The tile of a linear block index of the portable grid (its launch's
// divisors.query_blocks are those of kBlockM-row blocks).
template <bool kRagged>
__device__ __forceinline__ FwdTile fwd_tile_for_block(const FwdKernelParams &p, int linear_block) {
    const FastDivisor::Division head = p.divisors.query_blocks.divide(linear_block);
    return fwd_tile<kRagged>(p, head.quotient, p.divisors.query_blocks.divisor - 1 - head.remainder, p.divisors.tile);
}

// Rows of the tile's query block that exist (the last block of a sequence
// may be partial; <= 0 for blocks past a shorter sequence's end).
__device__ __forceinline__ int fwd_valid_rows(const FwdKernelParams &p, const FwdTile &tile, int block_m) {
    return min(block_m, tile.seqs.seqlen_q * p.packed_heads - tile.m_block * block_m);
}

// Element offsets of the tile's (batch, head) row 0 in q and out, and of its
// K/V head's key 0 (its page 0 row 0 for a paged cache, whose keys are
// found per page: fwd_page_of).
__device__ __forceinline__ int64_t fwd_q_offset(const FwdKernelParams &p, const FwdTile &t) {
    return t.batch * p.q_batch_stride + int64_t(t.seqs.q_row0) * p.q_seq_stride + t.head_q * p.q_head_stride;
}
__device__ __forceinline__ int64_t fwd_out_offset(const FwdKernelParams &p, const FwdTile &t) {
    return t.batch * p.out_batch_stride + int64_t(t.seqs.q_row0) * p.out_seq_stride + t.head_q * p.out_head_stride;
}
__device__ __forceinline__ int64_t fwd_lse_offset(const FwdKernelParams &p, const FwdTile &t) {
    return t.batch * p.lse_batch_stride + t.head_q * p.lse_head_stride + t.seqs.q_row0;
}
template <bool kRagged>
__device__ __forceinline__ int64_t fwd_k_offset(const FwdKernelParams &p, const FwdTile &t) {
    const int64_t batch = kRagged && p.block_table != nullptr ? 0 : t.batch * p.k_batch_stride;
    return batch + int64_t(t.seqs.k_row0) * p.k_seq_stride + t.head_kv * p.k_head_stride;
}
template <bool kRagged>
__device__ __forceinline__ int64_t fwd_v_offset(const FwdKernelParams &p, const FwdTile &t) {
    const int64_t batch = kRagged && p.block_table != nullptr ? 0 : t.batch * p.v_batch_stride;
    return batch + int64_t(t.seqs.k_row0) * p.v_seq_stride + t.head_kv * p.v_head_stride;
}

}  // namespace flashcore
