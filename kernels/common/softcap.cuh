// Logit softcapping (Gemma 2): each score s becomes softcap * tanh(s /
// softcap) before the mask and the softmax.
//
// The host folds the scales (src/params.cpp kernel_params): a raw score q.k
// times softcap_prescale (softmax_scale / softcap) goes through tanh, and the
// softmax exponentiates the result with the softcap as its scale, so the
// online softmax and the LSE need no other change. tanh is monotone, so a
// row's maximum can be taken over the raw scores and capped once (of_max).
//
// tanh(x) = 1 - 2 / (exp(2x) + 1), from ex2 and rcp: two MUFU operations
// per score on top of the softmax's exp2, which makes softcapped calls
// MUFU-bound (docs/log/perf.md: 1.55x the time of an uncapped call at
// d128, 1.9x at d64, H100). Measured against the alternatives:
//   - the reciprocal on the FMA pipe (an integer first guess and three
//     Newton steps) takes one MUFU operation fewer but nine instructions
//     more, and was 4-7% slower still: the issue slots become the limit;
//   - tanh.approx.f32 is one operation, but its relative error of 2^-11
//     times a softcap of 30 to 50 moves the capped logits by up to 0.02,
//     which the LSE (5e-5) and the output's error bar cannot absorb.
#pragma once

#include <cmath>

#include "common/ptx.cuh"
#include "common/types.h"

namespace flashcore {

// No softcap: scores pass unchanged.
struct NoSoftcap {
    __device__ __forceinline__ static NoSoftcap of(float /*prescale*/) { return {}; }
    __device__ __forceinline__ float operator()(float raw) const { return raw; }
    __device__ __forceinline__ float of_max(float raw_max) const { return raw_max; }
};

struct Softcap {
    float prescale;  // softmax_scale / softcap; 0: no softcap

    __device__ __forceinline__ static Softcap of(float prescale) { return {prescale}; }
    __device__ __forceinline__ bool enabled() const { return prescale != 0.f; }

    // tanh(raw * prescale), in the units the softmax then scales by softcap
    // (absolute error about 1e-7; exp2 of a large argument is +inf, whose
    // reciprocal is 0: tanh 1).
    __device__ __forceinline__ float operator()(float raw) const {
        constexpr float kTwoLog2e = 2.f * kLog2e;
        const float e2x = fast_exp2(raw * (prescale * kTwoLog2e));
        return fmaf(-2.f, fast_rcp(e2x + 1.f), 1.f);
    }

    // A row maximum, of raw scores, capped; -inf (every key masked) stays
    // -inf, where tanh would give -1.
    __device__ __forceinline__ float of_max(float raw_max) const {
        return raw_max == -INFINITY ? -INFINITY : (*this)(raw_max);
    }

    // Caps a fragment tile of raw scores in place (kernels that then mask
    // and exponentiate them in place).
    template <int kMAtoms, int kNAtoms>
    __device__ __forceinline__ void apply(float (&scores)[kMAtoms][kNAtoms][4]) const {
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) scores[m][n][e] = (*this)(scores[m][n][e]);
            }
        }
    }
};

}  // namespace flashcore
