// Host tests of the float64 reference the GPU tests judge the kernels by
// (tests/support/reference.cpp), no GPU needed: its backward pass against
// central finite differences of its forward pass, over the masks, softcap,
// GQA, seqused_k and variable-length batches, so a wrong reference cannot
// pass a wrong kernel (or fail a right one) unnoticed; the e4m3 codec the
// fp8 tests quantize their inputs with, against the OCP format; and the fp8
// prefill tests' error bounds against an emulation of the kernel's
// arithmetic (they hold, are not vacuous, and catch a kernel's mistakes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
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
    p = base;
    p.attention_chunk = 3;  // keys [0, 3), [3, 6), [6, 7); the diagonals 2 ... 6
    all.push_back({"chunked", p});
    p.causal = true;
    all.push_back({"chunked_causal", p});
    p.seqlen_q = 9;  // diagonals -2 and -1: a chunk below key 0, no key
    p.window_left = 1;
    all.push_back({"chunked_causal_window_more_queries_than_keys", p});
    p = base;
    p.sinks = {0.7, -1.3};
    all.push_back({"sinks", p});
    p.heads_q = 4;
    p.heads_kv = 1;
    p.sinks = {0.7, -1.3, 2.1, 0.0};
    p.causal = true;
    p.seqlen_q = 9;  // rows that see no key: out 0, lse the sink
    p.window_left = 2;
    p.softcap = 2.0;
    p.softmax_scale = 1.0;
    all.push_back({"sinks_gqa_causal_window_softcap", p});
    p = base;
    p.batch = 3;
    p.seqlens_q = {0, 5, 2};
    p.seqused_k = {4, 7, 1};
    p.sinks = {0.3, 1.1};
    p.attention_chunk = 2;
    p.causal = true;
    all.push_back({"sinks_chunked_varlen", p});
    return all;
}

// Central differences of the loss in each sink against the analytic dsinks.
std::string check_sinks_against_differences(const Problem &p, const std::vector<float> &q,
                                            const std::vector<float> &k, const std::vector<float> &v,
                                            const std::vector<float> &dout, const std::vector<double> &dsinks) {
    constexpr double kSinkStep = 1e-4;
    double max_grad = 0;
    for (double g : dsinks) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t h = 0; h < p.sinks.size(); ++h) {
        Problem up = p, down = p;
        up.sinks[h] += kSinkStep;
        down.sinks[h] -= kSinkStep;
        const double numeric = (loss(up, q, k, v, dout) - loss(down, q, k, v, dout)) / (2 * kSinkStep);
        if (std::fabs(numeric - dsinks[h]) > kAgreement * std::max(1.0, max_grad)) {
            return "dsinks[" + std::to_string(h) + "]: analytic " + std::to_string(dsinks[h]) +
                   ", central differences " + std::to_string(numeric);
        }
    }
    return "";
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
        std::vector<double> dq, dk, dv, dsinks;
        reference_attention_backward(p, q, k, v, dout, dq, dk, dv, &dsinks);
        ASSERT_EQ(dq.size(), q.size());
        ASSERT_EQ(dk.size(), k.size());
        ASSERT_EQ(dv.size(), v.size());
        ASSERT_EQ(dsinks.size(), size_t(p.heads_q));
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, q, dq, "dq"), "");
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, k, dk, "dk"), "");
        EXPECT_EQ(check_against_differences(p, q, k, v, dout, v, dv, "dv"), "");
        if (p.sinks.empty()) {
            for (double g : dsinks) EXPECT_EQ(g, 0.0) << "dsinks without sinks";
        } else {
            EXPECT_EQ(check_sinks_against_differences(p, q, k, v, dout, dsinks), "");
        }
    }
}

