// Writes a consumer warpgroup's finished rows of O and the log-sum-exp
// straight from the accumulator fragments: each quad of lanes stores 16
// contiguous bytes of a row.
#pragma once

#include <cstdint>

#include "epilogue.cuh"
#include "mask.cuh"
#include "ptx.cuh"

namespace flashcore::sm90 {

// warp_first_row: the warp's first row in the block (16 rows per warp).
template <typename Element, int kNAtomsO>
__device__ __forceinline__ void store_rows(const OutputBlock<Element> &dst, int64_t out_seq_stride,
                                           const float (&out)[kNAtomsO][4], const float (&lse)[2],
                                           int warp_first_row, int lane) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_first_row + frag_row(lane) + half * kFragRowHalf;
        if (row >= dst.valid_rows) continue;
        Element *row_out = dst.out + row * out_seq_stride + frag_col(lane);
#pragma unroll
        for (int n = 0; n < kNAtomsO; ++n) {
            *reinterpret_cast<uint32_t *>(row_out + n * kMmaN) =
                pack2<Element>(out[n][half * 2], out[n][half * 2 + 1]);
        }
    }
    if (dst.lse != nullptr) store_lse(lse, dst.lse, dst.valid_rows, warp_first_row, lane);
}

}  // namespace flashcore::sm90
