#include "reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

namespace flashcore_test {

namespace {

double softmax_scale_of(const Problem &p) {
    return p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(p.head_dim));
}

// In four partial sums: independent chains of additions, which the CPU
// overlaps (one chain waits an addition's latency per element; the
// backward reference spends most of its time here).
double dot(const float *a, const float *b, int n) {
    double sum[4] = {0, 0, 0, 0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int lane = 0; lane < 4; ++lane) sum[lane] += double(a[c + lane]) * double(b[c + lane]);
    for (; c < n; ++c) sum[0] += double(a[c]) * double(b[c]);
    return (sum[0] + sum[1]) + (sum[2] + sum[3]);
}

// A scaled (and capped) score and its derivative with respect to the
// scaled score before the cap: 1 without a softcap, 1 - tanh^2 with one.
struct Score {
    double value;
    double cap_derivative;
};

Score score_of(const Problem &p, double scale, const float *q_row, const float *k_row) {
    const double scaled = dot(q_row, k_row, p.head_dim) * scale;
    if (p.softcap <= 0) return {scaled, 1.0};
    const double t = std::tanh(scaled / p.softcap);
    return {p.softcap * t, 1.0 - t * t};
}

// work(i) for every i in [0, count), spread over all cores.
template <typename Work>
void parallel_for(int64_t count, Work &&work) {
    std::atomic<int64_t> next{0};
    auto worker = [&] {
        for (int64_t i; (i = next.fetch_add(1)) < count;) work(i);
    };
    const unsigned num_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < num_threads; ++t) threads.emplace_back(worker);
    for (auto &t : threads) t.join();
}

}  // namespace

void visible_keys(const Problem &p, int batch, int i, int *begin, int *end) {
    const int seqlen_k = batch_seqlen_k(p, batch);
    const int64_t diagonal = int64_t(i) + seqlen_k - batch_seqlen_q(p, batch);
    int64_t b = 0, e = seqlen_k;
    if (p.window_left >= 0) b = std::max<int64_t>(b, diagonal - p.window_left);
    if (p.causal) e = std::min<int64_t>(e, diagonal + 1);
    if (p.window_right >= 0) e = std::min<int64_t>(e, diagonal + 1 + p.window_right);
    if (p.attention_chunk > 0) {
        const int64_t chunk = p.attention_chunk;
        const int64_t start = (diagonal >= 0 ? diagonal / chunk : -((-diagonal + chunk - 1) / chunk)) * chunk;
        b = std::max(b, start);
        e = std::min(e, start + chunk);
    }
    *begin = int(std::min<int64_t>(b, seqlen_k));
    *end = int(std::max<int64_t>(e, *begin));
}

void reference_attention(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                         const std::vector<float> &v, std::vector<double> &out, std::vector<double> &lse) {
    const int d = p.head_dim;
    const int dv = value_head_dim(p);
    const double scale = softmax_scale_of(p);
    out.assign(size_t(p.batch) * p.heads_q * p.seqlen_q * dv, 0.0);
    lse.assign(size_t(p.batch) * p.heads_q * p.seqlen_q, 0.0);
    const int group = p.heads_q / p.heads_kv;
    const int num_rows = p.batch * p.heads_q * p.seqlen_q;

    std::atomic<int> next_row{0};
    auto worker = [&] {
        std::vector<double> scores(p.seqlen_k);
        for (int row; (row = next_row.fetch_add(1)) < num_rows;) {
            const int i = row % p.seqlen_q;
            const int bh = row / p.seqlen_q;
            const int h = bh % p.heads_q;
            const int b = bh / p.heads_q;
            const size_t kv_head = size_t(b) * p.heads_kv + h / group;
            const size_t kv_base = kv_head * p.seqlen_k * d;
            const size_t v_base = kv_head * p.seqlen_k * dv;
            const float *qi = &q[size_t(row) * d];
            int first = 0, end = 0;
            visible_keys(p, b, i, &first, &end);
            double *o = &out[size_t(row) * dv];
            if (i >= batch_seqlen_q(p, b)) continue;
            const double sink = p.sinks.empty() ? -std::numeric_limits<double>::infinity() : p.sinks[h];
            if (end <= first) {
                lse[row] = sink;
                continue;
            }
            double max_score = sink;
            for (int j = first; j < end; ++j) {
                scores[j] = score_of(p, scale, qi, &k[kv_base + size_t(j) * d]).value;
                max_score = std::max(max_score, scores[j]);
            }
            double sum = std::exp(sink - max_score);  // 0 without a sink
            for (int j = first; j < end; ++j) {
                const double w = std::exp(scores[j] - max_score);
                sum += w;
                const float *vj = &v[v_base + size_t(j) * dv];
                for (int c = 0; c < dv; ++c) o[c] += w * double(vj[c]);
            }
            for (int c = 0; c < dv; ++c) o[c] /= sum;
            lse[row] = max_score + std::log(sum);
        }
    };
    const unsigned num_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < num_threads; ++t) threads.emplace_back(worker);
    for (auto &t : threads) t.join();
}

