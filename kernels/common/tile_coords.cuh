// Decodes a query block's coordinates: (batch, query head, key/value head,
// query block) from a linear block or pair index.
//
// The portable grid is one-dimensional, so batch * heads is not bounded by
// gridDim.y/z. Blocks of the same (batch, head) are adjacent, so they share
// K/V in L2, and within a head the query blocks run last-to-first: under a
// causal mask the last blocks see the most keys, and starting the longest
// work first evens out the tail of the launch.
#pragma once

#include "common/fwd_params.h"
#include "common/key_range.cuh"

namespace flashcore {

struct FwdTile {
    int batch;
    int head_q;
    int head_kv;
    int m_block;
};

// Query block m_block of the bh-th (batch, head group) pair, groups of a
// batch adjacent. head_q is the group's first query head (the only one
// unless GQA-packed: fwd_params.h).
__device__ __forceinline__ FwdTile fwd_tile(const FwdKernelParams &p, int bh, int m_block) {
    FwdTile t;
    const int groups = fwd_head_groups(p);
    t.m_block = m_block;
    t.head_q = (bh % groups) * p.packed_heads;
    t.batch = bh / groups;
    t.head_kv = t.head_q / (p.num_heads_q / p.num_heads_kv);
    return t;
}

template <int kBlockM>
__device__ __forceinline__ FwdTile fwd_tile_for_block(const FwdKernelParams &p, int linear_block) {
    const int num_m_blocks = ceil_div(fwd_packed_rows(p), kBlockM);
    return fwd_tile(p, linear_block / num_m_blocks, num_m_blocks - 1 - linear_block % num_m_blocks);
}

// Rows of query block m_block that exist (the last block may be partial).
__device__ __forceinline__ int fwd_valid_rows(const FwdKernelParams &p, int m_block, int block_m) {
    return min(block_m, fwd_packed_rows(p) - m_block * block_m);
}

}  // namespace flashcore
