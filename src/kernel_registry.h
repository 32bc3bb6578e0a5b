// The one table of the forward kernels this build has, generated from
// kernels/fwd_variants.list (fwd_kernel_list.inc), and the questions the rest
// of the library asks it: which head dims are supported, which kernel head
// dims serve a call, and where a given kernel's entry points are.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/fwd_entry_points.h"

namespace flashcore {

// A call's head dims are multiples of this: loads and stores along D move
// 16-byte chunks of 2-byte elements, so a call narrower than its kernel
// masks whole chunks.
constexpr int32_t kHeadDimMultiple = 8;

// (head_dim, head_dim_v): of q/k, and of v/out.
struct HeadDims {
    int32_t head_dim;
    int32_t head_dim_v;
};

constexpr bool operator==(HeadDims a, HeadDims b) { return a.head_dim == b.head_dim && a.head_dim_v == b.head_dim_v; }
// By head_dim, then head_dim_v: the order pairs are listed and searched in.
constexpr bool operator<(HeadDims a, HeadDims b) {
    return a.head_dim < b.head_dim || (a.head_dim == b.head_dim && a.head_dim_v < b.head_dim_v);
}

// One kernel: a line of kernels/fwd_variants.list in one dtype.
struct KernelEntry {
    KernelPath path;
    DType dtype;
    HeadDims dims;
    FwdVariant variant;
    cudaError_t (*run)(const FwdKernelParams &, const FwdLaunchOptions &, cudaStream_t);
    FwdKernelInfo (*info)();
};

// A read-only run of T.
template <typename T>
struct Span {
    const T *data;
    size_t size;
    const T *begin() const { return data; }
    const T *end() const { return data + size; }
};

// The head dims the sm80 kernels have (every sm90 kernel has an sm80 twin
// with its head dims, so these are what every supported GPU runs), sorted by
// head_dim then head_dim_v, each once. Never empty.
Span<HeadDims> supported_head_dims();

// The kernel head dims that serve a call with head dims `call` (multiples of
// kHeadDimMultiple, >= it): the first supported pair with both components at
// least the call's. Returns false where no pair covers the call.
bool covering_head_dims(HeadDims call, HeadDims *kernel);

// The kernel of that path, dtype, kernel head dims and variant, or nullptr
// where this build has none (e.g. the sm_90a kernels were not built).
const KernelEntry *find_kernel(KernelPath path, DType dtype, HeadDims kernel, FwdVariant variant);

// Whether this build has any kernel of that path.
bool has_kernels(KernelPath path);

}  // namespace flashcore
