// FLASHCORE_FWD_VARIANT: the forward family's settings (family_settings.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "error.h"
#include "family_settings.h"
#include "fwd/registry.h"

namespace flashcore {
namespace {

// The forward's old name for the Hopper path, taken until 0.9.
constexpr const char *kOldHopperPath = "sm90";

}  // namespace

// FLASHCORE_FWD_VARIANT chooses the forward kernel for every call of the
// handle (unset or empty: per call, the sm_90a kernel where it runs):
//   portable        the portable kernel, tile variant chosen per call;
//   large|keysplit|keysplit4|decode|decodepair|wide|widedecode  the portable kernel with that tile variant
//                   (the pinnable tiles of kernels/fwd/tiles.def);
//   hopper (sm90)   the sm_90a kernel; an error where it cannot run.
flashcore_status read_fwd_settings(const flashcore_handle_s &h, FamilySettings *settings) {
    const bool has_kernels = fwd_kernels().has_path(KernelPath::kSm90);
    settings->use_hopper = runs_hopper_kernels(h, has_kernels);
    const char *value = std::getenv("FLASHCORE_FWD_VARIANT");
    if (value == nullptr || *value == '\0') return FLASHCORE_STATUS_SUCCESS;
    if (std::strcmp(value, kHopperPath) == 0 || std::strcmp(value, kOldHopperPath) == 0) {
        settings->hopper_forced = true;
        char setting[64];
        std::snprintf(setting, sizeof setting, "FLASHCORE_FWD_VARIANT=%s", value);
        return hopper_setting_usable(h, setting, has_kernels);
    }
    settings->use_hopper = false;
    if (std::strcmp(value, kPortablePath) == 0) return FLASHCORE_STATUS_SUCCESS;
    FwdVariant pinned{};
    if (fwd_pinnable_tile(value, &pinned)) {
        settings->pinned_tile = int(pinned);
        return FLASHCORE_STATUS_SUCCESS;
    }
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "FLASHCORE_FWD_VARIANT is '%.64s'; it must be unset, empty, '%s', '%s' ('%s' until 0.9), %s", value,
                kPortablePath, kHopperPath, kOldHopperPath, fwd_pinnable_tile_names());
}

}  // namespace flashcore