// The forward with sinks and chunks against its definition, written out
// for one row: the chunk bounds the keys, the sink joins the denominator
// only, and a row that sees no key gets out = 0 and lse = sink.
TEST(ReferenceForward, SinksAndChunksFollowTheirDefinition) {
    Problem p;
    p.seqlen_q = 6;
    p.seqlen_k = 4;  // diagonals -2 ... 3
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 8;
    p.attention_chunk = 3;  // keys [0, 3) and [3, 4)
    p.sinks = {0.5};
    std::mt19937_64 rng(11);
    const std::vector<float> q = normal_values(6 * 8, rng), k = normal_values(4 * 8, rng), v = normal_values(4 * 8, rng);
    for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    p.causal = causal;
    std::vector<double> out, lse;
    reference_attention(p, q, k, v, out, lse);
    const double scale = 1.0 / std::sqrt(8.0);
    for (int i = 0; i < 6; ++i) {
        const int diagonal = i - 2;
        // The keys of the diagonal's chunk (up to the diagonal with causal);
        // a diagonal below key 0 lies in a chunk below it, which holds none.
        const int start = diagonal / 3 * 3;
        const int first = diagonal < 0 ? 0 : start;
        const int end = diagonal < 0 ? 0 : causal ? diagonal + 1 : std::min(start + 3, 4);
        double sum = std::exp(p.sinks[0]);
        std::vector<double> o(8, 0.0);
        for (int j = first; j < end; ++j) {
            double s = 0;
            for (int c = 0; c < 8; ++c) s += double(q[i * 8 + c]) * double(k[j * 8 + c]);
            const double w = std::exp(s * scale);
            sum += w;
            for (int c = 0; c < 8; ++c) o[c] += w * double(v[j * 8 + c]);
        }
        EXPECT_NEAR(lse[i], std::log(sum), 1e-12) << "row " << i;
        for (int c = 0; c < 8; ++c) EXPECT_NEAR(out[i * 8 + c], o[c] / sum, 1e-12) << "row " << i << " col " << c;
    }
    EXPECT_EQ(lse[0], 0.5) << "a row that sees no key: lse is the sink";
    for (int c = 0; c < 8; ++c) EXPECT_EQ(out[c], 0.0);
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

// ---------------------------------------------------------------------------
// The e4m3 codec (e4m3_encode, e4m3_decode).
// ---------------------------------------------------------------------------

// "0x3a": a code as the failures name it.
std::string hex(unsigned code) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", code);
    return buf;
}

// The positive finite e4m3 values in increasing order, as the OCP 8-bit
// floating point specification (v1.0, E4M3) lists them: the subnormals
// 0, 1/8, ..., 7/8 of 2^-6, then each binade 2^-6 .. 2^8 in eighths, the
// last binade stopping at 1.75 * 2^8 = 448 (its 1.875 is NaN's code). The
// codes 0x00 .. 0x7e stand for them in this order.
std::vector<double> ocp_positive_values() {
    std::vector<double> values;
    for (int eighths = 0; eighths < 8; ++eighths) values.push_back(eighths / 8.0 * std::pow(2.0, -6));
    for (int binade = -6; binade <= 8; ++binade)
        for (int eighths = 0; eighths < 8; ++eighths) {
            if (binade == 8 && eighths == 7) break;
            values.push_back((1.0 + eighths / 8.0) * std::pow(2.0, binade));
        }
    return values;
}

