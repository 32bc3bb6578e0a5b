// What the GPU tests of the backward call share: the error bars of the
// gradients against the float64 reference, one problem's device buffers and
// parameters for flashcore_backward (BwdWorkload: the forward's Workload,
// whose out and lse it takes, plus dO and the gradients), and running a call
// with the workspace it asks for.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "forward_workload.h"
#include "reference.h"

namespace flashcore_test {

// Error bars of dq, dk and dv against the float64 reference, in units of the
// dtype's unit roundoff u (2^-11 for fp16, 2^-8 for bf16). The kernels round
// to 16 bits the P and dS operands of their matrix products, the gradients
// they store, and (as the caller's out) the O of D = rowsum(dO * O); every
// one of these is a relative error of at most u/2 per element, and they sum
// with random signs, so a gradient element is off by a few u of the
// tensor's largest element at worst (fp32 accumulation, the fp32 LSE and
// exp2 add ~1e-6, far below u). Hence the bars:
//   max_rel = max |got - ref| / max |ref| (see kGradientMagnitudeFloor below
//     for tensors whose exact values vanish): 10 u for bf16 (3.9e-2), 20 u for
//     fp16 (9.8e-3), where subnormal P and dS (below 6.1e-5) lose relative
//     precision and add an absolute error floor;
//   rel_l2 = ||got - ref|| / ||ref||: 4 u (fp16 2.0e-3, bf16 1.6e-2), which
//     a gradient scaled slightly wrong everywhere exceeds before max_rel does.
// The Python tests on the device hold the gradients to 2x PyTorch SDPA's own
// backward error on the same inputs; these bars are fixed so the C++ suite
// needs no PyTorch.
struct GradientTolerance {
    double max_rel;
    double rel_l2;
};
inline double unit_roundoff(flashcore_dtype dtype) {
    return dtype == FLASHCORE_DTYPE_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}
inline GradientTolerance gradient_tolerance_for(flashcore_dtype dtype) {
    constexpr double kMaxRelUnitsBf16 = 10, kMaxRelUnitsFp16 = 20, kRelL2Units = 4;
    const double u = unit_roundoff(dtype);
    return {(dtype == FLASHCORE_DTYPE_BF16 ? kMaxRelUnitsBf16 : kMaxRelUnitsFp16) * u, kRelL2Units * u};
}

// Where the exact gradient vanishes (every row sees a single key: P = 1 and
// dS = P (dP - D) = 0, so dq = dk = 0), the kernels' fp32 sums of dP and D
// leave noise of ~1e-6, which against a zero reference would be an
// infinite relative error: errors are taken relative to at least this
// magnitude (per element for max_rel, root mean square for rel_l2). It lies
// ~3000x above that noise, and below the root mean square of every
// gradient of these tests that does not vanish (the smallest, 4.3e-3, is
// dk of a single-query call over up to 700 keys), so it relaxes no real
// comparison.
constexpr double kGradientMagnitudeFloor = 3e-3;

struct GradientError {
    double max_abs = 0;
    double max_ref = 0;  // max |ref|
    double max_rel = 0;  // max_abs / max(max_ref, kGradientMagnitudeFloor)
    double rel_l2 = 0;   // ||got - ref|| / max(||ref||, kGradientMagnitudeFloor * sqrt(n))
    size_t non_finite = 0;  // got values that are NaN or infinite
};

inline GradientError compare_gradient(const std::vector<float> &got, const std::vector<double> &ref) {
    GradientError g;
    if (ref.empty()) return g;  // no query rows: an empty dq
    double diff_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        g.max_ref = std::max(g.max_ref, std::fabs(ref[i]));
        ref_sq += ref[i] * ref[i];
        if (!std::isfinite(got[i])) {
            ++g.non_finite;
            continue;
        }
        const double diff = double(got[i]) - ref[i];
        g.max_abs = std::max(g.max_abs, std::fabs(diff));
        diff_sq += diff * diff;
    }
    g.max_rel = g.max_abs / std::max(g.max_ref, kGradientMagnitudeFloor);
    g.rel_l2 = std::sqrt(diff_sq) /
               std::max(std::sqrt(ref_sq), kGradientMagnitudeFloor * std::sqrt(double(ref.size())));
    return g;
}

