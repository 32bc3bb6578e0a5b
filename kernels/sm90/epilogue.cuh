// Writes a consumer warpgroup's finished rows of O through shared memory
// and the TMA unit, and its log-sum-exp values straight from registers.
//
// The accumulator fragments are scattered (each quad of lanes holds 16
// bytes of a row); the warpgroup writes them into a staging buffer in the
// 128-byte swizzled panel layout, conflict-free, and one thread hands the
// whole 64-row block to the TMA unit. The warpgroup goes on to its next
// query block while the store drains, and the TMA unit clips rows past
// seqlen_q.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "mask.cuh"
#include "ptx.cuh"
#include "sm90_ptx.cuh"
#include "sm90_traits.cuh"
#include "tile_scheduler.cuh"

namespace flashcore::sm90 {

// Named barriers of the consumer warpgroups (0 is __syncthreads).
constexpr int kFirstConsumerBarrier = 1;

template <typename Traits>
__device__ __forceinline__ void store_rows(const Sm90KernelParams &params, const FwdTile &tile,
                                           unsigned char *staging, int consumer,
                                           const float (&out)[Traits::kHeadDim / 8][4], const float (&lse)[2],
                                           int wg_tid) {
    constexpr int kChunkBytes = 16;
    constexpr int kChunksPerRow = kPanelRowBytes / kChunkBytes;
    const int lane = wg_tid % 32;
    const int warp_first_row = (wg_tid / 32) * 16;  // within the warpgroup's rows
    const int barrier = kFirstConsumerBarrier + consumer;

    // The previous block's store must be done reading the staging buffer.
    if (wg_tid == 0) bulk_wait_group_read_all();
    named_barrier_sync_id(barrier, kWarpgroupThreads);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_first_row + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
        for (int n = 0; n < Traits::kHeadDim / kMmaN; ++n) {
            // An n8 atom is one 16-byte chunk of a panel row.
            const int panel = n / kChunksPerRow;
            const int chunk = (n % kChunksPerRow) ^ (row % kChunksPerRow);
            const uint32_t offset = panel * Traits::kOPanelBytes + row * kPanelRowBytes + chunk * kChunkBytes +
                                    frag_col(lane) * sizeof(typename Traits::Element);
            *reinterpret_cast<uint32_t *>(staging + offset) =
                pack2<typename Traits::Element>(out[n][half * 2], out[n][half * 2 + 1]);
        }
    }
    fence_shared_to_async_proxy();
    named_barrier_sync_id(barrier, kWarpgroupThreads);

    const int first_row = consumer * Traits::kRowsPerConsumer;  // within the CTA's block
    if (wg_tid == 0) {
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
            tma_store_4d(&params.tma_o, staging + panel * Traits::kOPanelBytes, panel * kPanelCols,
                         tile.m_block * Traits::kBlockM + first_row, tile.head_q, tile.batch);
        }
        bulk_commit_group();
    }
    const OutputBlock<typename Traits::Element> dst = OutputBlock<typename Traits::Element>::of(
        params.fwd, tile, Traits::kBlockM);
    if (dst.lse != nullptr) store_lse(lse, dst.lse, dst.valid_rows, first_row + warp_first_row, lane);
}

}  // namespace flashcore::sm90