TEST(E4m3, EveryCodeDecodesToItsOcpValue) {
    const std::vector<double> positive = ocp_positive_values();
    ASSERT_EQ(positive.size(), 127u);  // 0x00 .. 0x7e
    for (unsigned code = 0; code < 256; ++code) {
        const double value = e4m3_decode(uint8_t(code));
        const unsigned magnitude_code = code & 0x7F;
        if (magnitude_code == 0x7F) {
            EXPECT_TRUE(std::isnan(value)) << hex(code) << " is NaN";
            continue;
        }
        const double expected = (code & 0x80) != 0 ? -positive[magnitude_code] : positive[magnitude_code];
        EXPECT_EQ(value, expected) << hex(code);
        EXPECT_EQ(std::signbit(value), (code & 0x80) != 0) << hex(code) << ": the sign bit";
    }
    // Landmarks the format is known by.
    EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0, -9)) << "the smallest subnormal";
    EXPECT_EQ(e4m3_decode(0x07), 7 * std::ldexp(1.0, -9)) << "the largest subnormal";
    EXPECT_EQ(e4m3_decode(0x08), std::ldexp(1.0, -6)) << "the smallest normal";
    EXPECT_EQ(e4m3_decode(0x38), 1.0);
    EXPECT_EQ(e4m3_decode(0x39), 1.125);
    EXPECT_EQ(e4m3_decode(0xC0), -2.0);
    EXPECT_EQ(e4m3_decode(0x77), 240.0);
    EXPECT_EQ(e4m3_decode(0x78), 256.0);
    EXPECT_EQ(e4m3_decode(0x7E), kE4m3Max);
    EXPECT_EQ(e4m3_decode(0xFE), -kE4m3Max);
    EXPECT_EQ(e4m3_decode(0x80), 0.0);
    EXPECT_TRUE(std::signbit(e4m3_decode(0x80))) << "0x80 is -0";
    // Every value is exact in float (and so in fp16 and bf16: at most 4
    // significant bits, exponents from -9 to 8).
    for (unsigned code = 0; code < 256; ++code) {
        const double value = e4m3_decode(uint8_t(code));
        if (std::isnan(value)) continue;
        EXPECT_EQ(double(float(value)), value) << hex(code);
    }
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
    for (unsigned code = 0; code < 256; ++code) {
        if ((code & 0x7F) == 0x7F) continue;
        EXPECT_EQ(e4m3_encode(float(e4m3_decode(uint8_t(code)))), code) << hex(code);
    }
}

// Halfway between two neighbouring values the even code (mantissa bit 0)
// wins; a float either side of halfway goes to the nearer one. Every pair
// of neighbours, subnormal, across binades and up to 448, both signs; 0
// and the smallest subnormal's midpoint rounds to 0.
TEST(E4m3, RoundsToNearestWithTiesToEven) {
    for (unsigned code = 0; code < 0x7E; ++code) {
        const double low = e4m3_decode(uint8_t(code)), high = e4m3_decode(uint8_t(code + 1));
        const float midpoint = float((low + high) / 2);
        ASSERT_EQ(double(midpoint), (low + high) / 2) << "midpoints are floats";
        const unsigned even = code % 2 == 0 ? code : code + 1;
        for (unsigned sign : {0x00u, 0x80u}) {
            const float s = sign != 0 ? -1.f : 1.f;
            SCOPED_TRACE("between " + hex(code | sign) + " and " + hex((code + 1) | sign));
            EXPECT_EQ(e4m3_encode(s * midpoint), even | sign) << "halfway: the even code";
            EXPECT_EQ(e4m3_encode(s * std::nextafter(midpoint, 0.f)), code | sign) << "just below halfway";
            EXPECT_EQ(e4m3_encode(s * std::nextafter(midpoint, FLT_MAX)), (code + 1) | sign) << "just above";
            EXPECT_EQ(e4m3_encode(s * float(low + (high - low) / 4)), code | sign);
            EXPECT_EQ(e4m3_encode(s * float(high - (high - low) / 4)), (code + 1) | sign);
        }
    }
    EXPECT_EQ(e4m3_encode(1.0625f), 0x38u) << "1 + 1/16: between 1 (0x38) and 1.125 (0x39)";
    EXPECT_EQ(e4m3_encode(1.1875f), 0x3Au) << "1.125 + 1/16: between 0x39 and 1.25 (0x3a)";
    EXPECT_EQ(e4m3_encode(std::ldexp(1.f, -10)), 0x00u) << "half the smallest subnormal: to 0";
    EXPECT_EQ(e4m3_encode(-std::ldexp(1.f, -10)), 0x80u);
    EXPECT_EQ(e4m3_encode(std::ldexp(1.f, -30)), 0x00u);
    EXPECT_EQ(e4m3_encode(FLT_TRUE_MIN), 0x00u);
    EXPECT_EQ(e4m3_encode(0.f), 0x00u);
    EXPECT_EQ(e4m3_encode(-0.f), 0x80u);
}

