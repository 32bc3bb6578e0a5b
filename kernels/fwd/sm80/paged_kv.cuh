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

// The element offsets of a tile's chunks' first rows in a pool of given
// strides (TilePages::chunk_offset of each, computed once), for loads that
// find a row's chunk per row.
template <int kRows>
struct ChunkOffsets {
    static constexpr int kChunks = TilePages<kRows>::kChunks;
    int64_t chunk[kChunks];

    __device__ __forceinline__ ChunkOffsets(const TilePages<kRows> &pages, const FwdKernelParams &p,
                                            int64_t page_stride, int64_t row_stride) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) chunk[c] = pages.chunk_offset(p, c, page_stride, row_stride);
    }
    // The offset of the chunk that holds tile row `row`, chosen among the
    // compile-time indices (an index in a register would put the offsets in
    // local memory).
    __device__ __forceinline__ int64_t of_row(int row) const {
        int64_t offset = chunk[0];
#pragma unroll
        for (int c = 1; c < kChunks; ++c) {
            if (row >= c * kPageChunkRows) offset = chunk[c];
        }
        return offset;
    }
};

// Rows wider than this many bytes (the wide kernels' only) take the chunk
// lookup of load_paged_tile_async where no other way fits.
constexpr size_t kWideRowBytes = 512;

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
    } else if constexpr (kGroupCopy<Element, kRowElems, kRows, kThreads>) {
        // As load_tile_async's row groups (576-element rows): one row a
        // pass of 8 threads, its page that of its 16-row chunk.
        constexpr int kRowsPerPass = kThreads / kSwizzleGroupVectors;
        static_assert(kRowsPerPass % kPageChunkRows == 0, "a thread's rows sit at one place in their chunks");
        const int row0 = tid / kSwizzleGroupVectors;
        const int group_vec = tid % kSwizzleGroupVectors;
        const uint32_t dst = smem_address(smem) + swizzled_byte_offset<Element, kRowElems>(row0, group_vec);
        const Element *thread_gmem = gmem + row0 % kPageChunkRows * row_stride + group_vec * kElemsPerVector<Element>;
        const ChunkOffsets<kRows> chunks(pages, p, page_stride, row_stride);
#pragma unroll
        for (int i = 0; i < kRows / kRowsPerPass; ++i) {
            const int row = row0 + i * kRowsPerPass;
            copy_row_group_async<Element, kVectorsPerRow>(dst + row_block_bytes<Element, kRowElems>(i * kRowsPerPass),
                                                          thread_gmem + chunks.of_row(row), gmem, row < valid_rows,
                                                          group_vec, valid_vectors);
        }
    } else if constexpr (kRowElems * sizeof(Element) > kWideRowBytes) {
        // Rows past 512 bytes that neither way above takes (an e4m3 latent
        // cache's 576 bytes: 36 vectors): each vector's row finds its
        // chunk's offset among the tile's few, looked up once, where
        // load_rows_async below reads the block table and divides per
        // vector (a paged e4m3 MLA decode took 1.6x the 16-bit call's time).
        const ChunkOffsets<kRows> chunks(pages, p, page_stride, row_stride);
        const uint32_t base = smem_address(smem);
        constexpr int kVectors = kRows * kVectorsPerRow;
        // Rolled: unrolled, ptxas kept every vector's address live and the
        // 64-row kernel spilled.
#pragma unroll 1
        for (int idx = tid; idx < kVectors; idx += kThreads) {
            const int row = idx / kVectorsPerRow;
            const int vec = idx % kVectorsPerRow;
            const bool valid = vec < valid_vectors && row < valid_rows;
            cp_async_16(base + swizzled_byte_offset<Element, kRowElems>(row, vec),
                        valid ? gmem + chunks.of_row(row) + (row % kPageChunkRows) * row_stride +
                                    vec * kElemsPerVector<Element>
                              : gmem,
                        valid);
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
// V at kSmemKElems; only K where V is in K's rows, WideTraits::kVInK). k
// and v point at the batch's K/V head in page 0.
template <typename Traits, typename Element>
__device__ __forceinline__ void load_paged_kv_tile(const FwdKernelParams &p, int batch,
                                                   const TilePages<Traits::kBlockN> &pages, int valid_rows,
                                                   Element *slot_k, const Element *k, const Element *v,
                                                   int qk_vectors, int v_vectors, int tid) {
    load_paged_tile_async<Element, Traits::kHeadDim, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k, k, p.k_batch_stride, p.k_seq_stride, p, batch, pages, valid_rows, qk_vectors, tid);
    if constexpr (!Traits::kVInK) {  // V in K's tile: no copy of its own
        load_paged_tile_async<Element, Traits::kHeadDimV, Traits::kBlockN, Traits::kThreadsPerSplit>(
            slot_k + Traits::kSmemKElems, v, p.v_batch_stride, p.v_seq_stride, p, batch, pages, valid_rows,
            v_vectors, tid);
    }
}

}  // namespace flashcore
