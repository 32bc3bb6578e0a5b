// The persistent tile schedule of the sm90 kernel.
//
// The grid holds at most one CTA per SM, and CTA c takes work items c,
// c + gridDim.x, c + 2 * gridDim.x, ... The producer and the consumers walk
// the same sequence, so the producer loads the next block's Q and K/V while
// the consumers still finish (and store) the current one; no CTA pays a
// launch, a pipeline fill or a drain per query block.
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
// Chunked attention (attention_chunk, causal) is a run of such triangles,
// one per chunk: where each chunk is whole query blocks (seqlen_q ==
// seqlen_k and attention_chunk a multiple of kBlockM), the pairs are made
// within each chunk's run of blocks. Unpaired, the blocks' key counts are a
// sawtooth that a round-robin deals unevenly (Llama 4, 32k in chunks of 8k,
// d128: 64 blocks a chunk over 132 CTAs, CTA c takes positions c % 4 + 4 j
// of the chunks, the heaviest class 1.1x the lightest's keys: the chunked
// call ran 1.04x its four causal 8k sequences' time, which are paired).
// Items of one (batch, head) are adjacent, so the CTAs working at the same
// time read the K/V of only a few heads, which stay in L2.
//
// Split-KV (num_splits > 1): each item is done num_splits times, once per
// part of its blocks' key ranges (BlockKeyRange::split); the parts of an item
// are adjacent, so they run at the same time and share its Q and K/V in L2.
#pragma once

#include "common/params.h"
#include "common/key_range.cuh"
#include "common/tile_coords.cuh"

namespace flashcore::sm90 {

// The schedule's numbers (PersistentSchedule without its block shape): what
// the host passes to kernels that read them from their parameters
// (fwd/sm90/traits.cuh, schedule_of). Each step of the walk splits its item
// into (split, batch, head, block) by the divisors here, which the host
// works out once (common/fast_divisor.h).
struct ScheduleNumbers {
    int num_m_blocks;
    FastDivisor items_per_head;
    bool paired;
    // Blocks of a run paired within itself (one causal triangle): the
    // head's, or a chunk's; the last run may be shorter. And its items.
    int run_blocks;
    FastDivisor run_items;
    FastDivisor splits;  // num_splits
    FwdTileDivisors tile_divisors;

    // Query block `which` (0: the longer) of the head's item i.
    __host__ __device__ __forceinline__ int block_of(int i, int which) const {
        if (!paired) return num_m_blocks - 1 - i;
        const FastDivisor::Division run = run_items.divide(i);
        const int first = run.quotient * run_blocks;
        const int k = run.remainder;
        const int blocks = min(run_blocks, num_m_blocks - first);
        return first + (which == 0 ? blocks - 1 - k : k);
    }

    // Query blocks in the head's item i: 2 for a causal pair, else 1 (the
    // middle block of an odd run is alone).
    __host__ __device__ __forceinline__ int blocks_of(int i) const {
        return paired && block_of(i, 0) != block_of(i, 1) ? 2 : 1;
    }
};

// gridDim.x, read where it is used: a read the compiler may not hoist, so
// that it is not held (or spilled) across a loop body.
__device__ __forceinline__ int grid_ctas() {
    int ctas;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(ctas));
    return ctas;
}

// Where the producer warp's walk keeps its step counter (for_each_block's
// second form): a word of shared memory, the walking warp's alone; one lane
// (writer) stores it, between the warp's reads.
struct SharedStep {
    volatile int *word;
    bool writer;
    __device__ __forceinline__ int load() const { return *word; }
    __device__ __forceinline__ void store(int v) const {
        __syncwarp();  // every lane has read the last value
        if (writer) *word = v;
        __syncwarp();  // and sees the new one
    }
};

