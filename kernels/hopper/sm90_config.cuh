// Tile configuration of the sm90 kernel per (element type, head_dim).
// 128 query rows (two consumer warpgroups of 64) by 128-key tiles, two
// stages: 80 KB of shared memory at head_dim 64, 160 KB at 128.
#pragma once

#include "fwd_config.cuh"
#include "sm90_traits.cuh"

namespace flashcore::sm90 {

template <DType kDType, int kHeadDim>
struct Sm90Config {
    using Traits = Sm90Traits<typename ElementOf<kDType>::type, kHeadDim, /*kBlockN=*/128, /*kStages=*/2>;
};

}  // namespace flashcore::sm90
