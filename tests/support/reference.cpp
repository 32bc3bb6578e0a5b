#include "reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

namespace flashcore_test {

void visible_keys(const Problem &p, int batch, int i, int *begin, int *end) {
    const int seqlen_k = batch_seqlen_k(p, batch);
    const int64_t diagonal = int64_t(i) + seqlen_k - batch_seqlen_q(p, batch);
    int64_t b = 0, e = seqlen_k;
    if (p.window_left >= 0) b = std::max<int64_t>(b, diagonal - p.window_left);
    if (p.causal) e = std::min<int64_t>(e, diagonal + 1);
    if (p.window_right >= 0) e = std::min<int64_t>(e, diagonal + 1 + p.window_right);
    *begin = int(std::min<int64_t>(b, seqlen_k));
    *end = int(std::max<int64_t>(e, *begin));
}

void reference_attention(const Problem &p, const std::vector<float> &q, const std::vector<float> &k,
                         const std::vector<float> &v, std::vector<double> &out, std::vector<double> &lse) {
    const int d = p.head_dim;
    const int dv = value_head_dim(p);
    const double scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
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
            if (end <= first) {
                lse[row] = -std::numeric_limits<double>::infinity();
                continue;
            }
            double max_score = -std::numeric_limits<double>::infinity();
            for (int j = first; j < end; ++j) {
                const float *kj = &k[kv_base + size_t(j) * d];
                double s = 0;
                for (int c = 0; c < d; ++c) s += double(qi[c]) * double(kj[c]);
                scores[j] = s * scale;
                if (p.softcap > 0) scores[j] = p.softcap * std::tanh(scores[j] / p.softcap);
                max_score = std::max(max_score, scores[j]);
            }
            double sum = 0;
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
