// The TMA maps of a forward call on the sm90 kernel: the geometries of Q,
// K, V and O, which the launch encodes (launch.cuh) and planning checks
// first (src/fwd/dispatch.cpp: the plan chooses this kernel only for
// tensors the driver can describe, so the launch never has to fall back).
// Host code only.
#pragma once

#include <cstdint>

#include "common/params.h"
#include "sm90/tensor_map.cuh"

namespace flashcore::sm90 {

// The boxes a configuration reads and writes: panel columns, and the rows
// of a Q, a K/V and an O box.
struct FwdMapBoxes {
    int cols;
    int q_rows;
    int kv_rows;
    int out_cols;
    int out_rows;
};

struct FwdMapGeometries {
    TensorMapGeometry q, k, v, out;
};

// The maps' (seq, batch) extents: packed tensors are one batch of all their
// rows, a paged pool is num_pages batches of page_size rows (read a page's
// share of a tile per box). The batch dimension of a packed map has extent
// 1; its stride is unused but must be one the driver accepts.
inline FwdMapGeometries fwd_map_geometries(const FwdKernelParams &params, DType input, DType output,
                                           const FwdMapBoxes &box) {
    const bool packed_q = params.cu_seqlens_q != nullptr;
    const int q_rows = packed_q ? params.total_seqlen_q : params.seqlen_q;
    const int q_batches = packed_q ? 1 : params.batch_size;
    const bool paged = params.block_table != nullptr;
    const bool packed_kv = params.cu_seqlens_k != nullptr;
    const int kv_rows = paged ? params.page_size : packed_kv ? params.total_seqlen_k : params.seqlen_k;
    const int kv_batches = paged ? params.num_pages : packed_kv ? 1 : params.batch_size;
    const int64_t q_batch_stride = packed_q ? params.q_seq_stride : params.q_batch_stride;
    const int64_t out_batch_stride = packed_q ? params.out_seq_stride : params.out_batch_stride;
    const int64_t k_batch_stride = packed_kv ? params.k_seq_stride : params.k_batch_stride;
    const int64_t v_batch_stride = packed_kv ? params.v_seq_stride : params.v_batch_stride;
    return {
        tensor_geometry(TensorRole::kQ, input, params.head_dim, q_rows, params.num_heads_q, q_batches,
                        params.q_seq_stride, params.q_head_stride, q_batch_stride, box.cols, box.q_rows),
        tensor_geometry(TensorRole::kK, input, params.head_dim, kv_rows, params.num_heads_kv, kv_batches,
                        params.k_seq_stride, params.k_head_stride, k_batch_stride, box.cols, box.kv_rows),
        tensor_geometry(TensorRole::kV, input, params.head_dim_v, kv_rows, params.num_heads_kv, kv_batches,
                        params.v_seq_stride, params.v_head_stride, v_batch_stride, box.cols, box.kv_rows),
        tensor_geometry(TensorRole::kO, output, params.head_dim_v, q_rows, params.num_heads_q, q_batches,
                        params.out_seq_stride, params.out_head_stride, out_batch_stride, box.out_cols,
                        box.out_rows),
    };
}

// Whether the driver can describe the call's Q, K and V, and O where the
// kernel stores it through TMA (FwdKernelInfo::stores_out_by_tma). The
// boxes are a kernel's own; which one does not change the answer (128-byte
// boxes of 64 rows stand for every configuration).
inline bool fwd_maps_describable(const FwdKernelParams &params, DType input, DType output, bool out_by_tma) {
    constexpr int kNominalBoxRows = 64;
    constexpr int kNominalBoxBytes = 128;
    const int cols = kNominalBoxBytes / int(dtype_bytes(input));
    const int out_cols = kNominalBoxBytes / int(dtype_bytes(output));
    const FwdMapGeometries g = fwd_map_geometries(
        params, input, output, {cols, kNominalBoxRows, kNominalBoxRows, out_cols, kNominalBoxRows});
    return describable(g.q, params.q) && describable(g.k, params.k) && describable(g.v, params.v) &&
           (!out_by_tma || describable(g.out, params.out));
}

}  // namespace flashcore::sm90
