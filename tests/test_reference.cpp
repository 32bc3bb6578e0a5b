// Host tests of the float64 reference the GPU tests judge the kernels by
// (tests/support/reference.cpp), no GPU needed: its backward pass against
// central finite differences of its forward pass, over the masks, softcap,
// GQA, seqused_k and variable-length batches, so a wrong reference cannot
// pass a wrong kernel (or fail a right one) unnoticed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "reference.h"

using namespace flashcore_test;

namespace {

std::vector<float> normal_values(size_t n, std::mt19937_64 &rng) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> values(n);
    for (float &x : values) x = dist(rng);
    return values;
}

// The loss whose gradient with respect to out is dout: sum(dout * out).
double loss(const Problem &p, const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v,
            const std::vector<float> &dout) {
    std::vector<double> out, lse;
    reference_attention(p, q, k, v, out, lse);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += double(dout[i]) * out[i];
    return sum;
}

// Step of the central differences: small enough that their truncation
// error (~step^2 times the third derivative) stays near 1e-7, large enough
// that float inputs resolve it (the step actually taken is measured).
constexpr float kStep = 1e-3f;
// The differences agree with the analytic gradient to this fraction of the
// tensor's largest element (measured: ~1e-8 to 1e-7).
constexpr double kAgreement = 1e-5;

// Checks every element of `analytic` (the gradient of the loss with respect
// to `input`) against central differences; elements the reference must
// leave alone (NaN keys past seqused_k) are skipped. "" if all agree.
std::string check_against_differences(const Problem &p, std::vector<float> &q, std::vector<float> &k,
                                      std::vector<float> &v, const std::vector<float> &dout,
                                      std::vector<float> &input, const std::vector<double> &analytic,
                                      const char *name) {
    double max_grad = 0;
    for (double g : analytic) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t i = 0; i < input.size(); ++i) {
        const float original = input[i];
        if (!std::isfinite(original)) {
            if (analytic[i] != 0) return std::string(name) + ": a key nobody may read got a gradient";
            continue;
        }
        input[i] = original + kStep;
        const float up = input[i];
        const double loss_up = loss(p, q, k, v, dout);
        input[i] = original - kStep;
        const float down = input[i];
        const double loss_down = loss(p, q, k, v, dout);
        input[i] = original;
        const double numeric = (loss_up - loss_down) / (double(up) - double(down));
        if (std::fabs(numeric - analytic[i]) > kAgreement * std::max(1.0, max_grad)) {
            return std::string(name) + "[" + std::to_string(i) + "]: analytic " + std::to_string(analytic[i]) +
                   ", central differences " + std::to_string(numeric);
        }
    }
    return "";
}

struct Case {
    const char *name;
    Problem p;
};

std::vector<Case> cases() {
    Problem base;
    base.batch = 1;
    base.seqlen_q = 5;
    base.seqlen_k = 7;
    base.heads_q = 2;
    base.heads_kv = 2;
    base.head_dim = 8;
    std::vector<Case> all;
    all.push_back({"full", base});
    Problem p = base;
    p.causal = true;
    all.push_back({"causal", p});
    p.seqlen_q = 9;  // the first two rows see no key
    all.push_back({"causal_more_queries_than_keys", p});
    p = base;
    p.window_left = 2;
    p.window_right = 1;
    all.push_back({"window", p});
    p = base;
    p.softcap = 2.0;
    p.softmax_scale = 1.0;  // logits large enough to bend on the cap
    all.push_back({"softcap", p});
    p = base;
    p.heads_q = 4;
    p.heads_kv = 1;
    p.head_dim_v = 16;
    all.push_back({"gqa_head_dim_v", p});
    p = base;
    p.batch = 3;
    p.causal = true;
    p.seqused_k = {3, 0, 7};
    all.push_back({"seqused_k", p});
    p = base;
    p.batch = 3;
    p.seqlens_q = {0, 5, 2};
    p.seqused_k = {4, 7, 1};
    p.window_left = 1;
    p.window_right = 0;
    all.push_back({"varlen", p});
    return all;
}

TEST(ReferenceBackward, MatchesCentralDifferencesOfTheForward) {
    for (const Case &c : cases()) {
        SCOPED_TRACE(c.name);
        const Problem &p = c.p;
        std::mt19937_64 rng(12345);
        const int d_v = value_head_dim(p);
        std::vector<float> q = normal_values(size_t(p.batch) * p.heads_q * p.seqlen_q * p.head_dim, rng);
        std::vector<float> k = normal_values(size_t(p.batch) * p.heads_kv * p.seqlen_k * p.head_dim, rng);
        std::vector<float> v = normal_values(size_t(p.batch) * p.heads_kv * p.seqlen_k * d_v, rng);
        const std::vector<float> dout = normal_values(size_t(p.batch) * p.heads_q * p.seqlen_q * d_v, rng);
        // Keys past seqused_k hold NaN: the reference must never read them.
        for (int b = 0; b < p.batch; ++b)
            for (int h = 0; h < p.heads_kv; ++h)
                for (int j = batch_seqlen_k(p, b); j < p.seqlen_k; ++j) {
                    const size_t row = (size_t(b) * p.heads_kv + h) * p.seqlen_k + j;
                    std::fill_n(&k[row * p.head_dim], p.head_dim, NAN);
                    std::fill_n(&v[row * d_v], d_v, NAN);
                }
        std::vector<double> dq, dk, dv;
        reference_attention_backward(p, q, k, v, dout, dq, dk, dv);
        ASSERT_EQ(dq.size(), q.size());
        ASSERT_EQ(dk.size(), k.size());
        ASSERT_EQ(dv.size(), v.size());
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, q, dq, "dq"), "");
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, k, dk, "dk"), "");
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, v, dv, "dv"), "");
    }
}

// Rows that see no key get dq = 0 and keys that no row sees dk = dv = 0,
// exactly (the GPU tests require exact zeros there).
TEST(ReferenceBackward, UnseenRowsAndKeysGetZeroGradients) {
    Problem p;
    p.seqlen_q = 6;
    p.seqlen_k = 4;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 8;
    p.causal = true;       // rows 0 and 1 see no key
    p.window_left = 0;     // each other row sees its diagonal key only...
    p.window_right = 0;
    std::mt19937_64 rng(7);
    const std::vector<float> q = normal_values(6 * 8, rng), k = normal_values(4 * 8, rng),
                             v = normal_values(4 * 8, rng), dout = normal_values(6 * 8, rng);
    std::vector<double> dq, dk, dv;
    reference_attention_backward(p, q, k, v, dout, dq, dk, dv);
    for (int c = 0; c < 16; ++c) EXPECT_EQ(dq[c], 0.0) << "rows 0 and 1";
    // ...so P = 1 and dS = P (dP - D) = 0: dq and dk vanish everywhere,
    // while dv = dout of the row that sees the key.
    for (double g : dq) EXPECT_EQ(g, 0.0);
    for (double g : dk) EXPECT_EQ(g, 0.0);
    for (int j = 0; j < 4; ++j)
        for (int c = 0; c < 8; ++c) EXPECT_EQ(dv[j * 8 + c], double(dout[(j + 2) * 8 + c])) << "key " << j;
}

}  // namespace