// The codec against brute force: for random floats over the whole range
// (magnitudes 2^-12 .. 2^10, log-uniform, both signs), the code is the
// nearest finite value's, the even one on a tie, 448 past the top.
TEST(E4m3, EncodesRandomFloatsToTheNearestValue) {
    const std::vector<double> positive = ocp_positive_values();
    std::mt19937_64 rng(20240611);
    std::uniform_real_distribution<double> log2_magnitude(-12.0, 10.0);
    for (int i = 0; i < 200000; ++i) {
        const float x = float((i % 2 == 0 ? 1 : -1) * std::exp2(log2_magnitude(rng)));
        const double magnitude = std::fabs(double(x));
        unsigned nearest = 0;
        for (unsigned c = 1; c < positive.size(); ++c) {
            const double distance = std::fabs(positive[c] - magnitude), best = std::fabs(positive[nearest] - magnitude);
            if (distance < best || (distance == best && c % 2 == 0)) nearest = c;
        }
        const unsigned expected = nearest | (x < 0 ? 0x80u : 0x00u);
        ASSERT_EQ(e4m3_encode(x), expected) << "x = " << x;
    }
}

TEST(E4m3, SaturatesPast448) {
    const float large[] = {448.f, 448.5f, 463.9f, 464.f, 465.f, 480.f, 1000.f, 65504.f, 1e30f, FLT_MAX, INFINITY};
    for (float x : large) {
        EXPECT_EQ(e4m3_encode(x), 0x7Eu) << x;
        EXPECT_EQ(e4m3_encode(-x), 0xFEu) << -x;
    }
    EXPECT_EQ(e4m3_encode(447.f), 0x7Eu) << "nearer 448 than 416";
    EXPECT_EQ(e4m3_encode(431.f), 0x7Du) << "nearer 416 than 448";
}

TEST(E4m3, NanHasTheNanCodes) {
    EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)));
    EXPECT_TRUE(std::isnan(e4m3_decode(0xFF)));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(e4m3_encode(nan), 0x7Fu);
    EXPECT_EQ(e4m3_encode(-nan), 0xFFu);
    EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::signaling_NaN()) & 0x7F, 0x7Fu);
    // Only those two: every other code is a number.
    int nan_codes = 0;
    for (unsigned code = 0; code < 256; ++code) nan_codes += std::isnan(e4m3_decode(uint8_t(code)));
    EXPECT_EQ(nan_codes, 2);
}

// ---------------------------------------------------------------------------
// The fp8 prefill error model (kFp8PrefillModel, fp8_error_bounds,
// kFp8PrefillRelL2) against an emulation of the kernel's arithmetic: the
// GPU tests' bounds must hold for a kernel that computes as described, be
// near what such a kernel reaches (else they would pass a wrong one), and
// fail the mistakes an fp8 kernel can make: a descale factor missed, K and
// V keys out of step.
// ---------------------------------------------------------------------------

// x with its mantissa truncated to `bits` bits after the leading one
// (toward 0), as the fp8 tensor cores keep their accumulators.
double truncate_mantissa(double x, int bits) {
    if (x == 0 || !std::isfinite(x)) return x;
    const double unit = std::ldexp(1.0, std::ilogb(x) - bits);
    return std::trunc(x / unit) * unit;
}

// x rounded to bf16 (8 significant bits, to nearest even).
double round_to_bf16(double x) {
    if (x == 0 || !std::isfinite(x)) return x;
    const int e = std::ilogb(x);
    return std::ldexp(std::nearbyint(std::ldexp(x, 7 - e)), e - 7);
}

constexpr int kEmulatedAccumulatorBits = 13;
constexpr int kEmulatedTermsPerStep = 32;
constexpr int kEmulatedTileKeys = 128;
constexpr int kEmulatedProbExponent = 8;
// The largest |out - ref| / bound the emulation must reach on the test
// shapes: a bound far above what the kernel's arithmetic can reach would
// pass mistakes of that size.
constexpr double kBoundReachedAtLeast = 0.25;

// The sum of a[i] * b[i] as the fp8 tensor cores form it: exact products,
// 32 a step added to the accumulator, which keeps 13 mantissa bits.
double fp8_dot(const float *a, const float *b, int n) {
    double acc = 0;
    for (int start = 0; start < n; start += kEmulatedTermsPerStep) {
        double step = 0;
        for (int i = start; i < std::min(n, start + kEmulatedTermsPerStep); ++i) step += double(a[i]) * double(b[i]);
        acc = truncate_mantissa(acc + step, kEmulatedAccumulatorBits);
    }
    return acc;
}

