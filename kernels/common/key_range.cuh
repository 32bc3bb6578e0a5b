// Which keys a query may see, in one place for both kernels, their
// schedulers and the TMA producer:
//   KeyMask          per call: each query row's visible key interval;
//   BlockKeyRange    per query block: the key blocks to visit and which of
//                    them need per-element masking;
//   FragmentKeyMask  per warp and key tile: whether each score element of the
//                    warp's accumulator fragments is visible.
// Kernels visit key blocks n_block_max - 1 down to n_block_min, so the blocks
// that need masking at the right end (the partial last tile, the causal
// diagonal) come first and the rest run unmasked.
//
// The masks: seqlen_k, a window around each query's diagonal (bottom-right
// aligned: query i's diagonal key is i + seqlen_k - seqlen_q), of which
// causal is the right bound 0, and chunks (Llama 4's chunked attention: a
// query sees only the keys of the chunk its diagonal lies in), over tile
// rows that may be GQA-packed (KeyMask::query). A row's interval is
// [key_begin, key_end); both ends only grow with the row, which
// BlockKeyRange relies on.
#pragma once

#include <cmath>

#include "common/fragment_layout.cuh"
#include "common/params.h"

namespace flashcore {

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Keys [begin, end) of one query row; empty when end <= begin.
struct RowKeys {
    int begin;
    int end;
    __device__ __forceinline__ bool contains(int key) const { return key >= begin && key < end; }
};

// Rows are tile rows: query r / rows_per_query (rows_per_query > 1 where
// GQA packing puts several heads' copies of a query in consecutive rows; a
// divisor the host worked out, FwdDivisors::packed_heads).
struct KeyMask {
    int seqlen_q;
    int seqlen_k;
    FastDivisor rows_per_query;
    // Keys a query sees left and right of its diagonal, at most seqlen_k and
    // seqlen_q - 1 (FwdKernelParams::window_left, window_right).
    int window_left;
    int window_right;
    // 0, or the chunk length: query i then sees key j only where j and i's
    // diagonal lie in the same chunk, [c * chunk, (c + 1) * chunk) for an
    // integer c (floor division: a diagonal below key 0, where seqlen_q >
    // seqlen_k, lies in a chunk below key 0 and sees no key).
    int chunk = 0;

    // The mask of a batch's sequences (fwd_batch_seqs): their lengths set
    // the diagonal.
    __device__ static KeyMask of(const FwdKernelParams &p, const BatchSeqs &seqs) {
        return {seqs.seqlen_q, seqs.seqlen_k, p.divisors.packed_heads, p.window_left, p.window_right,
                p.attention_chunk};
    }
    // The same for kernels that pack no heads (the sm_90a forward, the
    // backward): one row a query, known at compile time, so that the mask
    // keeps no divisor in registers (a run-time one spilled the sm_90a d128
    // softcap kernel).
    __device__ static KeyMask of_unpacked(const FwdKernelParams &p, const BatchSeqs &seqs) {
        return {seqs.seqlen_q, seqs.seqlen_k, FastDivisor::of(1), p.window_left, p.window_right, p.attention_chunk};
    }

    __host__ __device__ int num_rows() const { return seqlen_q * rows_per_query.divisor; }
    __host__ __device__ int query(int row) const { return rows_per_query.quotient(row); }

    // Query i's diagonal key is i + diagonal_shift() (bottom-right
    // alignment: the last query's is the last key).
    __host__ __device__ int diagonal_shift() const { return seqlen_k - seqlen_q; }

