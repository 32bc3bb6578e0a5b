// The element types and kernel paths every kernel family shares, and what
// the host needs to know of them. Plain data only: host C++ files that nvcc
// does not compile include it.
#pragma once

#include <cstddef>

// Functions both the host dispatcher and the kernels call.
#if defined(__CUDACC__)
#define FLASHCORE_HOST_DEVICE __host__ __device__
#else
#define FLASHCORE_HOST_DEVICE
#endif

namespace flashcore {

// Element types of kernel inputs and outputs; the values are those of
// flashcore_dtype. A kernel's input, K/V and output types are separate
// (kernels/kernels.list names all three), so a one-byte K/V type can serve a
// two-byte query and output.
enum class DType : int { kFp16 = 1, kBf16 = 2, kE4m3 = 4 };

// Bytes of one element of `dtype`: what every stride, vector width and
// alignment rule is computed from, never a literal.
constexpr size_t dtype_bytes(DType dtype) {
    switch (dtype) {
        case DType::kFp16:
        case DType::kBf16:
            return 2;
        case DType::kE4m3:
            return 1;
    }
    return 0;
}
// The bytes of the widest element type: what a size check assumes of a
// dtype it has not validated yet.
constexpr size_t kWidestDTypeBytes = 2;

// log2(e): the kernels exponentiate with exp2, so the host folds it into
// the softmax scale and the kernels into the LSE and the softcap's tanh.
constexpr float kLog2e = 1.4426950408889634f;

// Bytes every load and store along a row's contiguous head dimension moves
// at once (one 16-byte vector): a call's head dims are multiples of a
// vector's elements, head_dim_multiple(dtype), since a kernel wider than the
// call masks whole vectors.
constexpr size_t kVectorBytes = 16;
constexpr int head_dim_multiple(DType dtype) { return int(kVectorBytes / dtype_bytes(dtype)); }

// Where a kernel runs: sm80, the portable path (every GPU from sm_80), and
// sm90, the sm_90a path (wgmma, TMA: H100, H200). Each family has kernels in
// one or both (kernels/<family>/sm80/, kernels/<family>/sm90/).
enum class KernelPath : int { kSm80 = 0, kSm90 = 1 };

}  // namespace flashcore