// out and lse of an fp8 prefill of dense q, k, v (dequantized values) as
// the kernel computes them: scores by fp8_dot; per 128-key tile the
// online softmax against the running row maximum, probabilities scaled so
// that the maximum is 2^8 and rounded to e4m3 for P V, whose steps of 32
// keys truncate the accumulator as fp8_dot does; the row sum of the
// unrounded probabilities; out rounded to bf16.
void emulate_fp8_prefill(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                         const std::vector<float> &v, std::vector<double> &out, std::vector<double> &lse) {
    const int d = p.head_dim, dv = value_head_dim(p), group = p.heads_q / p.heads_kv;
    const double scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
    const double prob_scale = std::ldexp(1.0, kEmulatedProbExponent);
    out.assign(size_t(p.batch) * p.heads_q * p.seqlen_q * dv, 0.0);
    lse.assign(size_t(p.batch) * p.heads_q * p.seqlen_q, 0.0);
    for (size_t row = 0; row < lse.size(); ++row) {
        const int i = int(row % p.seqlen_q);
        const int b = int(row / p.seqlen_q / p.heads_q), h = int(row / p.seqlen_q % p.heads_q);
        const size_t kv_head = size_t(b) * p.heads_kv + h / group;
        int first = 0, end = 0;
        visible_keys(p, b, i, &first, &end);
        if (end <= first) {
            lse[row] = -std::numeric_limits<double>::infinity();
            continue;
        }
        double row_max = -std::numeric_limits<double>::infinity(), row_sum = 0;
        std::vector<double> acc(size_t(dv), 0.0);
        for (int tile = first / kEmulatedTileKeys * kEmulatedTileKeys; tile < end; tile += kEmulatedTileKeys) {
            const int tile_end = std::min(end, tile + kEmulatedTileKeys), tile_first = std::max(first, tile);
            std::vector<double> scores(size_t(tile_end - tile_first));
            double tile_max = row_max;
            for (int j = tile_first; j < tile_end; ++j) {
                scores[j - tile_first] = scale * fp8_dot(&q[row * d], &k[(kv_head * p.seqlen_k + j) * d], d);
                tile_max = std::max(tile_max, scores[j - tile_first]);
            }
            const double correction = std::exp(row_max - tile_max);
            row_sum *= correction;
            for (double &o : acc) o *= correction;
            row_max = tile_max;
            std::vector<double> rounded(scores.size());
            for (size_t j = 0; j < scores.size(); ++j) {
                const double prob = prob_scale * std::exp(scores[j] - row_max);
                row_sum += prob;
                rounded[j] = e4m3_decode(e4m3_encode(float(prob)));
            }
            for (int c = 0; c < dv; ++c)
                for (size_t start = 0; start < rounded.size(); start += kEmulatedTermsPerStep) {
                    double step = 0;
                    for (size_t j = start; j < std::min(rounded.size(), start + kEmulatedTermsPerStep); ++j)
                        step += rounded[j] * double(v[(kv_head * p.seqlen_k + tile_first + j) * dv + c]);
                    acc[size_t(c)] = truncate_mantissa(acc[size_t(c)] + step, kEmulatedAccumulatorBits);
                }
        }
        for (int c = 0; c < dv; ++c) out[row * dv + c] = round_to_bf16(acc[size_t(c)] / row_sum);
        lse[row] = row_max + std::log(row_sum / prob_scale);
    }
}

// Dense [batch, heads, seqlen, dim] inputs as the fp8 tests make them: unit
// normal values through e4m3 with a descale factor per (batch, K/V head)
// (2^-7 .. 2^-2: some heads saturate, others reach the subnormals),
// dequantized. Query heads share their K/V head's factor.
std::vector<float> dequantized_normal_values(int batch, int heads, int heads_per_factor, int seqlen, int dim,
                                             std::mt19937_64 &rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_int_distribution<int> exponent(-7, -2), sixteenths(0, 15);
    std::vector<float> factors(size_t(batch) * (heads / heads_per_factor));
    for (float &f : factors) f = std::ldexp(1.f + sixteenths(rng) / 16.f, exponent(rng));
    std::vector<float> values(size_t(batch) * heads * seqlen * dim);
    for (size_t i = 0; i < values.size(); ++i) {
        const size_t bh = i / (size_t(seqlen) * dim);
        const float f = factors[bh / heads_per_factor];
        values[i] = float(e4m3_decode(e4m3_encode(normal(rng) / f))) * f;
    }
    return values;
}

