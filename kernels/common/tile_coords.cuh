// Maps a CTA to its (batch, query head, query block) and to the range of key
// blocks that query block can see.
//
// The grid is one-dimensional so batch * heads is not bounded by gridDim.y/z.
// CTAs of the same (batch, head) are adjacent, so they share K/V in L2, and
// within a head the query blocks run last-to-first: under a causal mask the
// last blocks see the most keys, and starting the longest work first evens
// out the tail of the launch.
#pragma once

#include "fwd_params.h"

namespace flashcore {

struct FwdTile {
    int batch;
    int head_q;
    int head_kv;
    int m_block;
};

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Query block m_block of the bh-th (batch, query head) pair, heads of a
// batch adjacent.
__device__ __forceinline__ FwdTile fwd_tile(const FwdKernelParams &p, int bh, int m_block) {
    FwdTile t;
    t.m_block = m_block;
    t.head_q = bh % p.num_heads_q;
    t.batch = bh / p.num_heads_q;
    t.head_kv = t.head_q / (p.num_heads_q / p.num_heads_kv);
    return t;
}

template <int kBlockM>
__device__ __forceinline__ FwdTile fwd_tile_for_block(const FwdKernelParams &p, int linear_block) {
    const int num_m_blocks = ceil_div(p.seqlen_q, kBlockM);
    return fwd_tile(p, linear_block / num_m_blocks, num_m_blocks - 1 - linear_block % num_m_blocks);
}

// Rows of query block m_block that exist (the last block may be partial).
__device__ __forceinline__ int fwd_valid_rows(const FwdKernelParams &p, int m_block, int block_m) {
    return min(block_m, p.seqlen_q - m_block * block_m);
}

// Key offset of the causal diagonal: query i sees keys j <= i + causal_shift
// (bottom-right alignment, so the last query always sees the last key).
__device__ __forceinline__ int causal_shift(const FwdKernelParams &p) { return p.seqlen_k - p.seqlen_q; }

// Number of key blocks query block m_block must visit: all of them without a
// causal mask, otherwise those left of the diagonal of its last row. May be
// <= 0 when every row of the block sees no key.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int fwd_num_n_blocks(const FwdKernelParams &p, int m_block) {
    const int all = ceil_div(p.seqlen_k, kBlockN);
    if (!p.causal) return all;
    const int last_visible_key_end = (m_block + 1) * kBlockM + causal_shift(p);  // exclusive
    if (last_visible_key_end <= 0) return 0;
    const int causal_blocks = ceil_div(last_visible_key_end, kBlockN);
    return causal_blocks < all ? causal_blocks : all;
}

}  // namespace flashcore
