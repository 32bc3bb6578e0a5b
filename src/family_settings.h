// What the environment asks of each family's calls, kept by the handle in
// one table: every family of kernels/kernels.list (generated/families.inc)
// has an entry and reads its own variable (src/<family>/settings.cpp), so
// the handle names no family and a family added to the list needs no edit
// here.
#pragma once

#include <cstddef>

#include "flashcore.h"

struct flashcore_handle_s;

namespace flashcore {

// The values every family's variant variable takes for a path: the
// portable kernels, or the sm_90a (Hopper) ones.
constexpr const char *kPortablePath = "portable";
constexpr const char *kHopperPath = "hopper";

// The families of the kernel list, in its order.
enum class Family {
#define FLASHCORE_FAMILY(name) name,
#include "families.inc"
#undef FLASHCORE_FAMILY
    kCount
};

// One family's settings, read once when the handle is created.
struct FamilySettings {
    // Whether calls may use the sm_90a kernels: the library has them, the
    // device is compute capability 9.0, and the variable does not ask for
    // the portable path.
    bool use_hopper = false;
    // Whether every call the sm_90a kernels can serve uses them, however
    // small (the variable asks for hopper).
    bool hopper_forced = false;
    // The portable tile every call uses (the value of the family's Tile
    // enumerator), or kNoPinnedTile: chosen per call.
    int pinned_tile = kNoPinnedTile;
    static constexpr int kNoPinnedTile = -1;
};

// Whether the handle's device runs the sm_90a kernels (compute capability
// 9.0), where the build has them (has_kernels).
bool runs_hopper_kernels(const flashcore_handle_s &h, bool has_kernels);

// SUCCESS where a setting that asks for the sm_90a kernels (`setting`,
// quoted in the message) can have them; UNSUPPORTED, saying what is
// missing, elsewhere.
flashcore_status hopper_setting_usable(const flashcore_handle_s &h, const char *setting, bool has_kernels);

// Each family's reader of its variable (src/<family>/settings.cpp): its
// settings for handle h, or INVALID_ARGUMENT / UNSUPPORTED naming the value.
#define FLASHCORE_FAMILY(name) \
    flashcore_status read_##name##_settings(const flashcore_handle_s &h, FamilySettings *settings);
#include "families.inc"
#undef FLASHCORE_FAMILY

}  // namespace flashcore
