// The producer: one thread of the producer warpgroup issues every TMA copy
// of a CTA. For each query block of its schedule: Q, into a buffer the
// consumers are done with; then the K and V tiles, last key tile
// first (the order the consumers visit them), each into the next free stage
// of the ring.
#pragma once

#include "sm90_pipeline.cuh"
#include "sm90_ptx.cuh"
#include "sm90_tile_scheduler.cuh"
#include "sm90_traits.cuh"
#include "tile_scheduler.cuh"

namespace flashcore::sm90 {

// Copies a [rows][head_dim] box starting at `row` as kPanels panels of 64
// columns, all signalled on `bar`.
template <typename Traits>
__device__ __forceinline__ void load_panels(unsigned char *dst, uint32_t panel_bytes, const CUtensorMap *map, int row,
                                            int head, int batch, uint64_t *bar) {
#pragma unroll
    for (int panel = 0; panel < Traits::kPanels; ++panel) {
        tma_load_4d(dst + panel * panel_bytes, map, panel * kPanelCols, row, head, batch, bar);
    }
}

template <typename Traits>
__device__ __forceinline__ void run_producer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe) {
    const FwdKernelParams &p = params.fwd;
    uint32_t kv_count = 0;  // K/V tiles loaded so far: their stage and phase
    uint32_t q_count = 0;   // query blocks loaded so far
    PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(p).for_each_block(
        p, [&](const FwdTile &tile, int num_n_blocks) {
            if (num_n_blocks <= 0) return;  // the consumers store it without K/V
            const int q_buffer = Pipeline<Traits>::q_buffer_of(q_count);
            mbarrier_wait(pipe.q_empty(q_buffer), Pipeline<Traits>::q_phase_of(q_count) ^ 1u);
            mbarrier_arrive_expect_tx(pipe.q_full(q_buffer), Traits::kQBytes);
            load_panels<Traits>(pipe.q_tile(q_buffer), Traits::kQPanelBytes, &params.tma_q,
                                tile.m_block * Traits::kBlockM, tile.head_q, tile.batch, pipe.q_full(q_buffer));
            for (int j = 0; j < num_n_blocks; ++j, ++kv_count) {
                const int stage = Pipeline<Traits>::stage_of(kv_count);
                const uint32_t free_phase = Pipeline<Traits>::phase_of(kv_count) ^ 1u;
                const int first_key = (num_n_blocks - 1 - j) * Traits::kBlockN;
                mbarrier_wait(pipe.k_empty(stage), free_phase);
                mbarrier_arrive_expect_tx(pipe.k_full(stage), Traits::kKVTileBytes);
                load_panels<Traits>(pipe.k_tile(stage), Traits::kKVPanelBytes, &params.tma_k, first_key,
                                    tile.head_kv, tile.batch, pipe.k_full(stage));
                mbarrier_wait(pipe.v_empty(stage), free_phase);
                mbarrier_arrive_expect_tx(pipe.v_full(stage), Traits::kKVTileBytes);
                load_panels<Traits>(pipe.v_tile(stage), Traits::kKVPanelBytes, &params.tma_v, first_key,
                                    tile.head_kv, tile.batch, pipe.v_full(stage));
            }
            ++q_count;
        });
}

}  // namespace flashcore::sm90
