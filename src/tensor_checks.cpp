#include "tensor_checks.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

#include "error.h"

namespace flashcore {

flashcore_status check_pointer(const void *ptr, const char *name, size_t alignment) {
    if (ptr == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
        return fail(FLASHCORE_STATUS_MISALIGNED, "%s (%p) must be %zu-byte aligned", name, ptr, alignment);
    }
    return FLASHCORE_STATUS_SUCCESS;
}


namespace {

// "0x..." of a byte address the range arithmetic computed in 128 bits: a
// range that starts near the top of the address space ends past 2^64, and
// printing its low 64 bits would show an end below its start.
std::string hex_address(unsigned __int128 address) {
    char text[40];
    const uint64_t high = uint64_t(address >> 64), low = uint64_t(address);
    if (high != 0) {
        std::snprintf(text, sizeof text, "0x%" PRIx64 "%016" PRIx64, high, low);
    } else {
        std::snprintf(text, sizeof text, "0x%" PRIx64, low);
    }
    return text;
}


// The strided dimensions of a tensor, batch, seq, head and (the merge's)
// state, as (stride, extent) pairs.
struct StridedDim {
    const char *suffix;
    int64_t stride;
    int32_t extent;
};

void strided_dims(const TensorDims &t, StridedDim dims[4]) {
    dims[0] = {"batch_stride", t.batch_stride, t.batch};
    dims[1] = {"seq_stride", t.seq_stride, t.seqlen};
    dims[2] = {"head_stride", t.head_stride, t.heads};
    dims[3] = {t.state_stride_name, t.state_stride, t.states};
}

// The element offset of the tensor's last element (every extent >= 1,
// strides >= 0): at most 2^94, exact in 128 bits.
__int128 last_element_offset(const TensorDims &t) {
    StridedDim dims[4];
    strided_dims(t, dims);
    __int128 last = t.dim - 1;
    for (const StridedDim &d : dims) last += __int128(d.extent - 1) * d.stride;
    return last;
}

}  // namespace

// Pointer, stride signs and alignment, and an addressable extent. Strides
// are named <name>_<dimension>_stride, as in the params structs.
flashcore_status check_tensor(const TensorDims &t) {
    flashcore_status status = check_pointer(t.data, t.name, FLASHCORE_ALIGNMENT);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const int64_t stride_multiple = int64_t(FLASHCORE_ALIGNMENT / t.element_bytes);
    const char *prefix = t.stride_prefix != nullptr ? t.stride_prefix : t.name;
    StridedDim dims[4];
    strided_dims(t, dims);
    for (const StridedDim &d : dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s_%s (%" PRId64 ") must be >= 0", prefix, d.suffix,
                        d.stride);
        }
        if (d.stride % stride_multiple != 0) {
            return fail(FLASHCORE_STATUS_MISALIGNED,
                        "%s_%s (%" PRId64 ") must be a multiple of %" PRId64
                        " elements (%d bytes); the head dimension must be the contiguous last dimension",
                        prefix, d.suffix, d.stride, stride_multiple, FLASHCORE_ALIGNMENT);
        }
    }
    // The largest element offset must be addressable in bytes: bounds the
    // kernels' 64-bit pointer arithmetic.
    if (last_element_offset(t) * __int128(t.element_bytes) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s strides address more than 2^63 bytes", t.name);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

ByteRange tensor_range(const TensorDims &t, bool written) {
    const unsigned __int128 begin = reinterpret_cast<uintptr_t>(t.data);
    return {t.name, begin, begin + (unsigned __int128)(last_element_offset(t) + 1) * t.element_bytes, written};
}

namespace {

// floor(a / b) and ceil(a / b) for b > 0.
__int128 floor_div(__int128 a, __int128 b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }
__int128 ceil_div(__int128 a, __int128 b) { return -floor_div(-a, b); }

// The most index differences the exact overlap search below tries; past it,
// a layout that fails the quick test is refused as unproven.
constexpr int64_t kMaxOverlapSearch = int64_t(1) << 16;

enum class Overlap { kNo, kYes, kUnknown };

// Whether two distinct indices of a strided tensor address rows (each `dim`
// contiguous elements) that share an element: whether some non-zero index
// difference (d_i with |d_i| < extent_i) has |sum d_i * stride_i| < dim.
Overlap rows_overlap(const TensorDims &t) {
    struct Dim {
        int64_t stride;
        int64_t extent;
    } dims[3];
    int n = 0;
    for (const Dim d : {Dim{t.batch_stride, t.batch}, Dim{t.seq_stride, t.seqlen}, Dim{t.head_stride, t.heads}}) {
        if (d.extent < 2) continue;  // never stepped along
        if (d.stride == 0) return Overlap::kYes;
        dims[n++] = d;
    }
    // Insertion sort of the (at most three) dimensions by `key`.
    const auto sort_by = [&](int64_t Dim::*key) {
        for (int i = 1; i < n; ++i) {
            for (int j = i; j > 0 && dims[j].*key < dims[j - 1].*key; --j) std::swap(dims[j], dims[j - 1]);
        }
    };
    // Quick, sufficient test: ordered by stride, each dimension steps past
    // the last element of everything below it.
    sort_by(&Dim::stride);
    __int128 span = t.dim;  // elements from the first to past the last, of the dimensions below
    bool nested = true;
    for (int i = 0; i < n; ++i) {
        if (__int128(dims[i].stride) < span) nested = false;
        span += __int128(dims[i].extent - 1) * dims[i].stride;
    }
    if (nested) return Overlap::kNo;
    // Exact search (interleaved layouts): every difference of the
    // dimensions but the one of the largest extent, solving for that one.
    sort_by(&Dim::extent);
    const Dim last = dims[n - 1];
    int64_t combinations = 1;
    for (int i = 0; i + 1 < n; ++i) {
        combinations *= 2 * dims[i].extent - 1;
        if (combinations > kMaxOverlapSearch) return Overlap::kUnknown;
    }
    for (int64_t c = 0; c < combinations; ++c) {
        __int128 offset = 0;  // sum of the enumerated d_i * stride_i
        bool all_zero = true;
        int64_t rest = c;
        for (int i = 0; i + 1 < n; ++i) {
            const int64_t width = 2 * dims[i].extent - 1;
            const int64_t delta = rest % width - (dims[i].extent - 1);
            rest /= width;
            offset += __int128(delta) * dims[i].stride;
            all_zero = all_zero && delta == 0;
        }
        // The last difference d with -dim < offset + d * stride < dim.
        const __int128 bound = last.extent - 1;
        const __int128 lo = std::max(floor_div(-__int128(t.dim) - offset, last.stride) + 1, -bound);
        const __int128 hi = std::min(ceil_div(__int128(t.dim) - offset, last.stride) - 1, bound);
        if (lo <= hi && !(all_zero && lo == 0 && hi == 0)) return Overlap::kYes;
    }
    return Overlap::kNo;
}

}  // namespace

// The output gives each element its own address (rows_overlap).
flashcore_status check_no_self_overlap(const TensorDims &t) {
    const Overlap overlap = rows_overlap(t);
    if (overlap == Overlap::kNo) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "%s strides (batch %" PRId64 ", seq %" PRId64 ", head %" PRId64 ") %s; the output needs a distinct "
                "address for each element",
                t.name, t.batch_stride, t.seq_stride, t.head_stride,
                overlap == Overlap::kYes ? "make elements overlap"
                                         : "interleave its dimensions too finely to check that no elements overlap");
}


