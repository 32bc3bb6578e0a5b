// The producer: one lane of the producer warpgroup's first warp issues
// every TMA copy of a CTA (run_producer). For each query block of its
// schedule: Q, into a buffer the consumers are done with; then the K and V
// tiles of its BlockKeyRange, last key tile first (the order the consumers
// visit them), each into the next free stage of the ring. On e4m3 inputs it also tells the transposing
// warps (v_transpose.cuh) each V tile's valid keys, and when there are no
// more tiles: they need not walk the schedule themselves (which took more
// than the producer warpgroup's 24 registers a thread).
#pragma once

#include "common/tile_coords.cuh"
#include "fwd/sm90/pipeline.cuh"
#include "sm90/ptx.cuh"
#include "sm90/tile_scheduler.cuh"
#include "fwd/sm90/traits.cuh"

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

// The K and V tiles of keys [first_key, first_key + kBlockN) of a paged
// cache: box_rows rows at a time (fwd/sm90/launch.cuh: the largest multiple of 16
// dividing both the page and the tile), each box from its own page. Boxes
// past the batch's keys load page 0's rows instead of reading the table
// past its row; the consumers mask those keys and zero those V rows.
template <typename Traits>
__device__ __forceinline__ void load_paged_panels(unsigned char *dst, const CUtensorMap *map, int panels,
                                                  const FwdKernelParams &p, const FwdTile &tile, int first_key,
                                                  int box_rows, uint64_t *bar) {
    for (int box_key = first_key; box_key < first_key + Traits::kBlockN; box_key += box_rows) {
        const bool valid = box_key < tile.seqs.seqlen_k;
        const int page = valid ? fwd_page_of(p, tile.batch, box_key) : 0;
        const int row = valid ? fwd_page_row(p, box_key) : 0;
        unsigned char *box_dst = dst + (box_key - first_key) * Traits::kPanelRowBytes;
        for (int panel = 0; panel < panels; ++panel) {
            tma_load_4d(box_dst + panel * Traits::kKVPanelBytes, map, panel * Traits::kPanelCols, row, tile.head_kv,
                        page, bar);
        }
    }
}

// The K/V tile of keys from first_key: one box per panel, or by pages.
template <typename Traits, int kPanels, bool kRagged>
__device__ __forceinline__ void load_kv_panels(unsigned char *dst, const CUtensorMap *map, const Sm90KernelParams &params,
                                               const FwdTile &tile, int first_key, uint64_t *bar) {
    const FwdKernelParams &p = params.fwd;
    if (kRagged && p.block_table != nullptr) {
        load_paged_panels<Traits>(dst, map, kPanels, p, tile, first_key, params.kv_box_rows, bar);
    } else {
        load_panels<Traits, kPanels>(dst, Traits::kKVPanelBytes, map, tile.seqs.k_row0 + first_key, tile.head_kv,
                                     kRagged && p.cu_seqlens_k != nullptr ? 0 : tile.batch, bar);
    }
}

// The producer warp: every lane walks the schedule and waits on the
// barriers (the values it keeps are warp-uniform), and the leader lane
// issues the copies and the arrivals. With consumers of 240 registers
// (Traits::kWideConsumers) the producer warpgroup has 24 a thread, which
// the ragged kernel's walk fits only so: its ring positions in one
// register (ProducerRings), the first tile's tail as a flag, and the
// schedule's step counter in shared memory (SharedStep).
template <typename Traits, bool kRagged>
__device__ __forceinline__ void run_producer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe,
                                             bool leader) {
    const FwdKernelParams &p = params.fwd;
    // The next K/V stage and Q buffer, and their phases.
    typename Pipeline<Traits>::ProducerRings rings;
    const auto visit = [&](const FwdTile &tile, const BlockKeyRange<Traits::kBlockM, Traits::kBlockN> &keys,
                           int /*split*/) {
        if (keys.num_blocks() <= 0) return;  // the consumers store it without K/V
        const int q_buffer = rings.q_buffer();
        mbarrier_wait(pipe.q_empty(q_buffer), rings.q_phase() ^ 1u);
        if (leader) {
            mbarrier_arrive_expect_tx(pipe.q_full(q_buffer), Traits::kQBytes);
            // Packed queries (cu_seqlens_q): the map is one batch of all
            // rows; a block's rows past its sequence read the next one's,
            // which nothing stores.
            const int q_batch = kRagged && p.cu_seqlens_q != nullptr ? 0 : tile.batch;
            load_panels<Traits, Traits::kQKPanels>(pipe.q_tile(q_buffer), Traits::kQPanelBytes, &params.tma_q,
                                                   tile.seqs.q_row0 + tile.m_block * Traits::kBlockM, tile.head_q,
                                                   q_batch, pipe.q_full(q_buffer));
        }
        // fp8: whether the transposing warps must zero V rows past the
        // keys. Only a block's first tile (its last keys) can reach past
        // them. A flag worked out before the tile loop: the tile's end held
        // across it spilled the 24 registers.
        const bool first_tile_may_hold_garbage =
            Traits::kFp8 && v_tail_may_hold_garbage<kRagged>(p, tile.seqs, (keys.n_block(0) + 1) * Traits::kBlockN);
        for (int j = 0; j < keys.num_blocks(); ++j, rings.next_kv()) {
            const int stage = rings.kv_stage();
            const uint32_t free_phase = rings.kv_phase() ^ 1u;
            const int first_key = keys.n_block(j) * Traits::kBlockN;
            mbarrier_wait(pipe.k_empty(stage), free_phase);
            if (leader) {
                mbarrier_arrive_expect_tx(pipe.k_full(stage), Traits::kKTileBytes);
                load_kv_panels<Traits, Traits::kQKPanels, kRagged>(pipe.k_tile(stage), &params.tma_k, params, tile,
                                                                   first_key, pipe.k_full(stage));
            }
            mbarrier_wait(pipe.v_empty(stage), free_phase);
            if (leader) {
                if constexpr (Traits::kFp8) {
                    *pipe.v_tile_keys(stage) =
                        j == 0 && first_tile_may_hold_garbage ? tile.seqs.seqlen_k - first_key : Traits::kBlockN;
                }
                mbarrier_arrive_expect_tx(pipe.v_full(stage), Traits::kVTileBytes);
                load_kv_panels<Traits, Traits::kVPanels, kRagged>(pipe.v_tile(stage), &params.tma_v, params, tile,
                                                                  first_key, pipe.v_full(stage));
            }
        }
        rings.next_q();
    };
    if constexpr (Traits::kWideConsumers) {
        // At a fixed shared address: no register holds it.
        static_assert(!Traits::kCompactRaggedSchedule, "the shared-memory walk has no batch search");
        __shared__ int step;
        schedule_of<Traits>(params).template for_each_block<kRagged>(p, visit, SharedStep{&step, leader});
    } else {
        schedule_of<Traits>(params).template for_each_block<kRagged>(p, visit);
    }
    if constexpr (Traits::kFp8) {
        // The transposing warps' end: the next stage, once free, holds no
        // tile (a plain arrival completes v_full's phase).
        const int stage = rings.kv_stage();
        mbarrier_wait(pipe.v_empty(stage), rings.kv_phase() ^ 1u);
        if (leader) {
            *pipe.v_tile_keys(stage) = kNoMoreVTiles;
            mbarrier_arrive(pipe.v_full(stage));
        }
    }
}

}  // namespace flashcore::sm90
