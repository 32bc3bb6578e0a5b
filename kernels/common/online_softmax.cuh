// Online softmax over key tiles (FlashAttention-2 style) for the rows a
// thread holds in its accumulator fragments.
//
// Per row we keep the running maximum of the raw scores and the running sum
// of exp2(score * scale_log2 - max * scale_log2). When a new tile raises the
// maximum, the sum and the output accumulator are rescaled by the ratio. The
// sum is kept per thread (each thread sees a quarter of the row's columns)
// and reduced across the four threads of a row only once, at the end; the
// maximum must be reduced every tile because all four threads use it.
#pragma once

#include <cmath>

#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "common/softcap.cuh"

namespace flashcore {

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// What to subtract from score * scale_log2 before exp2, for a row whose
// maximum is row_max. A row that has seen only masked keys keeps
// max = -inf; using 0 as its offset keeps exp2(-inf - offset) = 0 instead of
// NaN.
__device__ __forceinline__ float exp2_offset(float row_max, float scale_log2) {
    return row_max == -INFINITY ? 0.f : row_max * scale_log2;
}

// The maxima of a tile's scores in the lane's two rows (an m16 tile's rows
// g and g + 8), over the quad of lanes that holds them.
template <int kNAtoms>
__device__ __forceinline__ void tile_row_maxima(const float (&scores)[1][kNAtoms][4], float (&tile_max)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float m = -INFINITY;
#pragma unroll
        for (int n = 0; n < kNAtoms; ++n) m = fmaxf(m, fmaxf(scores[0][n][half * 2], scores[0][n][half * 2 + 1]));
        tile_max[half] = quad_max(m);
    }
}

// The lane's two rows' running maxima and sums after a tile whose row
// maxima, over every warp that holds the tile's keys, are tile_max(half)
// (half 0: row g, 1: row g + 8): the scores exponentiated in place against
// the new maxima and added to the sums; correction, the factor of the terms
// before. The wide kernels', whose warps split a row's keys and exchange its
// maxima themselves (OnlineSoftmax keeps a row's keys in one warp).
template <int kNAtoms, typename TileMax>
__device__ __forceinline__ void fold_tile_into_rows(float (&scores)[1][kNAtoms][4], TileMax &&tile_max,
                                                    float scale_log2, float (&row_max)[2], float (&row_sum)[2],
                                                    float (&correction)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float new_max = fmaxf(row_max[half], tile_max(half));
        const float offset = exp2_offset(new_max, scale_log2);
        correction[half] = fast_exp2(row_max[half] * scale_log2 - offset);
        row_max[half] = new_max;
        row_sum[half] *= correction[half];
#pragma unroll
        for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
            for (int e = half * 2; e < half * 2 + 2; ++e) {
                const float prob = fast_exp2(fmaf(scores[0][n][e], scale_log2, -offset));
                scores[0][n][e] = prob;
                row_sum[half] += prob;
            }
        }
    }
}

// kMaxChains: independent partial maxima per row and tile in update_max,
// combined at the end. One chain (each FMNMX waiting for the previous one's
// result) is latency-bound where few warps share a scheduler; more chains
// cost registers and instruction order (per-config choice: fwd/sm90/config.cuh).
// kProbExponent: the probabilities (and row sums) come out scaled by
// 2^kProbExponent, a row's largest at 2^kProbExponent instead of 1 (for
// fp8 P, whose range 1 would leave mostly to subnormals); normalisation
// cancels the factor, and finalize takes it out of the LSE.
template <int kMAtoms, int kMaxChains = 1, int kProbExponent = 0>
struct OnlineSoftmax {
    static constexpr int kRows = kMAtoms * 2;  // rows g and g + 8 of each m16 tile
    float row_max[kRows];
    float row_sum[kRows];

