// The backward pass's last kernel: dq = grad_scale * the fp32 dQ
// accumulator, in the input type, over dq's scratch words (row_stats.cuh).
// A CTA per query block of a (batch, query head), the main kernel's blocks,
// so that it knows which blocks are stored by fragment
// (dq_accumulator.cuh); it writes the rows of the block that exist.
//
// Where the call asks for dsinks it carries each block's share of them on:
// the sinks' preprocess left the block's sum of its rows' terms in its first
// row's stats (row_stats.cuh word 2), which thread 0 reads before its first
// store overwrites them and, after its last read of the accumulator, leaves
// in the accumulator's first float (thread 0's own: no barrier is needed);
// bwd_dsinks_kernel then adds the blocks' sums of each head in (batch,
// block) order. dsinks cost no pass over the rows of their own (one took
// 15-20 us of gpt-oss's 350 us windowed backward at 8k on an H200).
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/dq_accumulator.cuh"
#include "bwd/row_stats.cuh"
#include "common/block_sum.cuh"
#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/params.h"

namespace flashcore {


#if defined(__CUDACC__)
// dq of the block's rows: seq_rows > 0 of the sequence from its first row
// on, valid_rows of them in the block. Thread 0's first step reads the
// accumulator's first float and writes the first row's first vector (the
// dsinks carry above relies on both).
template <typename Traits>
__device__ __forceinline__ void bwd_convert_rows(const BwdKernelParams &p, const float *accumulator,
                                                 typename Traits::Element *dq, int seq_rows, int valid_rows) {
    using Element = typename Traits::Element;
    using Layout = DqAccumLayout<Traits>;
    constexpr int kElems = kElemsPerVector<Element>;
    // One 16-byte vector of dq per thread and step.
    auto store = [&](int row, int vec, const float (&values)[kElems]) {
        uint4 packed;
        Element *e = reinterpret_cast<Element *>(&packed);
#pragma unroll
        for (int i = 0; i < kElems; ++i) e[i] = Element(values[i] * p.grad_scale);
        *reinterpret_cast<uint4 *>(dq + row * p.dq_seq_stride + vec * kElems) = packed;
    };
    if (Layout::by_fragment(seq_rows, p.fwd.head_dim)) {
        constexpr int kVectors = Traits::kHeadDim / kElems;
        if constexpr (Layout::kValueStride == 1) {
            // sm_90's order keeps a lane's four values together: columns 2j,
            // 2j + 1 of a row and of the row kFragRowHalf below it. One
            // float4 per lane then gives both rows' pairs, so a thread stores
            // a vector of each row and every 16-byte load is used whole
            // (float2 loads, each sector read by two threads, ran at about
            // 3/4 of the kernel's traffic bound at d128: 143 us against
            // cuDNN's 105 on an H200).
            constexpr int kRowPairs = Traits::kBlockM / 2;
            for (int i = threadIdx.x; i < kRowPairs * kVectors; i += Traits::kNumThreads) {
                const int pair = i / kVectors;
                const int vec = i % kVectors;
                const int row = (pair / kFragRowHalf) * kMmaM + pair % kFragRowHalf;
                const float *base = accumulator + Layout::offset(row, vec * kElems);
                float upper[kElems], lower[kElems];
#pragma unroll
                for (int j = 0; j < kElems / 2; ++j) {
                    const float4 lane = *reinterpret_cast<const float4 *>(base + j * Layout::kLaneStride);
                    upper[2 * j] = lane.x;
                    upper[2 * j + 1] = lane.y;
                    lower[2 * j] = lane.z;
                    lower[2 * j + 1] = lane.w;
                }
                store(row, vec, upper);
                store(row + kFragRowHalf, vec, lower);
            }
        } else {
            // sm_80's order keeps each value's 32 lanes together: column
            // pairs 2j, 2j + 1 of the vector are lane + j of the tile, the
            // pair's second value kValueStride floats on.
            for (int i = threadIdx.x; i < Traits::kBlockM * kVectors; i += Traits::kNumThreads) {
                const int row = i / kVectors;
                const int vec = i % kVectors;
                const float *base = accumulator + Layout::offset(row, vec * kElems);
                float values[kElems];
#pragma unroll
                for (int j = 0; j < kElems / 2; ++j) {
                    values[2 * j] = base[j * Layout::kLaneStride];
                    values[2 * j + 1] = base[j * Layout::kLaneStride + Layout::kValueStride];
                }
                store(row, vec, values);
            }
        }
    } else {
        const int vectors = p.fwd.head_dim / kElems;
        for (int i = threadIdx.x; i < valid_rows * vectors; i += Traits::kNumThreads) {
            const int row = i / vectors;
            const int vec = i % vectors;
            const float *base = accumulator + int64_t(row) * p.fwd.head_dim + vec * kElems;
            float values[kElems];
#pragma unroll
            for (int j = 0; j < kElems; j += 4) {
                const float4 a = *reinterpret_cast<const float4 *>(base + j);
                values[j] = a.x;
                values[j + 1] = a.y;
                values[j + 2] = a.z;
                values[j + 3] = a.w;
            }
            store(row, vec, values);
        }
    }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads) bwd_convert_kernel(const __grid_constant__ BwdKernelParams p) {
    using Element = typename Traits::Element;
    const BwdQueryBlock b = BwdQueryBlock::of_cta(p, Traits::kBlockM);
    if (b.valid_rows == 0) return;
    float *accumulator = bwd_accumulator_row(p, b.batch, b.head, b.row0);
    Element *dq = static_cast<Element *>(p.dq) + b.batch * p.dq_batch_stride + b.row0 * p.dq_seq_stride +
                  int64_t(b.head) * p.dq_head_stride;
    const bool carries_sinks = p.dsinks != nullptr && threadIdx.x == 0;
    const float block_terms = carries_sinks ? bwd_row_stats(p, b.batch, b.head, b.row0)[kSinkTermWord] : 0.f;
    bwd_convert_rows<Traits>(p, accumulator, dq, b.seq_rows, b.valid_rows);
    if (carries_sinks) accumulator[0] = block_terms;
}

// dsinks[head] for head blockIdx.x: minus the sum of its blocks' sums of
// sink terms (the first float of each block's accumulator, from the convert
// kernel), in (batch, block) order: each thread a fixed stride of them, then
// a fixed tree; 0 for a call without query blocks. (A template only so that
// every unit that includes this header may define it.)
template <int kBlockM, int kThreads>
__global__ void __launch_bounds__(kThreads) bwd_dsinks_kernel(const __grid_constant__ BwdKernelParams p) {
    __shared__ float scratch[kThreads / kWarpSize];
    const int head = blockIdx.x;
    const int64_t num_m_blocks = bwd_query_blocks(p, kBlockM);
    const int64_t head_blocks = num_m_blocks * p.fwd.batch_size;
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < head_blocks; i += kThreads) {
        const BwdQueryBlock b = BwdQueryBlock::at(p, kBlockM, int(i / num_m_blocks), head, int(i % num_m_blocks));
        if (b.valid_rows > 0) sum += *bwd_accumulator_row(p, b.batch, head, b.row0);
    }
    const float total = block_sum_in_order<kThreads>(sum, scratch);
    if (threadIdx.x == 0) p.dsinks[head] = 0.f - total;  // (+0 for a head without rows, not -0)
}
#endif

}  // namespace flashcore
