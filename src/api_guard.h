// What every exported C function does around its body: the thread's error
// message cleared, exceptions mapped to statuses (none crosses the C ABI),
// and the checks several families' functions share. Included by src/api.cpp
// and each family's src/<family>/api.cpp.
#pragma once

#include <cstdint>
#include <new>

#include "error.h"
#include "flashcore.h"

namespace flashcore {

// Runs an API body with the thread's message cleared and exceptions mapped to
// statuses.
template <typename Body>
inline flashcore_status guarded(const char *function, Body &&body) noexcept {
    clear_error();
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(FLASHCORE_STATUS_OUT_OF_MEMORY, "%s: out of host memory", function);
    } catch (...) {
        return fail(FLASHCORE_STATUS_INTERNAL, "%s: unexpected internal exception", function);
    }
}

#define FLASHCORE_TRY(expr)                                       \
    do {                                                          \
        const flashcore_status status_ = (expr);                  \
        if (status_ != FLASHCORE_STATUS_SUCCESS) return status_;  \
    } while (0)

// A flashcore_layout passed as an int (abi_enums.h): one of its enumerators.
inline flashcore_status check_layout(int32_t layout) {
    if (layout == FLASHCORE_LAYOUT_BHSD || layout == FLASHCORE_LAYOUT_BSHD) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "layout %d is not one of FLASHCORE_LAYOUT_BHSD (0), FLASHCORE_LAYOUT_BSHD (1)", int(layout));
}

}  // namespace flashcore
