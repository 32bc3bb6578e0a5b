// The backward pass's row-wise kernel before the main one, a memory-bound
// pass over the query rows (the convert kernel after it goes by query
// block: convert.cuh): the preprocess, a group of lanes per row, writes D =
// rowsum(dO * O) into dq's scratch words (row_stats.cuh) and zeroes the
// deterministic counter and the row's fp32 dQ accumulator (the main kernel
// only adds to it). Where the call asks for dsinks, its form by query block
// also leaves each block's share of them (bwd_preprocess_sinks_kernel).
// Rows are those of every (batch, query head): seqlen_q per batch, or the
// packed rows [cu_seqlens_q[0], cu_seqlens_q[batch_size]) of a
// variable-length call (rows outside every sequence are not touched).
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/row_stats.cuh"
#include "common/block_sum.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/launch_options.h"

namespace flashcore {

constexpr int kRowKernelWarps = 8;
constexpr int kRowKernelThreads = kRowKernelWarps * kWarpSize;

// Rows per (batch, query head) the row kernels walk (the packed rows of a
// variable-length call), and how many (batch, head) pairs there are.
FLASHCORE_HOST_DEVICE inline int64_t bwd_rows_per_head(const BwdKernelParams &p) {
    return p.fwd.cu_seqlens_q != nullptr ? p.fwd.total_seqlen_q : p.fwd.seqlen_q;
}
FLASHCORE_HOST_DEVICE inline int64_t bwd_row_kernel_rows(const BwdKernelParams &p) {
    const int64_t batches = p.fwd.cu_seqlens_q != nullptr ? 1 : p.fwd.batch_size;
    return batches * p.fwd.num_heads_q * bwd_rows_per_head(p);
}

// Lanes that share one row: the fewest (a power of two, at most a warp) that
// hold a row of O or dO one 16-byte vector each, so that a warp takes
// kWarpSize / lanes rows at once. One row per warp left three quarters of
// the lanes idle at head_dim_v 64 and made the pass latency-bound: it ran
// about 180 us at B16 H16 S2k on an H200 at d64 as at d128, 3x its traffic.
FLASHCORE_HOST_DEVICE inline int bwd_preprocess_lanes_per_row(int head_dim_v, int elems_per_vector) {
    const int vectors = head_dim_v / elems_per_vector;
    int lanes = 1;
    while (lanes < vectors && lanes < kWarpSize) lanes *= 2;
    return lanes;
}

#if defined(__CUDACC__)
// The rows of a variable-length call's sequences, [first, last) of the
// packed tensors (cu_seqlens_q[0] to cu_seqlens_q[batch_size], clamped into
// total_seqlen_q): those the row kernels touch.
__device__ __forceinline__ void bwd_packed_rows(const FwdKernelParams &f, int *first, int *last) {
    *first = min(max(__ldg(f.cu_seqlens_q), 0), f.total_seqlen_q);
    *last = min(max(__ldg(f.cu_seqlens_q + f.batch_size), *first), f.total_seqlen_q);
}

// The row this group of lanes handles: (batch, head, row), or false where
// it is past the last row or outside every packed sequence.
struct BwdRow {
    int batch;
    int head;
    int64_t row;

    __device__ __forceinline__ static bool of(const BwdKernelParams &p, int rows_per_warp, BwdRow *r) {
        const int lane = threadIdx.x % kWarpSize;
        const int64_t warp = int64_t(blockIdx.x) * kRowKernelWarps + threadIdx.x / kWarpSize;
        const int64_t index = warp * rows_per_warp + lane / (kWarpSize / rows_per_warp);
        if (index >= bwd_row_kernel_rows(p)) return false;
        const int64_t rows = bwd_rows_per_head(p);
        r->row = index % rows;
        const int64_t bh = index / rows;
        r->head = int(bh % p.fwd.num_heads_q);
        r->batch = int(bh / p.fwd.num_heads_q);
        if (p.fwd.cu_seqlens_q != nullptr) {
            int first = 0, last = 0;
            bwd_packed_rows(p.fwd, &first, &last);
            if (r->row < first || r->row >= last) return false;
        }
        return true;
    }

