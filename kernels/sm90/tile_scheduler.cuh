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
// Ragged batches of packed queries (cu_seqlens_q) are walked by each
// sequence's own query blocks: batch b's heads hold ceil(len_b / kBlockM)
// blocks, paired as above within them, and the items of all batches are
// numbered one after another (batch, head, item), with none for blocks past
// a sequence's end. Numbered by the longest sequence instead, every batch
// had that one's item count: a short sequence's blocks paired with blocks it
// does not have, so its items carried a sawtooth of keys, and more than half
// of all items were empty (16 sequences of 114-6906 tokens: 7456 of 13824).
// The round-robin then dealt the busiest SM 1.12x the mean's cycles (ncu,
// H200; 1.04x walked as here, 1.01x under FA3's varlen scheduler). Longest
// first: the sequences are walked by size class (the bit length of their
// block count), the largest class first, each in batch order. The item
// counts are known only on the device: each walker finds an item's batch by
// a warp's prefix sum over 32 batches of the class at a time (step_of),
// resuming where its last search ended, since its items only grow.
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
    // Ragged batches of packed queries: items by each sequence's own query
    // blocks (step_of). Chunks paired within runs: attention_chunk /
    // kBlockM blocks a run, else 0 (a run is the head).
    bool compact;
    int chunk_blocks;

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

    // The same for a head of its own num_blocks query blocks (compact): its
    // item count, and block_of. Integer divisions only where chunks make
    // runs shorter than the head.
    __host__ __device__ __forceinline__ int items_of_head(int num_blocks) const {
        if (!paired) return num_blocks;
        const int run = chunk_blocks == 0 ? num_blocks : min(chunk_blocks, num_blocks);
        if (run == num_blocks) return (num_blocks + 1) / 2;
        const int full_runs = num_blocks / run;
        return full_runs * ((run + 1) / 2) + (num_blocks - full_runs * run + 1) / 2;
    }
    __host__ __device__ __forceinline__ int block_of_head(int i, int which, int num_blocks) const {
        if (!paired) return num_blocks - 1 - i;
        int first = 0, k = i, run = num_blocks;
        if (chunk_blocks != 0 && chunk_blocks < num_blocks) {
            run = chunk_blocks;
            const int run_items = (run + 1) / 2;
            const int r = i / run_items;
            first = r * run;
            k = i - r * run_items;
        }
        const int blocks = min(run, num_blocks - first);
        return first + (which == 0 ? blocks - 1 - k : k);
    }
};

// The size class of a sequence of num_blocks query blocks: its bit length
// (0 for none).
__host__ __device__ __forceinline__ int size_class_of(int num_blocks) {
#ifdef __CUDA_ARCH__
    return 32 - __clz(num_blocks);
#else
    int bits = 0;
    while (bits < 31 && (num_blocks >> bits) != 0) ++bits;
    return bits;
#endif
}

// Where a walker's search for batches (step_of) resumes: the size class it
// walks, the first of the 32 batches it looked at last, and the items of
// the batches walked before that one (every larger class's, and this
// class's before first_batch).
struct BatchCursor {
    int size_class;
    int first_batch;
    int items_before;
};

// A walker's step: the (batch, head group) pair bh (fwd_tile's), the head's
// item, and the head's query blocks. bh < 0: past the walker's last item.
struct WalkItem {
    int bh;
    int head_item;
    int num_blocks;
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
        s.chunk_blocks = p.attention_chunk == 0 ? 0 : p.attention_chunk / kBlockM;
        s.run_blocks = s.chunk_blocks == 0 ? s.num_m_blocks : min(s.chunk_blocks, s.num_m_blocks);
        s.run_items = FastDivisor::of((s.run_blocks + 1) / 2);
        s.items_per_head = FastDivisor::of(s.items_of_head(s.num_m_blocks));
        // The launch's own divisors (FwdKernelParams::divisors).
        s.splits = p.divisors.splits;
        s.tile_divisors = p.divisors.tile;
        s.compact = p.cu_seqlens_q != nullptr;
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

    // Query blocks of batch b's heads (compact).
    __host__ __device__ __forceinline__ static int batch_blocks(const FwdKernelParams &p, int b) {
        int row0, len;
        packed_rows(p.cu_seqlens_q, b, p.total_seqlen_q, p.seqlen_q, row0, len);
        return ceil_div(len * p.packed_heads, kBlockM);
    }

    // Where a ragged walker's search starts: the largest size class a
    // sequence may have (batch_blocks of the longest).
    __host__ __device__ __forceinline__ static BatchCursor first_cursor(const FwdKernelParams &p) {
        return {size_class_of(ceil_div(fwd_packed_rows(p), kBlockM)), 0, 0};
    }