    // The first key `row` sees (>= 0). The diagonal lies in
    // [seqlen_k - seqlen_q, seqlen_k) and the bounds are clamped (above), so
    // nothing here exceeds 2^31 - 1 in magnitude (seqlen_q, seqlen_k <= 2^30).
    __host__ __device__ int key_begin(int row) const {
        const int diagonal = query(row) + diagonal_shift();
        int first = diagonal - window_left;
        if (chunk > 0) {
            const int start = chunk_start(diagonal);
            first = start > first ? start : first;
        }
        return first > 0 ? first : 0;
    }
    // One past the last key `row` sees; <= key_begin when it sees none.
    __host__ __device__ int key_end(int row) const {
        const int diagonal = query(row) + diagonal_shift();
        int end = diagonal + 1 + window_right;
        if (chunk > 0) {
            const int chunk_end = chunk_end_below(chunk_start(diagonal), seqlen_k);
            end = chunk_end < end ? chunk_end : end;
        }
        return end < seqlen_k ? end : seqlen_k;
    }
    // The first position of the chunk holding `position` (which may be
    // negative): floor(position / chunk) * chunk. Never below -chunk for a
    // position >= -chunk, and the true value fits an int for every position
    // KeyMask meets (|position| <= 2^30).
    __host__ __device__ int chunk_start(int position) const {
        const int rem = position % chunk;  // in (-chunk, chunk)
        return rem < 0 ? position - (rem + chunk) : position - rem;
    }
    // One past the last position of the chunk that starts at `start`,
    // capped at `cap` (>= 0), without computing start + chunk where it would
    // pass `cap` (it may not fit an int).
    __host__ __device__ int chunk_end_below(int start, int cap) const {
        return start >= cap - chunk ? cap : start + chunk;
    }
    __device__ __forceinline__ RowKeys row(int r) const { return {key_begin(r), key_end(r)}; }
};

// The key blocks of kBlockN keys that query block m_block (rows
// m_block * kBlockM ...) visits: [n_block_min, n_block_max). Blocks in
// [n_block_min_unmasked, n_block_max_unmasked) are visible to every row of
// the block and need no per-element mask.
template <int kBlockM, int kBlockN>
struct BlockKeyRange {
    int n_block_min;
    int n_block_max;
    int n_block_min_unmasked;
    int n_block_max_unmasked;

    __host__ __device__ static BlockKeyRange of(const KeyMask &mask, int m_block) {
        const int first_row = m_block * kBlockM;
        BlockKeyRange r;
        // A block past a shorter sequence's end (variable-length batches):
        // nothing to visit, nothing to store.
        if (first_row >= mask.num_rows()) {
            r.n_block_min = r.n_block_max = r.n_block_min_unmasked = r.n_block_max_unmasked = 0;
            return r;
        }
        const int last_row = (first_row + kBlockM < mask.num_rows() ? first_row + kBlockM : mask.num_rows()) - 1;
        // Intervals only grow with the row: the last row reaches furthest
        // right, the first row's right end is the nearest.
        const int begin = mask.key_begin(first_row);
        const int end = mask.key_end(last_row);
        r.n_block_min = begin / kBlockN;
        r.n_block_max = end > begin ? ceil_div(end, kBlockN) : r.n_block_min;
        r.n_block_min_unmasked = ceil_div(mask.key_begin(last_row), kBlockN);
        const int nearest_end = mask.key_end(first_row);
        r.n_block_max_unmasked = nearest_end > 0 ? nearest_end / kBlockN : 0;
        return r;
    }

    // Key blocks to visit; <= 0 when no row of the block sees a key.
    __host__ __device__ int num_blocks() const { return n_block_max - n_block_min; }

    // The key block visited j-th (last first).
    __host__ __device__ int n_block(int j) const { return n_block_max - 1 - j; }

    __device__ __forceinline__ bool needs_mask(int n_block) const {
        return n_block >= n_block_max_unmasked || n_block < n_block_min_unmasked;
    }

    // Split `split` of `num_splits` equal parts of the range (the last may be
    // shorter or empty), for kernels that spread one query block's keys over
    // several CTAs. The masking bounds stay those of the whole block. With
    // min_blocks_per_split > 1 a range is cut into no more parts than hold
    // that many blocks each (at least one part): the splits past those are
    // empty, so short ranges of a ragged batch stay whole while its long
    // ones are cut num_splits ways.
    __host__ __device__ BlockKeyRange split(int split_index, int num_splits, int min_blocks_per_split = 1) const {
        const int blocks = num_blocks() > 0 ? num_blocks() : 0;
        if (min_blocks_per_split > 1) {
            const int parts = ceil_div(blocks, min_blocks_per_split);
            if (parts < num_splits) num_splits = parts > 1 ? parts : 1;
        }
        return part(split_index, ceil_div(blocks, num_splits));
    }
    // The same split by num_splits as a divisor the host worked out
    // (FwdDivisors::splits): only a range cut into fewer parts than that
    // (min_blocks_per_split) divides at run time.
    __host__ __device__ BlockKeyRange split(int split_index, const FastDivisor &num_splits,
                                            int min_blocks_per_split = 1) const {
        const int blocks = num_blocks() > 0 ? num_blocks() : 0;
        if (min_blocks_per_split > 1) {
            const int parts = ceil_div(blocks, min_blocks_per_split);
            if (parts < num_splits.divisor) return part(split_index, ceil_div(blocks, parts > 1 ? parts : 1));
        }
        return part(split_index, num_splits.quotient(blocks + num_splits.divisor - 1));
    }

