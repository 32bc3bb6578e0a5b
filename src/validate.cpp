#include "validate.h"

#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>

#include "error.h"
#include "kernel_registry.h"
#include "params.h"

namespace flashcore {
namespace {

constexpr size_t kLseAlignment = alignof(float);
// A paged cache's pages hold a multiple of this many keys: the TMA boxes
// and the kernels' 16-row steps never straddle a page.
constexpr int32_t kPageSizeMultiple = 16;

// Entries a block-table row needs: pages for seqlen_k keys (page_size > 0).
int64_t pages_per_sequence(const flashcore_forward_params &p) {
    return (int64_t(p.seqlen_k) + p.page_size - 1) / p.page_size;
}
constexpr size_t kElementBytes = 2;  // fp16 and bf16

flashcore_status check_pointer(const void *ptr, const char *name, size_t alignment) {
    if (ptr == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
        return fail(FLASHCORE_STATUS_MISALIGNED, "%s (%p) must be %zu-byte aligned", name, ptr, alignment);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

struct TensorDims {
    const char *name;
    const void *data;
    int32_t batch, seqlen, heads;
    int32_t dim;  // the contiguous last dimension: head_dim, or head_dim_v for v and out
    int64_t batch_stride, seq_stride, head_stride;
    size_t element_bytes = kElementBytes;
    // A fourth strided dimension (the merge's states); extent 1: none.
    int32_t states = 1;
    int64_t state_stride = 0;
    const char *state_stride_name = "state_stride";
    const char *stride_prefix = nullptr;  // strides are <prefix>_<dimension>_stride; nullptr: name
};

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

// Fails with UNSUPPORTED: `problem`, then the head dims this build has and
// the rule by which the others run.
flashcore_status unsupported_head_dims(const char *problem) {
    std::string pairs;
    for (const HeadDims &d : supported_head_dims()) {
        if (!pairs.empty()) pairs += ", ";
        pairs += "(" + std::to_string(d.head_dim) + ", " + std::to_string(d.head_dim_v) + ")";
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s; supported (head_dim, head_dim_v): %s, and any pair of multiples of %d that one of these "
                "covers (it runs on the first with both at least its own)",
                problem, pairs.c_str(), int(kHeadDimMultiple));
}

// The call's head dims have a kernel: multiples of kHeadDimMultiple that a
// pair of the registry covers.
flashcore_status check_head_dims(const flashcore_forward_params &p) {
    const HeadDims call{p.head_dim, effective_head_dim_v(p)};
    // Named as the caller set it: head_dim_v 0 stands for head_dim.
    const char *v_name = p.head_dim_v == 0 ? "head_dim_v (0, so head_dim)" : "head_dim_v";
    char problem[160];
    HeadDims kernel{};
    if (call.head_dim % kHeadDimMultiple != 0) {
        std::snprintf(problem, sizeof problem, "head_dim %d is not a multiple of %d", int(call.head_dim),
                      int(kHeadDimMultiple));
    } else if (call.head_dim_v % kHeadDimMultiple != 0) {
        std::snprintf(problem, sizeof problem, "%s %d is not a multiple of %d", v_name, int(call.head_dim_v),
                      int(kHeadDimMultiple));
    } else if (covering_head_dims(call, &kernel)) {
        return FLASHCORE_STATUS_SUCCESS;
    } else {
        // No pair covers the call: either head_dim exceeds every pair's, or
        // head_dim_v exceeds that of every pair wide enough for head_dim.
        int32_t max_head_dim = 0, max_head_dim_v = 0, max_head_dim_v_here = 0;
        for (const HeadDims &d : supported_head_dims()) {
            max_head_dim = std::max(max_head_dim, d.head_dim);
            max_head_dim_v = std::max(max_head_dim_v, d.head_dim_v);
            if (d.head_dim >= call.head_dim) max_head_dim_v_here = std::max(max_head_dim_v_here, d.head_dim_v);
        }
        if (call.head_dim > max_head_dim) {
            std::snprintf(problem, sizeof problem, "head_dim %d exceeds %d", int(call.head_dim), int(max_head_dim));
        } else if (max_head_dim_v_here == max_head_dim_v) {
            std::snprintf(problem, sizeof problem, "%s %d exceeds %d", v_name, int(call.head_dim_v),
                          int(max_head_dim_v));
        } else {
            std::snprintf(problem, sizeof problem, "%s %d exceeds %d, the largest with head_dim >= %d", v_name,
                          int(call.head_dim_v), int(max_head_dim_v_here), int(call.head_dim));
        }
    }
    return unsupported_head_dims(problem);
}

}  // namespace

bool forward_is_empty(const flashcore_forward_params &p) {
    return p.batch_size == 0 || p.seqlen_q == 0 || p.num_heads_q == 0 ||
           (p.cu_seqlens_q != nullptr && p.total_seqlen_q == 0);
}

flashcore_status validate_sizes(const flashcore_forward_params &p) {
    const struct {
        int32_t value;
        const char *name;
    } sizes[] = {{p.batch_size, "batch_size"},   {p.seqlen_q, "seqlen_q"},         {p.seqlen_k, "seqlen_k"},
                 {p.num_heads_q, "num_heads_q"}, {p.num_heads_kv, "num_heads_kv"}};
    for (const auto &s : sizes) {
        if (s.value < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s (%d) must be >= 0 (0 only where the output is empty: batch_size, seqlen_q or "
                        "num_heads_q 0)",
                        s.name, int(s.value));
        }
    }
    if (p.head_dim < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim (%d) must be >= 1", int(p.head_dim));
    }
    if (p.head_dim_v < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim_v (%d) must be >= 1, or 0 for the same as head_dim",
                    int(p.head_dim_v));
    }
    // Keys and K/V heads may be missing only where no output row needs them.
    if (p.num_heads_kv == 0 && p.num_heads_q != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "num_heads_kv (0) must be >= 1 where num_heads_q (%d) is not 0", int(p.num_heads_q));
    }
    if (p.seqlen_k == 0 && !forward_is_empty(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "seqlen_k (0) must be >= 1 where the output is not empty (batch_size %d, seqlen_q %d, "
                    "num_heads_q %d)",
                    int(p.batch_size), int(p.seqlen_q), int(p.num_heads_q));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_shapes(const flashcore_forward_params &p) {
    if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "dtype %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d)",
                    int(p.dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16));
    }
    flashcore_status status = validate_sizes(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.num_heads_kv != 0 && p.num_heads_q % p.num_heads_kv != 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                    int(p.num_heads_q), int(p.num_heads_kv));
    }
    status = check_head_dims(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "seqlen_q (%d) and seqlen_k (%d) must be at most %d",
                    int(p.seqlen_q), int(p.seqlen_k), int(kMaxSeqlen));
    }
    if (p.num_splits < 0 || p.num_splits > FLASHCORE_MAX_NUM_SPLITS) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "num_splits (%d) must be 0 (chosen per call), 1 (no split) or at most "
                    "FLASHCORE_MAX_NUM_SPLITS (%d)",
                    int(p.num_splits), int(FLASHCORE_MAX_NUM_SPLITS));
    }
    if (p.softmax_scale != FLASHCORE_SOFTMAX_SCALE_DEFAULT && !(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.f)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale (%g) must be finite and > 0, or FLASHCORE_SOFTMAX_SCALE_DEFAULT (0) for "
                    "1/sqrt(head_dim)",
                    double(p.softmax_scale));
    }
    // -0 compares equal to the default's +0, but a caller who passes it most
    // likely computed a negative scale that underflowed: refused, not taken
    // for 1/sqrt(head_dim).
    if (p.softmax_scale == 0.f && std::signbit(p.softmax_scale)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale is -0.0; it must be finite and > 0, or +0 (FLASHCORE_SOFTMAX_SCALE_DEFAULT) for "
                    "1/sqrt(head_dim)");
    }
    // The kernels exponentiate with exp2: the scale times log2(e) must be a
    // finite float too.
    if (!std::isfinite(softmax_scale_log2(p))) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale (%g) times log2(e) overflows a float; it must be at most %g",
                    double(p.softmax_scale), double(FLT_MAX) / double(kLog2e));
    }
    status = validate_window(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = validate_packing(p);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    return validate_softcap(p);
}