struct Fp8Inputs {
    Problem p;
    std::vector<float> q, k, v;
};

Fp8Inputs fp8_inputs(const Problem &p, std::mt19937_64 &rng) {
    const int group = p.heads_q / p.heads_kv;
    return {p, dequantized_normal_values(p.batch, p.heads_q, group, p.seqlen_q, p.head_dim, rng),
            dequantized_normal_values(p.batch, p.heads_kv, 1, p.seqlen_k, p.head_dim, rng),
            dequantized_normal_values(p.batch, p.heads_kv, 1, p.seqlen_k, value_head_dim(p), rng)};
}

// How `out` and `lse` stand against the bounds of inputs x.
struct BoundCheck {
    double worst_out_ratio = 0;  // max |out - ref| / bound
    double worst_lse_ratio = 0;
    double rel_l2 = 0;
    size_t lse_inf_mismatches = 0;
};

BoundCheck check_bounds(const Fp8Inputs &x, const std::vector<double> &out, const std::vector<double> &lse) {
    std::vector<double> ref_out, ref_lse, out_bound, lse_bound;
    reference_attention(x.p, x.q, x.k, x.v, ref_out, ref_lse);
    fp8_error_bounds(x.p, x.q, x.k, x.v, kFp8PrefillModel, out_bound, lse_bound);
    BoundCheck c;
    double diff_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < ref_out.size(); ++i) {
        const double diff = std::fabs(out[i] - ref_out[i]);
        c.worst_out_ratio = std::max(c.worst_out_ratio, diff == 0 ? 0 : diff / out_bound[i]);
        diff_sq += diff * diff;
        ref_sq += ref_out[i] * ref_out[i];
    }
    c.rel_l2 = std::sqrt(diff_sq / ref_sq);
    for (size_t r = 0; r < ref_lse.size(); ++r) {
        if (std::isinf(ref_lse[r]) || std::isinf(lse[r])) {
            c.lse_inf_mismatches += lse[r] != ref_lse[r];
            continue;
        }
        const double diff = std::fabs(lse[r] - ref_lse[r]);
        c.worst_lse_ratio = std::max(c.worst_lse_ratio, diff == 0 ? 0 : diff / lse_bound[r]);
    }
    return c;
}

Problem fp8_problem(int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim, bool causal) {
    Problem p;
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.head_dim = head_dim;
    p.causal = causal;
    return p;
}

// Shapes of the GPU tests' kinds: head dims 64, 128, 256; causal and not;
// GQA; seqlen_q > seqlen_k (rows that see no key); a window; a key count
// past one tile and not a multiple of it.
std::vector<Problem> fp8_emulation_problems() {
    std::vector<Problem> problems = {
        fp8_problem(1, 2, 2, 200, 200, 64, true),  fp8_problem(1, 2, 2, 200, 200, 64, false),
        fp8_problem(2, 4, 2, 90, 300, 128, true),  fp8_problem(1, 4, 1, 130, 333, 128, false),
        fp8_problem(1, 2, 1, 150, 150, 256, true), fp8_problem(1, 2, 2, 300, 100, 64, true),
    };
    Problem windowed = fp8_problem(1, 2, 2, 256, 256, 128, true);
    windowed.window_left = 40;
    problems.push_back(windowed);
    return problems;
}

