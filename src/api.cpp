// The exported C functions every family shares: version, status strings,
// the thread's last error, handles. Each family's own are in
// src/<family>/api.cpp. Each one clears the thread's error message, checks
// its arguments, and never lets a C++ exception cross the boundary
// (api_guard.h).
#include <cuda_runtime_api.h>

#include <new>

#include "abi_enums.h"
#include "api_guard.h"
#include "flashcore.h"
#include "handle.h"

namespace flashcore {
namespace {

#define FLASHCORE_STR2(x) #x
#define FLASHCORE_STR(x) FLASHCORE_STR2(x)
constexpr const char kVersionString[] = FLASHCORE_STR(FLASHCORE_VERSION_MAJOR) "." FLASHCORE_STR(
    FLASHCORE_VERSION_MINOR) "." FLASHCORE_STR(FLASHCORE_VERSION_PATCH);

}  // namespace
}  // namespace flashcore

using namespace flashcore;

extern "C" {

unsigned flashcore_version_number(void) { return FLASHCORE_VERSION_NUMBER; }

const char *flashcore_version_string(void) { return kVersionString; }

int flashcore_cuda_runtime_version(void) { return CUDART_VERSION; }

// The functions that take an enum by value are defined in abi_enums.c:
// C reads any int there, where C++ must not load an enum outside its
// enumerators' range. They pass the value on as an int32_t.
const char *fcimpl_status_string(int32_t status) {
    switch (status) {
        case FLASHCORE_STATUS_SUCCESS: return "success";
        case FLASHCORE_STATUS_INVALID_ARGUMENT: return "invalid argument";
        case FLASHCORE_STATUS_UNSUPPORTED: return "unsupported";
        case FLASHCORE_STATUS_MISALIGNED: return "misaligned";
        case FLASHCORE_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
        case FLASHCORE_STATUS_NO_DEVICE: return "no CUDA device or driver";
        case FLASHCORE_STATUS_CUDA_ERROR: return "CUDA error";
        case FLASHCORE_STATUS_OUT_OF_MEMORY: return "out of memory";
        case FLASHCORE_STATUS_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *flashcore_last_error_message(void) { return last_error_message(); }

flashcore_status flashcore_create(flashcore_handle *handle) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        *handle = nullptr;
        int device = 0;
        const cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return create_handle(0, handle);  // reports the missing device or driver
        }
        return create_handle(device, handle);
    });
}

flashcore_status flashcore_create_for_device(flashcore_handle *handle, int device) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        *handle = nullptr;
        return create_handle(device, handle);
    });
}

flashcore_status flashcore_destroy(flashcore_handle handle) {
    return guarded(__func__, [&] {
        if (handle == nullptr) return FLASHCORE_STATUS_SUCCESS;
        FLASHCORE_TRY(check_handle(handle));
        handle->magic = kHandleDestroyed;
        delete handle;
        return FLASHCORE_STATUS_SUCCESS;
    });
}

flashcore_status flashcore_handle_device(flashcore_handle handle, int *device) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        if (device == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "device is NULL");
        *device = handle->device;
        return FLASHCORE_STATUS_SUCCESS;
    });
}

}  // extern "C"
