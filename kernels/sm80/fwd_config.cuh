// Tile configurations of the portable forward kernel per (element type,
// head_dim, variant): the table the launch heuristic (src/dispatch.cpp)
// chooses from. Measured on an H200 with a scratch sweep over block sizes,
// warps, stages and Q in registers or not; the choices and the numbers behind
// them are in docs/perf-notes.md.
//
// kLargeTiles, for grids that fill the GPU: 128 query rows, 4 warps of two
// m16 tiles each, so every K/V fragment read from shared memory feeds two
// MMAs. At head_dim 128, 32-key tiles keep the live S tile small enough to
// fit 255 registers without spilling.
//
// kKeySplit, for small problems: 64 query rows, two groups of 4 warps
// splitting the key tiles between them, so each warp's serial chain of tiles
// is half as long (the latency of a small problem is that chain). At
// head_dim 128 its two rings take 144 KB of shared memory, more than sm_86
// and sm_89 offer (99 KB): there the dispatcher uses the large tiles.
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

template <DType kDType, int kHeadDim, FwdVariant kVariant>
struct FwdConfig;

// FwdTraits<Element, head_dim, BlockM, BlockN, WarpsPerSplit, KeySplits, Stages, MaxRegisters, QInRegisters>
template <DType kDType>
struct FwdConfig<kDType, 64, FwdVariant::kLargeTiles> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 64, 128, 64, 4, 1, 2, 255, true>;
};

template <DType kDType>
struct FwdConfig<kDType, 64, FwdVariant::kKeySplit> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 64, 64, 64, 4, 2, 2, 255, true>;
};

template <DType kDType>
struct FwdConfig<kDType, 128, FwdVariant::kLargeTiles> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 128, 128, 32, 4, 1, 2, 255, false>;
};

template <DType kDType>
struct FwdConfig<kDType, 128, FwdVariant::kKeySplit> {
    using Traits = FwdTraits<typename ElementOf<kDType>::type, 128, 64, 64, 4, 2, 2, 255, false>;
};

}  // namespace flashcore
