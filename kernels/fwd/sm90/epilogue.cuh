// Writes a consumer warpgroup's finished rows of a plain block (a split-KV
// part's rows go to the workspace straight from the fragments: consumer.cuh,
// fwd/output_destination.cuh): O by the kernel's output path, then the
// log-sum-exp values straight from registers.
//
// OutputPath::kTmaStore: the accumulator fragments are scattered (each quad
// of lanes holds 16 bytes of a row); the warpgroup writes them into a
// staging buffer in the swizzled panel layout, conflict-free, and one thread
// hands the whole 64-row block to the TMA unit. The warpgroup goes on to its
// next query block while the store drains, and the TMA unit clips rows past
// seqlen_q and columns past head_dim_v.
// Packed queries (cu_seqlens_q) take the staging buffer too, but the
// warpgroup copies it out row by row: a TMA box would also write the rows of
// the next sequence that follow a short block.
// OutputPath::kRegisters: each thread stores its own 4-byte pieces of rows
// (store_fragment_rows), where shared memory has no room for staging (head
// dims 192 and 256).
#pragma once

#include <cstdint>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "fwd/output_destination.cuh"
#include "fwd/sm90/traits.cuh"
#include "common/tile_coords.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// The warpgroup's staged rows (stage_and_store_rows) to the block's rows of
// out, 16 bytes per thread and step, within its valid rows and head_dim_v.
template <typename Traits>
__device__ __forceinline__ void copy_staged_rows(const FwdKernelParams &p,
                                                 const PlainBlock<typename Traits::ElementOut> &block,
                                                 const unsigned char *staging, int consumer, int wg_tid) {
    constexpr int kElems = kElemsPerVector<typename Traits::ElementOut>;
    constexpr int kChunksPerRow = Traits::kHeadDimV / kElems;
    constexpr int kAtomsPerPanel = Traits::kOutPanelCols / kElems;
    const BlockRows<typename Traits::ElementOut> dst = block.rows();
    const int first_row = consumer * Traits::kRowsPerConsumer;
    const int valid_rows = dst.valid_rows - first_row;
    const int valid_chunks = p.head_dim_v / kElems;
    for (int i = wg_tid; i < Traits::kRowsPerConsumer * kChunksPerRow; i += kWarpgroupThreads) {
        const int row = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        if (row >= valid_rows || chunk >= valid_chunks) continue;
        const uint4 value = *reinterpret_cast<const uint4 *>(staging + (chunk / kAtomsPerPanel) * Traits::kOPanelBytes +
                                                             Traits::OutSwizzle::offset(row, chunk % kAtomsPerPanel));
        *reinterpret_cast<uint4 *>(dst.out + dst.out_offset(first_row + row) + chunk * kElems) = value;
    }
}

template <typename Traits, bool kRagged>
__device__ __forceinline__ void stage_and_store_rows(const Sm90KernelParams &params, const FwdTile &tile,
                                                     const PlainBlock<typename Traits::ElementOut> &block,
                                                     unsigned char *staging, int consumer,
                                                     const float (&out)[Traits::kHeadDimV / 8][4], int wg_tid) {
    using Swizzle = typename Traits::OutSwizzle;
    using ElementOut = typename Traits::ElementOut;
    constexpr int kChunkBytes = int(kVectorBytes);
    constexpr int kAtomsPerPanel = Traits::kOutPanelCols / kMmaN;  // an n8 atom is one 16-byte chunk of a row
    const int lane = wg_tid % 32;
    const int warp_first_row = (wg_tid / 32) * kMmaM;  // within the warpgroup's rows
    const int barrier = kFirstConsumerBarrier + consumer;

    // The previous block's store must be done reading the staging buffer.
    if (wg_tid == 0) bulk_wait_group_read_all();
    named_barrier_sync_id(barrier, kWarpgroupThreads);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_first_row + frag_row(lane) + half * kFragRowHalf;
#pragma unroll
        for (int n = 0; n < Traits::kHeadDimV / kMmaN; ++n) {
            const uint32_t offset = (n / kAtomsPerPanel) * Traits::kOPanelBytes +
                                    Swizzle::offset(row, n % kAtomsPerPanel) + frag_col(lane) * sizeof(ElementOut);
            static_assert(kChunkBytes == kMmaN * sizeof(ElementOut), "one n8 atom per chunk");
            *reinterpret_cast<uint32_t *>(staging + offset) = pack2<ElementOut>(out[n][half * 2], out[n][half * 2 + 1]);
        }
    }
    fence_shared_to_async_proxy();
    named_barrier_sync_id(barrier, kWarpgroupThreads);

    if (kRagged && params.fwd.cu_seqlens_q != nullptr) {
        copy_staged_rows<Traits>(params.fwd, block, staging, consumer, wg_tid);
        return;
    }
    if (wg_tid == 0) {
        const int first_row = consumer * Traits::kRowsPerConsumer;  // within the CTA's block
#pragma unroll
        for (int panel = 0; panel < Traits::kOutPanels; ++panel) {
            tma_store_4d(&params.tma_o, staging + panel * Traits::kOPanelBytes, panel * Traits::kOutPanelCols,
                         tile.m_block * Traits::kBlockM + first_row, tile.head_q, tile.batch);
        }
        bulk_commit_group();
    }
}

// The consumer's rows of a finished plain block: O by the kernel's output
// path, then the LSE.
template <typename Traits, bool kRagged>
__device__ __forceinline__ void store_rows(const Sm90KernelParams &params, const FwdTile &tile,
                                           const PlainBlock<typename Traits::ElementOut> &block, unsigned char *staging,
                                           int consumer, const float (&out)[1][Traits::kHeadDimV / 8][4],
                                           const float (&lse)[2], int wg_tid) {
    if constexpr (Traits::kOutputPath == OutputPath::kTmaStore) {
        stage_and_store_rows<Traits, kRagged>(params, tile, block, staging, consumer, out[0], wg_tid);
        const BlockRows<typename Traits::ElementOut> dst = block.rows();
        const int warp_first_row = consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * kMmaM;
        if (dst.lse != nullptr) store_fragment_lse(dst.lse, dst.valid_rows, lse, warp_first_row, wg_tid % 32);
    } else {
        store_fragment_rows(block, out, lse, consumer * Traits::kRowsPerConsumer + (wg_tid / 32) * kMmaM, wg_tid % 32,
                            params.fwd);
    }
}

}  // namespace flashcore::sm90
