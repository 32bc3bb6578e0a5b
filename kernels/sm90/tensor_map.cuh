// The TMA descriptors (CUtensorMap) of a call's tensors. Encoding one is a
// driver call that costs about as much host time as the launch itself
// (docs/log/perf.md, "Host time per call"), and a model calls with the same
// shapes and strides over and over: each thread keeps the maps it encoded
// last, one per role (Q, K, V, O) and geometry, and a call with a geometry
// seen before copies its map, swapping in the new base address where it
// changed (cuTensorMapReplaceAddress, a much cheaper call).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "common/driver_function.h"
#include "common/types.h"

#include <cstdint>
#include <cstring>

namespace flashcore::sm90 {

// A driver function, found through the runtime (common/driver_function.h).
template <typename Fn>
Fn driver_function(const char *name) {
    return reinterpret_cast<Fn>(flashcore::driver_function(name));
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const auto encoder = driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
    return encoder;
}

inline PFN_cuTensorMapReplaceAddress_v12000 tensor_map_address_replacer() {
    static const auto replacer = driver_function<PFN_cuTensorMapReplaceAddress_v12000>("cuTensorMapReplaceAddress");
    return replacer;
}

// Which of a call's tensors a map describes: maps of different roles are
// kept apart even where their geometry agrees (K and V of one call).
enum class TensorRole : uint32_t { kQ, kK, kV, kO, kDout };

// Everything a map is encoded from but the base address: a 4-d tensor
// (head_dim, seq, head, batch) of `type` elements, read in boxes of
// box_cols columns (one shared-memory panel) x box_rows rows.
struct TensorMapGeometry {
    TensorRole role;
    CUtensorMapDataType type;
    uint32_t box_cols, box_rows;
    uint64_t dims[4];
    uint64_t byte_strides[3];
};

namespace detail {

// Bytes of one element of a map type the kernels use (0: another).
inline uint32_t element_bytes(CUtensorMapDataType type) {
    switch (type) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8:
            return 1;
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
            return 2;
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
            return 4;
        default:
            return 0;
    }
}

// Maps a thread keeps: two geometries of each role, enough for a model
// that alternates between two shapes (prefill and decode, say).
constexpr int kCachedTensorMaps = 8;

struct CachedTensorMap {
    TensorMapGeometry geometry;
    const void *base;
    bool valid;
    CUtensorMap map;
};

struct TensorMapCache {
    CachedTensorMap entries[kCachedTensorMaps];
    unsigned next_victim;
};

inline TensorMapCache &thread_tensor_maps() {
    static thread_local TensorMapCache cache{};
    return cache;
}

inline bool same_geometry(const TensorMapGeometry &a, const TensorMapGeometry &b) {
    // The struct has no padding (static_assert below): bytes compare as fields.
    return std::memcmp(&a, &b, sizeof a) == 0;
}
static_assert(sizeof(TensorMapGeometry) == 4 * sizeof(uint32_t) + 7 * sizeof(uint64_t),
              "TensorMapGeometry must have no padding bytes, which memcmp would compare");

}  // namespace detail

// What cuTensorMapEncodeTiled takes (CUDA driver API, "Tensor Map Object
// Management"): a base address and byte strides that are multiples of 16,
// strides below 2^40, extents from 1 to 2^32.
constexpr uint64_t kTensorMapAlignment = 16;
constexpr uint64_t kMaxTensorMapByteStride = uint64_t(1) << 40;
constexpr uint64_t kMaxTensorMapExtent = uint64_t(1) << 32;

// Whether the driver can describe `base` with geometry `g`: planning asks
// this before it chooses a kernel that reads through TMA, so that a launch
// never finds out (src/fwd/dispatch.cpp, src/bwd/dispatch.cpp). The box is
// the kernel's own (64 or 128 bytes wide: the panels' swizzles, sm90/ptx.cuh).
inline bool describable(const TensorMapGeometry &g, const void *base) {
    if (reinterpret_cast<uintptr_t>(base) % kTensorMapAlignment != 0) return false;
    const uint32_t box_bytes = g.box_cols * detail::element_bytes(g.type);
    if (box_bytes != 128 && box_bytes != 64) return false;
    for (const uint64_t extent : g.dims) {
        if (extent == 0 || extent > kMaxTensorMapExtent) return false;
    }
    for (const uint64_t stride : g.byte_strides) {
        if (stride % kTensorMapAlignment != 0 || stride >= kMaxTensorMapByteStride) return false;
    }
    return true;
}

