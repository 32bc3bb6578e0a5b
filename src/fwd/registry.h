// The forward family's kernels: its table generated from kernels/kernels.list
// (generated/fwd_kernels.inc, expanded in registry.cpp), and the questions
// forward dispatch and validation ask it.
#pragma once

#include "fwd/entry_points.h"
#include "kernel_registry.h"

namespace flashcore {

// The forward family, as the generic registry (kernel_registry.h) sees it.
struct FwdFamily {
    using Tile = FwdVariant;
    using Run = cudaError_t (*)(const FwdKernelParams &, const FwdLaunchOptions &, cudaStream_t);
    using Info = FwdKernelInfo;
    using InfoFn = Info (*)();
};
using FwdKernel = KernelEntry<FwdFamily>;

// Every forward kernel of this build.
const KernelTable<FwdFamily> &fwd_kernels();

// The head dims the sm80 kernels have (every 16-bit sm90 kernel has an sm80
// twin with its head dims, so these are what every supported GPU runs),
// sorted by head_dim then head_dim_v, each once. Never empty.
Span<HeadDims> fwd_supported_head_dims();

// The head dims of the kernels on quantized (e4m3) K/V (kv_dtype), sorted
// as above; empty where the build has none.
Span<HeadDims> fwd_quantized_kv_head_dims();
// The head dims of the kernels on e4m3 queries (fp8 prefill, sm90 only).
Span<HeadDims> fwd_fp8_head_dims();

// Whether the kernels of head dims `dims` read V as the first head_dim_v
// columns of K's rows (FwdKernelInfo::v_in_k: MLA's latent cache).
bool fwd_head_dims_read_v_from_k(HeadDims dims);

// A tile's name: its name in kernels/kernels.list and fwd/tiles.def.
const char *fwd_tile_name(FwdVariant tile);

// The tile FLASHCORE_FWD_VARIANT=<name> pins the portable kernel to, where
// `name` names one that may be pinned (fwd/tiles.def). Returns false otherwise.
bool fwd_pinnable_tile(const char *name, FwdVariant *tile);

// The names of the tiles that may be pinned, quoted, as "'a', 'b' or 'c'".
const char *fwd_pinnable_tile_names();

}  // namespace flashcore