// Gaps (elements, multiples of 8) after each head, row and batch of the
// padded layouts of dO and of the gradients: other than q, k, v and out's
// (strides_for's 8, 16, 24), so a kernel that addresses one tensor with
// another's strides shows.
struct Padding {
    int head, seq, batch;
};
constexpr Padding kDoutPadding{16, 8, 40};
constexpr Padding kGradientPadding{24, 32, 8};

// Element strides of dO or a gradient ([B, H, S, D] logically) for a case
// of the given layout: as q, k, v and out for the dense layouts, and
// [B, S, H, D] with `pad`'s gaps for Layout::kPadded.
inline void strides_with_padding(Layout layout, Padding pad, int heads, int seqlen, int head_dim, int64_t *batch,
                                 int64_t *seq, int64_t *head) {
    if (layout != Layout::kPadded) {
        strides_for(layout, heads, seqlen, head_dim, batch, seq, head);
        return;
    }
    *head = head_dim + pad.head;
    *seq = int64_t(heads) * *head + pad.seq;
    *batch = int64_t(seqlen) * *seq + pad.batch;
}

// Raw 16-bit contents of a device tensor's whole buffer (padding included).
inline std::vector<uint16_t> raw_bits(const DeviceTensor &t) {
    std::vector<uint16_t> host(t.capacity);
    if (!host.empty()) {
        FC_CHECK_CUDA(cudaMemcpy(host.data(), t.data, host.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    }
    return host;
}

struct GradientBits {
    std::vector<uint16_t> dq, dk, dv;
    std::vector<float> dsinks;  // empty without sinks
};

// What the backward call reads, as it was before the call.
struct InputSnapshot {
    std::vector<uint16_t> q, k, v, out, dout;
    std::vector<float> lse;
};

// Device buffers and parameters of one backward problem. `fwd` holds q, k,
// v, out and lse as the forward test lays them out (strided, packed for
// varlen, key tails NaN past seqused_k); run_forward_pass() fills out and lse.
// dO and the gradients dq, dk, dv are laid out like q and k (packed where
// they are), with paddings of their own in Layout::kPadded. The gradients
// start poisoned (NaN).
struct BwdWorkload {
    Workload fwd;
    const FwdCase &c;
    std::vector<float> dout;  // dense [batch, heads_q, seqlen_q, head_dim_v] host values of dO
    DeviceTensor grad_out, grad_q, grad_k, grad_v;
    GuardedBuffer grad_sinks;  // dsinks (float32 [heads_q]), where the case has sinks
    flashcore_backward_params params{};

    BwdWorkload(const FwdCase &c_, std::mt19937_64 &rng) : fwd(c_, rng), c(fwd.c) {
        dout = random_values(c.dtype, size_t(c.batch) * c.heads_q * c.seqlen_q * c.value_dim(), rng);
        if (c.varlen_q()) {
            const int total = fwd.dout.seqlen;  // packed out's rows: the sequences, then kPackedTrailingRows
            allocate_packed(grad_out, kDoutPadding, c.heads_q, total, c.value_dim());
            allocate_packed(grad_q, kGradientPadding, c.heads_q, total, c.head_dim);
            // Rows outside every sequence hold random values, as the rest of
            // a larger batch would.
            std::vector<float> packed = random_values(c.dtype, size_t(c.heads_q) * total * c.value_dim(), rng);
            Workload::pack_rows(dout, c.heads_q, c.seqlen_q, c.value_dim(), c.seqlens_q, fwd.cu_q, total, packed);
            grad_out.upload(c.dtype, packed);
        } else {
            allocate(grad_out, kDoutPadding, c.heads_q, c.seqlen_q, c.value_dim());
            allocate(grad_q, kGradientPadding, c.heads_q, c.seqlen_q, c.head_dim);
            grad_out.upload(c.dtype, dout);
        }
        if (c.varlen_k()) {
            const int total = fwd.dk.seqlen;
            allocate_packed(grad_k, kGradientPadding, c.heads_kv, total, c.head_dim);
            allocate_packed(grad_v, kGradientPadding, c.heads_kv, total, c.value_dim());
        } else {
            allocate(grad_k, kGradientPadding, c.heads_kv, c.seqlen_k, c.head_dim);
            allocate(grad_v, kGradientPadding, c.heads_kv, c.seqlen_k, c.value_dim());
        }

        const flashcore_forward_params &f = fwd.params;
        flashcore_backward_params_init(&params, sizeof params);
        params.dtype = f.dtype;
        params.batch_size = f.batch_size;
        params.seqlen_q = f.seqlen_q;
        params.seqlen_k = f.seqlen_k;
        params.num_heads_q = f.num_heads_q;
        params.num_heads_kv = f.num_heads_kv;
        params.head_dim = f.head_dim;
        params.head_dim_v = f.head_dim_v;
        params.causal = f.causal;
        params.softmax_scale = f.softmax_scale;
        params.use_window = f.use_window;
        params.window_left = f.window_left;
        params.window_right = f.window_right;
        params.softcap = f.softcap;
        params.attention_chunk = f.attention_chunk;
        params.sm_margin = f.sm_margin;
        params.sinks = f.sinks;
        if (c.sinks) {
            grad_sinks.allocate(size_t(c.heads_q) * sizeof(float));
            params.dsinks = static_cast<float *>(grad_sinks.data);
        }
        params.q = f.q;
        params.k = f.k;
        params.v = f.v;
        params.out = f.out;
        params.lse = f.lse;
        params.dout = grad_out.data;
        params.dq = grad_q.data;
        params.dk = grad_k.data;
        params.dv = grad_v.data;
        params.q_batch_stride = f.q_batch_stride;
        params.q_seq_stride = f.q_seq_stride;
        params.q_head_stride = f.q_head_stride;
        params.k_batch_stride = f.k_batch_stride;
        params.k_seq_stride = f.k_seq_stride;
        params.k_head_stride = f.k_head_stride;
        params.v_batch_stride = f.v_batch_stride;
        params.v_seq_stride = f.v_seq_stride;
        params.v_head_stride = f.v_head_stride;
        params.out_batch_stride = f.out_batch_stride;
        params.out_seq_stride = f.out_seq_stride;
        params.out_head_stride = f.out_head_stride;
        Workload::bind(grad_out, &params.dout_batch_stride, &params.dout_seq_stride, &params.dout_head_stride);
        Workload::bind(grad_q, &params.dq_batch_stride, &params.dq_seq_stride, &params.dq_head_stride);
        Workload::bind(grad_k, &params.dk_batch_stride, &params.dk_seq_stride, &params.dk_head_stride);
        Workload::bind(grad_v, &params.dv_batch_stride, &params.dv_seq_stride, &params.dv_head_stride);
        params.seqused_k = f.seqused_k;
        params.cu_seqlens_q = f.cu_seqlens_q;
        params.cu_seqlens_k = f.cu_seqlens_k;
        params.total_seqlen_q = f.total_seqlen_q;
        params.total_seqlen_k = f.total_seqlen_k;
    }
    BwdWorkload(const BwdWorkload &) = delete;
    BwdWorkload &operator=(const BwdWorkload &) = delete;

    void allocate(DeviceTensor &t, Padding pad, int heads, int seqlen, int head_dim) const {
        int64_t b, s, h;
        strides_with_padding(c.layout, pad, heads, seqlen, head_dim, &b, &s, &h);
        t.allocate(c.batch, heads, seqlen, head_dim, b, s, h);
    }
    // A packed [rows, heads, dim] tensor (one batch), as Workload::allocate_packed.
    void allocate_packed(DeviceTensor &t, Padding pad, int heads, int rows, int head_dim) const {
        int64_t b, s, h;
        strides_with_padding(c.layout == Layout::kPadded ? Layout::kPadded : Layout::kBSHD, pad, heads, rows, head_dim,
                             &b, &s, &h);
        t.allocate(1, heads, rows, head_dim, b, s, h);
    }

    // The forward call that gives out and lse (poisoned first).
    flashcore_status run_forward_pass(flashcore_handle handle) {
        fwd.poison_outputs();
        return run_forward(handle, fwd.params);
    }

    void poison_gradients() {
        grad_q.poison();
        grad_k.poison();
        grad_v.poison();
        if (c.sinks) {
            FC_CHECK_CUDA(cudaMemset(grad_sinks.data, 0xFF, size_t(c.heads_q) * sizeof(float)));
            finish_device_writes();
        }
    }
    GradientBits gradient_bits() const {
        return {raw_bits(grad_q), raw_bits(grad_k), raw_bits(grad_v), dsinks_host()};
    }
    // dsinks as the call wrote it (empty without sinks).
    std::vector<float> dsinks_host() const {
        std::vector<float> host(c.sinks ? size_t(c.heads_q) : 0);
        if (!host.empty()) {
            FC_CHECK_CUDA(cudaMemcpy(host.data(), grad_sinks.data, host.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost));
        }
        return host;
    }

    InputSnapshot snapshot_inputs() const {
        return {raw_bits(fwd.dq), raw_bits(fwd.dk), raw_bits(fwd.dv), raw_bits(fwd.dout), raw_bits(grad_out),
                fwd.lse_count > 0 ? fwd.lse_host() : std::vector<float>()};
    }

    // The bytes flashcore_backward_workspace_size must ask for: the fp32 dQ
    // accumulator, 4 bytes per query row, head and column of the call's
    // head_dim (not its kernel's), rounded up to FLASHCORE_ALIGNMENT.
    size_t expected_workspace_bytes() const {
        const size_t rows = params.cu_seqlens_q != nullptr ? size_t(params.total_seqlen_q)
                                                           : size_t(params.batch_size) * size_t(params.seqlen_q);
        const size_t raw = rows * size_t(params.num_heads_q) * size_t(params.head_dim) * sizeof(float);
        return (raw + FLASHCORE_ALIGNMENT - 1) / FLASHCORE_ALIGNMENT * FLASHCORE_ALIGNMENT;
    }

    // The gradients as dense [batch, heads, seqlen, dim] values beside the
    // reference's: packed rows unpacked, and rows past a batch's sequence
    // (which the call does not write) given the reference's values.
    std::vector<float> dense_dq(const std::vector<double> &ref) const {
        if (!c.varlen_q()) return grad_q.download(c.dtype);
        return unpack(grad_q, ref, c.heads_q, c.seqlen_q, c.head_dim, c.seqlens_q, fwd.cu_q);
    }
    std::vector<float> dense_dk(const std::vector<double> &ref) const {
        if (!c.varlen_k()) return grad_k.download(c.dtype);
        return unpack(grad_k, ref, c.heads_kv, c.seqlen_k, c.head_dim, c.seqlens_k, fwd.cu_k);
    }
    std::vector<float> dense_dv(const std::vector<double> &ref) const {
        if (!c.varlen_k()) return grad_v.download(c.dtype);
        return unpack(grad_v, ref, c.heads_kv, c.seqlen_k, c.value_dim(), c.seqlens_k, fwd.cu_k);
    }
    std::vector<float> unpack(const DeviceTensor &t, const std::vector<double> &fill, int heads, int seqlen, int dim,
                              const std::vector<int> &lengths, const std::vector<int32_t> &cu) const {
        const std::vector<float> packed = t.download(c.dtype);
        std::vector<float> dense(fill.begin(), fill.end());
        for (size_t b = 0; b < lengths.size(); ++b)
            for (int h = 0; h < heads; ++h)
                for (int i = 0; i < lengths[b]; ++i)
                    std::copy_n(&packed[(size_t(h) * t.seqlen + cu[b] + i) * dim], dim,
                                &dense[((b * heads + h) * size_t(seqlen) + i) * dim]);
        return dense;
    }

    // "" if every gradient element that must be exactly zero is: dq of rows
    // that see no key, dk and dv of keys (inside their sequence) that no
    // query sees; else the first that is not. Dense values.
    std::string unseen_gradients_not_zero(const std::vector<float> &dq, const std::vector<float> &dk,
                                          const std::vector<float> &dv) const {
        const Problem &p = fwd.problem;
        for (int b = 0; b < c.batch; ++b) {
            const int key_rows = c.varlen_k() ? c.seqlens_k[b] : c.seqlen_k;
            // How many rows see each key, as a difference array: +1 where a
            // row's visible keys begin, -1 where they end.
            std::vector<int> seen(size_t(c.seqlen_k) + 1, 0);
            for (int i = 0; i < c.batch_seqlen_q(b); ++i) {
                int first = 0, end = 0;
                visible_keys(p, b, i, &first, &end);
                if (end > first) {
                    ++seen[first];
                    --seen[end];
                }
                if (end > first) continue;
                for (int h = 0; h < c.heads_q; ++h) {
                    const size_t at = ((size_t(b) * c.heads_q + h) * c.seqlen_q + i) * c.head_dim;
                    for (int col = 0; col < c.head_dim; ++col)
                        if (dq[at + col] != 0.f)
                            return "dq of batch " + std::to_string(b) + " head " + std::to_string(h) + " row " +
                                   std::to_string(i) + " (which sees no key) is " + std::to_string(dq[at + col]);
                }
            }
            int running = 0;
            for (int j = 0; j < key_rows; ++j) {
                running += seen[j];
                if (running > 0) continue;
                for (int h = 0; h < c.heads_kv; ++h) {
                    const size_t row = (size_t(b) * c.heads_kv + h) * c.seqlen_k + j;
                    for (int col = 0; col < c.head_dim; ++col)
                        if (dk[row * c.head_dim + col] != 0.f)
                            return "dk of batch " + std::to_string(b) + " head " + std::to_string(h) + " key " +
                                   std::to_string(j) + " (which no query sees) is " +
                                   std::to_string(dk[row * c.head_dim + col]);
                    for (int col = 0; col < c.value_dim(); ++col)
                        if (dv[row * c.value_dim() + col] != 0.f)
                            return "dv of batch " + std::to_string(b) + " head " + std::to_string(h) + " key " +
                                   std::to_string(j) + " (which no query sees) is " +
                                   std::to_string(dv[row * c.value_dim() + col]);
                }
            }
        }
        return "";
    }

    // "" if rows of packed gradients after the last sequence still hold the
    // poison; else which changed.
    std::string check_trailing_gradient_rows() const {
        struct Packed {
            const DeviceTensor *t;
            const char *name;
            bool packed;
            int first_unused;
        };
        const Packed tensors[] = {
            {&grad_q, "dq", c.varlen_q(), c.varlen_q() ? fwd.cu_q.back() : 0},
            {&grad_k, "dk", c.varlen_k(), c.varlen_k() ? fwd.cu_k.back() : 0},
            {&grad_v, "dv", c.varlen_k(), c.varlen_k() ? fwd.cu_k.back() : 0},
        };
        for (const Packed &p : tensors) {
            if (!p.packed) continue;
            const std::vector<uint16_t> bits = raw_bits(*p.t);
            for (int h = 0; h < p.t->heads; ++h)
                for (int s = p.first_unused; s < p.t->seqlen; ++s)
                    for (int col = 0; col < p.t->head_dim; ++col)
                        if (bits[p.t->offset(0, h, s) + col] != 0xFFFFu)
                            return std::string(p.name) + " row " + std::to_string(s) +
                                   " lies outside every sequence and was written";
        }
        return "";
    }

    // Bitwise equality: lse rows outside every packed sequence are never
    // written by the forward and may hold NaN, which == would call changed.
    static bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
        return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }

    // "" if the call wrote nothing it should not have: the gradients' guard
    // bands, padding and rows outside every sequence untouched, and every
    // input (q, k, v, out, dO, lse, their guards and padding) as `before`;
    // else what changed.
    std::string check_untouched(const InputSnapshot &before) const {
        const InputSnapshot now = snapshot_inputs();
        const std::pair<bool, const char *> inputs[] = {
            {now.q == before.q, "q"},       {now.k == before.k, "k"},     {now.v == before.v, "v"},
            {now.out == before.out, "out"}, {now.dout == before.dout, "dout"}, {same_bits(now.lse, before.lse), "lse"},
        };
        for (const auto &[same, name] : inputs)
            if (!same) return std::string(name) + " (an input) changed";
        for (const std::string &report :
             {grad_q.check_untouched("dq"), grad_k.check_untouched("dk"), grad_v.check_untouched("dv"),
              grad_out.check_untouched("dout"), fwd.check_untouched(), check_trailing_gradient_rows(),
              c.sinks ? grad_sinks.check("dsinks") : std::string()}) {
            if (!report.empty()) return report;
        }
        return "";
    }
};

// Runs the backward call of `p` on `stream` with the workspace it asks for,
// in a buffer between guard bands and filled with NaN (the call must need no
// initialised workspace), and waits for it.
inline flashcore_status run_backward(flashcore_handle h, const flashcore_backward_params &p,
                                     cudaStream_t stream = nullptr) {
    size_t ws_bytes = 0;
    flashcore_status status = flashcore_backward_workspace_size(h, &p, &ws_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    GuardedBuffer ws;
    if (ws_bytes > 0) {
        ws.allocate(ws_bytes);
        FC_CHECK_CUDA(cudaMemset(ws.data, 0xFF, ws_bytes));
        finish_device_writes();
    }
    status = flashcore_backward(h, &p, ws.data, ws_bytes, stream);
    FC_CHECK_CUDA(cudaGetLastError());
    FC_CHECK_CUDA(cudaStreamSynchronize(stream));
    if (ws_bytes > 0) {
        const std::string report = ws.check("workspace");
        if (!report.empty()) ADD_FAILURE() << report;
    }
    return status;
}

}  // namespace flashcore_test