namespace detail {

inline bool encode(CUtensorMap *map, const TensorMapGeometry &g, const void *base) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = tensor_map_encoder();
    if (encode_tiled == nullptr || !describable(g, base)) return false;
    const uint32_t box_bytes = g.box_cols * element_bytes(g.type);
    const cuuint64_t dims[4] = {g.dims[0], g.dims[1], g.dims[2], g.dims[3]};
    const cuuint64_t strides[3] = {g.byte_strides[0], g.byte_strides[1], g.byte_strides[2]};
    const cuuint32_t box[4] = {g.box_cols, g.box_rows, 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUtensorMapSwizzle swizzle = box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    return encode_tiled(map, g.type, 4, const_cast<void *>(base), dims, strides, box, element_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace detail

// Writes to *map the descriptor of `base` with geometry `g`: head_dim is
// the call's, so columns past it, like rows past seqlen, read as zeros and
// are not written; the panel's swizzle follows box_cols. Returns false
// where the driver cannot describe the tensor.
inline bool tensor_map(CUtensorMap *map, const TensorMapGeometry &g, const void *base) {
    detail::TensorMapCache &cache = detail::thread_tensor_maps();
    for (detail::CachedTensorMap &entry : cache.entries) {
        if (!entry.valid || !detail::same_geometry(entry.geometry, g)) continue;
        if (entry.base != base) {
            const PFN_cuTensorMapReplaceAddress_v12000 replace = tensor_map_address_replacer();
            if (replace == nullptr || replace(&entry.map, const_cast<void *>(base)) != CUDA_SUCCESS) {
                // An address the driver refuses (misaligned): encoding says so, or describes it.
                entry.valid = false;
                break;
            }
            entry.base = base;
        }
        *map = entry.map;
        return true;
    }
    if (!detail::encode(map, g, base)) return false;
    detail::CachedTensorMap &victim = cache.entries[cache.next_victim++ % detail::kCachedTensorMaps];
    victim.geometry = g;
    victim.base = base;
    victim.map = *map;
    victim.valid = true;
    return true;
}

// The TMA element type of a DType (e4m3: bytes, which TMA only copies).
constexpr CUtensorMapDataType tensor_map_type(DType dtype) {
    return dtype == DType::kBf16    ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
           : dtype == DType::kE4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A stride of `element_bytes`-byte elements in bytes, saturated at
// UINT64_MAX: the stride of a dimension of extent 1 may be any int64, whose
// bytes need not fit, and a saturated stride is one the TMA unit refuses
// (describable), where a wrapped one could pass.
inline uint64_t saturated_stride_bytes(int64_t stride, int64_t element_bytes) {
    const __int128 bytes = __int128(stride) * element_bytes;
    return bytes < 0 || bytes > __int128(UINT64_MAX) ? UINT64_MAX : uint64_t(bytes);
}

// The geometry of a map of `role` over a 4-d (head_dim, seq, head, batch)
// tensor of `dtype` elements, with strides in elements.
inline TensorMapGeometry tensor_geometry(TensorRole role, DType dtype, int head_dim, int seqlen, int heads, int batch,
                                         int64_t seq_stride, int64_t head_stride, int64_t batch_stride, int box_cols,
                                         int box_rows) {
    const int64_t kElementBytes = int64_t(dtype_bytes(dtype));
    TensorMapGeometry g{};
    g.role = role;
    g.type = tensor_map_type(dtype);
    g.box_cols = uint32_t(box_cols);
    g.box_rows = uint32_t(box_rows);
    g.dims[0] = uint64_t(head_dim);
    g.dims[1] = uint64_t(seqlen);
    g.dims[2] = uint64_t(heads);
    g.dims[3] = uint64_t(batch);
    g.byte_strides[0] = saturated_stride_bytes(seq_stride, kElementBytes);
    g.byte_strides[1] = saturated_stride_bytes(head_stride, kElementBytes);
    g.byte_strides[2] = saturated_stride_bytes(batch_stride, kElementBytes);
    return g;
}

}  // namespace flashcore::sm90
