// Reading the caller's parameter structs whatever header version they were
// built with (the ABI policy in flashcore.h): what every struct that crosses
// the ABI (flashcore_forward_params, flashcore_merge_params, and those to
// come) is read through.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "error.h"
#include "flashcore.h"

namespace flashcore {

// A struct_size beyond this is not a params struct from any header version,
// but an uninitialised field.
constexpr size_t kMaxPlausibleStructSize = 64 * 1024;

// A struct_size for a struct that has had one layout since `first_version`
// (flashcore_merge_params, flashcore_backward_params): at least its size
// then, `first_size`, and plausible (a newer header's may be larger).
inline flashcore_status check_size_since_first_release(size_t size, const char *what, const char *struct_name,
                                                       size_t first_size, const char *first_version) {
    if (size < first_size || size > kMaxPlausibleStructSize) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "%s (%zu) is not a valid size of %s (at least %zu, its size in %s, where it first appeared); "
                    "pass sizeof(%s) to %s_init",
                    what, size, struct_name, first_size, first_version, struct_name, struct_name);
    }
    return FLASHCORE_STATUS_SUCCESS;
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