    // The step of `item` (its split's share aside) in kernels for ragged
    // batches. Not compact: a division (the walker keeps item below
    // num_items). Compact: the batch whose items hold it, searched from the
    // walker's cursor on (its items only grow), or bh < 0 past the last.
    // Warp-collective on the device: every lane of the warp calls it with
    // the same item.
    __host__ __device__ __forceinline__ WalkItem step_of(const FwdKernelParams &p, int item,
                                                         BatchCursor &cursor) const {
        if (!compact) {
            const FastDivisor::Division head = items_per_head.divide(item);
            return {head.quotient, head.remainder, num_m_blocks};
        }
        const int groups = tile_divisors.head_groups.divisor;
        for (;;) {
            const BatchCursor at = cursor;
#ifdef __CUDA_ARCH__
            // 32 batches a round, one a lane: the items of those in the
            // class, their inclusive prefix sum, and the first batch whose
            // sum passes the item.
            const int lane = threadIdx.x % 32;
            const int b = at.first_batch + lane;
            const int blocks = b < p.batch_size ? batch_blocks(p, b) : 0;
            const int items = size_class_of(blocks) == at.size_class ? groups * items_of_head(blocks) : 0;
            int through = items;
            for (int offset = 1; offset < 32; offset *= 2) {
                const int below = __shfl_up_sync(~0u, through, offset);
                if (lane >= offset) through += below;
            }
            const unsigned holds = __ballot_sync(~0u, at.items_before + through > item);
            if (holds != 0) {
                const int l = __ffs(holds) - 1;
                const int local = item - at.items_before - __shfl_sync(~0u, through - items, l);
                const int head_blocks = __shfl_sync(~0u, blocks, l);
                const int head_items = items_of_head(head_blocks);
                const int group = local / head_items;
                return {(at.first_batch + l) * groups + group, local - group * head_items, head_blocks};
            }
            const int round_items = __shfl_sync(~0u, through, 31);
#else
            int round_items = 0;
            for (int l = 0; l < 32 && at.first_batch + l < p.batch_size; ++l) {
                const int head_blocks = batch_blocks(p, at.first_batch + l);
                if (size_class_of(head_blocks) != at.size_class) continue;
                const int head_items = items_of_head(head_blocks);
                const int local = item - at.items_before - round_items;
                if (local < groups * head_items) {
                    const int group = local / head_items;
                    return {(at.first_batch + l) * groups + group, local - group * head_items, head_blocks};
                }
                round_items += groups * head_items;
            }
#endif
            if (at.first_batch + 32 < p.batch_size) {
                cursor = {at.size_class, at.first_batch + 32, at.items_before + round_items};
            } else if (at.size_class > 1) {
                cursor = {at.size_class - 1, 0, at.items_before + round_items};
            } else {
                return {-1, 0, 0};
            }
        }
    }

    // Query blocks in a step: 2 for a causal pair, else 1.
    __host__ __device__ __forceinline__ int blocks_in(const WalkItem &w) const {
        if (!compact) return blocks_of(w.head_item);
        return paired && block_of_head(w.head_item, 0, w.num_blocks) != block_of_head(w.head_item, 1, w.num_blocks)
                   ? 2
                   : 1;
    }

    // Block `which` (0: the longer) of a step, in kernels for ragged
    // batches.
    __device__ __forceinline__ FwdTile tile(const FwdKernelParams &p, const WalkItem &w, int which) const {
        const int block = compact ? block_of_head(w.head_item, which, w.num_blocks) : block_of(w.head_item, which);
        return fwd_tile<true>(p, w.bh, block, tile_divisors);
    }

    // Calls visit(tile, keys, split) for each query block of this CTA, in
    // schedule order, with the block's BlockKeyRange, or its part `split`
    // under split-KV (keys.num_blocks() <= 0: no row of the block sees a key
    // of it). Kernels for ragged batches walk by step_of (the same order
    // unless compact); dense kernels keep the plain walk, unchanged by it.
    template <bool kRagged, typename Visit>
    __device__ __forceinline__ void for_each_block(const FwdKernelParams &p, Visit &&visit) const {
        if constexpr (kRagged) {
            BatchCursor cursor = first_cursor(p);
            // Not compact: the plain walk's bound (the same bound held in
            // step_of instead made ptxas spill 424 bytes at head dim 128).
            const int items = int(num_items(p));
            for (int split_item = blockIdx.x; compact || split_item < items; split_item += gridDim.x) {
                const FastDivisor::Division part = splits.divide(split_item);
                const WalkItem w = step_of(p, part.quotient, cursor);
                if (w.bh < 0) break;
                const int split = part.remainder;
                for (int which = 0; which < blocks_in(w); ++which) {
                    const FwdTile t = tile(p, w, which);
                    visit(t,
                          BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of_unpacked(p, t.seqs), t.m_block)
                              .split(split, splits),
                          split);
                }
            }
            return;
        }
        const int items = int(num_items(p));
        for (int split_item = blockIdx.x; split_item < items; split_item += gridDim.x) {
            const FastDivisor::Division part = splits.divide(split_item);
            const int item = part.quotient;
            const int split = part.remainder;
            for (int which = 0; which < blocks_in(item); ++which) {
                const FwdTile t = tile<kRagged>(p, item, which);
                visit(t,
                      BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of_unpacked(p, t.seqs), t.m_block)
                          .split(split, splits),
                      split);
            }
        }
    }

    // The same walk for a warp with no register to spare across visit (the
    // producer warp at 24 registers a thread, beside consumers of 240; not
    // compact, Traits::kCompactRaggedSchedule): one
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
            // The split by num_splits itself, not by the divisor `splits` as
            // the walk above: that spilled 8 bytes in the e4m3 d256 producer.
            visit(t,
                  BlockKeyRange<kBlockM, kBlockN>::of(KeyMask::of_unpacked(p, t.seqs), t.m_block).split(split, p.num_splits),
                  split);
        }
    }

    // Query blocks an item may hold (a causal pair).
    static constexpr int kMaxBlocksPerItem = 2;
};

}  // namespace flashcore::sm90
