#include "fwd/registry.h"

#include <cstdio>
#include <cstring>
#include <iterator>

namespace flashcore {
namespace {

#define FLASHCORE_KERNEL_PATH_sm80 KernelPath::kSm80
#define FLASHCORE_KERNEL_PATH_sm90 KernelPath::kSm90
// One line of fwd_kernels.inc: (path token sm80|sm90, input, K/V and output
// DType enumerators, head_dim, head_dim_v, FwdVariant enumerator).
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile)                                 \
    FwdKernel{FLASHCORE_KERNEL_PATH_##path,                                                                   \
              DType::input,                                                                                   \
              DType::kv,                                                                                      \
              DType::output,                                                                                  \
              HeadDims{head_dim, head_dim_v},                                                                 \
              FwdVariant::tile,                                                                               \
              &run_fwd_##path<DType::input, DType::kv, DType::output, head_dim, head_dim_v, FwdVariant::tile>, \
              &fwd_info_##path<DType::input, DType::kv, DType::output, head_dim, head_dim_v, FwdVariant::tile>},

constexpr FwdKernel kKernels[] = {
#include "fwd_kernels.inc"
};

#undef FLASHCORE_KERNEL
#undef FLASHCORE_KERNEL_PATH_sm80
#undef FLASHCORE_KERNEL_PATH_sm90

constexpr KernelTable<FwdFamily> kTable{{kKernels, std::size(kKernels)}};
constexpr auto kSupportedHeadDims = head_dims_of_path(kKernels, KernelPath::kSm80);

// The head dims of the kernels on quantized (e4m3) K/V, and on e4m3 queries.
constexpr auto kSupportedQuantizedKvHeadDims =
    head_dims_where(kKernels, [](const FwdKernel &e) { return e.kv != e.input; });
constexpr auto kSupportedFp8HeadDims =
    head_dims_where(kKernels, [](const FwdKernel &e) { return e.input == DType::kE4m3; });

constexpr bool has_sm80_twin(const FwdKernel &e) {
    for (const FwdKernel &other : kKernels) {
        if (other.path == KernelPath::kSm80 && other.input == e.input && other.kv == e.input && other.dims == e.dims) {
            return true;
        }
    }
    return false;
}

constexpr bool every_kernel_is_well_formed() {
    for (const FwdKernel &e : kKernels) {
        for (const int32_t dim : {e.dims.head_dim, e.dims.head_dim_v}) {
            if (dim < head_dim_multiple(e.input) || dim % head_dim_multiple(e.input) != 0) return false;
        }
        // The output is the input's type, or bf16 for e4m3 inputs (sm90 only).
        if (e.input == DType::kE4m3) {
            if (e.path != KernelPath::kSm90 || e.kv != e.input || e.output != DType::kBf16) return false;
        } else if (e.input != e.output) {
            return false;
        }
        if (dtype_bytes(e.input) == 2 && e.kv == e.input && !has_sm80_twin(e)) return false;
        // A quantized cache: e4m3 K/V, whole 16-byte vectors of them, under
        // a 16-bit input on the portable path or the sm90 wide tile.
        if (e.kv != e.input) {
            const bool quantizing_path = e.path == KernelPath::kSm80 || e.tile == FwdVariant::kWideWgmma;
            if (e.kv != DType::kE4m3 || dtype_bytes(e.input) != 2 || !quantizing_path) return false;
            for (const int32_t dim : {e.dims.head_dim, e.dims.head_dim_v}) {
                if (dim % head_dim_multiple(e.kv) != 0) return false;
            }
        }
    }
    return true;
}

static_assert(kSupportedHeadDims.count > 0, "fwd_kernels.inc has no sm80 kernel");
static_assert(every_kernel_is_well_formed(),
              "every forward kernel's head dims must be multiples of its vector's elements, its output type its "
              "input's, and every 16-bit sm90 kernel needs an sm80 kernel of the same dtype and head dims "
              "(kernels/fwd/family.cmake checks the list the same way)");

struct TileName {
    const char *name;
    FwdVariant tile;
    bool pinnable;
};
constexpr TileName kTileNames[] = {
#define FLASHCORE_FWD_TILE(name, enumerator, value, path, pinnable) {#name, FwdVariant::enumerator, pinnable != 0},
#include "fwd/tiles.def"
#undef FLASHCORE_FWD_TILE
};

// "'a', 'b' or 'c'" of the pinnable tiles, built once.
struct PinnableNames {
    char text[256];
    PinnableNames() : text{} {
        size_t count = 0, total = 0;
        for (const TileName &t : kTileNames) total += t.pinnable ? 1 : 0;
        for (const TileName &t : kTileNames) {
            if (!t.pinnable) continue;
            const char *separator = count == 0 ? "" : (count + 1 == total ? " or " : ", ");
            const size_t used = std::strlen(text);
            std::snprintf(text + used, sizeof(text) - used, "%s'%s'", separator, t.name);
            ++count;
        }
    }
};

}  // namespace

const KernelTable<FwdFamily> &fwd_kernels() { return kTable; }

Span<HeadDims> fwd_supported_head_dims() { return kSupportedHeadDims.span(); }

Span<HeadDims> fwd_quantized_kv_head_dims() { return kSupportedQuantizedKvHeadDims.span(); }

Span<HeadDims> fwd_fp8_head_dims() { return kSupportedFp8HeadDims.span(); }

bool fwd_head_dims_read_v_from_k(HeadDims dims) {
    for (const FwdKernel &kernel : kTable.kernels) {
        if (kernel.dims == dims && kernel.info().v_in_k) return true;
    }
    return false;
}

const char *fwd_tile_name(FwdVariant tile) {
    for (const TileName &t : kTileNames) {
        if (t.tile == tile) return t.name;
    }
    return "unknown";
}

bool fwd_pinnable_tile(const char *name, FwdVariant *tile) {
    for (const TileName &t : kTileNames) {
        if (t.pinnable && std::strcmp(name, t.name) == 0) {
            *tile = t.tile;
            return true;
        }
    }
    return false;
}

const char *fwd_pinnable_tile_names() {
    static const PinnableNames names;
    return names.text;
}

}  // namespace flashcore
