// What the GPU tests of the forward call share: the error bars against the
// float64 reference, tensor layouts, one problem's device buffers and
// parameters (Workload; K and V 16-bit or an fp8 cache with its descale
// factors; or q, k and v all e4m3, fp8 prefill, with a bf16 out), and
// running a call with the workspace it asks for.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "reference.h"

namespace flashcore_test {


// Error bars against the float64 reference: twice the worst error PyTorch
// SDPA's own fp16/bf16 kernels (flash, efficient, cuDNN) reach against the
// same kind of reference on these shapes, as measured on an H200 by
// tests/tools/sdpa_error_baseline.py (fp16: rel_l2 2.83e-4, max_abs 1.03e-3;
// bf16: rel_l2 2.26e-3, max_abs 9.35e-3). The LSE is computed in fp32 from
// exact fp32 scores; its bound leaves ~10x headroom over what we measure
// (4e-6). With an fp8 K/V cache the same bars apply: the reference is the
// attention of the dequantized K and V (each e4m3 value times its descale
// factor, exact in fp32), and the kernels widen the e4m3 values to q's
// dtype exactly (each is exact in fp16 and bf16) and apply the factors in
// fp32, so the quantization itself is no part of the error.
struct Tolerance {
    double rel_l2;
    double max_abs;
    double lse_max_abs;
};
// 16-bit queries (fp8 queries are judged by fp8_error_bounds instead:
// expect_fp8_prefill_matches_reference).
inline Tolerance tolerance_for(flashcore_dtype dtype) {
    if (dtype == FLASHCORE_DTYPE_BF16) return {4.6e-3, 1.9e-2, 5.0e-5};
    return {5.7e-4, 2.1e-3, 5.0e-5};
}

enum class Layout { kBHSD, kBSHD, kPadded };

inline const char *layout_name(Layout l) {
    switch (l) {
        case Layout::kBHSD: return "bhsd";
        case Layout::kBSHD: return "bshd";
        case Layout::kPadded: return "padded";
    }
    return "?";
}

// Element strides of a [B, H, S, D] tensor in the given layout. "Padded" is
// [B, S, H, D] with gaps after each head, row and batch, as views into larger
// buffers have: 1, 2 and 3 times pad_unit elements, which is 16 bytes' worth
// (8 for 16-bit elements, 16 for e4m3) so the strides stay aligned.
inline void strides_for(Layout layout, int heads, int seqlen, int head_dim, int64_t *batch, int64_t *seq, int64_t *head,
                        int pad_unit = 8) {
    switch (layout) {
        case Layout::kBHSD:
            *seq = head_dim;
            *head = int64_t(seqlen) * head_dim;
            *batch = int64_t(heads) * seqlen * head_dim;
            return;
        case Layout::kBSHD:
            *head = head_dim;
            *seq = int64_t(heads) * head_dim;
            *batch = int64_t(seqlen) * heads * head_dim;
            return;
        case Layout::kPadded:
            *head = head_dim + pad_unit;
            *seq = int64_t(heads) * (head_dim + pad_unit) + 2 * pad_unit;
            *batch = int64_t(seqlen) * *seq + 3 * pad_unit;
            return;
    }
}

// How an fp8 case passes its descale factors (flashcore_forward_params::
// k_descale, v_descale and their strides; with fp8 queries q_descale too);
// q, K and V get factors of their own.
enum class Descale {
    kNone,          // NULL pointers: a factor of 1
    kPerTensor,     // one factor each (strides 0, 0)
    kPerBatchHead,  // one per (batch, K/V head), [batch][head] contiguous (strides heads_kv, 1)
    kPerHeadBatch,  // the same as [head][batch] (strides 1, batch): the batch stride is the smaller
};

// The descale layouts in the order case tables take them in turn (turn:
// the table's running count): per (batch, head), per tensor, per (head,
// batch), none.
inline Descale descale_turn(size_t turn) {
    constexpr Descale kOrder[] = {Descale::kPerBatchHead, Descale::kPerTensor, Descale::kPerHeadBatch, Descale::kNone};
    return kOrder[turn % (sizeof kOrder / sizeof kOrder[0])];
}

inline const char *descale_name(Descale d) {
    switch (d) {
        case Descale::kNone: return "none";
        case Descale::kPerTensor: return "tensor";
        case Descale::kPerBatchHead: return "bh";
        case Descale::kPerHeadBatch: return "hb";
    }
    return "?";
}

struct FwdCase {
    flashcore_dtype dtype;
    int head_dim;
    bool causal;
    int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    Layout layout;
    int head_dim_v = 0;  // 0: head_dim
    int num_splits = 0;  // flashcore_forward_params::num_splits (0: the library's choice)
    // flashcore_forward_params::use_window, window_left, window_right.
    bool use_window = false;
    int window_left = -1;
    int window_right = -1;
    float softcap = 0.f;
    float softmax_scale = 0.f;  // 0: 1/sqrt(head_dim)
    // flashcore_forward_params::seqused_k, one per batch; empty: none.
    std::vector<int> seqused_k;
    // Variable-length batches: each batch's queries (keys), packed into
    // [total, heads, dim] tensors with cu_seqlens_q (_k); empty: not packed.
    // seqlen_q (seqlen_k) is then the longest.
    std::vector<int> seqlens_q;
    std::vector<int> seqlens_k;
    // > 0: K and V in a paged pool of pages of this many keys, in shuffled
    // order, with a block table (lengths from seqused_k).
    int page_size = 0;
    // K and V as an fp8 cache (kv_dtype FLASHCORE_DTYPE_FP8_E4M3): e4m3
    // bytes, with descale factors passed as `descale` says. With dtype
    // FLASHCORE_DTYPE_FP8_E4M3 (fp8 prefill: with_fp8_q) q, k and v are all
    // e4m3 with factors passed so, and out is bf16.
    bool kv_fp8 = false;
    Descale descale = Descale::kNone;
    // fp8 queries: kv_dtype FLASHCORE_DTYPE_FP8_E4M3 and out_dtype
    // FLASHCORE_DTYPE_BF16 named, rather than 0 (their default for fp8
    // queries).
    bool fp8_dtypes_named = false;
    // > 0: q's values times 2^this (and the softmax scale divided by it), so
    // that bf16 queries exceed fp16's range (the e4m3 products keep bf16
    // there: sm80/warp_gemm_e4m3.cuh).
    int q_scale_log2 = 0;
    // flashcore_forward_params::attention_chunk (0: none).
    int attention_chunk = 0;
    // Learnable sinks (flashcore_forward_params::sinks): random logits per
    // query head (Workload::random_sinks), one head in four without (-inf).
    bool sinks = false;
    // V is the first value_dim() columns of K's rows, passed as k's view
    // (v = k, k's strides): DeepSeek MLA's latent cache.
    bool v_in_k = false;
    // flashcore_forward_params::sm_margin (and the backward's): SMs left to
    // other streams.
    int sm_margin = 0;