    __device__ __forceinline__ float *accumulator(const BwdKernelParams &p) const {
        return bwd_accumulator_row(p, batch, head, row);
    }
};

// The preprocess's work on one row (has_row: r is a row; every lane of the
// row's group of `lanes` takes part in its reduction either way): D =
// rowsum(dO * O) into the row's stats, its deterministic counter and fp32
// dQ accumulator zeroed. Returns D, in every lane of the group.
template <typename Element>
__device__ __forceinline__ float bwd_preprocess_row(const BwdKernelParams &p, bool has_row, const BwdRow &r, int lanes,
                                                    int sublane) {
    constexpr int kElems = kElemsPerVector<Element>;
    float sum = 0.f;
    if (has_row) {
        const Element *dout = static_cast<const Element *>(p.dout) + r.batch * p.dout_batch_stride +
                              r.row * p.dout_seq_stride + r.head * p.dout_head_stride;
        const Element *out = static_cast<const Element *>(p.fwd.out) + r.batch * p.fwd.out_batch_stride +
                             r.row * p.fwd.out_seq_stride + r.head * p.fwd.out_head_stride;
        for (int vec = sublane; vec < p.fwd.head_dim_v / kElems; vec += lanes) {
            const uint4 dout_vec = *reinterpret_cast<const uint4 *>(dout + vec * kElems);
            const uint4 out_vec = *reinterpret_cast<const uint4 *>(out + vec * kElems);
            const Element *d = reinterpret_cast<const Element *>(&dout_vec);
            const Element *o = reinterpret_cast<const Element *>(&out_vec);
#pragma unroll
            for (int e = 0; e < kElems; ++e) sum += float(d[e]) * float(o[e]);
        }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (!has_row) return sum;
    float4 *accumulator = reinterpret_cast<float4 *>(r.accumulator(p));
    for (int i = sublane; i < p.fwd.head_dim / 4; i += lanes) accumulator[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (sublane == 0) {
        float *stats = bwd_row_stats(p, r.batch, r.head, r.row);
        stats[0] = sum;
        *bwd_block_counter(stats) = 0;
    }
    return sum;
}

template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_preprocess_kernel(const __grid_constant__ BwdKernelParams p) {
    const int lanes = bwd_preprocess_lanes_per_row(p.fwd.head_dim_v, kElemsPerVector<Element>);
    BwdRow r;
    const bool has_row = BwdRow::of(p, kWarpSize / lanes, &r);
    bwd_preprocess_row<Element>(p, has_row, r, lanes, threadIdx.x % lanes);
}

// The preprocess of a call that asks for dsinks: a CTA per query block of
// kBlockM rows of each (batch, query head), the convert kernel's blocks
// (convert.cuh), each row's work as above, and the block's share of its
// head's sink gradient: dsinks[h] = -sum over the head's rows of
// exp(sink - lse) * D, the sink's probability times minus the row's D (dS =
// P (dP - D) for a key whose dP is 0: the sink attends to nothing). Each
// thread sums its rows' terms, the block sums the threads' in a fixed order
// into its first row's stats (row_stats.cuh word 2), which the convert
// kernel reads and bwd_dsinks_kernel adds up. A head without a sink (-inf)
// has terms of 0 (its rows' lse may be -inf too).
template <typename Element, int kBlockM>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_preprocess_sinks_kernel(const __grid_constant__ BwdKernelParams p) {
    __shared__ float scratch[kRowKernelWarps];
    const BwdQueryBlock block = BwdQueryBlock::of_cta(p, kBlockM);
    if (block.valid_rows == 0) return;  // the whole CTA: no block here
    const int valid_rows = block.valid_rows;
    const int64_t row0 = block.row0;
    BwdRow r;
    r.head = block.head;
    r.batch = block.batch;
    const FwdKernelParams &f = p.fwd;
    const float sink = __ldg(f.sinks + r.head);
    const float *lse = f.lse + r.batch * f.lse_batch_stride + r.head * f.lse_head_stride + row0;
    const int lanes = bwd_preprocess_lanes_per_row(f.head_dim_v, kElemsPerVector<Element>);
    const int sublane = threadIdx.x % lanes;
    float terms = 0.f;
    for (int row = threadIdx.x / lanes; row < kBlockM; row += kRowKernelThreads / lanes) {
        const bool has_row = row < valid_rows;
        // The row's lse first, so that its load waits beside dO's and O's.
        const float row_lse = has_row && sublane == 0 ? lse[row] : 0.f;
        r.row = row0 + row;
        const float d = bwd_preprocess_row<Element>(p, has_row, r, lanes, sublane);
        if (has_row && sublane == 0 && sink != -INFINITY) terms += expf(sink - row_lse) * d;
    }
    const float block_terms = block_sum_in_order<kRowKernelThreads>(terms, scratch);
    if (threadIdx.x == 0) bwd_row_stats(p, r.batch, r.head, row0)[kSinkTermWord] = block_terms;
}

// One row kernel over every query row, rows_per_warp rows to a warp (none:
// nothing launched).
inline cudaError_t launch_row_kernel(void (*kernel)(BwdKernelParams), const BwdKernelParams &params,
                                     int rows_per_warp, const LaunchOptions &options, cudaStream_t stream,
                                     const char *name) {
    const int64_t rows = bwd_row_kernel_rows(params);
    if (rows == 0) return cudaSuccess;
    const int64_t rows_per_block = int64_t(kRowKernelWarps) * rows_per_warp;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((rows + rows_per_block - 1) / rows_per_block));
    config.blockDim = dim3(kRowKernelThreads);
    config.stream = stream;
    return launch_step(cudaLaunchKernelEx(&config, kernel, params), options, name);
}

#endif

}  // namespace flashcore
