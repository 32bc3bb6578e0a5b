// K/V tiles of a paged cache for the portable kernel: rows gathered from
// their pages (fwd_params.h: key j of a batch is row j % page_size of page
// block_table[batch][j / page_size]), 16 rows per page lookup. The table row
// is small and stays in L1.
#pragma once

#include <cstdint>

#include "common/fwd_params.h"
#include "sm80/smem_tile.cuh"

namespace flashcore {

// Rows of a tile that always share a page: pages hold a multiple of 16 keys
// and tiles start at multiples of 16 keys.
constexpr int kPageChunkRows = 16;

// As load_tile_async (smem_tile.cuh), for the rows of one K or V tile of a
// paged cache: keys [first_key, first_key + kRows) of `batch`, rows past
// valid_rows zero-filled. gmem is the K/V head's row 0 of page 0. Where the
// threads cover whole 16-row chunks in passes of one vector column each,
// every thread looks up one page per chunk; otherwise (rows of 12 vectors,
// head dim 96) each vector finds its row's page.
template <typename Element, int kRowElems, int kRows, int kThreads>
__device__ __forceinline__ void load_paged_tile_async(Element *smem, const Element *gmem, int64_t page_stride,
                                                      int64_t row_stride, const FwdKernelParams &p, int batch,
                                                      int first_key, int valid_rows, int valid_vectors, int tid) {
    constexpr int kVectorsPerRow = kRowElems / kElemsPerVector;
    const auto key_offset = [&](int key) {
        return int64_t(fwd_page_of(p, batch, key)) * page_stride + int64_t(key % p.page_size) * row_stride;
    };
    if constexpr (kThreads % kVectorsPerRow == 0 && kPageChunkRows % (kThreads / kVectorsPerRow) == 0 &&
                  kRows % kPageChunkRows == 0) {
        constexpr int kRowsPerPass = kThreads / kVectorsPerRow;
        const int row0 = tid / kVectorsPerRow;
        const int vec = tid % kVectorsPerRow;
        const uint32_t base = smem_address(smem);
        const bool vec_valid = vec < valid_vectors;
        // Not unrolled: the large-tile kernel has no registers to spare for
        // every chunk's source address at once.
#pragma unroll 1
        for (int chunk = 0; chunk < kRows / kPageChunkRows; ++chunk) {
            const int chunk_row = chunk * kPageChunkRows;
            const Element *src = chunk_row < valid_rows ? gmem + key_offset(first_key + chunk_row) : gmem;
#pragma unroll
            for (int i = 0; i < kPageChunkRows / kRowsPerPass; ++i) {
                const int row = chunk_row + row0 + i * kRowsPerPass;
                const bool valid = vec_valid && row < valid_rows;
                // An invalid vector still needs a mapped address: gmem, the
                // head's first row of page 0, always is.
                cp_async_16(base + swizzled_byte_offset<kRowElems>(row, vec),
                            valid ? src + int64_t(row0 + i * kRowsPerPass) * row_stride + vec * kElemsPerVector : gmem,
                            valid);
            }
        }
    } else {
        load_rows_async<Element, kRowElems, kRows, kThreads>(
            smem, gmem, [&](int row) { return key_offset(first_key + row); }, valid_rows, valid_vectors, tid);
    }
}

// The K and V tiles of keys [first_key, first_key + kBlockN) of `batch`
// into a ring slot (K, then V at kSmemKElems). k and v point at the batch's
// K/V head in page 0.
template <typename Traits, typename Element>
__device__ __forceinline__ void load_paged_kv_tile(const FwdKernelParams &p, int batch, int first_key, int valid_rows,
                                                   Element *slot_k, const Element *k, const Element *v,
                                                   int qk_vectors, int v_vectors, int tid) {
    load_paged_tile_async<Element, Traits::kHeadDim, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k, k, p.k_batch_stride, p.k_seq_stride, p, batch, first_key, valid_rows, qk_vectors, tid);
    load_paged_tile_async<Element, Traits::kHeadDimV, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k + Traits::kSmemKElems, v, p.v_batch_stride, p.v_seq_stride, p, batch, first_key, valid_rows, v_vectors,
        tid);
}

}  // namespace flashcore
