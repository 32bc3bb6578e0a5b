// Host-side launch of the Hopper backward pass: the portable path's
// preprocess, the sm90 main kernel with its TMA descriptors, and the
// portable path's convert kernel, which reads the dQ accumulator in the
// fragment order this kernel adds it in (config.cuh: the same
// DqAccumLayout). Included only by the generated sm_90a translation units
// (kernels/CMakeLists.txt from bwd/sm90/instantiation.cu.in).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "bwd/entry_points.h"
#include "bwd/passes.cuh"
#include "bwd/sm90/config.cuh"
#include "bwd/sm90/kernel.cuh"
#include "bwd/sm90/tensor_maps.h"
#include "sm90/tensor_map.cuh"

namespace flashcore {

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
BwdKernelInfo bwd_info_sm90(size_t /*max_smem_per_block: one configuration*/) {
    using Traits = typename sm90::BwdSm90Config<kInput, kHeadDim, kHeadDimV>::Traits;
    return {Traits::kSmemBytes, Traits::kBlockM, Traits::kBlockN};
}

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, BwdVariant kVariant>
cudaError_t run_bwd_sm90(const BwdKernelParams &params, const LaunchOptions &options, cudaStream_t stream) {
    static_assert(kInput == kOutput && kVariant == BwdVariant::kHopper,
                  "the sm90 backward writes its input type (bwd/family.cmake)");
    using Traits = typename sm90::BwdSm90Config<kInput, kHeadDim, kHeadDimV>::Traits;
    const FwdKernelParams &f = params.fwd;
    sm90::BwdSm90Params p{};
    p.bwd = bwd_schedule_params<Traits>(params, options);
    const sm90::BwdMapGeometries maps =
        sm90::bwd_map_geometries(params, kInput, Traits::kPanelCols, Traits::kBlockM, Traits::kBlockN);
    // Planning checked that the driver can describe these
    // (bwd_maps_describable): a refusal here is the launch's error.
    using sm90::tensor_map;
    const bool encoded = (!sm90::bwd_reads_queries(params) ||
                          (tensor_map(&p.tma_q, maps.q, f.q) && tensor_map(&p.tma_dout, maps.dout, params.dout))) &&
                         tensor_map(&p.tma_k, maps.k, f.k) && tensor_map(&p.tma_v, maps.v, f.v);
    if (!encoded) return cudaErrorNotSupported;

    return run_bwd_passes<Traits>(p.bwd, options, stream, sm90::flash_bwd_sm90_kernel<Traits>, p);
}

}  // namespace flashcore
