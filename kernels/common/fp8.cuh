// e4m3 (OCP FP8, CUDA __nv_fp8_e4m3) values widened to the 16-bit types the
// tensor cores of every GPU from sm_80 take: how the portable kernels read a
// quantized KV cache. Every e4m3 value, subnormals included, is exact in
// fp16 and in bf16, so widening loses nothing; the descale factors are
// applied to the scores and the output, not here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace flashcore {

// fp16's 2^8 and bf16's 2^120: what an e4m3 code moved into their bit
// positions is multiplied by to be exact (their exponent biases are 15 and
// 127, e4m3's 7).
constexpr unsigned short kFp16TwoPow8 = 0x5C00;
constexpr unsigned short kBf16TwoPow120 = 0x7B80;
// Their quiet NaN in both halves.
constexpr uint32_t kFp16x2NanBits = 0x7E007E00u;
constexpr uint32_t kBf16x2NanBits = 0x7FC07FC0u;

// The two e4m3 codes in the low (first) and high bytes of `pair` moved into
// the bit positions of a 16-bit type whose exponent begins kShift bits below
// the top of its half (fp16: 1, bf16: 4), first code in the low half: the
// sign stays, eeee mmm becomes the low bits of the exponent and the top of
// the mantissa, which stands for the value times 2^7 / 2^bias. e4m3's NaN
// (every eeee mmm bit set) becomes nan_bits.
template <int kShift>
__device__ __forceinline__ uint32_t e4m3x2_in_16bit_fields(uint16_t pair, uint32_t nan_bits) {
    constexpr uint32_t kFields = (0x7F00u >> kShift) * 0x10001u;
    // Each byte into the high byte of its half: s eeee mmm 00000000.
    const uint32_t high = __byte_perm(uint32_t(pair), 0u, 0x1404);
    const uint32_t bits = (high & 0x80008000u) | ((high >> kShift) & kFields);
    return bits | (__vcmpeq2(bits & 0x7FFF7FFFu, kFields) & nan_bits);
}

// The two e4m3 values of `pair` as an fp16x2 (first value in the low half),
// with integer operations and one multiply: the sm_80 and sm_86 way (they
// have no fp8 conversion instruction). Exact for every code; NaN stays NaN.
// Kept apart from widen_e4m3x2_to_fp16x2 so that a GPU with the instruction
// can test this path against it.
__device__ __forceinline__ uint32_t widen_e4m3x2_by_bits(uint16_t pair) {
    const uint32_t bits = e4m3x2_in_16bit_fields<1>(pair, kFp16x2NanBits);
    const __half two_pow8 = __ushort_as_half(kFp16TwoPow8);
    const __half2 scaled = __hmul2(*reinterpret_cast<const __half2 *>(&bits), __halves2half2(two_pow8, two_pow8));
    return *reinterpret_cast<const uint32_t *>(&scaled);
}

// As widen_e4m3x2_by_bits, with sm_89's and sm_90's conversion instruction
// where the GPU has it.
__device__ __forceinline__ uint32_t widen_e4m3x2_to_fp16x2(uint16_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const __half2_raw wide = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
    return uint32_t(wide.x) | (uint32_t(wide.y) << 16);
#else
    return widen_e4m3x2_by_bits(pair);
#endif
}

// Two e4m3 values as a pair of Element (__half or __nv_bfloat16), first in
// the low half. bf16 goes through fp16 and float, both exact.
template <typename Element>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint16_t pair);

template <>
__device__ __forceinline__ uint32_t widen_e4m3x2<__half>(uint16_t pair) {
    return widen_e4m3x2_to_fp16x2(pair);
}

// As widen_e4m3x2_by_bits, into bf16x2, e4m3's subnormals (bf16 subnormals
// before the multiply) included.
__device__ __forceinline__ uint32_t widen_e4m3x2_to_bf16x2_by_bits(uint16_t pair) {
    const uint32_t bits = e4m3x2_in_16bit_fields<4>(pair, kBf16x2NanBits);
    const __nv_bfloat16 two_pow120 = __ushort_as_bfloat16(kBf16TwoPow120);
    const __nv_bfloat162 scaled =
        __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&bits), __halves2bfloat162(two_pow120, two_pow120));
    return *reinterpret_cast<const uint32_t *>(&scaled);
}

// bf16: by integer operations and one multiply where the GPU has no fp8
// conversion; through fp16 and float (both exact) where it has.
template <>
__device__ __forceinline__ uint32_t widen_e4m3x2<__nv_bfloat16>(uint16_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const uint32_t fp16x2 = widen_e4m3x2_to_fp16x2(pair);
    const float2 values = __half22float2(*reinterpret_cast<const __half2 *>(&fp16x2));
    const __nv_bfloat162 wide = __float22bfloat162_rn(values);
    return *reinterpret_cast<const uint32_t *>(&wide);
#else
    return widen_e4m3x2_to_bf16x2_by_bits(pair);
#endif
}

}  // namespace flashcore
