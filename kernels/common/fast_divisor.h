// Division by a number fixed for a launch (a head count, an item count),
// with a multiply-high and a shift instead of the ~20 instructions and the
// registers a run-time integer division costs: the host computes the
// multiplier once, and the kernel reads it from its parameters (the
// constant bank). Plain data: host C++ files include it.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace flashcore {

struct FastDivisor {
    int divisor;          // >= 1
    uint32_t multiplier;  // ceil(2^(31 + l) / divisor), l = ceil(log2(divisor)); 0 for divisor 1
    uint32_t shift;       // l - 1

    // The divisor d (>= 1).
    static FastDivisor of(int d) {
        FastDivisor f{d, 0, 0};
        if (d > 1) {
            uint32_t l = 0;
            while ((uint64_t(1) << l) < uint64_t(d)) ++l;
            f.multiplier = uint32_t(((uint64_t(1) << (31 + l)) + uint64_t(d) - 1) / uint64_t(d));
            f.shift = l - 1;
        }
        return f;
    }

    // x / divisor for 0 <= x < 2^31 (Granlund and Montgomery: a 31-bit
    // dividend keeps the rounded-up multiplier within 32 bits and exact).
    FLASHCORE_HOST_DEVICE int div(int x) const {
#if defined(__CUDA_ARCH__)
        const uint32_t high = __umulhi(uint32_t(x), multiplier);
#else
        const uint32_t high = uint32_t((uint64_t(uint32_t(x)) * multiplier) >> 32);
#endif
        return multiplier == 0 ? x : int(high >> shift);
    }
    // x % divisor, given q = div(x).
    FLASHCORE_HOST_DEVICE int mod(int x, int q) const { return x - q * divisor; }
};

}  // namespace flashcore
