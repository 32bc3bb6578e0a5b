// The producer: one thread of the producer warpgroup issues every TMA copy
// of a CTA. For each query block of its schedule: Q, into a buffer the
// consumers are done with; then the K and V tiles of its BlockKeyRange, last
// key tile first (the order the consumers visit them), each into the next
// free stage of the ring.
#pragma once

#include "common/tile_coords.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace flashcore::sm90 {

// Copies a [rows][kPanels * panel columns] box starting at `row` as kPanels
// panels, all signalled on `bar`.
template <typename Traits, int kPanels>
__device__ __forceinline__ void load_panels(unsigned char *dst, uint32_t panel_bytes, const CUtensorMap *map, int row,
                                            int head, int batch, uint64_t *bar) {
#pragma unroll
    for (int panel = 0; panel < kPanels; ++panel) {
        tma_load_4d(dst + panel * panel_bytes, map, panel * Traits::kPanelCols, row, head, batch, bar);
    }
}

template <typename Traits>
__device__ __forceinline__ void run_producer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe) {
    const FwdKernelParams &p = params.fwd;
    // K/V tiles loaded so far: their stage and phase. Starts where the
    // consumers' count does.
    KvPosition kv_count = Pipeline<Traits>::first_position(params.first_kv_position);
    uint32_t q_count = 0;   // query blocks loaded so far
    PersistentSchedule<Traits::kBlockM, Traits::kBlockN>::of(p).for_each_block(
        p, [&](const FwdTile &tile, const BlockKeyRange<Traits::kBlockM, Traits::kBlockN> &keys, int /*split*/) {
            if (keys.num_blocks() <= 0) return;  // the consumers store it without K/V
            const int q_buffer = Pipeline<Traits>::q_buffer_of(q_count);
            mbarrier_wait(pipe.q_empty(q_buffer), Pipeline<Traits>::q_phase_of(q_count) ^ 1u);
            mbarrier_arrive_expect_tx(pipe.q_full(q_buffer), Traits::kQBytes);
            load_panels<Traits, Traits::kQKPanels>(pipe.q_tile(q_buffer), Traits::kQPanelBytes, &params.tma_q,
                                                   tile.m_block * Traits::kBlockM, tile.head_q, tile.batch,
                                                   pipe.q_full(q_buffer));
            for (int j = 0; j < keys.num_blocks(); ++j, ++kv_count) {
                const int stage = Pipeline<Traits>::stage_of(kv_count);
                const uint32_t free_phase = Pipeline<Traits>::phase_of(kv_count) ^ 1u;
                const int first_key = keys.n_block(j) * Traits::kBlockN;
                mbarrier_wait(pipe.k_empty(stage), free_phase);
                mbarrier_arrive_expect_tx(pipe.k_full(stage), Traits::kKTileBytes);
                load_panels<Traits, Traits::kQKPanels>(pipe.k_tile(stage), Traits::kKVPanelBytes, &params.tma_k,
                                                       first_key, tile.head_kv, tile.batch, pipe.k_full(stage));
                mbarrier_wait(pipe.v_empty(stage), free_phase);
                mbarrier_arrive_expect_tx(pipe.v_full(stage), Traits::kVTileBytes);
                load_panels<Traits, Traits::kVPanels>(pipe.v_tile(stage), Traits::kKVPanelBytes, &params.tma_v,
                                                      first_key, tile.head_kv, tile.batch, pipe.v_full(stage));
            }
            ++q_count;
        });
}

}  // namespace flashcore::sm90
