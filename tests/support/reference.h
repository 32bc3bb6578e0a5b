// Float64 reference attention on the CPU, the error statistics the tests
// and the demo report against it, and the host codec of the fp8 (e4m3)
// elements of a quantized K/V cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashcore_test {

struct Problem {
    int batch = 1;
    int seqlen_q = 1;
    int seqlen_k = 1;
    int heads_q = 1;
    int heads_kv = 1;
    int head_dim = 64;
    int head_dim_v = 0;  // of v and out; 0: head_dim
    bool causal = false;
    double softmax_scale = 0;  // 0: 1/sqrt(head_dim)
    // Keys seen left and right of each query's diagonal (i + seqlen_k -
    // seqlen_q); -1: unbounded. causal bounds the right at 0 as well.
    int window_left = -1;
    int window_right = -1;
    double softcap = 0;  // > 0: scores become softcap * tanh(score / softcap)
    // Keys each batch attends to (seqused_k); empty: seqlen_k for all. The
    // diagonal follows them.
    std::vector<int> seqused_k;
    // Queries of each batch (variable-length batches); empty: seqlen_q for
    // all. The diagonal follows them; rows past a batch's count are not
    // computed (out and lse 0 there).
    std::vector<int> seqlens_q;
    // Chunked attention (Llama 4): 0 for none, else query i sees key j only
    // where j and i's diagonal lie in one chunk, [c * chunk, (c + 1) *
    // chunk) for an integer c (floor division: a diagonal below key 0 lies
    // in a chunk below it). Combines with causal and the window.
    int attention_chunk = 0;
    // Learnable sinks (gpt-oss): empty for none, else one logit per query
    // head, in the units of the scaled (capped) scores. Each row's softmax
    // denominator gains exp(sink): lse = log(sum_j exp(s_j) + exp(sink)),
    // and the sink adds nothing to out. A row that sees no key gets out = 0
    // and lse = sink.
    std::vector<double> sinks;
};

// Keys batch b of p attends to, and its queries.
inline int batch_seqlen_k(const Problem &p, int b) { return p.seqused_k.empty() ? p.seqlen_k : p.seqused_k[b]; }
inline int batch_seqlen_q(const Problem &p, int b) { return p.seqlens_q.empty() ? p.seqlen_q : p.seqlens_q[b]; }

// The keys [begin, end) query i of batch b sees (end <= begin: none).
void visible_keys(const Problem &p, int b, int i, int *begin, int *end);

// Dense [batch, heads, seqlen, head_dim] tensors (v and out: head_dim_v) of float values (already
// rounded to the kernel's input precision). out and lse are resized. Rows
// with no visible key get out = 0 and lse = -inf (the sink, with sinks).
// Runs on all cores.
void reference_attention(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                         const std::vector<float> &v, std::vector<double> &out, std::vector<double> &lse);

inline int value_head_dim(const Problem &p) { return p.head_dim_v != 0 ? p.head_dim_v : p.head_dim; }

// The float64 gradients of reference_attention's out for a loss whose
// gradient with respect to out is dout (dense [batch, heads_q, seqlen_q,
// head_dim_v], values already rounded to the kernel's precision), resized
// to dense [batch, heads, seqlen, dim] tensors like their inputs:
//     P = softmax(scores + mask),  D = rowsum(dout * out),
//     dS = P * (dout V^T - D)  [* (1 - tanh^2) of the softcap],
//     dq = scale dS K,  dk = scale dS^T Q,  dv = P^T dout,
// dk and dv summed over the query heads that share a key/value head. P, out
// and D come from the float64 forward, not from the kernels' 16-bit out, so
// the reference owes nothing to the code under test. Rows past a batch's
// queries and rows that see no key get dq = 0; keys no query sees (those
// past seqused_k included) get dk = dv = 0; keys past seqused_k are never
// read (they may hold NaN). With sinks, P's rows hold the sink's share
// too (through lse), and dsinks, where given, is resized to heads_q and
// gets each sink's gradient: -sum over its rows of exp(sink - lse) * D.
// Runs on all cores.
void reference_attention_backward(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                                  const std::vector<float> &v, const std::vector<float> &dout,
                                  std::vector<double> &dq, std::vector<double> &dk, std::vector<double> &dv,
                                  std::vector<double> *dsinks = nullptr,
                                  std::vector<double> *dsinks_scale = nullptr);
