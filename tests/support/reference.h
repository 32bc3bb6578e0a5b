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
};

// Keys batch b of p attends to, and its queries.
inline int batch_seqlen_k(const Problem &p, int b) { return p.seqused_k.empty() ? p.seqlen_k : p.seqused_k[b]; }
inline int batch_seqlen_q(const Problem &p, int b) { return p.seqlens_q.empty() ? p.seqlen_q : p.seqlens_q[b]; }

// The keys [begin, end) query i of batch b sees (end <= begin: none).
void visible_keys(const Problem &p, int b, int i, int *begin, int *end);

// Dense [batch, heads, seqlen, head_dim] tensors (v and out: head_dim_v) of float values (already
// rounded to the kernel's input precision). out and lse are resized. Rows
// with no visible key get out = 0 and lse = -inf. Runs on all cores.
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
// read (they may hold NaN). Runs on all cores.
void reference_attention_backward(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                                  const std::vector<float> &v, const std::vector<float> &dout,
                                  std::vector<double> &dq, std::vector<double> &dk, std::vector<double> &dv);

struct ErrorStats {
    double max_abs = 0;
    double rel_l2 = 0;   // ||got - ref|| / ||ref||
    size_t non_finite = 0;  // got values that are NaN or +-inf where ref is finite
    size_t mismatched_inf = 0;  // ref is +-inf but got differs
};

ErrorStats compare(const std::vector<float> &got, const std::vector<double> &ref);

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
