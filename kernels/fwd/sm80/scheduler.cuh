// The portable kernel's schedule: one CTA per query block and split-KV part,
// nothing persistent. gridDim.x counts the query blocks of every (batch,
// head group), in fwd_tile_for_block's order (common/tile_coords.cuh: blocks of a
// head adjacent, last block first); gridDim.y the parts of each block's keys
// (p.num_splits, BlockKeyRange::split).
#pragma once

#include <cuda_runtime.h>

#include "common/key_range.cuh"
#include "fwd/entry_points.h"
#include "common/params.h"
#include "common/tile_coords.cuh"

namespace flashcore::sm80 {

template <int kBlockM, int kBlockN, bool kRagged>
struct BlockScheduler {
    using KeyRange = BlockKeyRange<kBlockM, kBlockN>;

    // A CTA's work: its query block, which keys its rows see, and the key
    // tiles it visits (its part of them under split-KV; none: no row of the
    // block sees a key of its part, and the CTA only writes that).
    struct Work {
        FwdTile tile;
        int valid_rows;  // of the block: the last block of a sequence may be partial
        KeyMask mask;
        int split;  // the split-KV part
        KeyRange keys;
    };

    // The grid of a call: the dispatcher has checked that the blocks fit
    // gridDim.x; the splits (at most FLASHCORE_MAX_NUM_SPLITS) are gridDim.y.
    static dim3 grid(const FwdKernelParams &p) {
        return dim3(unsigned(fwd_num_blocks(p, kBlockM)), unsigned(p.num_splits));
    }

    __device__ __forceinline__ static Work work(const FwdKernelParams &p) {
        Work w;
        w.tile = fwd_tile_for_block<kRagged>(p, blockIdx.x);
        w.valid_rows = fwd_valid_rows(p, w.tile, kBlockM);
        w.mask = KeyMask::of(p, w.tile.seqs);
        w.split = blockIdx.y;
        w.keys = KeyRange::of(w.mask, w.tile.m_block)
                     .split(w.split, p.divisors.splits, ceil_div(p.split_min_keys, kBlockN));
        return w;
    }

    // The CTA's query block again, from a fresh read of blockIdx.x: for an
    // epilogue, where values kept from the start would live across the
    // mainloop (common/ptx.cuh, opaque_block_index).
    __device__ __forceinline__ static FwdTile tile_again(const FwdKernelParams &p) {
        return fwd_tile_for_block<kRagged>(p, opaque_block_index());
    }
    __device__ __forceinline__ static int split_again() { return blockIdx.y; }
};

}  // namespace flashcore::sm80