TEST(Fp8PrefillModel, EmulatedKernelIsWithinTheBoundsAndNearThem) {
    std::mt19937_64 rng(36);
    double worst_ratio = 0, worst_rel_l2 = 0;
    for (const Problem &p : fp8_emulation_problems()) {
        const Fp8Inputs x = fp8_inputs(p, rng);
        std::vector<double> out, lse;
        emulate_fp8_prefill(p, x.q, x.k, x.v, out, lse);
        const BoundCheck c = check_bounds(x, out, lse);
        std::printf("[ fp8 model ] d%d Sq%d Sk%d %s: out %.3f of its bound (rel L2 %.4f), lse %.3f of its bound\n",
                    p.head_dim, p.seqlen_q, p.seqlen_k, p.causal ? "causal" : "full", c.worst_out_ratio, c.rel_l2,
                    c.worst_lse_ratio);
        EXPECT_LE(c.worst_out_ratio, 1.0) << "d" << p.head_dim << " Sq " << p.seqlen_q << " Sk " << p.seqlen_k;
        EXPECT_LE(c.worst_lse_ratio, 1.0) << "d" << p.head_dim << " Sq " << p.seqlen_q << " Sk " << p.seqlen_k;
        EXPECT_LE(c.rel_l2, kFp8PrefillRelL2);
        EXPECT_EQ(c.lse_inf_mismatches, 0u);
        worst_ratio = std::max(worst_ratio, c.worst_out_ratio);
        worst_rel_l2 = std::max(worst_rel_l2, c.rel_l2);
    }
    // Not vacuous: some element comes within a small factor of its bound,
    // and the relative L2 error is what e4m3 probabilities give (~2%), not
    // far below the bar.
    EXPECT_GE(worst_ratio, kBoundReachedAtLeast);
    EXPECT_GE(worst_rel_l2, kFp8PrefillRelL2 / 4);
}

// The mistakes an fp8 kernel can make break the bounds: one (batch, K/V
// head)'s v, or q, descale factor applied twice (or once where it should
// be squared: the same change), and V's keys paired with the wrong scores
// (two neighbours swapped, as a wrong fragment order would).
TEST(Fp8PrefillModel, KernelMistakesBreakTheBounds) {
    std::mt19937_64 rng(37);
    const Problem p = fp8_problem(2, 4, 2, 160, 200, 128, true);
    const Fp8Inputs x = fp8_inputs(p, rng);
    struct Mistake {
        const char *what;
        void (*apply)(Fp8Inputs &wrong);
    };
    const Mistake mistakes[] = {
        {"v of batch 1, K/V head 0 scaled by 2",
         [](Fp8Inputs &w) {
             const size_t per_head = size_t(w.p.seqlen_k) * value_head_dim(w.p);
             for (size_t i = 0; i < per_head; ++i) w.v[(1 * w.p.heads_kv + 0) * per_head + i] *= 2;
         }},
        {"q of batch 0, query head 3 scaled by 2",
         [](Fp8Inputs &w) {
             const size_t per_head = size_t(w.p.seqlen_q) * w.p.head_dim;
             for (size_t i = 0; i < per_head; ++i) w.q[(0 * w.p.heads_q + 3) * per_head + i] *= 2;
         }},
        {"V's keys 2j and 2j + 1 swapped",
         [](Fp8Inputs &w) {
             const int dv = value_head_dim(w.p);
             for (int bh = 0; bh < w.p.batch * w.p.heads_kv; ++bh)
                 for (int j = 0; j + 1 < w.p.seqlen_k; j += 2)
                     for (int c = 0; c < dv; ++c)
                         std::swap(w.v[(size_t(bh) * w.p.seqlen_k + j) * dv + c],
                                   w.v[(size_t(bh) * w.p.seqlen_k + j + 1) * dv + c]);
         }},
    };
    for (const Mistake &m : mistakes) {
        Fp8Inputs wrong = x;
        m.apply(wrong);
        std::vector<double> out, lse;
        emulate_fp8_prefill(p, wrong.q, wrong.k, wrong.v, out, lse);
        const BoundCheck c = check_bounds(x, out, lse);
        std::printf("[ fp8 model ] %s: out %.1f times its bound (rel L2 %.3f), lse %.1f times\n", m.what,
                    c.worst_out_ratio, c.rel_l2, c.worst_lse_ratio);
        EXPECT_GT(c.worst_out_ratio, 1.0) << m.what;
    }
}

}  // namespace