template <int kBlockM, int kBlockN>
struct PersistentSchedule : ScheduleNumbers {
    __host__ __device__ static PersistentSchedule of(const FwdKernelParams &p) {
        PersistentSchedule s;
        s.num_m_blocks = ceil_div(p.seqlen_q, kBlockM);
        // A left window bound makes the blocks' key counts nearly equal;
        // chunks that are not whole blocks, a sawtooth that pairs do not
        // even out.
        const bool chunks_whole_blocks =
            p.attention_chunk == 0 || (p.attention_chunk % kBlockM == 0 && p.seqlen_q == p.seqlen_k);
        s.paired = p.causal && p.window_left >= p.seqlen_k && chunks_whole_blocks &&
                   p.seqlen_k - p.seqlen_q < p.seqlen_q;
        s.run_blocks = p.attention_chunk == 0 ? s.num_m_blocks : min(p.attention_chunk / kBlockM, s.num_m_blocks);
        const int run_items = (s.run_blocks + 1) / 2;
        s.run_items = FastDivisor::of(run_items);
        if (s.paired) {
            const int full_runs = s.num_m_blocks / s.run_blocks;
            const int last_run = s.num_m_blocks % s.run_blocks;
            s.items_per_head = FastDivisor::of(full_runs * run_items + (last_run + 1) / 2);
        } else {
            s.items_per_head = FastDivisor::of(s.num_m_blocks);
        }
        s.splits = FastDivisor::of(p.num_splits);
        s.tile_divisors = FwdTileDivisors::of(p);
        return s;
    }

    __host__ __device__ int64_t num_items(const FwdKernelParams &p) const {
        return int64_t(items_per_head.divisor) * p.num_heads_q * p.batch_size * p.num_splits;
    }

    // Query blocks in `item`: 2 for a causal pair, else 1.
    __device__ __forceinline__ int blocks_in(int item) const {
        return blocks_of(items_per_head.divide(item).remainder);
    }

    // Block `which` (0: the longer) of `item`.
    template <bool kRagged>
    __device__ __forceinline__ FwdTile tile(const FwdKernelParams &p, int item, int which) const {
        const FastDivisor::Division head = items_per_head.divide(item);
        return fwd_tile<kRagged>(p, head.quotient, block_of(head.remainder, which), tile_divisors);
    }

    // Calls visit(tile, keys, split) for each query block of this CTA, in
    // schedule order, with the block's BlockKeyRange, or its part `split`
    // under split-KV (keys.num_blocks() <= 0: no row of the block sees a key
    // of it).
    template <bool kRagged, typename Visit>
    __device__ __forceinline__ void for_each_block(const FwdKernelParams &p, Visit &&visit) const {
        const int items = int(num_items(p));
        for (int split_item = blockIdx.x; split_item < items; split_item += gridDim.x) {
            const FastDivisor::Division part = splits.divide(split_item);
            const int item = part.quotient;
            const int split = part.remainder;
            for (int which = 0; which < blocks_in(item); ++which) {
                const FwdTile t = tile<kRagged>(p, item, which);
                visit(t,
                      BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of(p, t.seqs), t.m_block)
                          .split(split, p.num_splits),
                      split);
            }
        }
    }

    // The same walk for a warp with no register to spare across visit (the
    // producer warp at 24 registers a thread, beside consumers of 240): one
    // counter walks the (item, block of its pair) steps, kMaxBlocksPerItem
    // an item (a single block's second step skipped), kept in shared memory
    // (SharedStep), and everything else is derived from it at each step.
    // (The item's bound, split and pair held in registers across visit
    // spilled; so did the counter.)
    template <bool kRagged, typename Visit>
    __device__ __forceinline__ void for_each_block(const FwdKernelParams &p, Visit &&visit, SharedStep step) const {
        for (step.store(0);; step.store(step.load() + 1)) {
            const int at = step.load();
            const int split_item = int(blockIdx.x) + at / kMaxBlocksPerItem * grid_ctas();
            if (split_item >= int(num_items(p))) break;
            const FastDivisor::Division part = splits.divide(split_item);
            const int item = part.quotient;
            if (at % kMaxBlocksPerItem >= blocks_in(item)) continue;
            const int split = part.remainder;
            const FwdTile t = tile<kRagged>(p, item, at % kMaxBlocksPerItem);
            visit(t,
                  BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of(p, t.seqs), t.m_block).split(split, p.num_splits),
                  split);
        }
    }

    // Query blocks an item may hold (a causal pair).
    static constexpr int kMaxBlocksPerItem = 2;
};

}  // namespace flashcore::sm90