    bool fp8_q() const { return dtype == FLASHCORE_DTYPE_FP8_E4M3; }
    // K and V are e4m3 bytes with descale factors: an fp8 cache or fp8 prefill.
    bool kv_e4m3() const { return kv_fp8 || fp8_q(); }
    flashcore_dtype kv_dtype() const { return kv_e4m3() ? FLASHCORE_DTYPE_FP8_E4M3 : dtype; }
    // out's type: q's, bf16 for fp8 queries.
    flashcore_dtype out_dtype() const { return fp8_q() ? FLASHCORE_DTYPE_BF16 : dtype; }

    int value_dim() const { return head_dim_v != 0 ? head_dim_v : head_dim; }
    int batch_seqlen_q(int b) const { return seqlens_q.empty() ? seqlen_q : seqlens_q[b]; }
    // Keys batch b attends to: its packed length, then seqused_k.
    int key_count(int b) const {
        int n = seqlens_k.empty() ? seqlen_k : seqlens_k[b];
        if (!seqused_k.empty()) n = std::min(n, std::max(seqused_k[b], 0));
        return n;
    }
    bool varlen_q() const { return !seqlens_q.empty(); }
    bool varlen_k() const { return !seqlens_k.empty(); }
    bool key_tails_unused() const { return !seqused_k.empty() || varlen_k() || page_size > 0; }

    FwdCase with_window(int left, int right) const {
        FwdCase c = *this;
        c.use_window = true;
        c.window_left = left;
        c.window_right = right;
        return c;
    }
    FwdCase with_softcap(float cap, float scale = 0.f) const {
        FwdCase c = *this;
        c.softcap = cap;
        c.softmax_scale = scale;
        return c;
    }
    FwdCase with_seqused_k(std::vector<int> used) const {
        FwdCase c = *this;
        c.seqused_k = std::move(used);
        return c;
    }
    // batch and seqlen_q (seqlen_k) follow the lengths.
    FwdCase with_varlen_q(std::vector<int> lengths) const {
        return with_lengths(std::move(lengths), &FwdCase::seqlen_q, &FwdCase::seqlens_q);
    }
    FwdCase with_varlen_k(std::vector<int> lengths) const {
        return with_lengths(std::move(lengths), &FwdCase::seqlen_k, &FwdCase::seqlens_k);
    }
    FwdCase with_lengths(std::vector<int> lengths, int FwdCase::*longest, std::vector<int> FwdCase::*field) const {
        FwdCase c = *this;
        c.batch = int(lengths.size());
        c.*longest = std::max(1, *std::max_element(lengths.begin(), lengths.end()));
        c.*field = std::move(lengths);
        return c;
    }
    FwdCase with_pages(int size) const {
        FwdCase c = *this;
        c.page_size = size;
        return c;
    }
    FwdCase with_chunk(int chunk) const {
        FwdCase c = *this;
        c.attention_chunk = chunk;
        return c;
    }
    FwdCase with_sinks() const {
        FwdCase c = *this;
        c.sinks = true;
        return c;
    }
    FwdCase with_latent_v() const {
        FwdCase c = *this;
        c.v_in_k = true;
        return c;
    }
    FwdCase with_splits(int splits) const {
        FwdCase c = *this;
        c.num_splits = splits;
        return c;
    }
    FwdCase with_large_q(int scale_log2) const {
        FwdCase c = *this;
        c.q_scale_log2 = scale_log2;
        c.softmax_scale = std::ldexp(1.f / std::sqrt(float(head_dim)), -scale_log2);
        return c;
    }
    FwdCase with_fp8_kv(Descale d) const {
        FwdCase c = *this;
        c.kv_fp8 = true;
        c.descale = d;
        return c;
    }
    // fp8 prefill: q, k and v e4m3 with descale factors as `d` says (q's per
    // (batch, K/V head) like k's and v's), out bf16; kv_dtype and out_dtype
    // named or left 0.
    FwdCase with_fp8_q(Descale d, bool name_dtypes = false) const {
        FwdCase c = *this;
        c.dtype = FLASHCORE_DTYPE_FP8_E4M3;
        c.descale = d;
        c.fp8_dtypes_named = name_dtypes;
        return c;
    }
};

inline const char *dtype_label(flashcore_dtype dtype) {
    switch (dtype) {
        case FLASHCORE_DTYPE_FP16: return "fp16";
        case FLASHCORE_DTYPE_BF16: return "bf16";
        case FLASHCORE_DTYPE_FP8_E4M3: return "e4m3";
        case FLASHCORE_DTYPE_FP32: return "fp32";
    }
    return "?";
}

inline std::string case_name(const FwdCase &c) {
    char dims[32];
    if (c.value_dim() == c.head_dim) {
        std::snprintf(dims, sizeof dims, "d%d", c.head_dim);
    } else {
        std::snprintf(dims, sizeof dims, "d%dx%d", c.head_dim, c.value_dim());
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s_%s_%s_b%d_hq%d_hkv%d_sq%d_sk%d_%s", dtype_label(c.dtype), dims,
                  c.causal ? "causal" : "full", c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k,
                  layout_name(c.layout));
    std::string name = buf;
    if (c.num_splits != 0) name += "_splits" + std::to_string(c.num_splits);
    // gtest names allow [A-Za-z0-9_] only: m1 for -1.
    const auto bound = [](int b) { return b < 0 ? std::string("m1") : std::to_string(b); };
    if (c.use_window) name += "_window" + bound(c.window_left) + "_" + bound(c.window_right);
    if (c.softcap != 0.f) name += "_softcap" + std::to_string(int(c.softcap));
    if (c.attention_chunk != 0) name += "_chunk" + std::to_string(c.attention_chunk);
    if (c.sm_margin != 0) name += "_margin" + std::to_string(c.sm_margin);
    if (c.sinks) name += "_sinks";
    if (c.v_in_k) name += "_latent";
    if (c.q_scale_log2 != 0) {
        name += "_qx2e" + std::to_string(c.q_scale_log2);
    } else if (c.softmax_scale != 0.f) {
        name += "_scale" + std::to_string(int(c.softmax_scale * 1000)) + "m";
    }
    if (!c.seqused_k.empty()) {
        name += "_used";
        for (int used : c.seqused_k) name += "_" + bound(used);
    }
    if (c.varlen_q()) {
        name += "_qlens";
        for (int n : c.seqlens_q) name += "_" + std::to_string(n);
    }
    if (c.varlen_k()) {
        name += "_klens";
        for (int n : c.seqlens_k) name += "_" + std::to_string(n);
    }
    if (c.page_size > 0) name += "_page" + std::to_string(c.page_size);
    if (c.kv_fp8) name += std::string("_kvfp8_descale_") + descale_name(c.descale);
    if (c.fp8_q()) name += std::string("_descale_") + descale_name(c.descale) + (c.fp8_dtypes_named ? "_named" : "");
    return name;
}

struct HandleDeleter {
    void operator()(flashcore_handle_s *h) const { flashcore_destroy(h); }
};
using UniqueHandle = std::unique_ptr<flashcore_handle_s, HandleDeleter>;

inline UniqueHandle make_handle() {
    flashcore_handle h = nullptr;
    const flashcore_status status = flashcore_create(&h);
    if (status != FLASHCORE_STATUS_SUCCESS) {
        ADD_FAILURE() << "flashcore_create: " << flashcore_status_string(status) << ": "
                      << flashcore_last_error_message();
    }
    return UniqueHandle(h);
}

// Rows after the last sequence of packed q and out (total_seqlen_q counts
// them): the call must leave them alone. Packed k and v have as many, NaN.
constexpr int kPackedTrailingRows = 3;
// Pages of a paged pool that no sequence uses (they hold NaN).
constexpr int kSparePages = 2;

// Prefix sums of lengths: batch + 1 values.
inline std::vector<int32_t> prefix_sums(const std::vector<int> &lengths) {
    std::vector<int32_t> cu(1, 0);
    for (int n : lengths) cu.push_back(cu.back() + n);
    return cu;
}

// The descale factors of one fp8 tensor (K or V) as the device array holds
// them: factor(b, h) = values[b * batch_stride + h * head_stride].
struct DescaleFactors {
    std::vector<float> values;  // empty: none passed (a factor of 1)
    int64_t batch_stride = 0, head_stride = 0;

