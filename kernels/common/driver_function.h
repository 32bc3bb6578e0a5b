// Driver API functions found through the CUDA runtime, so that the library has
// no link-time dependency on libcuda (the runtime loads the driver itself).
// Shared by the host code (src/handle.cpp) and the sm_90a launch path
// (sm90/tensor_map.cuh).
#pragma once

#include <cuda_runtime.h>

namespace flashcore {

// Every driver function is asked for in its CUDA 12.0 form: the oldest driver
// the CUDA 12 build runs on (525.60.13, CUDA's minor-version compatibility)
// has it, and a newer driver keeps serving that form.
constexpr int kDriverFunctionVersion = 12000;

// The driver's entry point for `name`, or null where the driver lacks it.
inline void *driver_function(const char *name) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion(name, &fn, kDriverFunctionVersion, cudaEnableDefault, &found);
#else
    // Runtimes before 12.5 have no ...ByVersion: they ask for the form of their
    // own version (12.4 for the CUDA 12 build), which for every function asked
    // here (cuCtxGetCurrent, cuCtxSetCurrent, cuTensorMapEncodeTiled,
    // cuTensorMapReplaceAddress) is still the 12.0 form.
    const cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();  // not sticky, but keep it from the caller's next cudaGetLastError
        return nullptr;
    }
    return fn;
}

}  // namespace flashcore
