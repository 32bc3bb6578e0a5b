// Tile configuration of the sm90 kernel per (element type, head_dim):
// 128 query rows (two consumer warpgroups of 64) by 128-key tiles, two K/V
// stages, two Q buffers (the next block's Q loads, and its first S = Q*K^T
// starts, while the current block finishes) and O staging for the TMA
// store: 112 KB of shared memory at head_dim 64, 225 KB at 128.
#pragma once

#include "fwd_config.cuh"
#include "sm90_traits.cuh"

namespace flashcore::sm90 {

template <DType kDType, int kHeadDim>
struct Sm90Config {
    using Traits = Sm90Traits<typename ElementOf<kDType>::type, kHeadDim, /*kBlockN=*/128, /*kStages=*/2,
                              /*kQStages=*/2>;
};

}  // namespace flashcore::sm90