flashcore_status validate_packing(const flashcore_forward_params &p) {
    const struct {
        const int32_t *cu_seqlens;
        int32_t total;
        const char *side;
    } packed[] = {{p.cu_seqlens_q, p.total_seqlen_q, "q"}, {p.cu_seqlens_k, p.total_seqlen_k, "k"}};
    for (const auto &t : packed) {
        if (t.cu_seqlens == nullptr && t.total != 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "total_seqlen_%s (%d) is set but cu_seqlens_%s is NULL; total_seqlen_%s counts the rows of "
                        "packed (variable-length) tensors and must be 0 without them",
                        t.side, int(t.total), t.side, t.side);
        }
        if (t.cu_seqlens != nullptr && (t.total < 0 || t.total > kMaxSeqlen)) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "total_seqlen_%s (%d) must be in [0, %d]: the rows of the packed tensors (cu_seqlens_%s[batch_size])",
                        t.side, int(t.total), int(kMaxSeqlen), t.side);
        }
    }
    if (p.cu_seqlens_k != nullptr && p.total_seqlen_k == 0 && !forward_is_empty(p)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "total_seqlen_k (0) must be >= 1 where the output is not empty: k and v hold no rows");
    }
    if (p.block_table == nullptr) {
        if (p.page_size != 0 || p.num_pages != 0 || p.block_table_batch_stride != 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "page_size (%d), num_pages (%d) and block_table_batch_stride (%" PRId64
                        ") describe a paged K/V cache and must be 0 without a block_table",
                        int(p.page_size), int(p.num_pages), p.block_table_batch_stride);
        }
        return FLASHCORE_STATUS_SUCCESS;
    }
    if (p.cu_seqlens_k != nullptr) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "cu_seqlens_k and block_table cannot be combined: a paged cache's key counts come from seqused_k "
                    "(cu_seqlens_q with a block_table is supported)");
    }
    // A page of no keys is wrong whatever the GPU (a size <= 0); other
    // sizes are what the kernels do not implement.
    if (p.page_size < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "page_size (%d) must be >= 1 with a block_table; pages must hold a multiple of %d keys", int(p.page_size),
                    int(kPageSizeMultiple));
    }
    if (p.page_size % kPageSizeMultiple != 0 || p.page_size > kMaxSeqlen) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "page_size (%d) is not supported; pages must hold a multiple of %d keys, at most %d",
                    int(p.page_size), int(kPageSizeMultiple), int(kMaxSeqlen));
    }
    if (p.num_pages < 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "num_pages (%d) must be >= 1 with a block_table",
                    int(p.num_pages));
    }
    // An empty call's strides are not looked at (flashcore.h, "Empty calls").
    if (forward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    const int64_t pages_per_seq = pages_per_sequence(p);
    if (p.block_table_batch_stride < pages_per_seq && p.batch_size > 1) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "block_table_batch_stride (%" PRId64 ") must be at least ceil(seqlen_k / page_size) = %" PRId64
                    ": each row of the table lists the pages of a sequence of up to seqlen_k (%d) keys",
                    p.block_table_batch_stride, pages_per_seq, int(p.seqlen_k));
    }
    if (p.block_table_batch_stride < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "block_table_batch_stride (%" PRId64 ") must be >= 0",
                    p.block_table_batch_stride);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_window(const flashcore_forward_params &p) {
    if (p.use_window == 0) return FLASHCORE_STATUS_SUCCESS;
    const struct {
        int32_t value;
        const char *name;
    } bounds[] = {{p.window_left, "window_left"}, {p.window_right, "window_right"}};
    for (const auto &b : bounds) {
        if (b.value < -1) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                        "%s (%d) must be -1 (unbounded) or >= 0 (keys seen on that side of the diagonal)", b.name,
                        int(b.value));
        }
    }
    if (p.causal != 0 && p.window_right > 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "window_right (%d) must be -1 or 0 with causal, which is window_right 0; for a window reaching "
                    "%d keys past the diagonal pass causal 0",
                    int(p.window_right), int(p.window_right));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_softcap(const flashcore_forward_params &p) {
    if (p.softcap == 0.f) return FLASHCORE_STATUS_SUCCESS;
    if (!(std::isfinite(p.softcap) && p.softcap > 0.f)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "softcap (%g) must be finite and > 0, or 0 for none",
                    double(p.softcap));
    }
    if (!std::isfinite(p.softcap * kLog2e)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softcap (%g) times log2(e) overflows a float; it must be at most %g", double(p.softcap),
                    double(FLT_MAX) / double(kLog2e));
    }
    // The kernels scale the raw scores by softmax_scale / softcap before the
    // tanh; a quotient of 0 would read as "no softcap".
    const float prescale = softcap_prescale(p);
    if (!(prescale > 0.f) || !std::isfinite(prescale)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "softmax_scale / softcap (%g / %g) is not a finite float > 0; a softcap this far from the "
                    "scale caps nothing",
                    double(effective_softmax_scale(p)), double(p.softcap));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

