// What every kernel family's registry is made of: a kernel's key (path,
// element types, head dims, tile) and the generated table of a family's
// kernels (kernels/kernels.list -> generated/<family>_kernels.inc), with the
// questions dispatch and validation ask it. A family supplies its tile enum
// and entry-point types (its `Family` struct: fwd/registry.h) and its own
// registry source that expands its table; nothing here names a family.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace flashcore {

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

// A read-only run of T.
template <typename T>
struct Span {
    const T *data;
    size_t size;
    const T *begin() const { return data; }
    const T *end() const { return data + size; }
};

// One kernel of a family: a line of kernels/kernels.list in one input type.
// Family provides Tile (its tiles.def enum), Run (the launcher's function
// type) and InfoFn (the function type of what its dispatcher checks before
// a launch: the backward's depends on the device's shared memory per block,
// which picks its configuration).
template <typename Family>
struct KernelEntry {
    KernelPath path;
    DType input;
    DType kv;  // of K and V: input, or a quantized type (e4m3)
    DType output;
    HeadDims dims;
    typename Family::Tile tile;
    typename Family::Run run;
    typename Family::InfoFn info;
};

// A family's kernels, in list order. Lookups are linear: a family has tens
// of kernels, and a call looks up a handful.
template <typename Family>
struct KernelTable {
    using Entry = KernelEntry<Family>;
    Span<Entry> kernels;

    // The kernel of that path, input and K/V types, kernel head dims and
    // tile, or nullptr where this build has none.
    const Entry *find(KernelPath path, DType input, DType kv, HeadDims dims, typename Family::Tile tile) const {
        for (const Entry &e : kernels) {
            if (e.path == path && e.input == input && e.kv == kv && e.dims == dims && e.tile == tile) return &e;
        }
        return nullptr;
    }

    // Whether this build has any kernel of that path.
    bool has_path(KernelPath path) const {
        for (const Entry &e : kernels) {
            if (e.path == path) return true;
        }
        return false;
    }
};

// The sorted, distinct head dims of a table's kernels of one path, built at
// compile time (kCapacity: at least the table's size).
template <size_t kCapacity>
struct HeadDimSet {
    HeadDims pairs[kCapacity];
    size_t count;

    constexpr void insert(HeadDims dims) {
        size_t at = 0;
        while (at < count && pairs[at] < dims) ++at;
        if (at < count && pairs[at] == dims) return;
        for (size_t i = count; i > at; --i) pairs[i] = pairs[i - 1];
        pairs[at] = dims;
        ++count;
    }
    Span<HeadDims> span() const { return {pairs, count}; }
};

// The head dims of the kernels `selected(entry)` holds for.
template <typename Entry, size_t kSize, typename Selected>
constexpr HeadDimSet<kSize> head_dims_where(const Entry (&kernels)[kSize], Selected selected) {
    HeadDimSet<kSize> set{};
    for (const Entry &e : kernels) {
        if (selected(e)) set.insert(e.dims);
    }
    return set;
}

template <typename Entry, size_t kSize>
constexpr HeadDimSet<kSize> head_dims_of_path(const Entry (&kernels)[kSize], KernelPath path) {
    return head_dims_where(kernels, [path](const Entry &e) { return e.path == path; });
}

// The first pair of `supported` (sorted) with both components at least the
// call's. Returns false where none covers the call.
inline bool covering_head_dims(Span<HeadDims> supported, HeadDims call, HeadDims *kernel) {
    for (const HeadDims &dims : supported) {
        if (dims.head_dim >= call.head_dim && dims.head_dim_v >= call.head_dim_v) {
            *kernel = dims;
            return true;
        }
    }
    return false;
}

}  // namespace flashcore
