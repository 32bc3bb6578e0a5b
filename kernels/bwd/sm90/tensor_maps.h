// The TMA maps of a backward call on the sm90 kernel: the geometries of Q,
// dO, K and V, which the launch encodes (launch.cuh) and planning checks
// first (src/bwd/dispatch.cpp: the plan chooses this kernel only for
// tensors the driver can describe, so the launch never has to fall back).
// Host code only.
#pragma once

#include "bwd/params.h"
#include "sm90/tensor_map.cuh"

namespace flashcore::sm90 {

struct BwdMapGeometries {
    TensorMapGeometry q, dout, k, v;
};

// The maps' (seq, batch) extents: packed tensors are one batch of all their
// rows (a packed map's batch stride is unused but must be one the driver
// accepts). Boxes of cols columns, block_m query rows and block_n keys.
inline BwdMapGeometries bwd_map_geometries(const BwdKernelParams &params, DType input, int cols, int block_m,
                                           int block_n) {
    const FwdKernelParams &f = params.fwd;
    const bool packed_q = f.cu_seqlens_q != nullptr;
    const bool packed_kv = f.cu_seqlens_k != nullptr;
    const int q_rows = packed_q ? f.total_seqlen_q : f.seqlen_q;
    const int q_batches = packed_q ? 1 : f.batch_size;
    const int kv_rows = packed_kv ? f.total_seqlen_k : f.seqlen_k;
    const int kv_batches = packed_kv ? 1 : f.batch_size;
    return {
        tensor_geometry(TensorRole::kQ, input, f.head_dim, q_rows, f.num_heads_q, q_batches, f.q_seq_stride,
                        f.q_head_stride, packed_q ? f.q_seq_stride : f.q_batch_stride, cols, block_m),
        tensor_geometry(TensorRole::kDout, input, f.head_dim_v, q_rows, f.num_heads_q, q_batches,
                        params.dout_seq_stride, params.dout_head_stride,
                        packed_q ? params.dout_seq_stride : params.dout_batch_stride, cols, block_m),
        tensor_geometry(TensorRole::kK, input, f.head_dim, kv_rows, f.num_heads_kv, kv_batches, f.k_seq_stride,
                        f.k_head_stride, packed_kv ? f.k_seq_stride : f.k_batch_stride, cols, block_n),
        tensor_geometry(TensorRole::kV, input, f.head_dim_v, kv_rows, f.num_heads_kv, kv_batches, f.v_seq_stride,
                        f.v_head_stride, packed_kv ? f.v_seq_stride : f.v_batch_stride, cols, block_n),
    };
}

// Whether the call has query rows: without them (dk and dv are zeros) the
// kernel reads no Q or dO, and a map of no rows cannot be encoded.
inline bool bwd_reads_queries(const BwdKernelParams &params) {
    const FwdKernelParams &f = params.fwd;
    return (f.cu_seqlens_q != nullptr ? f.total_seqlen_q : f.seqlen_q) > 0;
}

// Whether the driver can describe the call's Q and dO (where it has query
// rows), K and V. The boxes are a kernel's own; which one does not change
// the answer (128-byte boxes of 64 rows stand for every configuration).
inline bool bwd_maps_describable(const BwdKernelParams &params, DType input) {
    constexpr int kNominalBoxRows = 64;
    constexpr int kNominalBoxBytes = 128;
    const BwdMapGeometries g = bwd_map_geometries(params, input, kNominalBoxBytes / int(dtype_bytes(input)),
                                                  kNominalBoxRows, kNominalBoxRows);
    const bool queries = !bwd_reads_queries(params) ||
                         (describable(g.q, params.fwd.q) && describable(g.dout, params.dout));
    return queries && describable(g.k, params.fwd.k) && describable(g.v, params.fwd.v);
}

}  // namespace flashcore::sm90