    float factor(int b, int h) const {
        return values.empty() ? 1.f : values[size_t(b * batch_stride + h * head_stride)];
    }
};

// Random factors laid out as `d` says, each 2^e * (1 + j/16) with e in
// [-7, -2] and j in [0, 15]: spread over a factor of 64, so some heads' e4m3
// values reach the top of the range (448 times 2^-7 is 3.5: the tails of a
// normal distribution saturate) and others' reach the subnormals; and with
// five significant bits, so a factor times an e4m3 value (four) is exact in
// float.
inline DescaleFactors random_descale(Descale d, int batch, int heads_kv, std::mt19937_64 &rng) {
    DescaleFactors f;
    size_t count = 0;
    switch (d) {
        case Descale::kNone: return f;
        case Descale::kPerTensor: count = 1; break;
        case Descale::kPerBatchHead:
            count = size_t(batch) * heads_kv;
            f.batch_stride = heads_kv;
            f.head_stride = 1;
            break;
        case Descale::kPerHeadBatch:
            count = size_t(batch) * heads_kv;
            f.batch_stride = 1;
            f.head_stride = batch;
            break;
    }
    std::uniform_int_distribution<int> exponent(-7, -2), sixteenths(0, 15);
    for (size_t i = 0; i < count; ++i) f.values.push_back(std::ldexp(1.f + sixteenths(rng) / 16.f, exponent(rng)));
    return f;
}

// Dense [batch, heads, seqlen, dim] values of an e4m3 tensor as the
// kernels are to see them: fresh normal values (unit variance, as the 16-bit
// tests' inputs) quantized as a serving stack would, e4m3_encode(x /
// factor), and dequantized, e4m3_decode(code) * factor (exact in float).
// Head h has factor (b, h / heads_per_factor): the query heads of a K/V
// head share its factor.
inline std::vector<float> quantized_values(const DescaleFactors &f, int batch, int heads, int seqlen, int dim,
                                           std::mt19937_64 &rng, int heads_per_factor = 1) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> values(size_t(batch) * heads * seqlen * dim);
    size_t i = 0;
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h) {
            const float factor = f.factor(b, h / heads_per_factor);
            for (size_t n = 0; n < size_t(seqlen) * dim; ++n, ++i)
                values[i] = float(e4m3_decode(e4m3_encode(normal(rng) / factor))) * factor;
        }
    return values;
}

// Device buffers and parameters of one problem, with inputs uploaded. The
// host values q, k, v are dense [batch, heads, seqlen, dim] (seqlen the
// longest where lengths vary); the device tensors hold them as the case
// lays them out: strided, packed (cu_seqlens) or paged. With an fp8 cache,
// k and v are the dequantized values (what the reference computes with) and
// k_stored, v_stored the e4m3 values the device holds (k / factor, exact);
// otherwise the two are the same. Likewise q and q_stored with fp8 queries.
struct Workload {
    FwdCase c;
    Problem problem;
    std::vector<float> q, k, v;
    std::vector<float> q_stored, k_stored, v_stored;
    DescaleFactors q_descale, k_descale, v_descale;
    GuardedBuffer q_descale_memory, k_descale_memory, v_descale_memory;
    DeviceTensor dq, dk, dv, dout;
    GuardedBuffer lse_memory;
    float *dlse = nullptr;
    GuardedBuffer seqused_memory;  // seqused_k on the device, when the case has it
    GuardedBuffer cu_q_memory, cu_k_memory, block_table_memory;
    GuardedBuffer sinks_memory;  // the sinks on the device, when the case has them
    std::vector<int32_t> cu_q, cu_k;  // prefix sums of packed lengths
    std::vector<int32_t> block_table;  // [batch][pages_per_seq]
    int pages_per_seq = 0, num_pages = 0;
    size_t lse_count = 0;
    flashcore_forward_params params{};

