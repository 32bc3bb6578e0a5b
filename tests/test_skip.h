// Skipping GPU tests where there is no GPU, with the reason.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "device_tensors.h"

namespace flashcore_test {

// ctest's SKIP_RETURN_CODE for these binaries.
constexpr int kSkipExitCode = 77;

#define FC_REQUIRE_GPU()                                                       \
    do {                                                                       \
        std::string reason_;                                                   \
        if (!flashcore_test::cuda_device_available(&reason_)) {                \
            GTEST_SKIP() << "GPU test skipped: " << reason_;                   \
        }                                                                      \
    } while (0)

}  // namespace flashcore_test