namespace {

// q, k, v or out as strided [batch][seq][head][dim] extents: packed
// (variable-length) tensors are one batch of all their rows, their batch
// strides ignored; a paged cache is num_pages batches of page_size rows.
TensorDims forward_tensor(const flashcore_forward_params &p, int index) {
    const int32_t d = p.head_dim;
    const int32_t dv = effective_head_dim_v(p);
    const bool packed_q = p.cu_seqlens_q != nullptr;
    const int32_t q_batches = packed_q ? 1 : p.batch_size;
    const int32_t q_rows = packed_q ? p.total_seqlen_q : p.seqlen_q;
    int32_t kv_batches = p.batch_size, kv_rows = p.seqlen_k;
    if (p.cu_seqlens_k != nullptr) kv_batches = 1, kv_rows = p.total_seqlen_k;
    if (p.block_table != nullptr) kv_batches = p.num_pages, kv_rows = p.page_size;
    const bool packed_kv = p.cu_seqlens_k != nullptr;
    switch (index) {
        case 0:
            return {"q", p.q, q_batches, q_rows, p.num_heads_q, d, packed_q ? 0 : p.q_batch_stride, p.q_seq_stride,
                    p.q_head_stride};
        case 1:
            return {"k", p.k, kv_batches, kv_rows, p.num_heads_kv, d, packed_kv ? 0 : p.k_batch_stride,
                    p.k_seq_stride, p.k_head_stride};
        case 2:
            return {"v", p.v, kv_batches, kv_rows, p.num_heads_kv, dv, packed_kv ? 0 : p.v_batch_stride,
                    p.v_seq_stride, p.v_head_stride};
        default:
            return {"out", p.out, q_batches, q_rows, p.num_heads_q, dv, packed_q ? 0 : p.out_batch_stride,
                    p.out_seq_stride, p.out_head_stride};
    }
}
constexpr int kForwardTensors = 4;  // q, k, v, out
constexpr int kForwardOut = 3;

// A contiguous float32 LSE of `rows` values.
ByteRange lse_range(const float *lse, __int128 rows) {
    const unsigned __int128 begin = reinterpret_cast<uintptr_t>(lse);
    return {"lse", begin, begin + (unsigned __int128)rows * sizeof(float), true};
}

// An int32 array the kernels read (seqused_k, cu_seqlens_q/_k, block_table).
ByteRange int32_range(const char *name, const int32_t *array, __int128 count) {
    const unsigned __int128 begin = reinterpret_cast<uintptr_t>(array);
    return {name, begin, begin + (unsigned __int128)count * sizeof(int32_t), false};
}

// The entries of the block table the kernels may read: every row's first
// ceil(seqlen_k / page_size).
__int128 block_table_entries(const flashcore_forward_params &p) {
    return __int128(p.batch_size - 1) * p.block_table_batch_stride + pages_per_sequence(p);
}

// The int32 arrays of a call, with the entries each holds.
struct Int32Array {
    const char *name;
    const int32_t *data;
    __int128 count;
};
size_t int32_arrays(const flashcore_forward_params &p, Int32Array *arrays) {
    size_t n = 0;
    if (p.seqused_k != nullptr) arrays[n++] = {"seqused_k", p.seqused_k, p.batch_size};
    if (p.cu_seqlens_q != nullptr) arrays[n++] = {"cu_seqlens_q", p.cu_seqlens_q, __int128(p.batch_size) + 1};
    if (p.cu_seqlens_k != nullptr) arrays[n++] = {"cu_seqlens_k", p.cu_seqlens_k, __int128(p.batch_size) + 1};
    if (p.block_table != nullptr) arrays[n++] = {"block_table", p.block_table, block_table_entries(p)};
    return n;
}
constexpr size_t kMaxInt32Arrays = 4;

}  // namespace

