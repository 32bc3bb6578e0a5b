// The backward family's kernels: its table generated from
// kernels/kernels.list (generated/bwd_kernels.inc, expanded in registry.cpp),
// and the questions backward dispatch and validation ask it.
#pragma once

#include "bwd/entry_points.h"
#include "kernel_registry.h"

namespace flashcore {

// The backward family, as the generic registry (kernel_registry.h) sees it.
struct BwdFamily {
    using Tile = BwdVariant;
    using Run = cudaError_t (*)(const BwdKernelParams &, const LaunchOptions &, cudaStream_t);
    using Info = BwdKernelInfo;
    // Of the configuration a device with that much shared memory per block
    // (its opt-in limit) runs.
    using InfoFn = Info (*)(size_t max_smem_per_block);
};
using BwdKernel = KernelEntry<BwdFamily>;

// Every backward kernel of this build.
const KernelTable<BwdFamily> &bwd_kernels();

// The head dims the sm80 backward kernels have (what every supported GPU
// runs), sorted by head_dim then head_dim_v, each once. Never empty.
Span<HeadDims> bwd_supported_head_dims();

// The kernel head dims that serve a backward call with head dims `call`
// (multiples of head_dim_multiple(dtype)): the first supported pair with
// both components at least the call's. Returns false where none covers it.
bool bwd_covering_head_dims(HeadDims call, HeadDims *kernel);

// The same among the sm90 kernels' head dims, which may be larger than the
// portable kernel's: an sm90 kernel serves a call of smaller head dims with
// the columns past them zero (its TMA maps end at the call's head dims).
// Returns false where none covers it (or the build has no sm90 kernel).
bool bwd_hopper_covering_head_dims(HeadDims call, HeadDims *kernel);

// A tile's name: its name in kernels/kernels.list and bwd/tiles.def.
const char *bwd_tile_name(BwdVariant tile);

}  // namespace flashcore