    explicit Workload(const FwdCase &c_, std::mt19937_64 &rng) : c(c_) {
        problem.batch = c.batch;
        problem.seqlen_q = c.seqlen_q;
        problem.seqlen_k = c.seqlen_k;
        problem.heads_q = c.heads_q;
        problem.heads_kv = c.heads_kv;
        problem.head_dim = c.head_dim;
        problem.head_dim_v = c.value_dim();
        problem.causal = c.causal;
        problem.softmax_scale = c.softmax_scale;
        problem.window_left = c.use_window ? c.window_left : -1;
        problem.window_right = c.use_window ? c.window_right : -1;
        problem.softcap = c.softcap;
        problem.seqlens_q = c.seqlens_q;
        problem.attention_chunk = c.attention_chunk;
        if (c.sinks) problem.sinks = random_sinks(c.heads_q, rng);
        const int group = c.heads_q / c.heads_kv;
        if (c.fp8_q()) {
            q_descale = random_descale(c.descale, c.batch, c.heads_kv, rng);
            q = quantized_values(q_descale, c.batch, c.heads_q, c.seqlen_q, c.head_dim, rng, group);
        } else {
            q = random_values(c.dtype, size_t(c.batch) * c.heads_q * c.seqlen_q * c.head_dim, rng);
        }
        for (float &x : q) x = std::ldexp(x, c.q_scale_log2);  // exact: a power of two
        if (c.kv_e4m3()) {
            k_descale = random_descale(c.descale, c.batch, c.heads_kv, rng);
            // V in K's bytes: K's factors (the caller passes them as v_descale).
            v_descale = c.v_in_k ? k_descale : random_descale(c.descale, c.batch, c.heads_kv, rng);
            k = quantized_values(k_descale, c.batch, c.heads_kv, c.seqlen_k, c.head_dim, rng);
            v = quantized_values(v_descale, c.batch, c.heads_kv, c.seqlen_k, c.value_dim(), rng);
        } else {
            k = random_values(c.dtype, size_t(c.batch) * c.heads_kv * c.seqlen_k * c.head_dim, rng);
            v = random_values(c.dtype, size_t(c.batch) * c.heads_kv * c.seqlen_k * c.value_dim(), rng);
        }
        if (c.key_tails_unused()) {
            for (int b = 0; b < c.batch; ++b) problem.seqused_k.push_back(c.key_count(b));
            fill_unused_keys(k, c.head_dim);
            fill_unused_keys(v, c.value_dim());
        }
        if (c.v_in_k) {  // V: the first value_dim() columns of K's rows
            for (size_t row = 0; row < v.size() / c.value_dim(); ++row) {
                std::copy_n(&k[row * c.head_dim], c.value_dim(), &v[row * c.value_dim()]);
            }
        }
        q_stored = c.fp8_q() ? divided_by_factors(q, q_descale, c.heads_q, c.seqlen_q, c.head_dim, group) : q;
        k_stored = c.kv_e4m3() ? divided_by_factors(k, k_descale, c.heads_kv, c.seqlen_k, c.head_dim, 1) : k;
        v_stored = c.kv_e4m3() ? divided_by_factors(v, v_descale, c.heads_kv, c.seqlen_k, c.value_dim(), 1) : v;

        flashcore_forward_params_init(&params, sizeof params);
        if (c.varlen_q()) {
            cu_q = prefix_sums(c.seqlens_q);
            const int total = cu_q.back() + kPackedTrailingRows;
            allocate_packed(dq, c.heads_q, total, c.head_dim, c.dtype);
            allocate_packed(dout, c.heads_q, total, c.value_dim(), c.out_dtype());
            // The rows past the last sequence: values the call must not read
            // into anything (e4m3 ones for fp8 queries).
            std::vector<float> packed = c.fp8_q() ? quantized_values({}, 1, c.heads_q, total, c.head_dim, rng)
                                                  : random_values(c.dtype, size_t(c.heads_q) * total * c.head_dim, rng);
            pack_rows(q_stored, c.heads_q, c.seqlen_q, c.head_dim, c.seqlens_q, cu_q, total, packed);
            dq.upload(c.dtype, packed);
            upload_int32(cu_q_memory, cu_q);
            params.cu_seqlens_q = static_cast<const int32_t *>(cu_q_memory.data);
            params.total_seqlen_q = total;
            lse_count = size_t(c.heads_q) * total;
        } else {
            allocate(dq, c.heads_q, c.seqlen_q, c.head_dim, c.dtype);
            allocate(dout, c.heads_q, c.seqlen_q, c.value_dim(), c.out_dtype());
            dq.upload(c.dtype, q_stored);
            lse_count = size_t(c.batch) * c.heads_q * c.seqlen_q;
        }
        if (c.varlen_k()) {
            cu_k = prefix_sums(c.seqlens_k);
            // Rows after the last sequence hold NaN, as a larger buffer's
            // unused rows may: no sequence may see them.
            const int total = cu_k.back() + kPackedTrailingRows;
            allocate_packed(dk, c.heads_kv, total, c.head_dim, c.kv_dtype());
            allocate_packed(dv, c.heads_kv, total, c.value_dim(), c.kv_dtype());
            std::vector<float> pk(size_t(c.heads_kv) * total * c.head_dim, NAN);
            std::vector<float> pv(size_t(c.heads_kv) * total * c.value_dim(), NAN);
            pack_rows(k_stored, c.heads_kv, c.seqlen_k, c.head_dim, c.seqlens_k, cu_k, total, pk);
            pack_rows(v_stored, c.heads_kv, c.seqlen_k, c.value_dim(), c.seqlens_k, cu_k, total, pv);
            dk.upload(c.kv_dtype(), pk);
            dv.upload(c.kv_dtype(), pv);
            upload_int32(cu_k_memory, cu_k);
            params.cu_seqlens_k = static_cast<const int32_t *>(cu_k_memory.data);
            params.total_seqlen_k = total;
        } else if (c.page_size > 0) {
            build_pages(rng);
            upload_int32(block_table_memory, block_table);
            params.block_table = static_cast<const int32_t *>(block_table_memory.data);
            params.block_table_batch_stride = pages_per_seq;
            params.page_size = c.page_size;
            params.num_pages = num_pages;
        } else {
            allocate(dk, c.heads_kv, c.seqlen_k, c.head_dim, c.kv_dtype());
            allocate(dv, c.heads_kv, c.seqlen_k, c.value_dim(), c.kv_dtype());
            dk.upload(c.kv_dtype(), k_stored);
            dv.upload(c.kv_dtype(), v_stored);
        }
        lse_memory.allocate(lse_count * sizeof(float));
        dlse = static_cast<float *>(lse_memory.data);

        params.dtype = c.dtype;
        params.batch_size = c.batch;
        params.seqlen_q = c.seqlen_q;
        params.seqlen_k = c.seqlen_k;
        params.num_heads_q = c.heads_q;
        params.num_heads_kv = c.heads_kv;
        params.head_dim = c.head_dim;
        params.head_dim_v = c.head_dim_v;
        params.causal = c.causal;
        params.num_splits = c.num_splits;
        params.use_window = c.use_window;
        params.window_left = c.window_left;
        params.window_right = c.window_right;
        params.softcap = c.softcap;
        params.softmax_scale = c.softmax_scale;
        params.attention_chunk = c.attention_chunk;
        params.sm_margin = c.sm_margin;
        if (c.sinks) params.sinks = upload_sinks(sinks_memory, problem.sinks);
        if (!c.seqused_k.empty()) {
            upload_int32(seqused_memory, std::vector<int32_t>(c.seqused_k.begin(), c.seqused_k.end()));
            params.seqused_k = static_cast<const int32_t *>(seqused_memory.data);
        }
        if (c.fp8_q()) {
            // kv_dtype and out_dtype: 0 stands for e4m3 K/V and a bf16 out.
            if (c.fp8_dtypes_named) {
                params.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
                params.out_dtype = FLASHCORE_DTYPE_BF16;
            }
            params.q_descale = upload_descale(q_descale_memory, q_descale);
            params.q_descale_batch_stride = q_descale.batch_stride;
            params.q_descale_head_stride = q_descale.head_stride;
        }
        if (c.kv_e4m3()) {
            if (c.kv_fp8) params.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
            params.k_descale = upload_descale(k_descale_memory, k_descale);
            params.v_descale = upload_descale(v_descale_memory, v_descale);
            params.k_descale_batch_stride = k_descale.batch_stride;
            params.k_descale_head_stride = k_descale.head_stride;
            params.v_descale_batch_stride = v_descale.batch_stride;
            params.v_descale_head_stride = v_descale.head_stride;
        }
        params.q = dq.data;
        params.k = dk.data;
        params.v = dv.data;
        params.out = dout.data;
        params.lse = dlse;
        bind(dq, &params.q_batch_stride, &params.q_seq_stride, &params.q_head_stride);
        bind(dk, &params.k_batch_stride, &params.k_seq_stride, &params.k_head_stride);
        bind(dv, &params.v_batch_stride, &params.v_seq_stride, &params.v_head_stride);
        bind(dout, &params.out_batch_stride, &params.out_seq_stride, &params.out_head_stride);
        if (c.v_in_k) {
            params.v = params.k;
            bind(dk, &params.v_batch_stride, &params.v_seq_stride, &params.v_head_stride);
        }
    }

