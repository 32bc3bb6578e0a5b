// A CTA's sum of one float per thread in a fixed order, for reductions that
// must round the same way every run (the backward's dsinks).
#pragma once

#include "common/fragment_layout.cuh"

namespace flashcore {

#if defined(__CUDACC__)
// The sum of every thread's value, each warp's by a butterfly and then the
// warps' in order, in thread 0 (the others get 0); scratch, a float per
// warp, is free again on return. Every thread of the CTA must call it.
template <int kThreads>
__device__ __forceinline__ float block_sum_in_order(float value, float *scratch) {
    static_assert(kThreads % kWarpSize == 0, "whole warps");
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = value;
    __syncthreads();
    float total = 0.f;
    if (threadIdx.x == 0) {
        for (int w = 0; w < kThreads / kWarpSize; ++w) total += scratch[w];
    }
    __syncthreads();
    return total;
}
#endif

}  // namespace flashcore
