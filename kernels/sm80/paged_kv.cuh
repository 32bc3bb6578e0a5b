// K/V tiles of a paged cache for the portable kernel: each row is gathered
// from its page (fwd_params.h: key j of a batch is row j % page_size of page
// block_table[batch][j / page_size]). Pages hold a multiple of 16 keys, but
// a tile's rows need not start on a page, so every row looks up its own
// page; the table row is small and stays in L1.
#pragma once

#include <cstdint>

#include "common/fwd_params.h"
#include "sm80/smem_tile.cuh"

namespace flashcore {

// The K and V tiles of keys [first_key, first_key + kBlockN) of `batch`
// into a ring slot (K, then V at kSmemKElems), rows past valid_rows
// zero-filled. k and v point at the batch's K/V head in page 0.
template <typename Traits, typename Element>
__device__ __forceinline__ void load_paged_kv_tile(const FwdKernelParams &p, int batch, int first_key, int valid_rows,
                                                   Element *slot_k, const Element *k, const Element *v,
                                                   int qk_vectors, int v_vectors, int tid) {
    const auto key_offset = [&](int row, int64_t page_stride, int64_t seq_stride) {
        const int key = first_key + row;
        return int64_t(fwd_page_of(p, batch, key)) * page_stride + int64_t(key % p.page_size) * seq_stride;
    };
    load_rows_async<Element, Traits::kHeadDim, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k, k, [&](int row) { return key_offset(row, p.k_batch_stride, p.k_seq_stride); }, valid_rows,
        qk_vectors, tid);
    load_rows_async<Element, Traits::kHeadDimV, Traits::kBlockN, Traits::kThreadsPerSplit>(
        slot_k + Traits::kSmemKElems, v, [&](int row) { return key_offset(row, p.v_batch_stride, p.v_seq_stride); },
        valid_rows, v_vectors, tid);
}

}  // namespace flashcore
