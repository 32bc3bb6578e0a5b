// Tile configuration of the portable forward kernel per (element type,
// head_dim): the launch heuristic's table.
//
// Both head dims: 8 warps of 16 query rows (one m16 tile each). Two m16 tiles
// per warp would let each K/V fragment read from shared memory feed two MMAs,
// but with Q held in registers that spills at head_dim 64 (255 registers +
// 152 bytes of stack on sm_80). At head_dim 128 even one m16 tile spills with
// Q in registers (O alone is 64 registers a thread), so Q's fragments are
// re-read from shared memory at each k-step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fwd_params.h"
#include "kernel_traits.cuh"

namespace flashcore {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFp16> {
    using type = __half;
};
template <>
struct ElementOf<DType::kBf16> {
    using type = __nv_bfloat16;
};

template <DType kDType, int kHeadDim>
struct FwdConfig;

template <DType kDType>
struct FwdConfig<kDType, 64> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 64, /*kBlockM=*/128, /*kBlockN=*/64, /*kNumWarps=*/8,
                             /*kMaxRegisters=*/255, /*kQInRegisters=*/true>;
};

template <DType kDType>
struct FwdConfig<kDType, 128> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 128, /*kBlockM=*/128, /*kBlockN=*/64, /*kNumWarps=*/8,
                             /*kMaxRegisters=*/255, /*kQInRegisters=*/false>;
};

}  // namespace flashcore