   private:
    // Part split_index of parts of per_split blocks each (the last may be
    // shorter or empty).
    __host__ __device__ BlockKeyRange part(int split_index, int per_split) const {
        BlockKeyRange r = *this;
        r.n_block_min = n_block_min + split_index * per_split;
        r.n_block_max = r.n_block_min + per_split < n_block_max ? r.n_block_min + per_split : n_block_max;
        return r;
    }
};

// The transpose of BlockKeyRange, for kernels that walk the query blocks
// of one key block (a backward pass: dK, dV of key block n_block): the
// query blocks of kBlockM rows that see a key of key block n_block (keys
// n_block * kBlockN ...): [m_block_min, m_block_max). Query blocks in
// [m_block_min_unmasked, m_block_max_unmasked) need no per-element mask.
//
// Exact, as BlockKeyRange is: m_block is in [m_block_min, m_block_max) iff
// a row of it sees a key of the block (no block that sees none is in it,
// none that sees one is left out), and needs_mask(m_block) iff the tile
// (every row of the query block) x (the block's keys below seqlen_k) has an
// element the row does not see. Rows past num_rows (the partial last query
// block) count as not seeing any key, as keys past seqlen_k do on the key
// side; the key block's own keys past seqlen_k (its partial tile) are the
// kernel's to leave out, as BlockKeyRange leaves rows past num_rows to it.
// (Tested against a brute-force mask in tests/test_key_range.cu.)
//
// The queries that see a key j are those with diagonal in
// [j - window_right, j + window_left]: a contiguous run of queries for the
// keys [k0, k1) of the block, and the queries that see every key of it are
// those with diagonal in [k1 - 1 - window_right, k0 + window_left].
template <int kBlockM, int kBlockN>
struct QueryBlockRange {
    int m_block_min;
    int m_block_max;
    int m_block_min_unmasked;
    int m_block_max_unmasked;

    __host__ __device__ static QueryBlockRange of(const KeyMask &mask, int n_block) {
        const int k0 = n_block * kBlockN;
        QueryBlockRange r;
        // A key block past a shorter sequence's end (variable-length
        // batches), or of no keys: no query sees it.
        if (k0 >= mask.seqlen_k) {
            r.m_block_min = r.m_block_max = r.m_block_min_unmasked = r.m_block_max_unmasked = 0;
            return r;
        }
        const int k1 = k0 + kBlockN < mask.seqlen_k ? k0 + kBlockN : mask.seqlen_k;
        // Query q's diagonal is q + seqlen_k - seqlen_q. The sums are
        // arranged so that none exceeds 2^31 - 1 in magnitude (KeyMask's
        // bounds): key - seqlen_k <= 0 first, then the window, then seqlen_q.
        // Queries [q_begin, q_end) see a key of [k0, k1): the first sees k0
        // at its right window edge, the last k1 - 1 at its left one.
        // With chunks, the diagonals that see key j are further bounded by
        // j's chunk: [max(j - right, start(j)), min(j + left, start(j) +
        // chunk - 1)], both ends growing with j, so the union over the
        // block's keys and their intersection are still runs, bounded by
        // its first and last keys' ends.
        const int q_begin = clamp_query(lowest_diagonal(mask, k0), mask.seqlen_q);
        const int q_end = clamp_query(past_highest_diagonal(mask, k1 - 1), mask.seqlen_q);
        // Queries [full_begin, full_end) see all of [k0, k1).
        const int full_begin = clamp_query(lowest_diagonal(mask, k1 - 1), mask.seqlen_q);
        const int full_end = clamp_query(past_highest_diagonal(mask, k0), mask.seqlen_q);
        const int rows_per_query = mask.rows_per_query.divisor;
        r.m_block_min = q_begin * rows_per_query / kBlockM;
        r.m_block_max = q_end > q_begin ? ceil_div(q_end * rows_per_query, kBlockM) : r.m_block_min;
        r.m_block_min_unmasked = ceil_div(full_begin * rows_per_query, kBlockM);
        r.m_block_max_unmasked = full_end * rows_per_query / kBlockM;
        return r;
    }

