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

bool is_sticky_cuda_error(cudaError_t error) {
    switch (error) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchTimeout:
        case cudaErrorAssert:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorLaunchFailure:
        case cudaErrorECCUncorrectable:
            return true;
        default:
            return false;
    }
}

cudaError_t cleared(cudaError_t error) {
    if (error != cudaSuccess) cudaGetLastError();
    return error;
}

flashcore_status fail_cuda(cudaError_t error, const char *operation) {
    if (is_sticky_cuda_error(error)) {
        return fail(FLASHCORE_STATUS_CUDA_ERROR,
                    "%s failed: the device's CUDA context was already unusable after an earlier asynchronous fault "
                    "(a kernel queued before this call, not necessarily flashcore's): %s (%s, CUDA error %d); the "
                    "error is sticky, so every later CUDA call of this process fails",
                    operation, cudaGetErrorString(error), cudaGetErrorName(error), int(error));
    }
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