// dsinks_scale, where given, is resized to heads_q and gets the magnitude of
// the terms each dsinks[h] sums: sum over h's rows of exp(sink - lse) *
// sum_c |dout_c * out_c|. A kernel whose D = rowsum(dout * out) takes a
// 16-bit out (the caller's) is off by up to u/2 of that, however much the
// terms cancel in dsinks itself: the scale its error bar is relative to.

struct ErrorStats {
    double max_abs = 0;
    double rel_l2 = 0;   // ||got - ref|| / ||ref||
    size_t non_finite = 0;  // got values that are NaN or +-inf where ref is finite
    size_t mismatched_inf = 0;  // ref is +-inf but got differs
};

ErrorStats compare(const std::vector<float> &got, const std::vector<double> &ref);

// What an fp8 (e4m3) prefill kernel (dtype FLASHCORE_DTYPE_FP8_E4M3: q, k
// and v e4m3, out bf16) adds to the error of attention computed on its
// dequantized inputs, as fp8_error_bounds takes it (the kernel's numbers:
// kFp8PrefillModel below).
struct Fp8ErrorModel {
    // Relative rounding of a probability in e4m3's normal range (half a unit
    // of its 3 mantissa bits: 2^-4).
    double prob_rounding;
    // Absolute rounding of a probability below e4m3's normal range, as a
    // fraction of the row's largest probability (the kernel scales that one
    // to 2^8; subnormals are 2^-9 apart: half of that over 2^8 is 2^-18).
    double prob_subnormal_rounding;
    // Terms the tensor cores sum per fp8 product step (k of the e4m3 wgmma).
    int terms_per_step;
    // Product steps of P * V over masked keys a row may take besides those
    // of its visible keys (the partial key tiles at either end of its span).
    int partial_tile_steps;
    // What each product step may lose, relative to the magnitudes it sums
    // (its accumulator and its terms): the fp8 products' reduced-precision
    // accumulation.
    double step_rounding;
    // Relative rounding of out (bf16), its own error included.
    double out_rounding;
    // The lse's error where the scores are exact (fp32 exp and log).
    double lse_floor;
};

// Per-element bounds on |out - reference| and per-row bounds on |lse -
// reference| of an fp8 prefill of problem p, whose dequantized inputs are
// q, k, v (as for reference_attention; out_bound and lse_bound are resized
// like its out and lse). For each row, with weights w_j (the float64
// softmax over its visible keys j, whose largest has weight w_max and whose
// unnormalised sum is L), a_j = softmax_scale * sum_i |q_i k_ji| (the
// magnitude a score is summed from) and n its visible keys:
//   score error   eps = ceil(head_dim / terms_per_step) * step_rounding * max_j a_j
//   out_bound_c = sum_j max(prob_rounding * w_j, prob_subnormal_rounding * w_max) |v_jc|
//               + (expm1(2 eps) + (ceil(n / terms_per_step) + partial_tile_steps) * step_rounding)
//                 * sum_j w_j |v_jc|
//               + out_rounding * |ref_c|
//   lse_bound   = 2 eps + lse_floor
// (a weight moves by at most a factor exp(2 eps) when every score moves by
// at most eps; the P*V steps lose at most step_rounding of sum_j p_j |v_jc|
// each). Rows that see no key get bounds of 0: out 0 and lse -inf exactly.
// Runs on all cores.
void fp8_error_bounds(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                      const std::vector<float> &v, const Fp8ErrorModel &model, std::vector<double> &out_bound,
                      std::vector<double> &lse_bound);

