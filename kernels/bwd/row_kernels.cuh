// The backward pass's row-wise kernels before the main one, memory-bound
// passes over the query rows (the convert kernel after it goes by query
// block: convert.cuh):
//   preprocess  a group of lanes per row: D = rowsum(dO * O) into dq's
//               scratch words (row_stats.cuh), the deterministic counter
//               zeroed, the row's fp32 dQ accumulator zeroed (the main
//               kernel only adds to it);
//   dsinks      with learnable sinks, a CTA per query head: dsinks[h] =
//               -sum over its rows of exp(sink - lse) * D, the D the
//               preprocess left in dq, in a fixed order (deterministic).
// Rows are those of every (batch, query head): seqlen_q per batch, or the
// packed rows [cu_seqlens_q[0], cu_seqlens_q[batch_size]) of a
// variable-length call (rows outside every sequence are not touched).
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/row_stats.cuh"
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
        return p.dq_accum + batch * p.dq_accum_batch_stride + head * p.dq_accum_head_stride + row * p.fwd.head_dim;
    }
};

template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_preprocess_kernel(const __grid_constant__ BwdKernelParams p) {
    constexpr int kElems = kElemsPerVector<Element>;
    const int lanes = bwd_preprocess_lanes_per_row(p.fwd.head_dim_v, kElems);
    BwdRow r;
    // Every lane stays for the group's reduction; those without a row add 0.
    const bool has_row = BwdRow::of(p, kWarpSize / lanes, &r);
    const int sublane = threadIdx.x % lanes;
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
    if (!has_row) return;
    float4 *accumulator = reinterpret_cast<float4 *>(r.accumulator(p));
    for (int i = sublane; i < p.fwd.head_dim / 4; i += lanes) accumulator[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (sublane == 0) {
        float *stats = bwd_row_stats(p, r.batch, r.head, r.row);
        stats[0] = sum;
        *bwd_block_counter(stats) = 0;
    }
}

constexpr int kDsinksThreads = 512;
// Rows each thread loads before it adds: one CTA per head walks all of the
// head's rows, and one row at a time left it latency-bound (15 us, 4% of
// gpt-oss's windowed backward at 8k on an H200).
constexpr int kDsinksRowsInFlight = 4;

// The gradient of head blockIdx.x's sink t: each row adds -exp(t - lse) *
// D, its sink's probability times minus its D = rowsum(dO * O) (dS = P (dP
// - D) for a key whose dP is 0: the sink attends to nothing). Each thread
// sums a fixed stride of the head's rows, then the block reduces in a fixed
// tree: bitwise the same every run. Written, not accumulated; a head with
// no rows gets 0. (A template only so that every unit that includes this
// header may define it.)
template <int kThreads>
__global__ void __launch_bounds__(kThreads) bwd_dsinks_kernel(const __grid_constant__ BwdKernelParams p) {
    __shared__ float partial[kThreads / kWarpSize];
    const int head = blockIdx.x;
    const FwdKernelParams &f = p.fwd;
    const float sink = __ldg(f.sinks + head);
    // Rows of the head in each batch: a dense call's seqlen_q per batch, or
    // a packed call's rows of every sequence as one batch.
    int batches = f.batch_size, first = 0, last = f.seqlen_q;
    if (f.cu_seqlens_q != nullptr) {
        batches = 1;
        bwd_packed_rows(f, &first, &last);
    }
    float sum = 0.f;
    if (sink != -INFINITY) {
        for (int batch = 0; batch < batches; ++batch) {
            const float *lse = f.lse + batch * f.lse_batch_stride + head * f.lse_head_stride;
            for (int row0 = first + int(threadIdx.x); row0 < last; row0 += kThreads * kDsinksRowsInFlight) {
                float lse_of[kDsinksRowsInFlight], d_of[kDsinksRowsInFlight];
#pragma unroll
                for (int i = 0; i < kDsinksRowsInFlight; ++i) {
                    const int row = row0 + i * kThreads;
                    lse_of[i] = row < last ? lse[row] : INFINITY;  // +inf: a term of 0
                    d_of[i] = row < last ? *bwd_row_stats(p, batch, head, row) : 0.f;
                }
#pragma unroll
                for (int i = 0; i < kDsinksRowsInFlight; ++i) sum += expf(sink - lse_of[i]) * d_of[i];
            }
        }
    }
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int w = 0; w < kThreads / kWarpSize; ++w) total += partial[w];
        p.dsinks[head] = -total;
    }
}

// The dsinks kernel where the call asks for dsinks (after the preprocess,
// whose D it reads from dq; before the convert kernel overwrites them).
inline cudaError_t launch_dsinks_kernel(const BwdKernelParams &params, const LaunchOptions &options,
                                        cudaStream_t stream) {
    if (params.dsinks == nullptr) return cudaSuccess;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(params.fwd.num_heads_q));
    config.blockDim = dim3(kDsinksThreads);
    config.stream = stream;
    return launch_step(cudaLaunchKernelEx(&config, bwd_dsinks_kernel<kDsinksThreads>, params), options,
                       "cudaLaunchKernelEx (the backward's dsinks)");
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
