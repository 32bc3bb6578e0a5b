// The producer warpgroup: one thread (the dealer) walks the CTA's schedule
// and passes its blocks on; another (the producer) issues every TMA copy of
// the CTA.
#pragma once

#include "fwd/tile_coords.cuh"
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
// cache, for the block of ticket t: box_rows rows at a time (fwd_launch.cuh:
// the largest multiple of 16 dividing both the page and the tile), each box
// from its own page. Boxes past the batch's keys load page 0's rows instead
// of reading the table past its row; the consumers mask those keys and zero
// those V rows.
template <typename Traits>
__device__ __forceinline__ void load_paged_panels(unsigned char *dst, const CUtensorMap *map, int panels,
                                                  const FwdKernelParams &p, const TicketRef t,
                                                  int first_key, int box_rows, uint64_t *bar) {
    for (int box_key = first_key; box_key < first_key + Traits::kBlockN; box_key += box_rows) {
        const bool valid = box_key < t.seqlen_k();
        const int page = valid ? fwd_page_of(p, t.batch(), box_key) : 0;
        const int row = valid ? fwd_page_row(p, box_key) : 0;
        unsigned char *box_dst = dst + (box_key - first_key) * Traits::kPanelRowBytes;
        for (int panel = 0; panel < panels; ++panel) {
            tma_load_4d(box_dst + panel * Traits::kKVPanelBytes, map, panel * Traits::kPanelCols, row, t.head_kv(),
                        page, bar);
        }
    }
}

// The K/V tile of keys from first_key of ticket t's block: one box per
// panel, or by pages. The ticket's fields are read where they are used (its
// slot is released after the block's copies), not kept in registers: the
// producer has 24.
template <typename Traits, int kPanels, bool kRagged>
__device__ __forceinline__ void load_kv_panels(unsigned char *dst, const CUtensorMap *map,
                                               const Sm90KernelParams &params, const TicketRef t,
                                               int first_key, uint64_t *bar) {
    if (kRagged && params.fwd.block_table != nullptr) {
        load_paged_panels<Traits>(dst, map, kPanels, params.fwd, t, first_key, params.kv_box_rows, bar);
    } else {
        load_panels<Traits, kPanels>(dst, Traits::kKVPanelBytes, map, t.k_row0() + first_key, t.head_kv(),
                                     t.kv_batch(), bar);
    }
}

// The dealer: one warp walks the CTA's schedule (tile_scheduler.cuh) and
// passes each query block on as a BlockTicket (pipeline.cuh), then a last
// ticket that says there are no more. The producer follows the tickets
// instead of walking the schedule itself: the block arithmetic (run-time
// divisions, a tile counter's answer) stays out of its 24 registers.
// Under the longest-first schedule the dealer takes each next item from the
// tile counter once a ticket slot is free, so a CTA holds at most
// kTicketSlots blocks it has not started, and the consumers learn their
// items from the tickets too.
template <typename Traits, bool kRagged>
__device__ __forceinline__ void deal_blocks(const Sm90KernelParams &params, const Pipeline<Traits> &pipe, int lane) {
    // A whole warp walks the schedule, its values warp-uniform (uniform
    // registers: the warp has 24 vector registers a thread); lane 0 writes.
    const FwdKernelParams &p = params.fwd;
    const bool longest_first = p.tile_counter != nullptr;
    uint32_t dealt = 0;
    const auto wait_free_slot = [&] {
        mbarrier_wait(pipe.ticket_empty(Pipeline<Traits>::ticket_slot(dealt)),
                      Pipeline<Traits>::ticket_phase(dealt) ^ 1u);
    };
    const auto pass = [&](const FwdTile &tile, int n_block_max, int num_blocks, int item) {
        if (lane != 0) {
            ++dealt;
            return;
        }
        // Packed queries (cu_seqlens_q): the map is one batch of all rows; a
        // block's rows past its sequence read the next one's, which nothing
        // stores. Packed keys likewise; a paged cache's rows are found per
        // page (load_paged_panels).
        BlockTicket t;
        t.q_row = tile.seqs.q_row0 + tile.m_block * Traits::kBlockM;
        t.head_q = tile.head_q;
        t.q_batch = kRagged && p.cu_seqlens_q != nullptr ? 0 : tile.batch;
        t.head_kv = tile.head_kv;
        t.k_row0 = tile.seqs.k_row0;
        t.kv_batch = kRagged && p.cu_seqlens_k != nullptr ? 0 : tile.batch;
        t.batch = tile.batch;
        t.seqlen_k = tile.seqs.seqlen_k;
        t.n_block_max = n_block_max;
        t.num_blocks = num_blocks;
        t.item = item;
        t.unused = 0;
        pipe.ticket(Pipeline<Traits>::ticket_slot(dealt)).write(t);
        mbarrier_arrive(pipe.ticket_full(Pipeline<Traits>::ticket_slot(dealt)));  // release: the writes above
        ++dealt;
    };
    const auto schedule = schedule_of<Traits>(params);
    const auto take_item = [&] {
        wait_free_slot();
        int item = 0;
        if (lane == 0) item = int(gridDim.x) + atomicAdd(p.tile_counter, 1);
        return __shfl_sync(0xffffffffu, item, 0);
    };
    schedule.template for_each_block<kRagged>(
        p,
        [&] {
            if (longest_first) wait_free_slot();
            return int(blockIdx.x);
        },
        [&](int item, uint32_t) { return longest_first ? take_item() : item + int(gridDim.x); },
        [&](const FwdTile &tile, const BlockKeyRange<Traits::kBlockM, Traits::kBlockN> &keys, int, int item,
            int which) {
            if (!longest_first || which > 0) wait_free_slot();
            pass(tile, keys.n_block_max, keys.num_blocks(), item);
        });
    if (!longest_first) wait_free_slot();
    pass(FwdTile{}, 0, 0, BlockTicket::kNoMoreBlocks);
}

