#include "bwd/registry.h"

#include <iterator>

namespace flashcore {
namespace {

#define FLASHCORE_KERNEL_PATH_sm80 KernelPath::kSm80
#define FLASHCORE_KERNEL_PATH_sm90 KernelPath::kSm90
// One line of bwd_kernels.inc: (path token, input, K/V and output DType
// enumerators, head_dim, head_dim_v, BwdVariant enumerator).
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile)                                 \
    BwdKernel{FLASHCORE_KERNEL_PATH_##path,                                                                   \
              DType::input,                                                                                   \
              DType::kv,                                                                                      \
              DType::output,                                                                                  \
              HeadDims{head_dim, head_dim_v},                                                                 \
              BwdVariant::tile,                                                                               \
              &run_bwd_##path<DType::input, DType::output, head_dim, head_dim_v, BwdVariant::tile>,           \
              &bwd_info_##path<DType::input, DType::output, head_dim, head_dim_v, BwdVariant::tile>},

constexpr BwdKernel kKernels[] = {
#include "bwd_kernels.inc"
};

#undef FLASHCORE_KERNEL
#undef FLASHCORE_KERNEL_PATH_sm80
#undef FLASHCORE_KERNEL_PATH_sm90

constexpr KernelTable<BwdFamily> kTable{{kKernels, std::size(kKernels)}};
constexpr auto kSupportedHeadDims = head_dims_of_path(kKernels, KernelPath::kSm80);
constexpr auto kHopperHeadDims = head_dims_of_path(kKernels, KernelPath::kSm90);

// The gradients are written in the input's type, and every head dim is a
// whole number of the kernels' 16-byte vectors.
constexpr bool every_kernel_is_well_formed() {
    for (const BwdKernel &e : kKernels) {
        for (const int32_t dim : {e.dims.head_dim, e.dims.head_dim_v}) {
            if (dim < head_dim_multiple(e.input) || dim % head_dim_multiple(e.input) != 0) return false;
        }
        if (e.input != e.output || e.kv != e.input) return false;
    }
    return true;
}

static_assert(kSupportedHeadDims.count > 0, "bwd_kernels.inc has no sm80 kernel");
static_assert(every_kernel_is_well_formed(),
              "every backward kernel's head dims must be multiples of its vector's elements and its output type "
              "its input's (kernels/bwd/family.cmake checks the list the same way)");

struct TileName {
    const char *name;
    BwdVariant tile;
};
constexpr TileName kTileNames[] = {
#define FLASHCORE_BWD_TILE(name, enumerator, value, path, pinnable) {#name, BwdVariant::enumerator},
#include "bwd/tiles.def"
#undef FLASHCORE_BWD_TILE
};

}  // namespace

const KernelTable<BwdFamily> &bwd_kernels() { return kTable; }

Span<HeadDims> bwd_supported_head_dims() { return kSupportedHeadDims.span(); }

bool bwd_covering_head_dims(HeadDims call, HeadDims *kernel) {
    return covering_head_dims(bwd_supported_head_dims(), call, kernel);
}

bool bwd_hopper_covering_head_dims(HeadDims call, HeadDims *kernel) {
    return covering_head_dims(kHopperHeadDims.span(), call, kernel);
}

const char *bwd_tile_name(BwdVariant tile) {
    for (const TileName &t : kTileNames) {
        if (t.tile == tile) return t.name;
    }
    return "unknown";
}

}  // namespace flashcore
