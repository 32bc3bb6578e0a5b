// Reading the caller's parameter structs whatever header version they were
// built with (the ABI policy in flashcore.h): what every struct that crosses
// the ABI (flashcore_forward_params, flashcore_merge_params, and those to
// come) is read through.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "error.h"
#include "flashcore.h"

namespace flashcore {

// A struct_size beyond this is not a params struct from any header version,
// but an uninitialised field.
constexpr size_t kMaxPlausibleStructSize = 64 * 1024;

// The sizes a caller's struct_size may take: where a released header's
// struct ended (`released_ends`, in release order, the first where the
// struct first appeared in `first_version`), or that rounded up to the
// struct's alignment (its sizeof then), or at least our own sizeof (a newer
// header's) and plausible. Any other size ends inside a field, which would
// be read in part.
template <typename Struct, size_t kReleases>
flashcore_status check_released_size(size_t size, const char *what, const char *struct_name,
                                     const size_t (&released_ends)[kReleases], const char *first_version) {
    const auto padded = [](size_t end) { return (end + alignof(Struct) - 1) / alignof(Struct) * alignof(Struct); };
    if (size < released_ends[0]) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "%s (%zu) is not a valid size of %s (at least %zu, its size in %s, where it first appeared); "
                    "pass sizeof(%s) to %s_init",
                    what, size, struct_name, released_ends[0], first_version, struct_name, struct_name);
    }
    if (size > kMaxPlausibleStructSize) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "%s (%zu) is not a valid size of %s (more than %zu bytes: an uninitialised field?); pass "
                    "sizeof(%s) to %s_init",
                    what, size, struct_name, kMaxPlausibleStructSize, struct_name, struct_name);
    }
    if (size >= sizeof(Struct)) return FLASHCORE_STATUS_SUCCESS;
    std::string sizes;
    size_t listed = 0;
    for (size_t end : released_ends) {
        if (size == end || size == padded(end)) return FLASHCORE_STATUS_SUCCESS;
        if (padded(end) != listed) {
            listed = padded(end);
            sizes += (sizes.empty() ? "" : ", ") + std::to_string(listed);
        }
    }
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "%s (%zu) is not the size of %s in any flashcore.h (released sizes: %s; a newer header's is at "
                "least %zu); pass sizeof(%s) to %s_init",
                what, size, struct_name, sizes.c_str(), sizeof(Struct), struct_name, struct_name);
}

// Zeroes a caller's struct_size bytes, then writes as much of `defaults` as
// fits in them. Fields this library does not know (a newer caller's) stay
// zero: their documented default.
template <typename Struct>
void write_defaults(Struct *params, size_t struct_size, const Struct &defaults) {
    std::memset(static_cast<void *>(params), 0, struct_size);
    std::memcpy(static_cast<void *>(params), &defaults, std::min(struct_size, sizeof defaults));
}

// A struct larger than ours is from a newer header: fine as long as it sets
// nothing past the fields we know (a new field may sit in what is padding to
// us). A struct of our size or less is from our header or an older one,
// whose padding is not looked at.
inline flashcore_status check_unknown_fields_zero(const void *user, size_t size, size_t our_size, size_t known_end) {
    if (size <= our_size) return FLASHCORE_STATUS_SUCCESS;
    const unsigned char *bytes = static_cast<const unsigned char *>(user);
    for (size_t i = known_end; i < size; ++i) {
        if (bytes[i] != 0) {
            return fail(FLASHCORE_STATUS_UNSUPPORTED,
                        "params sets fields beyond the %zu bytes this library (version %s) knows; it was "
                        "built against a newer flashcore.h",
                        known_end, flashcore_version_string());
        }
    }
    return FLASHCORE_STATUS_SUCCESS;
}

// A caller's flashcore_*_params_init: its struct_size checked by
// check_size, then the defaults init writes into that many bytes.
template <typename Struct>
flashcore_status init_struct(Struct *params, size_t struct_size, flashcore_status (*check_size)(size_t, const char *),
                             void (*init)(Struct *, size_t)) {
    if (params == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
    const flashcore_status status = check_size(struct_size, "struct_size");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    init(params, struct_size);
    return FLASHCORE_STATUS_SUCCESS;
}

// Copies a caller's struct of any header version into *params: its
// struct_size checked by check_size, fields it does not have left at the
// defaults init writes, fields of a newer header (past known_end) refused
// unless zero.
template <typename Struct>
flashcore_status read_struct(const Struct *user, Struct *params, flashcore_status (*check_size)(size_t, const char *),
                             size_t known_end, void (*init)(Struct *, size_t)) {
    if (user == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL");
    const size_t size = user->struct_size;
    flashcore_status status = check_size(size, "params->struct_size");
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = check_unknown_fields_zero(user, size, sizeof(Struct), known_end);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    init(params, sizeof(Struct));
    std::memcpy(static_cast<void *>(params), user, std::min(size, known_end));
    return FLASHCORE_STATUS_SUCCESS;
}

}  // namespace flashcore
