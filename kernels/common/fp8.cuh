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

// fp16 bits of 2^8: an e4m3 code moved into fp16's bit positions is its
// value times 2^-8 (fp16's exponent bias is 15, e4m3's 7).
constexpr unsigned short kFp16TwoPow8 = 0x5C00;
// The codes of e4m3's NaN (S.1111.111) once moved into fp16's positions
// (sign bit cleared), and what makes such a value an fp16 NaN.
constexpr uint32_t kE4m3NanInFp16x2 = 0x3F803F80u;
constexpr uint32_t kFp16x2NanBits = 0x7E007E00u;
// The same in bf16's positions, and bf16's 2^120.
constexpr uint32_t kE4m3NanInBf16x2 = 0x07F007F0u;
constexpr uint32_t kBf16x2NanBits = 0x7FC07FC0u;
constexpr unsigned short kBf16TwoPow120 = 0x7B80;

// The two e4m3 values in the low (first) and high bytes of `pair` as an
// fp16x2 (first value in the low half), with integer operations only: the
// sm_80 and sm_86 way (they have no fp8 conversion instruction). Exact for
// every code; NaN stays NaN. Kept apart from widen_e4m3x2_to_fp16x2 so that
// a GPU with the instruction can test this path against it.
__device__ __forceinline__ uint32_t widen_e4m3x2_by_bits(uint16_t pair) {
    // Each byte into the high byte of its half: s eeee mmm 00000000.
    const uint32_t high = __byte_perm(uint32_t(pair), 0u, 0x1404);
    // The sign stays; eeee mmm moves down one bit into fp16's exponent and
    // mantissa, which makes the value 2^-8 of the e4m3 one.
    uint32_t bits = (high & 0x80008000u) | ((high >> 1) & 0x3F803F80u);
    const uint32_t nan_halves = __vcmpeq2(bits & 0x7FFF7FFFu, kE4m3NanInFp16x2);
    bits |= nan_halves & kFp16x2NanBits;
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

// As widen_e4m3x2_by_bits, into bf16x2: the code's bits move into bf16's
// exponent and mantissa (the value times 2^-120: bf16's bias is 127), and a
// bf16 multiply by 2^120 makes it exact, e4m3's subnormals (bf16 subnormals
// on the way) included.
__device__ __forceinline__ uint32_t widen_e4m3x2_to_bf16x2_by_bits(uint16_t pair) {
    const uint32_t high = __byte_perm(uint32_t(pair), 0u, 0x1404);
    uint32_t bits = (high & 0x80008000u) | ((high >> 4) & 0x07F007F0u);
    const uint32_t nan_halves = __vcmpeq2(bits & 0x7FFF7FFFu, kE4m3NanInBf16x2);
    bits |= nan_halves & kBf16x2NanBits;
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

// Sixteen e4m3 values (one 16-byte vector) as two 16-byte vectors of
// Element, in order.
template <typename Element>
__device__ __forceinline__ void widen_e4m3x16(uint4 in, uint4 &first, uint4 &second) {
    const uint32_t words[4] = {in.x, in.y, in.z, in.w};
    uint32_t out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        out[2 * w] = widen_e4m3x2<Element>(uint16_t(words[w] & 0xFFFFu));
        out[2 * w + 1] = widen_e4m3x2<Element>(uint16_t(words[w] >> 16));
    }
    first = make_uint4(out[0], out[1], out[2], out[3]);
    second = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace flashcore
