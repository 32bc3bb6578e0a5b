// The persistent tile schedule of the sm90 kernel.
//
// The grid holds at most one CTA per SM, and CTA c takes work items c,
// c + gridDim.x, c + 2 * gridDim.x, ... The producer warpgroup's dealer walks
// the sequence and passes the blocks to the producer (fwd/sm90/producer.cuh),
// so the producer loads the next block's Q and K/V while the consumers
// (which walk the same sequence) still finish and store the current one; no
// CTA pays a launch, a pipeline fill or a drain per query block.
//
// The host computes the schedule's numbers, with its divisors as
// FastDivisors (common/fast_divisor.h), and the kernel reads them from its
// parameters: a block's coordinates cost a few multiplies, and no
// registers.
//
// Without a causal mask a work item is one 128-row query block (also with a
// sliding window's left bound, whose blocks see about as many keys each).
// With one,
// block m of a head sees about (seqlen_k - seqlen_q) / kBlockN + m + 1 key
// tiles (the mask is aligned bottom-right). Where the triangle dominates
// (seqlen_k - seqlen_q < seqlen_q: the shortest block sees less than about
// half of the longest's keys), a static round-robin over single blocks
// would hand some CTAs far more keys than others, so an item pairs block
// num_m_blocks - 1 - i with block i: every pair of a head carries the same
// number of keys (the middle block of an odd count is alone), and the longer
// block of each pair goes first. A chunk of queries against a longer cache
// (chunked prefill) has blocks of nearly equal length: there pairing would
// only halve the items, leaving half of a one-wave grid's SMs idle (H200,
// Sq 512 / Sk 4096 causal: 95.7 us paired, against 54.5 us non-causal).
// Items of one (batch, head) are adjacent, so the CTAs working at the same
// time read the K/V of only a few heads, which stay in L2.
//
// Split-KV (num_splits > 1): each item is done num_splits times, once per
// part of its blocks' key ranges (BlockKeyRange::split); the parts of an item
// are adjacent, so they run at the same time and share its Q and K/V in L2.
//
// Longest first (heads_per_section > 0: causal calls given a tile counter,
// FwdKernelParams::tile_counter): a fixed share cannot follow how fast each
// SM actually runs (min/max instructions per cycle across SMs differ by
// ~7% on a causal d64 kernel), so each CTA takes its next item from the
// counter shortly before it needs it (fwd/sm90/producer.cuh, deal_blocks),
// and the items are single blocks ordered longest first: the short blocks
// that come last even out the tail. The order is by sections of
// heads_per_section (batch, head)s whose K/V fit in L2 together: within a
// section, every head's last block, then every head's next-to-last, and so
// on (FA3's order).
#pragma once

#include <algorithm>

#include "common/fast_divisor.h"
#include "common/key_range.cuh"
#include "fwd/params.h"
#include "fwd/tile_coords.cuh"

namespace flashcore::sm90 {

// The schedule's numbers (PersistentSchedule without its block shape): what
// the host passes in the kernel's parameters (fwd/sm90/traits.cuh,
// schedule_of).
struct ScheduleNumbers {
    int num_m_blocks;
    int items_per_head;
    bool paired;
    // The longest-first order's (batch, head)s per section; 0: the fixed
    // order above.
    int heads_per_section;
    FastDivisor by_items_per_head;
    FastDivisor by_splits;
    FastDivisor by_heads_q;          // a (batch, head) index: its batch and query head
    FastDivisor by_group;            // a query head: its K/V head
    FastDivisor by_section_items;    // longest first: heads_per_section * num_m_blocks
    FastDivisor by_section_heads;    // heads_per_section
    FastDivisor by_last_section_heads;  // the (batch, head)s of the last section
};

template <int kBlockM, int kBlockN>
struct PersistentSchedule : ScheduleNumbers {
    // The fixed order of the call's blocks (host).
    static PersistentSchedule of(const FwdKernelParams &p) {
        PersistentSchedule s{};
        s.num_m_blocks = ceil_div(p.seqlen_q, kBlockM);
        // A left window bound makes the blocks' key counts nearly equal.
        s.paired = p.causal && p.window_left >= p.seqlen_k && p.seqlen_k - p.seqlen_q < p.seqlen_q;
        s.items_per_head = s.paired ? (s.num_m_blocks + 1) / 2 : s.num_m_blocks;
        s.heads_per_section = 0;
        s.by_items_per_head = FastDivisor::of(s.items_per_head);
        s.by_splits = FastDivisor::of(p.num_splits);
        s.by_heads_q = FastDivisor::of(p.num_heads_q);
        s.by_group = FastDivisor::of(p.num_heads_q / p.num_heads_kv);
        s.by_section_items = s.by_section_heads = s.by_last_section_heads = FastDivisor::of(1);
        return s;
    }

