// The CUDA element type of each DType, and the 16-byte vector every kernel
// moves its elements in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/types.h"

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

template <>
struct ElementOf<DType::kE4m3> {
    using type = __nv_fp8_e4m3;
};

template <DType kDType>
using ElementType = typename ElementOf<kDType>::type;

static_assert(sizeof(ElementOf<DType::kFp16>::type) == dtype_bytes(DType::kFp16) &&
                  sizeof(ElementOf<DType::kBf16>::type) == dtype_bytes(DType::kBf16) &&
                  sizeof(ElementOf<DType::kE4m3>::type) == dtype_bytes(DType::kE4m3),
              "dtype_bytes (common/types.h) is the size of the element type");

// Elements of one 16-byte vector (kVectorBytes, common/types.h: the unit of
// every global and shared memory access of the tiles: cp.async, ldmatrix
// rows, the vector stores of O): 8 of a two-byte type, 16 of a one-byte
// type. Head dims are whole vectors of their element type.
template <typename Element>
constexpr int kElemsPerVector = int(kVectorBytes / sizeof(Element));

}  // namespace flashcore
