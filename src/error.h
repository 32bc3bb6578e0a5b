// The calling thread's last error message, and the helpers every API entry
// point uses to report a failure with it.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcore.h"

namespace flashcore {

// Clears the calling thread's message (called on entry to every API function).
void clear_error();

// Records a printf-style message for the calling thread and returns status.
flashcore_status fail(flashcore_status status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Maps a CUDA runtime error to a status, with a message naming the failed
// operation and the CUDA error.
flashcore_status fail_cuda(cudaError_t error, const char *operation);

const char *last_error_message();

}  // namespace flashcore
