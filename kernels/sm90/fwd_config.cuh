// Tile configuration of the sm90 kernel per (element type, head_dim):
// 128 query rows (two consumer warpgroups of 64) by 128-key tiles, two Q
// buffers (the next block's Q loads, and its first S = Q*K^T starts, while
// the current block finishes) and O staging for the TMA store. The K/V ring
// has three stages at head_dim 64 (144 KB of shared memory in all; a third
// stage made tput-2k 4-6% faster, as the next block's first tiles load
// earlier) and two at 128 (225 KB: a third does not fit).
#pragma once

#include "fwd_config.cuh"
#include "sm90_traits.cuh"

namespace flashcore::sm90 {

template <DType kDType, int kHeadDim>
struct Sm90Config {
    using Traits = Sm90Traits<typename ElementOf<kDType>::type, kHeadDim, /*kBlockN=*/128,
                              /*kStages=*/kHeadDim <= 64 ? 3 : 2, /*kQStages=*/2>;
};

}  // namespace flashcore::sm90