size_t forward_ranges(const flashcore_forward_params &p, ByteRange *ranges) {
    size_t n = 0;
    for (int i = 0; i < kForwardTensors; ++i) ranges[n++] = tensor_range(forward_tensor(p, i), i == kForwardOut);
    if (p.lse != nullptr) {
        // [num_heads_q][total_seqlen_q] for packed queries.
        const __int128 rows = p.cu_seqlens_q != nullptr ? __int128(p.num_heads_q) * p.total_seqlen_q
                                                        : __int128(p.batch_size) * p.num_heads_q * p.seqlen_q;
        ranges[n++] = lse_range(p.lse, rows);
    }
    Int32Array arrays[kMaxInt32Arrays];
    const size_t count = int32_arrays(p, arrays);
    for (size_t i = 0; i < count; ++i) ranges[n++] = int32_range(arrays[i].name, arrays[i].data, arrays[i].count);
    return n;
}

flashcore_status check_no_aliasing(const ByteRange *ranges, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        for (size_t j = 0; j < i; ++j) {
            const ByteRange &a = ranges[i], &b = ranges[j];
            if (!a.written && !b.written) continue;
            if (a.begin < b.end && b.begin < a.end) {
                return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                            "%s (bytes 0x%" PRIx64 " to 0x%" PRIx64 ") overlaps %s (bytes 0x%" PRIx64 " to 0x%" PRIx64
                            "); out, lse and the workspace must not overlap the inputs (q, k, v, seqused_k, cu_seqlens_q/_k, "
                            "block_table; a merge's partials) or one another",
                            a.name, uint64_t(a.begin), uint64_t(a.end - 1), b.name, uint64_t(b.begin),
                            uint64_t(b.end - 1));
            }
        }
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status validate_tensors(const flashcore_forward_params &p) {
    if (forward_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    for (int i = 0; i < kForwardTensors; ++i) {
        const flashcore_status status = check_tensor(forward_tensor(p, i));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    flashcore_status status = check_no_self_overlap(forward_tensor(p, kForwardOut));
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    Int32Array arrays[kMaxInt32Arrays];
    const size_t count = int32_arrays(p, arrays);
    for (size_t i = 0; i < count; ++i) {
        status = check_pointer(arrays[i].data, arrays[i].name, alignof(int32_t));
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    ByteRange ranges[kMaxForwardRanges];
    return check_no_aliasing(ranges, forward_ranges(p, ranges));
}

namespace {

size_t merge_element_bytes(int32_t dtype) { return dtype == FLASHCORE_DTYPE_FP32 ? 4 : 2; }

flashcore_status check_merge_dtype(int32_t dtype, const char *name) {
    if (dtype == FLASHCORE_DTYPE_FP16 || dtype == FLASHCORE_DTYPE_BF16 || dtype == FLASHCORE_DTYPE_FP32) {
        return FLASHCORE_STATUS_SUCCESS;
    }
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "%s %d is not supported; supported: FLASHCORE_DTYPE_FP16 (%d), FLASHCORE_DTYPE_BF16 (%d), "
                "FLASHCORE_DTYPE_FP32 (%d)",
                name, int(dtype), int(FLASHCORE_DTYPE_FP16), int(FLASHCORE_DTYPE_BF16), int(FLASHCORE_DTYPE_FP32));
}

}  // namespace

flashcore_status validate_merge(const flashcore_merge_params &p) {
    flashcore_status status = check_merge_dtype(p.partial_dtype, "partial_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_merge_dtype(p.out_dtype, "out_dtype");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // Batches, heads and rows may be 0 (nothing to merge); states and
    // head_dim may not. The kernel counts states and columns in 32-bit ints,
    // stepping past the last by up to a warp's worth: their documented
    // bounds keep that far from 2^31.
    const struct {
        int32_t value;
        const char *name;
        int32_t min;
        const char *max_name;  // nullptr: no bound but int32_t's
        int32_t max;
    } sizes[] = {
        {p.num_states, "num_states", 1, "FLASHCORE_MERGE_MAX_NUM_STATES", FLASHCORE_MERGE_MAX_NUM_STATES},
        {p.batch_size, "batch_size", 0, nullptr, INT32_MAX},
        {p.num_heads, "num_heads", 0, nullptr, INT32_MAX},
        {p.seqlen, "seqlen", 0, nullptr, INT32_MAX},
        {p.head_dim, "head_dim", 1, "FLASHCORE_MERGE_MAX_HEAD_DIM", FLASHCORE_MERGE_MAX_HEAD_DIM},
    };
    for (const auto &s : sizes) {
        if (s.value < s.min) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be >= %d", s.name, int(s.value), int(s.min));
        }
        if (s.value > s.max) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%d) must be at most %s (%d)", s.name, int(s.value),
                        s.max_name, int(s.max));
        }
    }
    if (p.head_dim % kHeadDimMultiple != 0) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED, "head_dim %d is not a multiple of %d", int(p.head_dim),
                    int(kHeadDimMultiple));
    }
    if (merge_is_empty(p)) return FLASHCORE_STATUS_SUCCESS;
    TensorDims partial{"partial_out", p.partial_out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                       p.partial_batch_stride, p.partial_seq_stride, p.partial_head_stride};
    partial.element_bytes = merge_element_bytes(p.partial_dtype);
    partial.states = p.num_states;
    partial.state_stride = p.partial_state_stride;
    partial.stride_prefix = "partial";
    TensorDims out{"out", p.out, p.batch_size, p.seqlen, p.num_heads, p.head_dim,
                   p.out_batch_stride, p.out_seq_stride, p.out_head_stride};
    out.element_bytes = merge_element_bytes(p.out_dtype);
    for (const TensorDims *t : {&partial, &out}) {
        status = check_tensor(*t);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = check_no_self_overlap(out);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;

    // The LSE values: 4-byte aligned, any non-negative strides.
    status = check_pointer(p.partial_lse, "partial_lse", kLseAlignment);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    const struct {
        const char *name;
        int64_t stride;
        int32_t extent;
    } lse_dims[] = {{"lse_state_stride", p.lse_state_stride, p.num_states},
                    {"lse_batch_stride", p.lse_batch_stride, p.batch_size},
                    {"lse_head_stride", p.lse_head_stride, p.num_heads},
                    {"lse_seq_stride", p.lse_seq_stride, p.seqlen}};
    __int128 last_lse = 0;
    for (const auto &d : lse_dims) {
        if (d.stride < 0) {
            return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s (%" PRId64 ") must be >= 0", d.name, d.stride);
        }
        last_lse += __int128(d.extent - 1) * d.stride;
    }
    if (last_lse * __int128(sizeof(float)) > __int128(INT64_MAX)) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "partial_lse strides address more than 2^63 bytes");
    }
    if (p.lse != nullptr) {
        status = check_pointer(p.lse, "lse", kLseAlignment);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    const unsigned __int128 partial_lse_begin = reinterpret_cast<uintptr_t>(p.partial_lse);
    ByteRange ranges[] = {
        tensor_range(partial, false),
        {"partial_lse", partial_lse_begin, partial_lse_begin + (unsigned __int128)(last_lse + 1) * sizeof(float),
         false},
        tensor_range(out, true),
        lse_range(p.lse, __int128(p.batch_size) * p.num_heads * p.seqlen),
    };
    return check_no_aliasing(ranges, p.lse != nullptr ? 4 : 3);
}

bool merge_is_empty(const flashcore_merge_params &p) {
    return p.batch_size == 0 || p.num_heads == 0 || p.seqlen == 0;
}

}  // namespace flashcore