    // Sink logits for `heads` query heads: from -2 to 6 (a row's log-sum-exp
    // over a few hundred keys is about 6, so the sink takes from a few
    // percent to most of its weight), every fourth head without (-inf).
    static std::vector<double> random_sinks(int heads, std::mt19937_64 &rng) {
        std::uniform_real_distribution<float> logit(-2.f, 6.f);
        std::vector<double> sinks(heads);
        for (int h = 0; h < heads; ++h) sinks[h] = h % 4 == 3 ? -INFINITY : double(logit(rng));
        return sinks;
    }
    static const float *upload_sinks(GuardedBuffer &memory, const std::vector<double> &sinks) {
        const std::vector<float> values(sinks.begin(), sinks.end());
        memory.allocate(values.size() * sizeof(float));
        FC_CHECK_CUDA(cudaMemcpy(memory.data, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
        finish_device_writes();
        return static_cast<const float *>(memory.data);
    }

    static void upload_int32(GuardedBuffer &memory, const std::vector<int32_t> &values) {
        memory.allocate(values.size() * sizeof(int32_t));
        FC_CHECK_CUDA(
            cudaMemcpy(memory.data, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        finish_device_writes();
    }
    // The device array of an fp8 tensor's factors; NULL where it has none.
    static const float *upload_descale(GuardedBuffer &memory, const DescaleFactors &f) {
        if (f.values.empty()) return nullptr;
        memory.allocate(f.values.size() * sizeof(float));
        FC_CHECK_CUDA(cudaMemcpy(memory.data, f.values.data(), f.values.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
        finish_device_writes();
        return static_cast<const float *>(memory.data);
    }

    // The e4m3 values an e4m3 tensor holds for dequantized dense [batch,
    // heads, seqlen, dim] values: each divided by its factor (batch, head /
    // heads_per_factor), exactly (the values are e4m3 values times the
    // factor; NaN stays NaN).
    static std::vector<float> divided_by_factors(const std::vector<float> &dequantized, const DescaleFactors &f,
                                                 int heads, int seqlen, int dim, int heads_per_factor) {
        std::vector<float> stored(dequantized.size());
        const size_t per_head = size_t(seqlen) * dim;
        for (size_t i = 0; i < stored.size(); ++i) {
            const size_t bh = i / per_head;
            stored[i] = dequantized[i] / f.factor(int(bh / heads), int(bh % heads) / heads_per_factor);
        }
        return stored;
    }

    // What the unused parts of a K/V buffer hold (keys past a batch's count;
    // negated, the rows of a paged pool that no sequence uses), which must
    // not reach the output: NaN and infinity alternately in 16-bit caches;
    // e4m3 has no infinity (it would saturate to 448), so NaN of both signs
    // there, the codes 0x7f and 0xff.
    float unused_key_value(size_t i) const {
        if (i % 2 == 0) return NAN;
        return c.kv_e4m3() ? -NAN : INFINITY;
    }

    // Keys a batch does not attend to (past seqused_k, its packed length or
    // its pages' keys) hold unused_key_value's NaN and infinity, as a KV
    // cache's unused tail may. Dense BHSD host values.
    void fill_unused_keys(std::vector<float> &values, int dim) const {
        for (int b = 0; b < c.batch; ++b)
            for (int h = 0; h < c.heads_kv; ++h)
                for (int s = c.key_count(b); s < c.seqlen_k; ++s)
                    for (int col = 0; col < dim; ++col)
                        values[((size_t(b) * c.heads_kv + h) * c.seqlen_k + s) * dim + col] =
                            unused_key_value(size_t(s + col));
    }

    // Elements of `storage` (16-bit or e4m3), padded for Layout::kPadded by
    // 16 bytes' worth of them.
    void allocate(DeviceTensor &t, int heads, int seqlen, int head_dim, flashcore_dtype storage) {
        const size_t bytes = element_bytes(storage);
        int64_t b, s, h;
        strides_for(c.layout, heads, seqlen, head_dim, &b, &s, &h, int(FLASHCORE_ALIGNMENT / bytes));
        t.allocate(c.batch, heads, seqlen, head_dim, b, s, h, bytes);
    }
    // A packed [rows, heads, dim] tensor (one batch), padded per head and row
    // for Layout::kPadded.
    void allocate_packed(DeviceTensor &t, int heads, int rows, int head_dim, flashcore_dtype storage) {
        const size_t bytes = element_bytes(storage);
        int64_t b, s, h;
        strides_for(c.layout == Layout::kPadded ? Layout::kPadded : Layout::kBSHD, heads, rows, head_dim, &b, &s, &h,
                    int(FLASHCORE_ALIGNMENT / bytes));
        t.allocate(1, heads, rows, head_dim, b, s, h, bytes);
    }
    // Dense [batch, heads, seqlen, dim] rows of each batch's first
    // lengths[b] positions into packed [1, heads, total, dim] at cu[b].
    static void pack_rows(const std::vector<float> &dense, int heads, int seqlen, int dim,
                          const std::vector<int> &lengths, const std::vector<int32_t> &cu, int total,
                          std::vector<float> &packed) {
        for (size_t b = 0; b < lengths.size(); ++b)
            for (int h = 0; h < heads; ++h)
                for (int i = 0; i < lengths[b]; ++i)
                    std::copy_n(&dense[((b * heads + h) * size_t(seqlen) + i) * dim], dim,
                                &packed[(size_t(h) * total + cu[b] + i) * dim]);
    }

    // A pool of pages holding each batch's keys in shuffled page order
    // (the pool's last page among them: an access past the pool would show),
    // spare pages and unused rows NaN, and the block table (entries past a
    // batch's keys hold page numbers past the pool: never to be read).
    void build_pages(std::mt19937_64 &rng) {
        const int page = c.page_size;
        pages_per_seq = (c.seqlen_k + page - 1) / page;
        int used_pages = 0;
        for (int b = 0; b < c.batch; ++b) used_pages += (c.key_count(b) + page - 1) / page;
        num_pages = used_pages + kSparePages;
        std::vector<int32_t> order(num_pages);
        for (int i = 0; i < num_pages; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        // The last used page (a batch's partial last page, usually) is the
        // pool's last.
        if (used_pages > 0) std::swap(*std::find(order.begin(), order.end(), num_pages - 1), order[used_pages - 1]);
        block_table.assign(size_t(c.batch) * pages_per_seq, 0);
        int next = 0;
        for (int b = 0; b < c.batch; ++b)
            for (int j = 0; j < pages_per_seq; ++j)
                block_table[size_t(b) * pages_per_seq + j] =
                    j * page < c.key_count(b) ? order[next++] : num_pages + 1000 + j;
        int64_t bs, ss, hs;
        const size_t bytes = element_bytes(c.kv_dtype());
        for (DeviceTensor *t : {&dk, &dv}) {
            const int dim = t == &dk ? c.head_dim : c.value_dim();
            strides_for(c.layout == Layout::kPadded ? Layout::kPadded : Layout::kBSHD, c.heads_kv, page, dim, &bs,
                        &ss, &hs, int(FLASHCORE_ALIGNMENT / bytes));
            t->allocate(num_pages, c.heads_kv, page, dim, bs, ss, hs, bytes);
            const std::vector<float> &dense = t == &dk ? k_stored : v_stored;
            std::vector<float> pool(size_t(num_pages) * c.heads_kv * page * dim);
            for (size_t i = 0; i < pool.size(); ++i) pool[i] = -unused_key_value(i);
            for (int b = 0; b < c.batch; ++b)
                for (int h = 0; h < c.heads_kv; ++h)
                    for (int j = 0; j < c.key_count(b); ++j) {
                        const int p = block_table[size_t(b) * pages_per_seq + j / page];
                        std::copy_n(&dense[((size_t(b) * c.heads_kv + h) * c.seqlen_k + j) * dim], dim,
                                    &pool[((size_t(p) * c.heads_kv + h) * page + j % page) * dim]);
                    }
            t->upload(c.kv_dtype(), pool);
        }
    }

    static void bind(const DeviceTensor &t, int64_t *b, int64_t *s, int64_t *h) {
        *b = t.batch_stride;
        *s = t.seq_stride;
        *h = t.head_stride;
    }
    void poison_outputs() {
        dout.poison();
        FC_CHECK_CUDA(cudaMemset(dlse, 0xFF, lse_count * sizeof(float)));
        finish_device_writes();
    }
    std::vector<float> lse_host() const {
        std::vector<float> host(lse_count);
        FC_CHECK_CUDA(cudaMemcpy(host.data(), dlse, lse_count * sizeof(float), cudaMemcpyDeviceToHost));
        return host;
    }

    // out and lse as dense [batch, heads, seqlen_q(, dim)] values beside
    // the reference's: packed rows unpacked, and rows past a batch's queries
    // (which the call does not compute) given the reference's values.
    std::vector<float> dense_out(const std::vector<double> &ref) const {
        const std::vector<float> out = dout.download(c.out_dtype());
        return c.varlen_q() ? unpack_rows(out, ref, c.value_dim()) : out;
    }
    std::vector<float> dense_lse(const std::vector<double> &ref) const {
        // [heads][total] packed: rows of width 1.
        return c.varlen_q() ? unpack_rows(lse_host(), ref, 1) : lse_host();
    }
    // pack_rows backwards for the queries: packed [1, heads, total, dim]
    // rows at cu_q[b] into dense [batch, heads, seqlen_q, dim], the rows
    // past each batch's queries taken from `fill`.
    std::vector<float> unpack_rows(const std::vector<float> &packed, const std::vector<double> &fill, int dim) const {
        std::vector<float> dense(fill.begin(), fill.end());
        const int total = dout.seqlen;
        for (int b = 0; b < c.batch; ++b)
            for (int h = 0; h < c.heads_q; ++h)
                for (int i = 0; i < c.seqlens_q[b]; ++i)
                    std::copy_n(&packed[(size_t(h) * total + cu_q[b] + i) * dim], dim,
                                &dense[((size_t(b) * c.heads_q + h) * c.seqlen_q + i) * dim]);
        return dense;
    }
    // "" if the rows of packed out and lse after the last sequence still
    // hold the poison; else which changed.
    std::string check_trailing_rows() const {
        if (!c.varlen_q()) return "";
        const std::vector<uint16_t> bits = out_bits();
        const std::vector<float> lse = lse_host();
        const int total = dout.seqlen;
        for (int h = 0; h < c.heads_q; ++h)
            for (int s = cu_q.back(); s < total; ++s) {
                for (int col = 0; col < c.value_dim(); ++col)
                    if (bits[dout.offset(0, h, s) + col] != 0xFFFF) return "out row " + std::to_string(s) + " written";
                if (!std::isnan(lse[size_t(h) * total + s])) return "lse row " + std::to_string(s) + " written";
            }
        return "";
    }

    // "" if no call wrote outside out and lse (their guard bands and the
    // padding of a strided out) or into q, k and v's guard bands and
    // padding; else what was overwritten.
    std::string check_untouched() const {
        for (const std::string &report : {dq.check_untouched("q"), dk.check_untouched("k"),
                                          dv.check_untouched("v"), dout.check_untouched("out"),
                                          lse_memory.check("lse"), check_trailing_rows()}) {
            if (!report.empty()) return report;
        }
        return "";
    }
    std::vector<uint16_t> out_bits() const {
        std::vector<uint16_t> host(dout.capacity);
        FC_CHECK_CUDA(cudaMemcpy(host.data(), dout.data, host.size() * 2, cudaMemcpyDeviceToHost));
        return host;
    }
};

inline flashcore_status run_forward(flashcore_handle h, const flashcore_forward_params &p, cudaStream_t stream = nullptr) {
    size_t ws_bytes = 0;
    flashcore_status status = flashcore_forward_workspace_size(h, &p, &ws_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    // The workspace sits between guard bands too: the library may write only
    // the bytes it asked for.
    GuardedBuffer ws;
    if (ws_bytes > 0) ws.allocate(ws_bytes);
    status = flashcore_forward(h, &p, ws.data, ws_bytes, stream);
    FC_CHECK_CUDA(cudaGetLastError());
    FC_CHECK_CUDA(cudaStreamSynchronize(stream));
    if (ws_bytes > 0) {
        const std::string report = ws.check("workspace");
        if (!report.empty()) ADD_FAILURE() << report;
    }
    return status;
}

inline uint64_t fresh_seed() {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
}


// fp8 queries run on the sm_90a kernels, on compute capability 9.0 GPUs
// only; elsewhere, in a library built without those kernels, and under a
// FLASHCORE_TEST_SMEM_PER_BLOCK below the kernel's shared memory (a suite
// run as on a GPU with less), the library refuses them (UNSUPPORTED, saying
// why). Whether a call of params (dtype FLASHCORE_DTYPE_FP8_E4M3) runs
// here; where not, *why gets the library's reason. A call accepted on
// another GPU, or refused on a 9.0 one for another reason than those, is a
// test failure.
inline bool fp8_prefill_runs_here(flashcore_handle h, const flashcore_forward_params &params, std::string *why) {
    int device = 0, major = 0, minor = 0;
    FC_CHECK_CUDA(cudaGetDevice(&device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    size_t bytes = 0;
    const flashcore_status status = flashcore_forward_workspace_size(h, &params, &bytes);
    const std::string message = status == FLASHCORE_STATUS_SUCCESS ? "" : flashcore_last_error_message();
    if (major != 9 || minor != 0) {
        EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED)
            << "fp8 queries on compute capability " << major << "." << minor << ": " << message;
        EXPECT_NE(message.find("sm_90"), std::string::npos) << message;
        *why = message.empty() ? "fp8 queries need a compute capability 9.0 GPU" : message;
        return false;
    }
    const bool smem_lowered = std::getenv("FLASHCORE_TEST_SMEM_PER_BLOCK") != nullptr &&
                              message.find("FLASHCORE_TEST_SMEM_PER_BLOCK") != std::string::npos;
    if (status == FLASHCORE_STATUS_UNSUPPORTED && (message.find("built without") != std::string::npos || smem_lowered)) {
        *why = message;
        return false;
    }
    EXPECT_EQ(status, FLASHCORE_STATUS_SUCCESS) << "fp8 queries on compute capability 9.0: " << message;
    *why = message;
    return status == FLASHCORE_STATUS_SUCCESS;
}

// Where out and lse of an fp8 prefill stand against fp8_error_bounds (the
// largest |got - ref| / bound, and where) and kFp8PrefillRelL2.
struct Fp8Errors {
    ErrorStats out, lse;
    double worst_out_ratio = 0, worst_lse_ratio = 0;
    size_t worst_out_at = 0, worst_lse_at = 0;
    size_t out_beyond = 0, lse_beyond = 0;  // elements (rows) past their bound
};

inline Fp8Errors fp8_errors(const Workload &w, const std::vector<double> &ref_out, const std::vector<double> &ref_lse) {
    std::vector<double> out_bound, lse_bound;
    fp8_error_bounds(w.problem, w.q, w.k, w.v, kFp8PrefillModel, out_bound, lse_bound);
    const std::vector<float> out = w.dense_out(ref_out), lse = w.dense_lse(ref_lse);
    Fp8Errors e;
    e.out = compare(out, ref_out);
    e.lse = compare(lse, ref_lse);
    const auto judge = [](const std::vector<float> &got, const std::vector<double> &ref,
                          const std::vector<double> &bound, double *worst, size_t *at, size_t *beyond) {
        for (size_t i = 0; i < ref.size(); ++i) {
            if (std::isinf(ref[i]) || !std::isfinite(got[i])) continue;  // compare() counts these
            const double diff = std::fabs(double(got[i]) - ref[i]);
            if (diff == 0) continue;
            const double ratio = diff / bound[i];  // bound 0 (rows without keys): infinity
            *beyond += ratio > 1;
            if (ratio > *worst) *worst = ratio, *at = i;
        }
    };
    judge(out, ref_out, out_bound, &e.worst_out_ratio, &e.worst_out_at, &e.out_beyond);
    judge(lse, ref_lse, lse_bound, &e.worst_lse_ratio, &e.worst_lse_at, &e.lse_beyond);
    return e;
}

// Case c with fp8 queries: runs it (skipping where fp8 queries do not run:
// fp8_prefill_runs_here) on fresh random inputs with poisoned outputs,
// compares out and lse with the float64 reference of the dequantized
// inputs within fp8_error_bounds and kFp8PrefillRelL2, and checks that a
// second run gives bitwise-identical output.
inline void expect_fp8_prefill_matches_reference(const FwdCase &c) {
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    Workload w(c, rng);
    std::string why;
    if (!fp8_prefill_runs_here(handle.get(), w.params, &why)) GTEST_SKIP() << "GPU test skipped: " << why;

    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const std::vector<uint16_t> first_bits = w.out_bits();
    std::vector<double> ref_out, ref_lse;
    reference_attention(w.problem, w.q, w.k, w.v, ref_out, ref_lse);
    const Fp8Errors e = fp8_errors(w, ref_out, ref_lse);
    std::printf("[ errors ] %s seed=%llu out: max_abs=%.3e rel_l2=%.3e worst=%.2f of its bound | lse: max_abs=%.3e "
                "worst=%.2f of its bound\n",
                case_name(c).c_str(), static_cast<unsigned long long>(seed), e.out.max_abs, e.out.rel_l2,
                e.worst_out_ratio, e.lse.max_abs, e.worst_lse_ratio);
    testing::Test::RecordProperty("out_max_abs", std::to_string(e.out.max_abs));
    testing::Test::RecordProperty("out_rel_l2", std::to_string(e.out.rel_l2));
    testing::Test::RecordProperty("out_worst_of_bound", std::to_string(e.worst_out_ratio));
    testing::Test::RecordProperty("lse_max_abs", std::to_string(e.lse.max_abs));
    // Dense [batch, heads_q, seqlen_q(, dim)] indices, for the messages.
    const auto where = [&](size_t i, int dim) {
        const size_t row = i / size_t(dim);
        return " at batch " + std::to_string(row / c.seqlen_q / c.heads_q) + ", head " +
               std::to_string(row / c.seqlen_q % c.heads_q) + ", query " + std::to_string(row % c.seqlen_q) +
               (dim > 1 ? ", column " + std::to_string(i % dim) : std::string());
    };
    EXPECT_EQ(e.out.non_finite, 0u) << "output elements not written or not finite";
    EXPECT_EQ(e.out.mismatched_inf, 0u);
    EXPECT_LE(e.out.rel_l2, kFp8PrefillRelL2);
    EXPECT_EQ(e.out_beyond, 0u) << "out elements past their error bound; the worst " << e.worst_out_ratio
                                << " times it" << where(e.worst_out_at, c.value_dim());
    EXPECT_EQ(e.lse.non_finite, 0u) << "lse elements not written or not finite";
    EXPECT_EQ(e.lse.mismatched_inf, 0u) << "rows with no visible key must have lse = -inf";
    EXPECT_EQ(e.lse_beyond, 0u) << "lse rows past their error bound; the worst " << e.worst_lse_ratio
                                << " times it" << where(e.worst_lse_at, 1);
    EXPECT_EQ(w.check_untouched(), "");

    // The same inputs give bitwise-identical outputs.
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    EXPECT_TRUE(w.out_bits() == first_bits) << "second run differs from the first";
    EXPECT_EQ(w.check_untouched(), "");
}

// Runs case c on fresh random inputs with poisoned outputs, compares out and
// lse with the float64 reference, and checks that a second run gives
// bitwise-identical output. The caller has checked for a GPU. Cases with
// fp8 queries: expect_fp8_prefill_matches_reference.
inline void expect_matches_reference(const FwdCase &c) {
    if (c.fp8_q()) {
        expect_fp8_prefill_matches_reference(c);
        return;
    }
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);

    Workload w(c, rng);
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const std::vector<uint16_t> first_bits = w.out_bits();

    std::vector<double> ref_out, ref_lse;
    reference_attention(w.problem, w.q, w.k, w.v, ref_out, ref_lse);
    const std::vector<float> out = w.dense_out(ref_out);
    const std::vector<float> lse = w.dense_lse(ref_lse);
    const ErrorStats e = compare(out, ref_out);
    const ErrorStats e_lse = compare(lse, ref_lse);
    const Tolerance tol = tolerance_for(c.dtype);
    std::printf("[ errors ] %s seed=%llu out: max_abs=%.3e rel_l2=%.3e | lse: max_abs=%.3e\n", case_name(c).c_str(),
                static_cast<unsigned long long>(seed), e.max_abs, e.rel_l2, e_lse.max_abs);
    testing::Test::RecordProperty("out_max_abs", std::to_string(e.max_abs));
    testing::Test::RecordProperty("out_rel_l2", std::to_string(e.rel_l2));
    testing::Test::RecordProperty("lse_max_abs", std::to_string(e_lse.max_abs));
    EXPECT_EQ(e.non_finite, 0u) << "output elements not written or not finite";
    EXPECT_EQ(e.mismatched_inf, 0u);
    EXPECT_LE(e.rel_l2, tol.rel_l2);
    EXPECT_LE(e.max_abs, tol.max_abs);
    EXPECT_EQ(e_lse.non_finite, 0u) << "lse elements not written or not finite";
    EXPECT_EQ(e_lse.mismatched_inf, 0u) << "rows with no visible key must have lse = -inf";
    EXPECT_LE(e_lse.max_abs, tol.lse_max_abs);
    EXPECT_EQ(w.check_untouched(), "");

    // The same inputs give bitwise-identical outputs.
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    EXPECT_TRUE(w.out_bits() == first_bits) << "second run differs from the first";
    EXPECT_EQ(w.check_untouched(), "");
}

}  // namespace flashcore_test
