// Division by a divisor the host knows before launch: one multiply-high and
// one shift instead of the 20-odd instructions of a 32-bit integer division
// (CUTLASS's FastDivmod, the Granlund-Montgomery round-up method). The sm_90a
// forward splits each query block's index into its (batch, head, block) with
// these: ncu put that split at 6% of the consumers' stall samples at 2k d128
// causal (docs/log/hopper.md, 2026-11-30), about ten divisions a block.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace flashcore {

struct FastDivisor {
    int divisor;          // at least 1
    uint32_t multiplier;  // ceil(2^(31 + ceil(log2 divisor)) / divisor); unused for 1
    uint32_t shift;       // ceil(log2 divisor) - 1

    FLASHCORE_HOST_DEVICE static FastDivisor of(int d) {
        FastDivisor f{d, 0u, 0u};
        if (d > 1) {
            uint32_t log2_ceil = 0;
            while ((int64_t(1) << log2_ceil) < d) ++log2_ceil;
            constexpr uint32_t kWordBits = 32;
            const uint32_t p = kWordBits - 1 + log2_ceil;
            f.multiplier = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
            f.shift = p - kWordBits;
        }
        return f;
    }

    // n / divisor for 0 <= n < 2^31.
    FLASHCORE_HOST_DEVICE int quotient(int n) const {
#ifdef __CUDA_ARCH__
        const uint32_t high = __umulhi(uint32_t(n), multiplier);
#else
        const uint32_t high = uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32);
#endif
        return divisor == 1 ? n : int(high >> shift);
    }

    struct Division {
        int quotient;
        int remainder;
    };

    // n / divisor and n % divisor for 0 <= n < 2^31.
    FLASHCORE_HOST_DEVICE Division divide(int n) const {
        const int q = quotient(n);
        return {q, n - q * divisor};
    }

    // (n / divisor) * quotient_stride + (n % divisor) * remainder_stride:
    // where GQA packing puts row n of a tile (divisor: the packed heads), as
    // query n / divisor of head n % divisor, from their strides.
    FLASHCORE_HOST_DEVICE int64_t strided(int n, int64_t quotient_stride, int64_t remainder_stride) const {
        const Division d = divide(n);
        return int64_t(d.quotient) * quotient_stride + int64_t(d.remainder) * remainder_stride;
    }
};

}  // namespace flashcore
