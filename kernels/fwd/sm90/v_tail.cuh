// Zeroes the rows of a V tile past a batch's keys, where TMA cannot.
//
// With seqused_k a batch attends to fewer keys than k and v hold (a KV
// cache's unused tail, which may hold anything, NaN included). The tensor
// map covers the whole cache, so the batch's last key tile loads those rows
// as they are. Their probabilities are 0, but in P*V a 0 times NaN or
// infinity is NaN: the rows must be zero in shared memory before the
// product (rows past seqlen_k itself already arrive as zeros). K needs
// nothing: the softmax selects, never multiplies, masked scores.
//
// Tiles are visited right to left, so only a block's first tile can hold
// such rows. Every consumer warpgroup reads every row of it, so they share
// the zeroing and meet at a named barrier.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "sm90/ptx.cuh"
#include "fwd/sm90/traits.cuh"

namespace flashcore::sm90 {

// Rows [first_row, kBlockN) of each panel of the V tile at `v_tile`, zeroed
// by the kConsumerWarpgroups * kWarpgroupThreads consumer threads (tid is
// the thread's index among them). The tile must have landed. A whole panel
// row is one swizzle line, so rows are cleared without unswizzling.
template <typename Traits>
__device__ __forceinline__ void zero_v_rows(unsigned char *v_tile, int first_row, int tid) {
    constexpr int kChunkBytes = 16;
    constexpr int kChunksPerRow = Traits::kPanelRowBytes / kChunkBytes;
    constexpr int kThreads = Traits::kConsumerWarpgroups * kWarpgroupThreads;
    // Every chunk of the tile in turn, so that all the index arithmetic is
    // by constants: this runs inside the mainloop's register budget.
    constexpr int kChunks = Traits::kVPanels * Traits::kBlockN * kChunksPerRow;
    constexpr int kPasses = (kChunks + kThreads - 1) / kThreads;
    // A loop, not unrolled: the fewest registers (a rare path).
#pragma unroll 1
    for (int pass = 0; pass < kPasses; ++pass) {
        const int i = pass * kThreads + tid;
        if (i < kChunks && (i / kChunksPerRow) % Traits::kBlockN >= first_row) {
            // Rows of a panel are consecutive, panels follow one another.
            *reinterpret_cast<uint4 *>(v_tile + i * kChunkBytes) = make_uint4(0, 0, 0, 0);
        }
    }
    // The zeros must be visible to wgmma (the async proxy) in every
    // consumer before any issues the product.
    fence_shared_to_async_proxy();
    named_barrier_sync_id(kAllConsumersBarrier, kThreads);
}

}  // namespace flashcore::sm90
