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
// operation and the CUDA error. An error of an earlier asynchronous fault
// (sticky: the context is unusable) is named as such, since no call of the
// library's own raises one synchronously.
flashcore_status fail_cuda(cudaError_t error, const char *operation);

// Whether `error` is one of the sticky errors an asynchronous fault leaves
// in a context (every later call of the process then fails with it).
bool is_sticky_cuda_error(cudaError_t error);

// For the library's own runtime calls: where `error` is a failure, clears
// it from the thread's last-error state (cudaGetLastError), so that it is
// reported once, by flashcore, and not again by whatever asks next. Returns
// `error`.
cudaError_t cleared(cudaError_t error);

const char *last_error_message();

}  // namespace flashcore
