// The CUDA element type of each DType.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fwd/params.h"

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

}  // namespace flashcore
