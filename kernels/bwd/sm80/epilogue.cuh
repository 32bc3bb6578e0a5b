// The portable backward kernel's epilogue: a key block's dK (times the
// softmax scale) and dV, from the warps' fragments to dk and dv, for the
// keys of the block below the sequence's end and the call's head dims; a key
// block that no query sees gets zeros.
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "common/tile_coords.cuh"

namespace flashcore::sm80 {

template <typename Traits>
struct BwdEpilogue {
    using Element = typename Traits::Element;
    static constexpr int kBlockN = Traits::kBlockN;

    // Row 0 of the key block in dk and dv.
    template <typename Work>
    __device__ __forceinline__ static Element *dk_rows(const BwdKernelParams &p, const Work &w) {
        return static_cast<Element *>(p.dk) + w.tile.batch * p.dk_batch_stride +
               (int64_t(w.tile.seqs.k_row0) + int64_t(w.n_block) * kBlockN) * p.dk_seq_stride +
               int64_t(w.tile.head_kv) * p.dk_head_stride;
    }
    template <typename Work>
    __device__ __forceinline__ static Element *dv_rows(const BwdKernelParams &p, const Work &w) {
        return static_cast<Element *>(p.dv) + w.tile.batch * p.dv_batch_stride +
               (int64_t(w.tile.seqs.k_row0) + int64_t(w.n_block) * kBlockN) * p.dv_seq_stride +
               int64_t(w.tile.head_kv) * p.dv_head_stride;
    }

    // Zeros for the block's keys [first_row, end_row), 16-byte stores.
    template <int kRowElems>
    __device__ __forceinline__ static void store_zeros(Element *rows, int64_t seq_stride, int first_row, int end_row,
                                                       int dim, int tid) {
        constexpr int kVectors = kRowElems / kElemsPerVector<Element>;
        for (int idx = tid; idx < kBlockN * kVectors; idx += Traits::kNumThreads) {
            const int row = idx / kVectors, vec = idx % kVectors;
            if (row >= first_row && row < end_row && vec * kElemsPerVector<Element> < dim) {
                *reinterpret_cast<uint4 *>(rows + row * seq_stride + vec * kElemsPerVector<Element>) =
                    make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }

    // Zeros for the keys in [first_row, stored_keys) of the block: keys no
    // query sees, and keys past seqused_k.
    template <typename Work>
    __device__ __forceinline__ static void store_zero_rows(const BwdKernelParams &p, const Work &w, int first_row,
                                                           int tid) {
        if (w.stored_keys <= first_row) return;
        store_zeros<Traits::kHeadDim>(dk_rows(p, w), p.dk_seq_stride, first_row, w.stored_keys, p.fwd.head_dim, tid);
        store_zeros<Traits::kHeadDimV>(dv_rows(p, w), p.dv_seq_stride, first_row, w.stored_keys, p.fwd.head_dim_v,
                                       tid);
    }

    template <typename Work>
    __device__ __forceinline__ static void store_empty(const BwdKernelParams &p, const Work &w, int tid) {
        store_zero_rows(p, w, 0, tid);
    }

    // One accumulator's fragments (m16 tiles of keys from row0, n8 tiles of
    // the head dim from col0), times `scale`, as the pairs each lane holds.
    template <int kMTiles, int kNTiles>
    __device__ __forceinline__ static void store_fragments_global(Element *rows, int64_t seq_stride,
                                                                  const float (&acc)[kMTiles][kNTiles][4], float scale,
                                                                  int row0, int col0, int valid_rows, int dim,
                                                                  int lane) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = row0 + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                if (row >= valid_rows) continue;
#pragma unroll
                for (int n = 0; n < kNTiles; ++n) {
                    const int col = col0 + n * kMmaN + frag_col(lane);
                    if (col >= dim) continue;
                    *reinterpret_cast<uint32_t *>(rows + row * seq_stride + col) =
                        pack2<Element>(acc[m][n][2 * half] * scale, acc[m][n][2 * half + 1] * scale);
                }
            }
        }
    }

    template <typename Mainloop, typename Work>
    __device__ __forceinline__ static void store(const BwdKernelParams &p, const Mainloop &mainloop, const Work &w,
                                                 const typename Mainloop::DkAccumulators &acc_dk,
                                                 const typename Mainloop::DvAccumulators &acc_dv,
                                                 unsigned char * /*smem*/) {
        const int warp = mainloop.warp;
        const int row0 = (warp / Traits::kWarpsDdKV) * (kBlockN / Traits::kWarpsNdKV);
        const int dk_col0 = (warp % Traits::kWarpsDdKV) * (Traits::kHeadDim / Traits::kWarpsDdKV);
        const int dv_col0 = (warp % Traits::kWarpsDdKV) * (Traits::kHeadDimV / Traits::kWarpsDdKV);
        store_fragments_global(dk_rows(p, w), p.dk_seq_stride, acc_dk, p.grad_scale, row0, dk_col0, w.valid_keys,
                               p.fwd.head_dim, mainloop.lane);
        store_fragments_global(dv_rows(p, w), p.dv_seq_stride, acc_dv, 1.f, row0, dv_col0, w.valid_keys,
                               p.fwd.head_dim_v, mainloop.lane);
        store_zero_rows(p, w, w.valid_keys, mainloop.tid);
    }
};

}  // namespace flashcore::sm80