    // Query blocks to visit; <= 0 when no row sees a key of the block.
    __host__ __device__ int num_blocks() const { return m_block_max - m_block_min; }

    // The query block visited j-th: first first, so that the blocks of the
    // causal diagonal, which need the mask, come first.
    __host__ __device__ int m_block(int j) const { return m_block_min + j; }

    __host__ __device__ bool needs_mask(int m_block) const {
        return m_block >= m_block_max_unmasked || m_block < m_block_min_unmasked;
    }

    // Split `split_index` of `num_splits` equal parts of the range (the last
    // may be shorter or empty), as BlockKeyRange::split. The masking bounds
    // stay those of the whole key block.
    __host__ __device__ QueryBlockRange split(int split_index, int num_splits) const {
        const int per_split = ceil_div(num_blocks() > 0 ? num_blocks() : 0, num_splits);
        QueryBlockRange r = *this;
        r.m_block_min = m_block_min + split_index * per_split;
        r.m_block_max = r.m_block_min + per_split < m_block_max ? r.m_block_min + per_split : m_block_max;
        return r;
    }

   private:
    // The lowest diagonal that sees key `key` (0 <= key < seqlen_k), minus
    // seqlen_k; and one past the highest, minus seqlen_k. Every term is
    // formed with key - seqlen_k <= 0 first, so none passes 2^31 - 1.
    __host__ __device__ static int lowest_diagonal(const KeyMask &mask, int key) {
        const int by_window = key - mask.seqlen_k - mask.window_right;
        if (mask.chunk <= 0) return by_window;
        const int by_chunk = mask.chunk_start(key) - mask.seqlen_k;
        return by_chunk > by_window ? by_chunk : by_window;
    }
    __host__ __device__ static int past_highest_diagonal(const KeyMask &mask, int key) {
        const int by_window = key + 1 - mask.seqlen_k + mask.window_left;
        if (mask.chunk <= 0) return by_window;
        const int by_chunk = mask.chunk_start(key) - mask.seqlen_k + mask.chunk;
        return by_chunk < by_window ? by_chunk : by_window;
    }

    // The query whose diagonal is `diagonal_minus_seqlen_k` + seqlen_k,
    // clamped into [0, seqlen_q]: diagonal d belongs to query
    // d - seqlen_k + seqlen_q.
    __host__ __device__ static int clamp_query(int diagonal_minus_seqlen_k, int seqlen_q) {
        if (diagonal_minus_seqlen_k >= 0) return seqlen_q;
        const int q = seqlen_q + diagonal_minus_seqlen_k;
        return q > 0 ? q : 0;
    }
};

// Visibility of one warp's accumulator fragments of a key tile: kMAtoms m16
// tiles of rows from warp_first_row, key columns from tile_first_key.
template <int kMAtoms>
struct FragmentKeyMask {
    RowKeys rows[kMAtoms * 2];  // rows g and g + 8 of each m16 tile
    int first_col;              // this lane's first key

    __device__ __forceinline__ static FragmentKeyMask of(const KeyMask &mask, int warp_first_row, int tile_first_key,
                                                         int lane) {
        FragmentKeyMask f;
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                f.rows[m * 2 + half] = mask.row(warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf);
            }
        }
        f.first_col = tile_first_key + frag_col(lane);
        return f;
    }

    // Element e of n8 tile n of m16 tile m.
    __device__ __forceinline__ bool visible(int m, int n, int e) const {
        return rows[m * 2 + e / 2].contains(first_col + n * kMmaN + e % 2);
    }

    // Sets the invisible scores to -inf, which the softmax gives exactly
    // zero weight.
    template <int kNAtoms>
    __device__ __forceinline__ void apply(float (&scores)[kMAtoms][kNAtoms][4]) const {
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (!visible(m, n, e)) scores[m][n][e] = -INFINITY;
                }
            }
        }
    }
};

}  // namespace flashcore