// The fp8 prefill kernel (kernels/fwd/sm90, Traits::kFp8) against the
// float64 attention of its dequantized inputs (each e4m3 value times its
// descale factor, exact in float):
// - Q K^T and P V are products of e4m3 values (exact) that the tensor cores
//   sum 32 terms a step into fp32 accumulators, which on the fp8 path keep
//   about 13 mantissa bits (SageAttention 2 and DeepSeek-V3 measured this
//   on Hopper: each step truncates); the descale factors and the softmax
//   scale multiply in fp32. step_rounding 2^-12: the truncation of the
//   accumulator and of the step's aligned terms, 2^-13 of their magnitudes
//   each.
// - P: each row's probabilities are scaled so that its largest is 2^8
//   (Traits::kProbExponent) and rounded to e4m3 (to nearest) for the P V
//   product. A normal one (>= 2^-6) moves by at most half a unit of its 3
//   mantissa bits, 2^-4 of itself; a subnormal one by at most 2^-10, 2^-18
//   of the largest. The row sums that normalise out are of the fp32
//   probabilities before that rounding, so out moves by sum_j w_j delta_j
//   v_j with |delta_j| <= 2^-4: fp8_error_bounds' first term, which a row
//   whose weight is on two keys, the second's rounding near 2^-4, comes
//   close to (the largest probability, 2^8, is exact).
// - out is bf16: 2^-9 of itself, 2^-8 with the error it rounds.
// - lse comes from the fp32 scores and those unrounded sums: only the
//   scores' error and fp32's enter (lse_floor: the 16-bit tests' lse bar).
constexpr Fp8ErrorModel kFp8PrefillModel = {
    /*prob_rounding=*/0x1p-4,
    /*prob_subnormal_rounding=*/0x1p-18,
    /*terms_per_step=*/32,
    /*partial_tile_steps=*/16,  // two partial tiles of up to 256 keys
    /*step_rounding=*/0x1p-12,
    /*out_rounding=*/0x1p-8,
    /*lse_floor=*/5e-5,
};

// The bar on an fp8 prefill's relative L2 error (||out - ref|| / ||ref||
// over the call's whole output). A row that spreads its weight over many
// keys has out - ref = sum_j w_j delta_j v_j against ref = sum_j w_j v_j:
// relative to ref, about the RMS of the probabilities' relative rounding,
// which for e4m3 over probabilities spread log-uniformly is 2.65%; rows
// whose weight is on few keys have less (the largest probability is exact).
// FlashAttention 3 rounds P the same way, so it errs as much: the bar is
// twice that (flashcore's fp8 error within 2x of FA3's, issue 36).
constexpr double kFp8PrefillRelL2 = 0.05;

// OCP 8-bit floating point E4M3 ("e4m3fn": CUDA's __nv_fp8_e4m3, PyTorch's
// float8_e4m3fn), the element of a quantized K/V cache (kv_dtype
// FLASHCORE_DTYPE_FP8_E4M3): a sign bit, 4 exponent bits (bias 7) and 3
// mantissa bits; exponent field 0 holds the subnormals (m * 2^-9); no
// infinities; S.1111.111 (0x7f, 0xff) is NaN, so the largest finite value
// is S.1111.110 = 448. Every e4m3 value is exact in fp16, bf16 and float.
constexpr double kE4m3Max = 448.0;
// The e4m3 code nearest to x, ties to even; magnitudes past 448 (infinity
// included) saturate to +-448 (CUDA's __NV_SATFINITE conversion), and NaN
// gives the NaN code of x's sign (0x7f or 0xff).
uint8_t e4m3_encode(float x);
// The value of an e4m3 code: NaN for 0x7f and 0xff, -0 for 0x80.
double e4m3_decode(uint8_t code);

}  // namespace flashcore_test
