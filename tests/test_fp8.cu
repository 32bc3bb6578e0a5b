// The widening of e4m3 K/V values to the MMA types (kernels/common/fp8.cuh)
// on the GPU, for every pair of codes: both ways (the integer one sm_80 and
// sm_86 run, and sm_89+'s conversion instruction where the GPU has it) give
// exactly the value of each code (tests/support/reference.h's codec), NaN
// for NaN, in fp16 and in bf16 (subnormals included: e4m3's smallest are
// bf16 subnormals on the integer way).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/fp8.cuh"
#include "device_tensors.h"
#include "reference.h"
#include "test_skip.h"

namespace {

constexpr int kPairs = 1 << 16;  // every (first code, second code)

// Each pair widened four ways: to fp16x2 and to bf16x2 by integer
// operations (sm_80's way), and by widen_e4m3x2<__half> and
// widen_e4m3x2<__nv_bfloat16> (the GPU's instruction where it has one).
constexpr int kWays = 4;
__global__ void widen_every_pair(uint32_t *out) {
    const int pair = blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= kPairs) return;
    out[pair] = flashcore::widen_e4m3x2_by_bits(uint16_t(pair));
    out[kPairs + pair] = flashcore::widen_e4m3x2<__half>(uint16_t(pair));
    out[2 * kPairs + pair] = flashcore::widen_e4m3x2_to_bf16x2_by_bits(uint16_t(pair));
    out[3 * kPairs + pair] = flashcore::widen_e4m3x2<__nv_bfloat16>(uint16_t(pair));
}

// Whether a 16-bit value (converted to double by `to_double`) is the code's.
template <typename ToDouble>
bool is_value_of(uint16_t bits, uint8_t code, ToDouble to_double) {
    const double expected = flashcore_test::e4m3_decode(code);
    const double got = to_double(bits);
    if (std::isnan(expected)) return std::isnan(got);
    return got == expected && std::signbit(got) == std::signbit(expected);
}

double fp16_value(uint16_t bits) {
    __half_raw raw;
    raw.x = bits;
    return double(__half2float(__half(raw)));
}

double bf16_value(uint16_t bits) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return double(__bfloat162float(__nv_bfloat16(raw)));
}

TEST(Fp8Widening, EveryPairOfCodesIsExactInFp16AndBf16) {
    FC_REQUIRE_GPU();
    uint32_t *device = nullptr;
    FC_CHECK_CUDA(cudaMalloc(&device, kWays * kPairs * sizeof(uint32_t)));
    constexpr int kThreads = 256;
    widen_every_pair<<<kPairs / kThreads, kThreads>>>(device);
    FC_CHECK_CUDA(cudaGetLastError());
    std::vector<uint32_t> host(kWays * kPairs);
    FC_CHECK_CUDA(cudaMemcpy(host.data(), device, host.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    FC_CHECK_CUDA(cudaFree(device));
    int wrong = 0;
    for (int pair = 0; pair < kPairs && wrong < 10; ++pair) {
        const uint8_t codes[2] = {uint8_t(pair & 0xFF), uint8_t(pair >> 8)};
        for (int half = 0; half < 2; ++half) {
            const auto part = [&](int which) { return uint16_t(host[which * kPairs + pair] >> (16 * half)); };
            const bool ok = is_value_of(part(0), codes[half], fp16_value) &&
                            is_value_of(part(1), codes[half], fp16_value) &&
                            is_value_of(part(2), codes[half], bf16_value) &&
                            is_value_of(part(3), codes[half], bf16_value);
            if (!ok) {
                ++wrong;
                ADD_FAILURE() << "code 0x" << std::hex << int(codes[half]) << " (pair 0x" << pair << ", half "
                              << half << "): fp16 by bits 0x" << part(0) << ", fp16 0x" << part(1)
                              << ", bf16 by bits 0x" << part(2) << ", bf16 0x" << part(3) << std::dec
                              << "; expected " << flashcore_test::e4m3_decode(codes[half]);
            }
        }
    }
}

}  // namespace
