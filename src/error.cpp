#include "error.h"

#include <cstdarg>
#include <cstdio>

namespace flashcore {
namespace {

// Long enough for any message flashcore writes; longer ones are truncated.
constexpr size_t kMessageCapacity = 1024;
thread_local char t_message[kMessageCapacity] = "";

}  // namespace

void clear_error() { t_message[0] = '\0'; }

flashcore_status fail(flashcore_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(t_message, kMessageCapacity, format, args);
    va_end(args);
    return status;
}

flashcore_status fail_cuda(cudaError_t error, const char *operation) {
    flashcore_status status = FLASHCORE_STATUS_CUDA_ERROR;
    switch (error) {
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorSystemDriverMismatch:
        case cudaErrorCompatNotSupportedOnDevice:
            status = FLASHCORE_STATUS_NO_DEVICE;
            break;
        case cudaErrorMemoryAllocation:
            status = FLASHCORE_STATUS_OUT_OF_MEMORY;
            break;
        default:
            break;
    }
    return fail(status, "%s failed: %s (%s, CUDA error %d)", operation, cudaGetErrorString(error),
                cudaGetErrorName(error), int(error));
}

const char *last_error_message() { return t_message; }

}  // namespace flashcore
