// The forward family's own part of its launch parameters: its tile variants.
// The parameter block itself (FwdKernelParams), which the backward and the
// merge kernel read too, is common/params.h. Plain data only: this header is
// included by host C++ files that are not compiled by nvcc.
#pragma once

#include "common/params.h"

namespace flashcore {

// Tile variants (fwd/tiles.def): the dispatcher picks one per call among
// those built for the call's path and head dims.
enum class FwdVariant : int {
#define FLASHCORE_FWD_TILE(name, enumerator, value, path, pinnable) enumerator = value,
#include "fwd/tiles.def"
#undef FLASHCORE_FWD_TILE
};

}  // namespace flashcore
