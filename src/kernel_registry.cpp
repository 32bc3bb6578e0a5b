#include "kernel_registry.h"

#include <iterator>

namespace flashcore {
namespace {

#define FLASHCORE_KERNEL_PATH_sm80 KernelPath::kSm80
#define FLASHCORE_KERNEL_PATH_sm90 KernelPath::kSm90
// One line of fwd_kernel_list.inc: (path token sm80|sm90, DType enumerator,
// head_dim, head_dim_v, FwdVariant enumerator).
#define FLASHCORE_FWD_KERNEL(path, dtype, head_dim, head_dim_v, variant)                               \
    KernelEntry{FLASHCORE_KERNEL_PATH_##path,                                                          \
                DType::dtype,                                                                          \
                HeadDims{head_dim, head_dim_v},                                                        \
                FwdVariant::variant,                                                                   \
                &run_fwd_##path<DType::dtype, head_dim, head_dim_v, FwdVariant::variant>,              \
                &fwd_info_##path<DType::dtype, head_dim, head_dim_v, FwdVariant::variant>},

constexpr KernelEntry kKernels[] = {
#include "fwd_kernel_list.inc"
};

#undef FLASHCORE_FWD_KERNEL
#undef FLASHCORE_KERNEL_PATH_sm80
#undef FLASHCORE_KERNEL_PATH_sm90

constexpr size_t kNumKernels = std::size(kKernels);

// The sorted, distinct head dims of the sm80 kernels, built at compile time.
struct HeadDimTable {
    HeadDims pairs[kNumKernels];
    size_t count;
};

constexpr HeadDimTable make_supported_head_dims() {
    HeadDimTable table{};
    for (const KernelEntry &e : kKernels) {
        if (e.path != KernelPath::kSm80) continue;
        const HeadDims dims = e.dims;
        size_t at = 0;
        while (at < table.count && table.pairs[at] < dims) ++at;
        if (at < table.count && table.pairs[at] == dims) continue;
        for (size_t i = table.count; i > at; --i) table.pairs[i] = table.pairs[i - 1];
        table.pairs[at] = dims;
        ++table.count;
    }
    return table;
}

constexpr HeadDimTable kSupportedHeadDims = make_supported_head_dims();

constexpr bool has_sm80_twin(const KernelEntry &e) {
    for (const KernelEntry &other : kKernels) {
        if (other.path == KernelPath::kSm80 && other.dtype == e.dtype && other.dims == e.dims) {
            return true;
        }
    }
    return false;
}

constexpr bool every_kernel_is_well_formed() {
    for (const KernelEntry &e : kKernels) {
        for (const int32_t dim : {e.dims.head_dim, e.dims.head_dim_v}) {
            if (dim < kHeadDimMultiple || dim % kHeadDimMultiple != 0) return false;
        }
        if (!has_sm80_twin(e)) return false;
    }
    return true;
}

static_assert(kSupportedHeadDims.count > 0, "fwd_kernel_list.inc has no sm80 kernel");
static_assert(every_kernel_is_well_formed(),
              "every kernel's head dims must be multiples of kHeadDimMultiple, and every sm90 kernel needs an sm80 "
              "kernel of the same dtype and head dims");

}  // namespace

Span<HeadDims> supported_head_dims() { return {kSupportedHeadDims.pairs, kSupportedHeadDims.count}; }

bool covering_head_dims(HeadDims call, HeadDims *kernel) {
    for (const HeadDims &dims : supported_head_dims()) {
        if (dims.head_dim >= call.head_dim && dims.head_dim_v >= call.head_dim_v) {
            *kernel = dims;
            return true;
        }
    }
    return false;
}

const KernelEntry *find_kernel(KernelPath path, DType dtype, HeadDims kernel, FwdVariant variant) {
    for (const KernelEntry &e : kKernels) {
        if (e.path == path && e.dtype == dtype && e.dims == kernel && e.variant == variant) {
            return &e;
        }
    }
    return nullptr;
}

bool has_kernels(KernelPath path) {
    for (const KernelEntry &e : kKernels) {
        if (e.path == path) return true;
    }
    return false;
}

}  // namespace flashcore
