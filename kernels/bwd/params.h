// Parameters of one backward launch, shared by the host dispatcher
// (src/bwd/) and the kernels. Plain data only: host C++ files that nvcc does
// not compile include it.
//
// The backward pass reads the forward's tensors with the forward's masks
// and ragged batches, so its parameter block embeds the forward's (`fwd`:
// q, k, v, out, lse, their strides, sizes, scale, window, softcap,
// seqused_k, cu_seqlens): KeyMask, the tile coordinates and the batch
// sequences (common/params.h, common/tile_coords.cuh) serve both families
// unchanged. fwd.out and fwd.lse are inputs here.
#pragma once

#include <cstdint>

#include "common/params.h"

namespace flashcore {

// Tile variants (bwd/tiles.def).
enum class BwdVariant : int {
#define FLASHCORE_BWD_TILE(name, enumerator, value, path, pinnable) enumerator = value,
#include "bwd/tiles.def"
#undef FLASHCORE_BWD_TILE
};

struct BwdKernelParams {
    // The forward's view of the call (packed_heads 1, num_splits 1; paged
    // caches are not taken): out and lse are read.
    FwdKernelParams fwd;

    const void *dout;
    void *dq;
    void *dk;
    void *dv;
    // Element strides; the head dimension is contiguous. Packed (varlen)
    // tensors have batch strides 0, as in fwd.
    int64_t dout_batch_stride, dout_seq_stride, dout_head_stride;
    int64_t dq_batch_stride, dq_seq_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_seq_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_seq_stride, dv_head_stride;

    // The fp32 dQ accumulator (the workspace): element (batch, head, row, d)
    // at batch * dq_accum_batch_stride + head * dq_accum_head_stride +
    // (first row + row) * fwd.head_dim + d, as lse is laid out times
    // head_dim ([batch][head][seqlen_q][head_dim], or with cu_seqlens_q
    // [head][total_seqlen_q][head_dim]).
    float *dq_accum;
    int64_t dq_accum_batch_stride;
    int64_t dq_accum_head_stride;

    // The factor dQ and dK take on top of dS K and dS^T Q: the call's
    // softmax scale (with a softcap too: the capped logit's derivative is
    // scale * (1 - tanh^2), and the kernel multiplies dS by 1 - tanh^2).
    float grad_scale;

    // Non-zero: dQ's additions from the key blocks of a (batch, head) are
    // made in a fixed order, each waiting for the one before (a counter per
    // query block, kept in dq's scratch words: bwd/row_stats.cuh), so
    // the sums round the same way every run.
    bool deterministic;

    // Set by the launcher (bwd_schedule_params) in the deterministic mode
    // where every query sees every key and the key blocks of one (batch,
    // K/V head) fit on the GPU at once, with room for a second such call
    // (at most half the SMs, LaunchOptions::max_persistent_ctas): each key
    // block's CTA starts its walk over the query blocks at its own place
    // (bwd/scheduler.cuh).
    bool rotated_walk;

    // The gradient of the learnable sinks (fwd.sinks), or nullptr: not
    // computed (flashcore_backward_params::dsinks; each query block's share
    // from the sinks' preprocess, the heads' sums from bwd_dsinks_kernel:
    // convert.cuh).
    float *dsinks;
};

// Query blocks of block_m rows of the longest sequence, per (batch, query
// head): the convert kernel's grid (and the sinks' preprocess's) is this
// times batch * query heads.
FLASHCORE_HOST_DEVICE inline int64_t bwd_query_blocks(const BwdKernelParams &p, int block_m) {
    return (int64_t(p.fwd.seqlen_q) + block_m - 1) / block_m;
}

}  // namespace flashcore
