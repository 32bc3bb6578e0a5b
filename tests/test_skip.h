// Skipping GPU tests where there is no GPU, with the reason.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "device_tensors.h"

namespace flashcore_test {

// ctest's SKIP_RETURN_CODE for these binaries.
constexpr int kSkipExitCode = 77;

// FLASHCORE_FWD_VARIANT=sm90 (ctest's gpu.sm90. run) asks for the sm_90a
// kernels, which run on compute capability 9.0 only; elsewhere that run's
// tests skip, saying so.
// The current device's compute capability; false (and the CUDA error
// cleared) where it cannot be read.
inline bool current_compute_capability(int *major, int *minor) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return true;
}

inline bool forced_path_unavailable(std::string *reason) {
    const char *forced = std::getenv("FLASHCORE_FWD_VARIANT");
    if (forced == nullptr || std::string(forced) != "sm90") return false;
    int major = 0, minor = 0;
    if (!current_compute_capability(&major, &minor)) {
        *reason = "could not read the device's compute capability";
        return true;
    }
    if (major == 9 && minor == 0) return false;
    *reason = "FLASHCORE_FWD_VARIANT=sm90 needs a compute capability 9.0 GPU; this one is " + std::to_string(major) +
              "." + std::to_string(minor);
    return true;
}

#define FC_REQUIRE_GPU()                                                       \
    do {                                                                       \
        std::string reason_;                                                   \
        if (!flashcore_test::cuda_device_available(&reason_)) {                \
            GTEST_SKIP() << "GPU test skipped: " << reason_;                   \
        }                                                                      \
        if (flashcore_test::forced_path_unavailable(&reason_)) {               \
            GTEST_SKIP() << "GPU test skipped: " << reason_;                   \
        }                                                                      \
    } while (0)

}  // namespace flashcore_test
