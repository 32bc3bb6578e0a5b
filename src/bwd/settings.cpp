// FLASHCORE_BWD_VARIANT: the backward family's settings (family_settings.h).
#include <cstdlib>
#include <cstring>

#include "bwd/registry.h"
#include "error.h"
#include "family_settings.h"

namespace flashcore {

// FLASHCORE_BWD_VARIANT chooses the backward kernel for every call of the
// handle: unset or empty, the sm_90a kernel where it runs and has the call's
// head dims (else the portable one); hopper, the same, but an error where
// the device or the build has no sm_90a backward kernels; portable, or its
// one tile kvblock, the portable kernel.
flashcore_status read_bwd_settings(const flashcore_handle_s &h, FamilySettings *settings) {
    const bool has_kernels = bwd_kernels().has_path(KernelPath::kSm90);
    settings->use_hopper = runs_hopper_kernels(h, has_kernels);
    const char *value = std::getenv("FLASHCORE_BWD_VARIANT");
    if (value == nullptr || *value == '\0') return FLASHCORE_STATUS_SUCCESS;
    if (std::strcmp(value, kHopperPath) == 0) {
        return hopper_setting_usable(h, "FLASHCORE_BWD_VARIANT=hopper", has_kernels);
    }
    if (std::strcmp(value, kPortablePath) == 0 || std::strcmp(value, bwd_tile_name(BwdVariant::kKvBlock)) == 0) {
        settings->use_hopper = false;
        return FLASHCORE_STATUS_SUCCESS;
    }
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "FLASHCORE_BWD_VARIANT is '%.64s'; it must be unset, empty, '%s', '%s' or '%s' (the portable "
                "kernel's one tile)",
                value, kPortablePath, kHopperPath, bwd_tile_name(BwdVariant::kKvBlock));
}

}  // namespace flashcore
