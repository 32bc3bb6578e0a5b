// Tile configuration of the portable forward kernel per (element type,
// head_dim): the launch heuristic's table.
//
// Both head dims: 4 warps of 16 query rows (one m16 tile each), 64-row query
// blocks, 64-key K/V tiles. At 201 (head_dim 64) and 255 (head_dim 128)
// registers two such CTAs fit an SM, whose barriers stall independently, and
// small problems get twice the CTAs of 128-row blocks. Measured on an H200
// against 8 warps x 128 rows: mission shape 15.5 -> 13.4 us, throughput
// shapes 190-270 -> 211-301 TFLOP/s (bench/compare.py).
//
// Two m16 tiles per warp would let each K/V fragment read from shared memory
// feed two MMAs, but every such configuration spills today (head_dim 64, 128
// rows: 255 registers + 24 bytes of stack even with Q re-read from shared
// memory). At head_dim 128 Q's fragments are re-read from shared memory at
// each k-step: held in registers they spill.
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
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 64, /*kBlockM=*/64, /*kBlockN=*/64, /*kNumWarps=*/4,
                             /*kMaxRegisters=*/255, /*kQInRegisters=*/true>;
};

template <DType kDType>
struct FwdConfig<kDType, 128> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 128, /*kBlockM=*/64, /*kBlockN=*/64, /*kNumWarps=*/4,
                             /*kMaxRegisters=*/255, /*kQInRegisters=*/false>;
};

}  // namespace flashcore
