// K/V tiles of a paged cache for the portable kernel: rows gathered from
// their pages (common/params.h: key j of a batch is row j % page_size of page
// block_table[batch][j / page_size]), 16 rows per page lookup. The table row
// is small and stays in L1.
#pragma once

#include <cstdint>

#include "common/params.h"
#include "sm80/smem_tile.cuh"

namespace flashcore {

// Rows of a tile that always share a page: pages hold a multiple of 16 keys
// and tiles start at multiples of 16 keys.
constexpr int kPageChunkRows = 16;

// The pages of one K/V tile's 16-row chunks, looked up a request ahead of
// their copies: the table read's latency would otherwise sit in front of
// every tile's cp.async (paged decode took 1.4-1.5x the contiguous call's
// time on an H100 with the lookups inline). Chunks past the batch's keys get
// page 0 without reading the table (its row may end there).
//
// The entries are kept as read and clamped into the pool only where the
// copies use them: a clamp right after the read waited for it there, a
// request early, which undid the look-ahead wherever the read missed L1
// (pages of 16: a table line serves four tiles of a decode split; that
// wait was the paged decode kernel's hottest stall, under ncu 21% of its
// samples, and the call took 1.09x the contiguous call's time).
template <int kRows>
struct TilePages {
    static constexpr int kChunks = kRows / kPageChunkRows;
    int entry[kChunks];  // the chunk's block-table entry, not yet clamped
    int row[kChunks];    // of the chunk's first key within its page
    int first_key;

    __device__ __forceinline__ void look_up(const FwdKernelParams &p, int batch, int first_key_, int seqlen_k) {
        first_key = first_key_;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const int key = first_key + c * kPageChunkRows;
            entry[c] = key < seqlen_k ? fwd_page_entry(p, batch, key) : 0;
            row[c] = fwd_page_row(p, key);
        }
    }
    // Element offset of the chunk's first row in a pool of these strides.
    __device__ __forceinline__ int64_t chunk_offset(const FwdKernelParams &p, int chunk, int64_t page_stride,
                                                    int64_t row_stride) const {
        return int64_t(fwd_clamp_page(p, entry[chunk])) * page_stride + int64_t(row[chunk]) * row_stride;
    }
};

// Whether kThreads threads copy a tile of kRowElems-element rows in passes
// of whole 16-row chunks, one vector column each (TilePages' chunks);
// otherwise (rows of 12 or 24 vectors) each vector finds its row's page.
template <typename Element, int kRowElems, int kRows, int kThreads>
constexpr bool kChunkedCopy = kThreads % (kRowElems / kElemsPerVector<Element>) == 0 &&
                              kPageChunkRows % (kThreads / (kRowElems / kElemsPerVector<Element>)) == 0 &&
                              kRows % kPageChunkRows == 0;

// As load_tile_async (smem_tile.cuh), for the rows of one K or V tile of a
// paged cache: keys [pages.first_key, + kRows) of `batch`, rows past
// valid_rows zero-filled. gmem is the K/V head's row 0 of page 0.
template <typename Element, int kRowElems, int kRows, int kThreads>
__device__ __forceinline__ void load_paged_tile_async(Element *smem, const Element *gmem, int64_t page_stride,
                                                      int64_t row_stride, const FwdKernelParams &p, int batch,
                                                      const TilePages<kRows> &pages, int valid_rows,
                                                      int valid_vectors, int tid) {
    constexpr int kVectorsPerRow = kRowElems / kElemsPerVector<Element>;
    if constexpr (kChunkedCopy<Element, kRowElems, kRows, kThreads>) {
        constexpr int kRowsPerPass = kThreads / kVectorsPerRow;
        const int row0 = tid / kVectorsPerRow;
        const int vec = tid % kVectorsPerRow;
        const uint32_t base = smem_address(smem);
        const bool vec_valid = vec < valid_vectors;
        const int64_t pass_stride = row_stride * kRowsPerPass;
        const Element *thread_gmem = gmem + row0 * row_stride + vec * kElemsPerVector<Element>;
#pragma unroll
        for (int chunk = 0; chunk < TilePages<kRows>::kChunks; ++chunk) {
            const int chunk_row = chunk * kPageChunkRows;
            // This thread's rows of the chunk, one pass apart (an add per
            // row, as load_tile_async).
            const Element *src = thread_gmem + pages.chunk_offset(p, chunk, page_stride, row_stride);
#pragma unroll
            for (int i = 0; i < kPageChunkRows / kRowsPerPass; ++i) {
                const int row = chunk_row + row0 + i * kRowsPerPass;
                const bool valid = vec_valid && row < valid_rows;
                // An invalid vector still needs a mapped address: gmem, the
                // head's first row of page 0, always is.
                cp_async_16(base + swizzled_byte_offset<Element, kRowElems>(row, vec), valid ? src : gmem, valid);
                src = opaque_advance(src, pass_stride);
            }
        }
    } else {
        load_rows_async<Element, kRowElems, kRows, kThreads>(
            smem, gmem,
            [&](int row) {
                const int key = pages.first_key + row;
                return int64_t(fwd_page_of(p, batch, key)) * page_stride + int64_t(fwd_page_row(p, key)) * row_stride;
            },
            valid_rows, valid_vectors, tid);
    }
}

// The K and V tiles of the keys `pages` describes into a ring slot (K, then
// V at kSmemKElems). k and v point at the batch's K/V head in page 0.
template <typename Traits, typename Element>
__device__ __forceinline__ void load_paged_kv_tile(const FwdKernelParams &p, int batch,
                                                   const TilePages<Traits::kBlockN> &pages, int valid_rows,
                                                   Element *slot_k, const Element *k, const Element *v,
                                                   int qk_vectors, int v_vectors, int tid) {
    load_paged_tile_async<Element, Traits::kHeadDim, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k, k, p.k_batch_stride, p.k_seq_stride, p, batch, pages, valid_rows, qk_vectors, tid);
    load_paged_tile_async<Element, Traits::kHeadDimV, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k + Traits::kSmemKElems, v, p.v_batch_stride, p.v_seq_stride, p, batch, pages, valid_rows, v_vectors,
        tid);
}

}  // namespace flashcore