namespace {

// `count` contiguous elements of T from `array`.
template <typename T>
ByteRange array_range(const char *name, const T *array, __int128 count, bool written) {
    const unsigned __int128 begin = reinterpret_cast<uintptr_t>(array);
    return {name, begin, begin + (unsigned __int128)count * sizeof(T), written};
}

}  // namespace

// A contiguous float32 LSE of `rows` values.
ByteRange lse_range(const float *lse, __int128 rows) { return array_range("lse", lse, rows, true); }

// An int32 array the kernels read (seqused_k, cu_seqlens_q/_k, block_table).
ByteRange int32_range(const char *name, const int32_t *array, __int128 count) {
    return array_range(name, array, count, false);
}

ByteRange float_range(const char *name, const float *array, __int128 count) {
    return array_range(name, array, count, false);
}


flashcore_status check_no_aliasing(const ByteRange *ranges, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        for (size_t j = 0; j < i; ++j) {
            const ByteRange &a = ranges[i], &b = ranges[j];
            if (!a.written && !b.written) continue;
            if (a.begin < b.end && b.begin < a.end) {
                // The rule in the call's own terms: what it writes, then
                // what it reads (inputs may share memory with each other).
                std::string written, read;
                for (size_t k = 0; k < count; ++k) {
                    std::string &list = ranges[k].written ? written : read;
                    list += (list.empty() ? "" : ", ") + std::string(ranges[k].name);
                }
                return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                            "%s (bytes %s to %s) overlaps %s (bytes %s to %s); what the call writes (%s) must not "
                            "overlap what it reads (%s) or one another",
                            a.name, hex_address(a.begin).c_str(), hex_address(a.end - 1).c_str(), b.name,
                            hex_address(b.begin).c_str(), hex_address(b.end - 1).c_str(), written.c_str(),
                            read.c_str());
            }
        }
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status check_workspace(void *workspace, size_t bytes, size_t needed, const char *size_function,
                                 const char *what, ByteRange *ranges, size_t count) {
    if (bytes < needed) {
        return fail(FLASHCORE_STATUS_WORKSPACE_TOO_SMALL,
                    "workspace_bytes (%zu) is smaller than the %zu bytes %s asks for (%s)", bytes, needed,
                    size_function, what);
    }
    // A call that needs none never looks at the workspace: any pointer and
    // size will do (the header: "then workspace may be NULL").
    if (needed == 0) return FLASHCORE_STATUS_SUCCESS;
    if (workspace == nullptr) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "workspace is NULL but the call needs %zu bytes of it (workspace_bytes is %zu)", needed, bytes);
    }
    if (reinterpret_cast<uintptr_t>(workspace) % FLASHCORE_ALIGNMENT != 0) {
        return fail(FLASHCORE_STATUS_MISALIGNED, "workspace (%p) must be %d-byte aligned", workspace,
                    FLASHCORE_ALIGNMENT);
    }
    // The bytes the call writes of the workspace must overlap no tensor.
    const unsigned __int128 begin = reinterpret_cast<uintptr_t>(workspace);
    ranges[count] = {"the workspace", begin, begin + needed, true};
    return check_no_aliasing(ranges, count + 1);
}

}  // namespace flashcore