    // The longest-first order (the caller gives the call a tile counter)
    // with sections of `section_heads` (batch, head)s (host).
    void order_longest_first(const FwdKernelParams &p, int section_heads) {
        const int bh = p.num_heads_q * p.batch_size;
        section_heads = std::min(std::max(section_heads, 1), bh);
        paired = false;
        items_per_head = num_m_blocks;
        heads_per_section = section_heads;
        by_items_per_head = FastDivisor::of(items_per_head);
        by_section_items = FastDivisor::of(section_heads * num_m_blocks);
        by_section_heads = FastDivisor::of(section_heads);
        const int last = bh % section_heads;
        by_last_section_heads = FastDivisor::of(last == 0 ? section_heads : last);
    }

    __host__ __device__ int64_t num_items(const FwdKernelParams &p) const {
        return int64_t(items_per_head) * p.num_heads_q * p.batch_size * p.num_splits;
    }

    // Query blocks in `item`: 2 for a causal pair, else 1.
    __device__ __forceinline__ int blocks_in(int item) const {
        if (!paired) return 1;
        const int i = by_items_per_head.mod(item, by_items_per_head.div(item));
        return i != num_m_blocks - 1 - i ? 2 : 1;
    }

    // Block `which` (0: the longer) of `item`.
    template <bool kRagged>
    __device__ __forceinline__ FwdTile tile(const FwdKernelParams &p, int item, int which) const {
        int bh, m_block;
        if (heads_per_section > 0) {
            // Longest first: section, then rank of the block from the last,
            // then (batch, head) within the section (the last may hold
            // fewer).
            const int section = by_section_items.div(item);
            const int within = by_section_items.mod(item, section);
            const int first_bh = section * heads_per_section;
            const bool last = first_bh + heads_per_section > p.num_heads_q * p.batch_size;
            const int rank = last ? by_last_section_heads.div(within) : by_section_heads.div(within);
            bh = first_bh + within - rank * (last ? by_last_section_heads.divisor : heads_per_section);
            m_block = num_m_blocks - 1 - rank;
        } else {
            bh = by_items_per_head.div(item);
            const int i = by_items_per_head.mod(item, bh);
            m_block = which == 0 ? num_m_blocks - 1 - i : i;
        }
        // The sm90 kernel never packs GQA heads (fwd/params.h, packed_heads).
        FwdTile t;
        t.m_block = m_block;
        t.batch = by_heads_q.div(bh);
        t.head_q = by_heads_q.mod(bh, t.batch);
        t.head_kv = by_group.div(t.head_q);
        t.seqs = fwd_batch_seqs<kRagged>(p, t.batch);
        return t;
    }

    // Calls visit(tile, keys, split, item, which) for each query block of
    // this CTA, in schedule order, with the block's BlockKeyRange, or its
    // part `split` under split-KV (keys.num_blocks() <= 0: no row of the
    // block sees a key of it), the item it belongs to, and which of the
    // item's blocks it is. The CTA's first item is
    // first_item(); after its n-th (from 0), next_item(item, n) gives the
    // next, until one is past the last: blockIdx.x, then item + gridDim.x in
    // the fixed order; the tile counter's in the longest-first one.
    template <bool kRagged, typename FirstItem, typename NextItem, typename Visit>
    __device__ __forceinline__ void for_each_block(const FwdKernelParams &p, FirstItem &&first_item,
                                                   NextItem &&next_item, Visit &&visit) const {
        const int items = int(num_items(p));
        uint32_t n = 0;
        for (int split_item = first_item(); split_item < items; split_item = next_item(split_item, n++)) {
            const int item = by_splits.div(split_item);
            const int split = by_splits.mod(split_item, item);
            for (int which = 0; which < blocks_in(item); ++which) {
                const FwdTile t = tile<kRagged>(p, item, which);
                auto keys = BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of(p, t.seqs), t.m_block);
                if (p.num_splits > 1) keys = keys.split(split, p.num_splits);
                visit(t, keys, split, split_item, which);
            }
        }
    }
};

}  // namespace flashcore::sm90
