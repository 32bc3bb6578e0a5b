// Tile configuration of the sm90 kernel per (element type, head_dim):
// 128 query rows (two consumer warpgroups of 64) by 128-key tiles, two K/V
// stages, and O staging for the TMA store. At head_dim 64 a second Q buffer
// lets the next block's Q load early (112 KB of shared memory in all); at
// 128 the second buffer measured no faster (193 KB with one).
#pragma once

#include "fwd_config.cuh"
#include "sm90_traits.cuh"

namespace flashcore::sm90 {

template <DType kDType, int kHeadDim>
struct Sm90Config {
    using Traits = Sm90Traits<typename ElementOf<kDType>::type, kHeadDim, /*kBlockN=*/128, /*kStages=*/2,
                              /*kQStages=*/kHeadDim <= 64 ? 2 : 1>;
};

}  // namespace flashcore::sm90