    // What to subtract from score * scale_log2 before exp2 (exp2_offset,
    // less the exponent).
    __device__ __forceinline__ static float offset_of(float row_max, float scale_log2) {
        if constexpr (kProbExponent == 0) {
            return exp2_offset(row_max, scale_log2);
        } else {
            return row_max == -INFINITY ? 0.f : row_max * scale_log2 - float(kProbExponent);
        }
    }
    // exp2's argument for the factor from a state at old_max to one at
    // offset (offset_of's): exp2(old_max * scale_log2 - that) = 2^(old - new),
    // 0 for a row that had seen no key.
    __device__ __forceinline__ static float rescale_exponent(float old_max, float scale_log2, float offset) {
        if constexpr (kProbExponent == 0) {
            return old_max * scale_log2 - offset;
        } else {
            return old_max * scale_log2 - float(kProbExponent) - offset;
        }
    }

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            row_max[r] = -INFINITY;
            row_sum[r] = 0.f;
        }
    }

    // Folds one tile of scores into the running state: turns `scores` into
    // the unnormalised probabilities P and rescales `out` to the new maximum.
    //
    // After the first few tiles a row's maximum rarely grows, and rescaling
    // `out` costs one multiply per accumulator (as many as the MMAs' share of
    // a 32-key tile at head_dim 128): it is skipped when no row of the warp
    // changed its maximum (warp-uniform, so no divergence), where every
    // correction factor would be exactly 1.
    template <int kNAtomsS, int kNAtomsO>
    __device__ __forceinline__ void update(float (&scores)[kMAtoms][kNAtomsS][4],
                                           float (&out)[kMAtoms][kNAtomsO][4], float scale_log2) {
        const auto all_visible = [](int, int, int) { return true; };
        float correction[kRows];
        if (update_max(scores, scale_log2, correction, all_visible)) rescale(out, correction);
        exponentiate(scores, scale_log2, all_visible, [&](int m, int n, int e, float p) { scores[m][n][e] = p; });
    }

    // update() for callers whose `out` is still being written by an
    // asynchronous GEMM, and which must not write the score registers (an
    // asynchronous GEMM may still own them as far as the compiler can tell):
    // visible(m, n, e) says whether score element e of tile (m, n) takes
    // part (a mask), and sink(m, n, e, p) receives its probability; the
    // scores are raw, and cap (common/softcap.cuh) is applied to them on the
    // way. Returns whether `out` needs rescale(out, correction) once it is
    // free.
    template <int kNAtomsS, typename Visible, typename Sink, typename Cap = NoSoftcap>
    __device__ __forceinline__ bool update_scores_into(const float (&scores)[kMAtoms][kNAtomsS][4], float scale_log2,
                                                       float (&correction)[kRows], Visible &&visible, Sink &&sink,
                                                       const Cap &cap = Cap{}) {
        const bool changed = update_max(scores, scale_log2, correction, visible, cap);
        exponentiate(scores, scale_log2, visible, sink, cap);
        return changed;
    }

    // The two halves of an update. update_max folds the tile's row maxima
    // into row_max, scales row_sum by the correction factors and returns
    // whether any row of the warp changed its maximum. The maximum is taken
    // over the raw scores and capped once (the cap is monotone).
    template <int kNAtomsS, typename Visible, typename Cap = NoSoftcap>
    __device__ __forceinline__ bool update_max(const float (&scores)[kMAtoms][kNAtomsS][4], float scale_log2,
                                               float (&correction)[kRows], Visible &&visible,
                                               const Cap &cap = Cap{}) {
        bool max_changed = false;
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = m * 2 + half;
                constexpr int kChains = 2 * kNAtomsS < kMaxChains ? 2 * kNAtomsS : kMaxChains;
                float partial_max[kChains];
#pragma unroll
                for (int k = 0; k < 2 * kNAtomsS; ++k) {
                    const int n = k / 2;
                    const int e = half * 2 + k % 2;
                    const float score = visible(m, n, e) ? scores[m][n][e] : -INFINITY;
                    partial_max[k % kChains] = k < kChains ? score : fmaxf(partial_max[k % kChains], score);
                }
                float tile_max = partial_max[0];
#pragma unroll
                for (int c = 1; c < kChains; ++c) tile_max = fmaxf(tile_max, partial_max[c]);
                const float new_max = fmaxf(row_max[r], cap.of_max(quad_max(tile_max)));
                correction[r] = fast_exp2(rescale_exponent(row_max[r], scale_log2, offset_of(new_max, scale_log2)));
                max_changed |= new_max != row_max[r];
                row_max[r] = new_max;
                row_sum[r] *= correction[r];
            }
        }
        return __any_sync(0xffffffffu, max_changed);
    }

    // exponentiate turns the tile's scores into probabilities against the
    // current row maxima and adds them to row_sum.
    template <int kNAtomsS, typename Visible, typename Sink, typename Cap = NoSoftcap>
    __device__ __forceinline__ void exponentiate(const float (&scores)[kMAtoms][kNAtomsS][4], float scale_log2,
                                                 Visible &&visible, Sink &&sink, const Cap &cap = Cap{}) {
        float offset[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) offset[r] = offset_of(row_max[r], scale_log2);
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < kNAtomsS; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = m * 2 + e / 2;
                    // Computed for masked elements too and then dropped:
                    // a select, where a conditional exp2 becomes a branch.
                    const float exp = fast_exp2(fmaf(cap(scores[m][n][e]), scale_log2, -offset[r]));
                    const float p = visible(m, n, e) ? exp : 0.f;
                    sink(m, n, e, p);
                    row_sum[r] += p;
                }
            }
        }
    }

    template <int kNAtomsO>
    __device__ __forceinline__ void rescale(float (&out)[kMAtoms][kNAtomsO][4], const float (&correction)[kRows]) {
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) out[m][n][e] *= correction[m * 2 + e / 2];
            }
        }
    }

    // Folds in the state another warp reached over other keys of the same
    // rows (row maxima and this thread's partial sums). Returns, per row, the
    // factors by which this state's and the other state's output
    // accumulators are to be scaled and added.
    __device__ __forceinline__ void merge(const float (&other_max)[kRows], const float (&other_sum)[kRows],
                                          float scale_log2, float (&own_factor)[kRows],
                                          float (&other_factor)[kRows]) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float new_max = fmaxf(row_max[r], other_max[r]);
            const float offset = offset_of(new_max, scale_log2);
            own_factor[r] = fast_exp2(rescale_exponent(row_max[r], scale_log2, offset));
            other_factor[r] = fast_exp2(rescale_exponent(other_max[r], scale_log2, offset));
            row_max[r] = new_max;
            row_sum[r] = row_sum[r] * own_factor[r] + other_sum[r] * other_factor[r];
        }
    }

    // Completes the rows: reduces the sums across the quad, normalises `out`
    // (and scales it by out_scale: a quantized V's descale) and returns each
    // row's natural-log log-sum-exp in lse[r]. Rows that saw no key get out =
    // 0 and lse = -inf.
    //
    // sinks: where given, each row's learnable sink in lse units
    // (fwd_row_sink; -inf for none), one more term of the denominator that
    // adds nothing to out: lse = log(exp(sink) + sum_j exp(s_j)), and a row
    // that saw no key gets lse = sink. Its term is taken at the larger of
    // the row's maximum and the sink, so neither overflows.
    template <int kNAtomsO>
    __device__ __forceinline__ void finalize(float (&out)[kMAtoms][kNAtomsO][4], float softmax_scale,
                                             float (&lse)[kRows], float out_scale = 1.f,
                                             const float (*sinks)[kRows] = nullptr) {
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = m * 2 + half;
                const float sum = quad_sum(row_sum[r]);
                const bool empty = sum == 0.f;
                // The sum is 2^kProbExponent times the true one.
                constexpr float kLnProbScale = float(kProbExponent) * 0.69314718055994531f;
                const float sink = sinks != nullptr ? (*sinks)[r] : -INFINITY;
                float inv_sum;
                // One branch or the other, not both: the sink's path computed
                // after the plain one paid a logf and an IEEE division more a
                // row (ncu, gpt-oss's windowed decode: 131 instructions a
                // warp for sinks, +3.6% in a latency-bound kernel).
                if (sink == -INFINITY) {
                    inv_sum = empty ? 0.f : out_scale / sum;
                    lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + (logf(sum) - kLnProbScale);
                } else {
                    // The sink's weight, 2^kProbExponent as the sum's terms.
                    // Both factors are exp2 of differences <= 0 (ex2.approx,
                    // as the kernels' probabilities), and the total is at
                    // least 2^kProbExponent (the larger of the row's top
                    // term and the sink's counts whole), well inside the
                    // range where the fast quotient is good to 2 ulp: a few
                    // instructions a row where expf and IEEE division take
                    // dozens.
                    constexpr float kProbScale = float(1 << kProbExponent);
                    const float row_top = empty ? -INFINITY : row_max[r] * softmax_scale;
                    const float top = fmaxf(row_top, sink);
                    const float own = empty ? 0.f : fast_exp2((row_top - top) * kLog2e);
                    const float total = fmaf(sum, own, kProbScale * fast_exp2((sink - top) * kLog2e));
                    lse[r] = top + (logf(total) - kLnProbScale);
                    inv_sum = __fdividef(out_scale * own, total);
                }
#pragma unroll
                for (int n = 0; n < kNAtomsO; ++n) {
                    out[m][n][half * 2] *= inv_sum;
                    out[m][n][half * 2 + 1] *= inv_sum;
                }
            }
        }
    }
};

}  // namespace flashcore