void reference_attention_backward(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                                  const std::vector<float> &v, const std::vector<float> &dout,
                                  std::vector<double> &dq, std::vector<double> &dk, std::vector<double> &dv,
                                  std::vector<double> *dsinks, std::vector<double> *dsinks_scale) {
    const int d = p.head_dim;
    const int d_v = value_head_dim(p);
    const double scale = softmax_scale_of(p);
    const int group = p.heads_q / p.heads_kv;
    std::vector<double> out, lse;
    reference_attention(p, q, k, v, out, lse);
    const int64_t num_rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
    // D = rowsum(dout * out), the softmax's share of each row's dP.
    std::vector<double> row_sums(size_t(num_rows), 0.0);
    for (int64_t row = 0; row < num_rows; ++row)
        for (int c = 0; c < d_v; ++c) row_sums[row] += double(dout[row * d_v + c]) * out[row * d_v + c];
    dq.assign(size_t(num_rows) * d, 0.0);
    dk.assign(size_t(p.batch) * p.heads_kv * p.seqlen_k * d, 0.0);
    dv.assign(size_t(p.batch) * p.heads_kv * p.seqlen_k * d_v, 0.0);
    // d lse / d sink = exp(sink - lse) = the sink's probability, and
    // d out / d sink = -that * out: the loss moves by -P_sink * D.
    if (dsinks != nullptr) dsinks->assign(size_t(p.heads_q), 0.0);
    if (dsinks_scale != nullptr) dsinks_scale->assign(size_t(p.heads_q), 0.0);
    for (int64_t row = 0; row < num_rows && !p.sinks.empty(); ++row) {
        const int i = int(row % p.seqlen_q);
        const int h = int((row / p.seqlen_q) % p.heads_q);
        const int b = int(row / (int64_t(p.seqlen_q) * p.heads_q));
        // A head without a sink (-inf) has gradient 0, also from rows that
        // see no key (lse -inf too).
        if (i >= batch_seqlen_q(p, b) || p.sinks[h] == -std::numeric_limits<double>::infinity()) continue;
        const double sink_share = std::exp(p.sinks[h] - lse[row]);
        if (dsinks != nullptr) (*dsinks)[h] -= sink_share * row_sums[row];
        if (dsinks_scale != nullptr) {
            double magnitude = 0;
            for (int c = 0; c < d_v; ++c) magnitude += std::fabs(double(dout[row * d_v + c]) * out[row * d_v + c]);
            (*dsinks_scale)[h] += sink_share * magnitude;
        }
    }

    // P and dS (the gradient of the loss with respect to the scaled score
    // before the cap) of query row `row` and key j of K/V head kv_head
    // (batch * heads_kv + head); the key must be visible to the row.
    auto probability_and_score_gradient = [&](int64_t row, int64_t kv_head, int j, double *probability) {
        const size_t key = size_t(kv_head) * p.seqlen_k + j;
        const Score s = score_of(p, scale, &q[row * d], &k[key * d]);
        *probability = std::exp(s.value - lse[row]);
        const double dprobability = dot(&dout[row * d_v], &v[key * d_v], d_v);
        return *probability * (dprobability - row_sums[row]) * s.cap_derivative;
    };

    // dq: each query row on its own, over the keys it sees.
    parallel_for(num_rows, [&](int64_t row) {
        const int i = int(row % p.seqlen_q);
        const int64_t bh = row / p.seqlen_q;
        const int b = int(bh / p.heads_q);
        const int64_t kv_head = int64_t(b) * p.heads_kv + (bh % p.heads_q) / group;
        if (i >= batch_seqlen_q(p, b)) return;
        int first = 0, end = 0;
        visible_keys(p, b, i, &first, &end);
        double *dq_row = &dq[size_t(row) * d];
        for (int j = first; j < end; ++j) {
            double probability = 0;
            const double ds = probability_and_score_gradient(row, kv_head, j, &probability);
            const float *k_row = &k[(size_t(kv_head) * p.seqlen_k + j) * d];
            for (int c = 0; c < d; ++c) dq_row[c] += scale * ds * double(k_row[c]);
        }
    });

    // dk and dv: each key of each K/V head on its own, summed over the query
    // heads of its group and the rows that see it.
    const int64_t num_keys = int64_t(p.batch) * p.heads_kv * p.seqlen_k;
    parallel_for(num_keys, [&](int64_t key) {
        const int j = int(key % p.seqlen_k);
        const int64_t kv_head = key / p.seqlen_k;
        const int b = int(kv_head / p.heads_kv);
        const int first_head = int(kv_head % p.heads_kv) * group;
        if (j >= batch_seqlen_k(p, b)) return;
        double *dk_row = &dk[size_t(key) * d];
        double *dv_row = &dv[size_t(key) * d_v];
        for (int h = first_head; h < first_head + group; ++h) {
            for (int i = 0; i < batch_seqlen_q(p, b); ++i) {
                int first = 0, end = 0;
                visible_keys(p, b, i, &first, &end);
                if (j < first || j >= end) continue;
                const int64_t row = (int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
                double probability = 0;
                const double ds = probability_and_score_gradient(row, kv_head, j, &probability);
                const float *q_row = &q[size_t(row) * d];
                const float *dout_row = &dout[size_t(row) * d_v];
                for (int c = 0; c < d; ++c) dk_row[c] += scale * ds * double(q_row[c]);
                for (int c = 0; c < d_v; ++c) dv_row[c] += probability * double(dout_row[c]);
            }
        }
    });
}

void fp8_error_bounds(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                      const std::vector<float> &v, const Fp8ErrorModel &model, std::vector<double> &out_bound,
                      std::vector<double> &lse_bound) {
    const int d = p.head_dim;
    const int dv = value_head_dim(p);
    const double scale = softmax_scale_of(p);
    const int group = p.heads_q / p.heads_kv;
    const int64_t num_rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
    out_bound.assign(size_t(num_rows) * dv, 0.0);
    lse_bound.assign(size_t(num_rows), 0.0);
    const auto steps = [&](int64_t terms) { return double((terms + model.terms_per_step - 1) / model.terms_per_step); };
    parallel_for(num_rows, [&](int64_t row) {
        const int i = int(row % p.seqlen_q);
        const int64_t bh = row / p.seqlen_q;
        const int b = int(bh / p.heads_q);
        const size_t kv_head = size_t(b) * p.heads_kv + (bh % p.heads_q) / group;
        if (i >= batch_seqlen_q(p, b)) return;
        int first = 0, end = 0;
        visible_keys(p, b, i, &first, &end);
        if (end <= first) return;
        const float *q_row = &q[size_t(row) * d];
        std::vector<double> scores(size_t(end - first));
        double max_score = -std::numeric_limits<double>::infinity(), max_magnitude = 0;
        for (int j = first; j < end; ++j) {
            const float *k_row = &k[(kv_head * p.seqlen_k + j) * d];
            double magnitude = 0;
            for (int c = 0; c < d; ++c) magnitude += std::fabs(double(q_row[c]) * double(k_row[c]));
            scores[j - first] = score_of(p, scale, q_row, k_row).value;
            max_score = std::max(max_score, scores[j - first]);
            max_magnitude = std::max(max_magnitude, magnitude * scale);
        }
        double sum = 0;
        for (double &s : scores) sum += (s = std::exp(s - max_score));  // now the unnormalised weights
        const double score_error = steps(d) * model.step_rounding * max_magnitude;
        const double spread = std::expm1(2 * score_error) + (steps(end - first) + model.partial_tile_steps) * model.step_rounding;
        const double w_max = 1 / sum;  // the largest key's weight (its unnormalised weight is 1)
        double *bound = &out_bound[size_t(row) * dv];
        std::vector<double> magnitude_sum(size_t(dv), 0.0), out_sum(size_t(dv), 0.0);
        for (int j = first; j < end; ++j) {
            const double w = scores[j - first] / sum;
            const double rounding = std::max(model.prob_rounding * w, model.prob_subnormal_rounding * w_max);
            const float *v_row = &v[(kv_head * p.seqlen_k + j) * dv];
            for (int c = 0; c < dv; ++c) {
                bound[c] += rounding * std::fabs(double(v_row[c]));
                magnitude_sum[c] += w * std::fabs(double(v_row[c]));
                out_sum[c] += w * double(v_row[c]);
            }
        }
        for (int c = 0; c < dv; ++c) bound[c] += spread * magnitude_sum[c] + model.out_rounding * std::fabs(out_sum[c]);
        lse_bound[size_t(row)] = 2 * score_error + model.lse_floor;
    });
}

uint8_t e4m3_encode(float x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return sign | 0x7F;
    const double magnitude = std::fabs(double(x));
    // 448 is the largest value; anything larger (up to 464) rounds down to
    // it, and beyond would round up to 480, which is NaN's code: saturated.
    if (magnitude >= kE4m3Max) return sign | 0x7E;
    // The spacing of e4m3 values around `magnitude`: 2^(e - 3) in the binade
    // [2^e, 2^(e + 1)), and the subnormals' 2^-9 below the smallest normal
    // value 2^-6. Counting in that unit, rounding to the nearest integer
    // with ties to even (the default rounding mode) rounds to the nearest
    // code with ties to the even code: the count's parity is the mantissa's.
    const int exponent = magnitude == 0 ? -6 : std::max(std::ilogb(magnitude), -6);
    const double unit = std::ldexp(1.0, exponent - 3);
    const double rounded = std::nearbyint(magnitude / unit) * unit;  // exact: a power-of-two unit
    if (rounded < std::ldexp(1.0, -6)) return sign | uint8_t(rounded / std::ldexp(1.0, -9));
    // A normal value (the count may have carried into the next binade).
    const int e = std::ilogb(rounded);
    const int mantissa = int(rounded / std::ldexp(1.0, e - 3)) - 8;
    return sign | uint8_t((e + 7) << 3 | mantissa);
}

double e4m3_decode(uint8_t code) {
    const int exponent_field = (code >> 3) & 0xF;
    const int mantissa = code & 0x7;
    if (exponent_field == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
    // Subnormal: m * 2^-9; normal: (1 + m / 8) * 2^(E - 7) = (8 + m) * 2^(E - 10).
    const double magnitude =
        exponent_field == 0 ? std::ldexp(double(mantissa), -9) : std::ldexp(double(8 + mantissa), exponent_field - 10);
    return (code & 0x80) != 0 ? -magnitude : magnitude;
}

ErrorStats compare(const std::vector<float> &got, const std::vector<double> &ref) {
    ErrorStats e;
    double diff_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (std::isinf(ref[i])) {
            if (double(got[i]) != ref[i]) ++e.mismatched_inf;
            continue;
        }
        if (!std::isfinite(got[i])) {
            ++e.non_finite;
            continue;
        }
        const double diff = double(got[i]) - ref[i];
        e.max_abs = std::max(e.max_abs, std::fabs(diff));
        diff_sq += diff * diff;
        ref_sq += ref[i] * ref[i];
    }
    e.rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
    return e;
}

}  // namespace flashcore_test