// The producer's places in its three rings (tickets, Q buffers, K/V
// stages), each counted modulo twice its slots (a slot and a phase bit: the
// 64-bit K/V count of the consumers, pipeline.cuh, starts at a multiple of
// that), packed into one register: the producer has 24.
template <typename Traits>
struct RingPositions {
    uint32_t bits = 0;

    struct Ring {
        int shift;
        int slots;
    };
    static constexpr Ring kTickets{0, Traits::kTicketSlots};
    static constexpr Ring kQ{4, Traits::kQStages};
    static constexpr Ring kKv{8, Traits::kStages};
    static_assert(2 * Traits::kTicketSlots <= 16 && 2 * Traits::kQStages <= 16 && 2 * Traits::kStages <= 16,
                  "four bits a ring");

    __device__ __forceinline__ int position(Ring r) const { return int(bits >> r.shift) & 15; }
    __device__ __forceinline__ int slot(Ring r) const {
        const int v = position(r);
        return v < r.slots ? v : v - r.slots;
    }
    __device__ __forceinline__ uint32_t phase(Ring r) const { return position(r) >= r.slots ? 1u : 0u; }
    __device__ __forceinline__ void advance(Ring r) {
        const int v = position(r) + 1;
        bits = (bits & ~(15u << r.shift)) | (uint32_t(v == 2 * r.slots ? 0 : v) << r.shift);
    }
};

// The producer: for each block the dealer passes on, Q into a buffer the
// consumers are done with, then the K and V tiles of its key blocks, last
// first (the order the consumers visit them), each into the next free stage
// of the ring.
template <typename Traits, bool kRagged>
__device__ __forceinline__ void run_producer(const Sm90KernelParams &params, const Pipeline<Traits> &pipe) {
    using Rings = RingPositions<Traits>;
    Rings at;
    for (;; at.advance(Rings::kTickets)) {
        mbarrier_wait(pipe.ticket_full(at.slot(Rings::kTickets)), at.phase(Rings::kTickets));
        // The ticket's place is found again from `at` where it is read, not
        // kept in a register.
        const auto ticket = [&] { return pipe.ticket(at.slot(Rings::kTickets)); };
        if (ticket().item() < 0) return;
        if (ticket().num_blocks() <= 0) {  // the consumers store it without K/V
            mbarrier_arrive(pipe.ticket_empty(at.slot(Rings::kTickets)));
            continue;
        }
        const int q_buffer = at.slot(Rings::kQ);
        mbarrier_wait(pipe.q_empty(q_buffer), at.phase(Rings::kQ) ^ 1u);
        mbarrier_arrive_expect_tx(pipe.q_full(q_buffer), Traits::kQBytes);
        load_panels<Traits, Traits::kQKPanels>(pipe.q_tile(q_buffer), Traits::kQPanelBytes, &params.tma_q,
                                               ticket().q_row(), ticket().head_q(), ticket().q_batch(),
                                               pipe.q_full(q_buffer));
        for (int j = 0; j < ticket().num_blocks(); ++j, at.advance(Rings::kKv)) {
            const int stage = at.slot(Rings::kKv);
            const uint32_t free_phase = at.phase(Rings::kKv) ^ 1u;
            const int first_key = (ticket().n_block_max() - 1 - j) * Traits::kBlockN;
            mbarrier_wait(pipe.k_empty(stage), free_phase);
            mbarrier_arrive_expect_tx(pipe.k_full(stage), Traits::kKTileBytes);
            load_kv_panels<Traits, Traits::kQKPanels, kRagged>(pipe.k_tile(stage), &params.tma_k, params, ticket(),
                                                               first_key, pipe.k_full(stage));
            mbarrier_wait(pipe.v_empty(stage), free_phase);
            mbarrier_arrive_expect_tx(pipe.v_full(stage), Traits::kVTileBytes);
            load_kv_panels<Traits, Traits::kVPanels, kRagged>(pipe.v_tile(stage), &params.tma_v, params, ticket(),
                                                              first_key, pipe.v_full(stage));
        }
        mbarrier_arrive(pipe.ticket_empty(at.slot(Rings::kTickets)));
        at.advance(Rings::kQ);
    }
}

}  // namespace flashcore::sm90
