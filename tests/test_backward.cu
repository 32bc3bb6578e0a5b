// GPU correctness of flashcore_backward against the float64 CPU reference,
// through the public C API only (flashcore_forward gives out and lse, then
// flashcore_backward gives dq, dk and dv): fp16/bf16 x every kernel head dim
// (32, 64, 96, 128, 192/128, 256, 512) and head dims that run on a larger
// kernel (40/24, 80, 112, 160/128, 136, 320, 384/320) x causal on/off, windows, softcap, GQA 1/4/8,
// seqlen_q != seqlen_k both ways, odd lengths, seqused_k, variable-length
// batches with empty sequences, calls without queries, strided layouts; each
// in the default and the deterministic mode; the same on the configurations
// of GPUs with less shared memory per block (A100: 163 KB; sm_86, sm_89: 99
// KB); determinism under contention, graph capture, the workspace's size
// and the calls refused before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backward_workload.h"
#include "device_tensors.h"
#include "flashcore.h"
#include "forward_workload.h"
#include "reference.h"
#include "scoped_env.h"
#include "test_skip.h"

using namespace flashcore_test;

namespace {

constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
constexpr auto bf16 = FLASHCORE_DTYPE_BF16;

struct ReferenceGradients {
    std::vector<double> dq, dk, dv;
    std::vector<double> dsinks, dsinks_scale;  // empty without sinks
};

ReferenceGradients reference_gradients(const BwdWorkload &w) {
    ReferenceGradients ref;
    reference_attention_backward(w.fwd.problem, w.fwd.q, w.fwd.k, w.fwd.v, w.dout, ref.dq, ref.dk, ref.dv,
                                 w.c.sinks ? &ref.dsinks : nullptr, w.c.sinks ? &ref.dsinks_scale : nullptr);
    return ref;
}

// "" if w's gradients (its last backward call's) are finite, within the
// dtype's error bars of the reference, and exactly zero where no key or no
// query is seen; else what is wrong. Prints the errors, labelled with
// `what`.
std::string gradient_differences(const BwdWorkload &w, const ReferenceGradients &ref, const std::string &what) {
    const std::vector<float> dq = w.dense_dq(ref.dq), dk = w.dense_dk(ref.dk), dv = w.dense_dv(ref.dv);
    const GradientTolerance tol = gradient_tolerance_for(w.c.dtype);
    struct Named {
        const char *name;
        GradientError e;
    };
    const Named errors[] = {
        {"dq", compare_gradient(dq, ref.dq)},
        {"dk", compare_gradient(dk, ref.dk)},
        {"dv", compare_gradient(dv, ref.dv)},
    };
    std::printf("[ errors ] %s:", what.c_str());
    for (const Named &n : errors) {
        std::printf(" %s max_rel=%.3e rel_l2=%.3e (max_ref %.3g)", n.name, n.e.max_rel, n.e.rel_l2, n.e.max_ref);
    }
    std::printf("\n");
    std::string report;
    for (const Named &n : errors) {
        char line[200];
        if (n.e.non_finite > 0) {
            std::snprintf(line, sizeof line, "%s: %zu elements not written or not finite; ", n.name, n.e.non_finite);
            report += line;
        } else if (n.e.max_rel > tol.max_rel || n.e.rel_l2 > tol.rel_l2) {
            std::snprintf(line, sizeof line, "%s: max_rel %.3e (bar %.3e), rel_l2 %.3e (bar %.3e); ", n.name,
                          n.e.max_rel, tol.max_rel, n.e.rel_l2, tol.rel_l2);
            report += line;
        }
    }
    // dsinks[h] sums a row's D = rowsum(dO * O), O the call's 16-bit out,
    // times the sink's probability over every row of head h: each D is off by
    // up to u/2 of sum_c |dO_c O_c|, however much the terms cancel in the
    // sum, so the bar is max_rel's times that magnitude (dsinks_scale).
    const std::vector<float> dsinks = w.dsinks_host();
    for (size_t h = 0; h < dsinks.size(); ++h) {
        const double bound = tol.max_rel * std::max(ref.dsinks_scale[h], kGradientMagnitudeFloor);
        const double error = std::fabs(double(dsinks[h]) - ref.dsinks[h]);
        std::printf("%s dsinks[%zu] %.6g vs %.6g (error %.3e, bar %.3e)\n", h == 0 ? "[ errors ]" : "          ", h,
                    double(dsinks[h]), ref.dsinks[h], error, bound);
        if (!(error <= bound)) {
            char line[200];
            std::snprintf(line, sizeof line, "dsinks[%zu]: %.6g against %.6g (error %.3e, bar %.3e); ", h,
                          double(dsinks[h]), ref.dsinks[h], error, bound);
            report += line;
        }
    }
    if (!report.empty()) return report;
    return w.unseen_gradients_not_zero(dq, dk, dv);
}

// Where two runs' gradients differ: "" if they are bitwise identical, else
// how many 16-bit words of the buffer differ and the first.
std::string describe_bit_differences(const std::vector<uint16_t> &got, const std::vector<uint16_t> &expected) {
    if (got == expected) return "";
    if (got.size() != expected.size()) return "sizes differ";
    size_t count = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] == expected[i]) continue;
        if (count++ == 0) first = i;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%zu of %zu elements differ, the first at element %zu: 0x%04x vs 0x%04x", count,
                  got.size(), first, unsigned(got[first]), unsigned(expected[first]));
    return buf;
}

// Runs case c's forward, then its backward twice in the default mode and
// twice in the deterministic mode, on fresh random inputs with the gradients
// poisoned before each run: every run within the error bars of the float64
// reference, dk and dv bitwise identical between runs of a mode (dq too in
// the deterministic mode), and nothing written outside dq, dk and dv. The
// caller has checked for a GPU.
void expect_gradients_match_reference(const FwdCase &c) {
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    BwdWorkload w(c, rng);
    ASSERT_EQ(w.run_forward_pass(handle.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const InputSnapshot inputs = w.snapshot_inputs();
    const ReferenceGradients ref = reference_gradients(w);

    EXPECT_EQ(flashcore_backward_check(&w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    size_t ws_bytes = 0;
    ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(ws_bytes, w.expected_workspace_bytes());

    for (const bool deterministic : {false, true}) {
        const std::string mode = deterministic ? "deterministic" : "default";
        SCOPED_TRACE(mode + " mode");
        w.params.deterministic = deterministic ? 1 : 0;
        w.poison_gradients();
        ASSERT_EQ(run_backward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        const GradientBits first = w.gradient_bits();
        const std::string label =
            case_name(c) + " seed=" + std::to_string(static_cast<unsigned long long>(seed)) + " " + mode;
        EXPECT_EQ(gradient_differences(w, ref, label), "");
        EXPECT_EQ(w.check_untouched(inputs), "");

        w.poison_gradients();
        ASSERT_EQ(run_backward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        const GradientBits second = w.gradient_bits();
        EXPECT_EQ(describe_bit_differences(second.dk, first.dk), "") << "dk of a second run";
        EXPECT_EQ(describe_bit_differences(second.dv, first.dv), "") << "dv of a second run";
        EXPECT_TRUE(second.dsinks == first.dsinks) << "dsinks of a second run (deterministic in both modes)";
        if (deterministic) {
            EXPECT_EQ(describe_bit_differences(second.dq, first.dq), "") << "dq of a second run";
        } else {
            // dq may round differently; it must still be right.
            EXPECT_EQ(gradient_differences(w, ref, label + " (second run)"), "");
        }
        EXPECT_EQ(w.check_untouched(inputs), "");
    }
}

// That a call which failed or was refused left dq, dk and dv as poisoned
// (`call` names it in the failure).
void expect_gradients_untouched(const BwdWorkload &w, const GradientBits &poisoned, const char *call) {
    const GradientBits after = w.gradient_bits();
    EXPECT_EQ(describe_bit_differences(after.dq, poisoned.dq), "") << call << " wrote dq";
    EXPECT_EQ(describe_bit_differences(after.dk, poisoned.dk), "") << call << " wrote dk";
    EXPECT_EQ(describe_bit_differences(after.dv, poisoned.dv), "") << call << " wrote dv";
}

class BackwardTest : public testing::TestWithParam<FwdCase> {};

TEST_P(BackwardTest, MatchesFloat64Reference) {
    FC_REQUIRE_GPU();
    expect_gradients_match_reference(GetParam());
}

// Every head-dim pair (the default build's kernels, then pairs that run on
// a larger kernel with masked loads and stores) x dtype x mask, on a small
// GQA shape with lengths that are not tile multiples (seqlen_q < seqlen_k),
// and causal on one with seqlen_q > seqlen_k (rows that see no key).
std::vector<FwdCase> head_dim_cases() {
    struct HeadDims {
        int qk, v;
    };
    const HeadDims head_dims[] = {{32, 32}, {64, 64},  {96, 96},   {128, 128}, {192, 128}, {256, 256},
                                  {40, 24}, {80, 80},  {112, 112}, {160, 128}, {136, 136}};
    const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kPadded};
    std::vector<FwdCase> cases;
    int n = 0;
    for (const HeadDims &d : head_dims) {
        const int head_dim_v = d.v == d.qk ? 0 : d.v;
        const Layout layout = layouts[n++ % 3];
        for (const flashcore_dtype dtype : {fp16, bf16}) {
            for (const bool causal : {false, true})
                cases.push_back({dtype, d.qk, causal, 2, 4, 2, 200, 333, layout, head_dim_v});
            cases.push_back({dtype, d.qk, true, 1, 2, 1, 257, 129, layout, head_dim_v});
        }
    }
    return cases;
}

// Shapes at the Hopper kernels' head dims, causal and not: single rows and
// keys, odd lengths, seqlen_q far above and below seqlen_k, GQA groups of 1,
// 4 and 8, batches, the three layouts, and two long ones.
std::vector<FwdCase> shape_cases() {
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        {1, 2, 2, 1, 1, Layout::kBSHD},       {1, 2, 2, 1, 129, Layout::kBHSD},
        {1, 2, 2, 17, 77, Layout::kBSHD},     {1, 2, 2, 77, 17, Layout::kBHSD},
        {1, 2, 2, 129, 257, Layout::kPadded}, {1, 2, 2, 257, 129, Layout::kBSHD},
        {1, 2, 2, 600, 40, Layout::kBHSD},    {2, 4, 4, 77, 600, Layout::kBSHD},
        {1, 2, 2, 512, 512, Layout::kBHSD},   {2, 8, 2, 300, 421, Layout::kBSHD},
        {1, 8, 1, 333, 200, Layout::kPadded}, {3, 4, 1, 128, 128, Layout::kBHSD},
        {1, 2, 2, 1024, 1024, Layout::kBSHD}, {1, 2, 2, 2048, 2048, Layout::kBHSD},
    };
    struct Kernel {
        flashcore_dtype dtype;
        int head_dim;
    };
    std::vector<FwdCase> cases;
    for (const Kernel k : {Kernel{fp16, 64}, Kernel{fp16, 96}, Kernel{bf16, 128}})
        for (const bool causal : {false, true})
            for (const Shape &s : shapes)
                cases.push_back({k.dtype, k.head_dim, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                 s.layout});
    return cases;
}

FwdCase with_scale(FwdCase c, float scale) {
    c.softmax_scale = scale;
    return c;
}

// Sliding windows (the diagonal only, one side unbounded, less than a tile,
// more than the sequence; with and without causal; seqlen_q below and above
// seqlen_k; GQA), softcap with large logits alone and with a window, and an
// explicit softmax scale.
std::vector<FwdCase> window_and_softcap_cases() {
    const FwdCase square{fp16, 64, true, 1, 2, 2, 300, 300, Layout::kBHSD};
    const FwdCase square_full{bf16, 128, false, 1, 2, 2, 300, 300, Layout::kBSHD};
    const FwdCase wide{fp16, 128, true, 1, 4, 2, 200, 600, Layout::kPadded};
    const FwdCase tall{bf16, 64, false, 1, 2, 2, 500, 250, Layout::kBHSD};
    const FwdCase d256{bf16, 256, false, 1, 2, 1, 150, 260, Layout::kBSHD};
    const FwdCase d32{fp16, 32, true, 2, 2, 2, 130, 130, Layout::kBSHD};
    const FwdCase d192{fp16, 192, false, 1, 4, 1, 100, 300, Layout::kBHSD, 128};
    return {
        square.with_window(0, 0),
        square.with_window(1, -1),
        square.with_window(37, 0),
        square.with_window(200, -1),
        square.with_window(4096, 0),
        square_full.with_window(0, 0),
        square_full.with_window(100, 50),
        square_full.with_window(-1, 0),
        square_full.with_window(-1, 30),
        square_full.with_window(63, -1),
        square_full.with_window(5000, 5000),
        wide.with_window(128, 0),
        wide.with_window(300, -1),
        tall.with_window(50, 10),
        tall.with_window(0, 0),
        tall.with_window(-1, 0),
        d256.with_window(40, 20),
        d32.with_window(16, 0),
        square_full.with_softcap(30.f, 1.f),
        square.with_softcap(50.f, 0.5f),
        wide.with_softcap(30.f, 1.f).with_window(100, 0),
        tall.with_softcap(20.f, 1.f),
        d256.with_softcap(30.f, 1.f),
        d192.with_softcap(50.f),
        d32.with_softcap(30.f, 1.f).with_window(50, 0),
        with_scale(square, 0.3f),
        with_scale(d192, 0.05f),
    };
}

// Per-batch key counts (seqused_k) over keys whose tails hold NaN and
// infinity: counts of 0, 1, tile multiples and not, the whole length;
// causal with counts below seqlen_q (rows that see no key), window,
// softcap, several head dims and layouts.
std::vector<FwdCase> seqused_k_cases() {
    return {
        FwdCase{bf16, 128, false, 4, 8, 2, 1, 700, Layout::kBSHD}.with_seqused_k({0, 1, 377, 700}),
        FwdCase{fp16, 64, true, 3, 4, 2, 100, 600, Layout::kBHSD}.with_seqused_k({100, 600, 50}),
        FwdCase{bf16, 128, false, 2, 2, 2, 300, 600, Layout::kBSHD}.with_softcap(30.f, 1.f).with_seqused_k({599, 129}),
        FwdCase{fp16, 64, true, 2, 2, 2, 64, 900, Layout::kBHSD}.with_window(300, 0).with_seqused_k({800, 300}),
        FwdCase{bf16, 96, false, 2, 4, 4, 33, 500, Layout::kPadded}.with_seqused_k({255, 500}),
        FwdCase{fp16, 256, false, 2, 2, 1, 16, 400, Layout::kBSHD}.with_seqused_k({300, 0}),
        FwdCase{bf16, 32, true, 2, 2, 2, 200, 520, Layout::kBHSD}.with_seqused_k({130, 519}),
    };
}

// Variable-length batches: sequences of length 0 and 1, lengths that are
// not tile multiples, queries and keys of different lengths, packed queries
// over dense keys and the reverse, GQA, window, softcap, seqused_k over
// packed keys, a batch with no query at all, and the head dims whose tiles
// differ.
std::vector<FwdCase> varlen_cases() {
    const FwdCase d64{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD};
    const FwdCase d128{bf16, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD};
    const FwdCase d128_full{bf16, 128, false, 1, 4, 4, 1, 1, Layout::kPadded};
    const FwdCase d256{fp16, 256, false, 1, 2, 1, 1, 1, Layout::kBSHD};
    const FwdCase d96{bf16, 96, true, 1, 2, 2, 1, 1, Layout::kPadded};
    return {
        d64.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k({0, 1, 17, 200, 513}),
        d128.with_varlen_q({128, 1, 300}).with_varlen_k({600, 64, 300}),
        d64.with_varlen_q({300, 33, 600}).with_varlen_k({300, 33, 600}).with_window(128, 0).with_softcap(30.f, 1.f),
        d128_full.with_varlen_q({1, 5, 64, 0}).with_varlen_k({900, 3, 600, 17}),
        d256.with_varlen_q({150, 300}).with_varlen_k({150, 300}),
        d96.with_varlen_q({129, 1, 260}).with_varlen_k({129, 1, 260}),
        FwdCase{bf16, 128, true, 3, 8, 2, 1, 700, Layout::kBSHD}.with_varlen_q({300, 1, 64}),
        FwdCase{fp16, 64, false, 2, 4, 4, 250, 1, Layout::kBHSD}.with_varlen_k({100, 333}),
        d128.with_varlen_q({200, 129}).with_varlen_k({700, 900}).with_seqused_k({650, 0}),
        d64.with_varlen_q({0, 0}).with_varlen_k({33, 1}),
    };
}

// Calls without queries (seqlen_q 0) but with keys: dk and dv are written,
// all zeros.
std::vector<FwdCase> no_query_cases() {
    return {
        FwdCase{fp16, 64, false, 2, 4, 2, 0, 77, Layout::kBSHD},
        FwdCase{bf16, 128, true, 1, 2, 2, 0, 129, Layout::kBHSD},
    };
}

// Chunked attention (Llama 4): chunks tile-aligned and not, of one key,
// longer than the sequence, causal or not, seqlen_q below and above
// seqlen_k, with a window, GQA, varlen, each tile path's head dims.
// Learnable sinks (gpt-oss): dsinks against the float64 gradient, with
// causal (rows that see no key), gpt-oss's window of 128 over GQA, softcap,
// chunks, varlen and seqused_k, and a call without queries (dsinks 0).
std::vector<FwdCase> chunk_and_sinks_cases() {
    const FwdCase square{fp16, 64, true, 1, 2, 2, 300, 300, Layout::kBHSD};
    const FwdCase square_full{bf16, 128, false, 1, 2, 2, 300, 300, Layout::kBSHD};
    const FwdCase wide{fp16, 128, true, 1, 4, 2, 200, 600, Layout::kPadded};
    const FwdCase tall{bf16, 64, false, 1, 2, 2, 500, 250, Layout::kBHSD};
    const FwdCase tall_causal{fp16, 64, true, 1, 4, 4, 500, 250, Layout::kBSHD};
    const FwdCase gqa{bf16, 64, true, 2, 8, 2, 300, 421, Layout::kBSHD};
    const FwdCase d256{bf16, 256, true, 1, 2, 1, 150, 260, Layout::kBSHD};
    const FwdCase d32{fp16, 32, false, 2, 2, 2, 130, 130, Layout::kBSHD};
    const FwdCase d192{fp16, 192, true, 1, 4, 1, 100, 300, Layout::kBHSD, 128};
    const FwdCase d128_long{bf16, 128, true, 1, 2, 2, 1024, 1024, Layout::kBSHD};
    const FwdCase d64{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD};
    return {
        square.with_chunk(64),
        square.with_chunk(100),
        square.with_chunk(1),
        square.with_chunk(5000),
        square_full.with_chunk(128),
        wide.with_chunk(256),
        tall.with_chunk(100),
        square.with_window(50, 0).with_chunk(64),
        gqa.with_chunk(200),
        d256.with_chunk(96),
        d32.with_chunk(50),
        d192.with_chunk(64),
        d128_long.with_chunk(256),
        d128_long.with_chunk(300),
        d64.with_varlen_q({300, 33, 600}).with_varlen_k({300, 33, 600}).with_chunk(128),
        square.with_sinks(),
        square_full.with_sinks(),
        tall_causal.with_sinks(),
        gqa.with_window(128, 0).with_sinks(),
        wide.with_softcap(30.f, 1.f).with_sinks(),
        d128_long.with_chunk(256).with_sinks(),
        d256.with_sinks(),
        d192.with_window(40, 0).with_sinks(),
        d64.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k({0, 1, 17, 200, 513}).with_window(128, 0).with_sinks(),
        FwdCase{bf16, 128, false, 4, 8, 2, 1, 700, Layout::kBSHD}.with_seqused_k({0, 1, 377, 700}).with_sinks(),
        FwdCase{fp16, 64, false, 2, 4, 2, 0, 77, Layout::kBSHD}.with_sinks(),
    };
}

// Head dim 512 (Gemma's: 32-key blocks, bwd/sm80/config.cuh), and pairs
// past 256 that run on it: full and causal, GQA, rows that see no key,
// windows with sinks, softcap, chunks, seqused_k and variable-length
// batches (WideGradients). Not in the 99 KB runs: no configuration of it
// fits there (BackwardApi.HeadDim512IsRefusedWhereItsTilesDoNotFit).
std::vector<FwdCase> d512_cases() {
    const FwdCase full{bf16, 512, false, 2, 4, 2, 200, 333, Layout::kBSHD};
    const FwdCase causal{fp16, 512, true, 1, 4, 1, 257, 129, Layout::kBHSD};
    return {
        full,
        FwdCase{fp16, 512, false, 2, 4, 2, 200, 333, Layout::kPadded},
        causal,
        FwdCase{bf16, 512, true, 2, 8, 2, 300, 421, Layout::kBSHD},
        full.with_window(100, 0).with_sinks(),
        causal.with_softcap(30.f, 1.f),
        FwdCase{bf16, 512, true, 1, 4, 2, 300, 300, Layout::kBSHD}.with_chunk(96).with_sinks(),
        FwdCase{fp16, 512, false, 2, 2, 1, 16, 400, Layout::kBSHD}.with_seqused_k({300, 0}),
        FwdCase{bf16, 512, true, 1, 2, 1, 1, 1, Layout::kBSHD}.with_varlen_q({150, 1, 300}).with_varlen_k(
            {150, 33, 300}),
        FwdCase{fp16, 320, true, 1, 2, 2, 130, 200, Layout::kPadded},
        FwdCase{bf16, 384, false, 1, 4, 2, 100, 150, Layout::kBSHD, 320},
    };
}

std::vector<FwdCase> all_cases() {
    std::vector<FwdCase> cases;
    std::set<std::string> names;
    for (const std::vector<FwdCase> &group : {head_dim_cases(), shape_cases(), window_and_softcap_cases(),
                                              seqused_k_cases(), varlen_cases(), no_query_cases(),
                                              chunk_and_sinks_cases()}) {
        for (const FwdCase &c : group) {
            // A case two groups share runs once (gtest refuses repeated names).
            if (names.insert(case_name(c)).second) cases.push_back(c);
        }
    }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Gradients, BackwardTest, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });
// Apart, for the 99 KB configuration to leave out (tests/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(WideGradients, BackwardTest, testing::ValuesIn(d512_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// The portable kernel has a configuration per shared-memory limit
// (bwd/sm80/config.cuh: at head dim 256 two Q/dO stages where a block may
// have 209 KB, as on sm_90, at 512 64-row query blocks; one stage, and 32
// rows at 512, within an A100's 163 KB; smaller tiles at every head dim up
// to 256 within sm_86's and sm_89's 99 KB). The cases above run the
// one this GPU picks; these run the others here, as if the GPU allowed that
// much (FLASHCORE_TEST_SMEM_PER_BLOCK: every choice of the call is made as
// on such a GPU, the forward's too).
constexpr const char *kA100SmemPerBlock = "166912";  // 163 KB
constexpr const char *kSm86SmemPerBlock = "101376";  // 99 KB: sm_86, sm_89 (RTX 3090, 4090, A10, L4)

TEST(BackwardConfigs, A100SharedMemoryConfigurationMatchesReference) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kA100SmemPerBlock}});
    expect_gradients_match_reference(FwdCase{fp16, 256, false, 2, 4, 2, 200, 333, Layout::kBSHD});
    expect_gradients_match_reference(FwdCase{bf16, 256, true, 1, 4, 1, 300, 257, Layout::kBHSD});
    expect_gradients_match_reference(FwdCase{bf16, 512, false, 2, 4, 2, 200, 333, Layout::kBSHD});
    expect_gradients_match_reference(FwdCase{fp16, 512, true, 1, 4, 1, 300, 257, Layout::kBHSD}.with_sinks());
}

// Head dim 512's smallest tiles need 132 KB per block: where a block may
// have 99 KB (sm_86, sm_89) its backward is refused as UNSUPPORTED, saying
// how much it needs and what the device allows, before anything is queued
// (the gradients keep their poison); its forward runs there.
// sm_margin changes what the plan counts (the deterministic schedule needs
// a head's key blocks within half the SMs left), not the arithmetic: with
// most SMs left to other streams, both modes match the reference and repeat
// bitwise. 640 keys make 5 or 10 key blocks, which 2 SMs' halves do not
// hold.
TEST(BackwardApi, SmMarginGradientsMatchTheReference) {
    FC_REQUIRE_GPU();
    int device = 0, sms = 0;
    FC_CHECK_CUDA(cudaGetDevice(&device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    for (const int margin : {16, sms - 2}) {
        // Head dim 64: every build has it (the sanitizers' has only it).
        FwdCase c{bf16, 64, true, 1, 4, 2, 640, 640, Layout::kBSHD};
        c.sm_margin = margin;
        SCOPED_TRACE(case_name(c));
        expect_gradients_match_reference(c);
    }
}

TEST(BackwardApi, HeadDim512IsRefusedWhereItsTilesDoNotFit) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kSm86SmemPerBlock}});
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    BwdWorkload w(FwdCase{bf16, 512, true, 1, 4, 2, 130, 200, Layout::kBSHD}, rng);
    ASSERT_EQ(w.run_forward_pass(handle.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    size_t ws_bytes = 0;
    ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    GuardedBuffer ws(ws_bytes);
    w.poison_gradients();
    const GradientBits poisoned = w.gradient_bits();
    EXPECT_EQ(flashcore_backward(handle.get(), &w.params, ws.data, ws_bytes, nullptr), FLASHCORE_STATUS_UNSUPPORTED);
    const std::string message = flashcore_last_error_message();
    EXPECT_NE(message.find("head dims (512, 512) needs 135424 bytes of shared memory"), std::string::npos) << message;
    EXPECT_NE(message.find("allows 101376"), std::string::npos) << message;
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    expect_gradients_untouched(w, poisoned, "a refused call");
    EXPECT_EQ(ws.check("workspace"), "");
}

// The 99 KB configurations: every head-dim pair (the kernels' own, and
// pairs that run on a larger kernel) x dtype x mask as above, and at the
// head dims whose tiles shrink most (256: 32 x 32, a warp's S one n8 tile;
// 128 and 192: one stage) GQA groups of 8, windows, softcap, seqused_k and
// variable-length batches. Each in the default and the deterministic mode
// (expect_gradients_match_reference).
std::vector<FwdCase> sm86_smem_cases() {
    std::vector<FwdCase> cases = head_dim_cases();
    const FwdCase d256{bf16, 256, false, 1, 8, 1, 150, 260, Layout::kBSHD};
    const FwdCase d128{fp16, 128, true, 1, 4, 2, 200, 600, Layout::kPadded};
    const FwdCase d192{bf16, 192, true, 2, 4, 1, 300, 300, Layout::kBHSD, 128};
    const FwdCase d32{fp16, 32, true, 2, 2, 2, 130, 130, Layout::kBSHD};
    const FwdCase d64{bf16, 64, false, 1, 8, 2, 333, 200, Layout::kBHSD};
    for (const FwdCase &c : {
             d256,
             d256.with_window(40, 20),
             d256.with_softcap(30.f, 1.f).with_window(100, 0),
             FwdCase{fp16, 256, true, 2, 2, 1, 16, 400, Layout::kBSHD}.with_seqused_k({300, 0}),
             FwdCase{fp16, 256, true, 1, 2, 1, 1, 1, Layout::kBSHD}.with_varlen_q({150, 1, 300}).with_varlen_k(
                 {150, 33, 300}),
             d128.with_window(128, 0),
             d128.with_softcap(30.f, 1.f),
             FwdCase{bf16, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD}.with_varlen_q({128, 1, 300}).with_varlen_k(
                 {600, 64, 300}),
             d192,
             d192.with_softcap(50.f),
             d32.with_softcap(30.f, 1.f).with_window(50, 0),
             FwdCase{bf16, 32, true, 2, 2, 2, 200, 520, Layout::kBHSD}.with_seqused_k({130, 519}),
             d64,
             d64.with_window(63, -1),
             FwdCase{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD}.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k(
                 {0, 1, 17, 200, 513}),
             FwdCase{bf16, 96, true, 1, 2, 2, 1, 1, Layout::kPadded}.with_varlen_q({129, 1, 260}).with_varlen_k(
                 {129, 1, 260}),
         }) {
        cases.push_back(c);
    }
    std::vector<FwdCase> distinct;
    std::set<std::string> names;
    for (const FwdCase &c : cases) {
        if (names.insert(case_name(c)).second) distinct.push_back(c);
    }
    return distinct;
}

class BackwardSm86SmemTest : public testing::TestWithParam<FwdCase> {};

TEST_P(BackwardSm86SmemTest, MatchesFloat64Reference) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kSm86SmemPerBlock}});
    expect_gradients_match_reference(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sm86SmemGradients, BackwardSm86SmemTest, testing::ValuesIn(sm86_smem_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

TEST(BackwardApi, BadSmemChoiceIsRejectedAtCreate) {
    FC_REQUIRE_GPU();
    expect_env_values_rejected("FLASHCORE_TEST_SMEM_PER_BLOCK", {"0", "-1", "12x", "99999999999"}, kA100SmemPerBlock);
}

// FLASHCORE_BWD_VARIANT: portable (or its one tile, kvblock) is accepted on
// every GPU; hopper where the device and the build have the sm_90a kernels,
// and refused with UNSUPPORTED elsewhere; anything else is refused (the
// forward's old name sm90 too: the backward never took it).
TEST(BackwardApi, BadVariantIsRejectedAtCreate) {
    FC_REQUIRE_GPU();
    expect_env_values_rejected("FLASHCORE_BWD_VARIANT", {"sm90", "portables", "Hopper", "kvblock "}, "portable");
    expect_env_values_rejected("FLASHCORE_BWD_VARIANT", {}, "kvblock");
    flashcore_handle h = nullptr;
    std::string message;
    const flashcore_status status = create_with_env("FLASHCORE_BWD_VARIANT", "hopper", &h, &message);
    int device = 0, major = 0;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
    if (status == FLASHCORE_STATUS_SUCCESS) {
        EXPECT_EQ(major, 9) << "hopper accepted on a GPU without sm_90a kernels";
        flashcore_destroy(h);
    } else {
        EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << message;
        EXPECT_NE(message.find("FLASHCORE_BWD_VARIANT=hopper"), std::string::npos) << message;
    }
}

// ---------------------------------------------------------------------------
// Determinism under contention, graphs.
// ---------------------------------------------------------------------------

// Shapes where many key blocks add into each row's dQ and several query
// heads into each K/V head's dK and dV: GQA with causal and seqlen_q <
// seqlen_k, a long full mask, a variable-length batch with an empty sequence;
// GQA causal again at head dim 96 (its dQ from one warpgroup).
std::vector<FwdCase> determinism_cases() {
    return {
        FwdCase{fp16, 64, true, 2, 8, 2, 700, 900, Layout::kBSHD},
        FwdCase{bf16, 128, false, 1, 4, 4, 1024, 1024, Layout::kBHSD},
        FwdCase{bf16, 64, true, 1, 8, 1, 1, 1, Layout::kBSHD}.with_varlen_q({300, 0, 517}).with_varlen_k({400, 1, 517}),
        FwdCase{bf16, 96, true, 2, 8, 2, 700, 900, Layout::kBSHD},
    };
}

struct Stream {
    cudaStream_t stream = nullptr;
    Stream() { FC_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(stream); }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
};

// Each mode, kRuns times on the same inputs, each run's backward queued on
// one stream while large forward calls run on another (so its thread blocks
// are scheduled differently every time), reusing one workspace that is never
// cleared: the deterministic mode gives bitwise-identical dq, dk and dv;
// the default mode bitwise-identical dk and dv (dq may differ in its last
// bits). The first run of each is checked against the reference. The
// caller has checked for a GPU (and set the environment the handle reads).
void expect_repeated_runs_bitwise_identical(const std::vector<FwdCase> &cases) {
    constexpr int kRuns = 8;
    constexpr int kNoiseCallsPerRun = 3;
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    // A forward call that fills the GPU for a few hundred microseconds; no
    // split, so it needs no workspace.
    FwdCase noise_case{fp16, 128, false, 2, 16, 16, 2048, 2048, Layout::kBSHD};
    noise_case.num_splits = 1;
    Workload noise(noise_case, rng);
    Stream work, background;

    for (const FwdCase &c : cases) {
        BwdWorkload w(c, rng);
        ASSERT_EQ(w.run_forward_pass(handle.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        const ReferenceGradients ref = reference_gradients(w);
        for (const bool deterministic : {true, false}) {
            const std::string mode = deterministic ? "deterministic" : "default";
            SCOPED_TRACE(case_name(c) + " seed=" + std::to_string(static_cast<unsigned long long>(seed)) + " " + mode);
            w.params.deterministic = deterministic ? 1 : 0;
            size_t ws_bytes = 0;
            ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
            GuardedBuffer ws(ws_bytes);
            FC_CHECK_CUDA(cudaMemset(ws.data, 0xFF, ws_bytes));
            finish_device_writes();
            GradientBits first;
            int dq_differs = 0;
            for (int run = 0; run < kRuns; ++run) {
                w.poison_gradients();
                for (int n = 0; n < kNoiseCallsPerRun; ++n) {
                    ASSERT_EQ(flashcore_forward(handle.get(), &noise.params, nullptr, 0, background.stream),
                              FLASHCORE_STATUS_SUCCESS)
                        << flashcore_last_error_message();
                }
                ASSERT_EQ(flashcore_backward(handle.get(), &w.params, ws.data, ws_bytes, work.stream),
                          FLASHCORE_STATUS_SUCCESS)
                    << flashcore_last_error_message();
                FC_CHECK_CUDA(cudaStreamSynchronize(work.stream));
                FC_CHECK_CUDA(cudaStreamSynchronize(background.stream));
                const GradientBits bits = w.gradient_bits();
                if (run == 0) {
                    first = bits;
                    EXPECT_EQ(gradient_differences(w, ref, case_name(c) + " " + mode + " under contention"), "");
                    continue;
                }
                EXPECT_EQ(describe_bit_differences(bits.dk, first.dk), "") << "dk, run " << run;
                EXPECT_EQ(describe_bit_differences(bits.dv, first.dv), "") << "dv, run " << run;
                if (deterministic) {
                    EXPECT_EQ(describe_bit_differences(bits.dq, first.dq), "") << "dq, run " << run;
                } else if (bits.dq != first.dq) {
                    ++dq_differs;
                }
            }
            if (!deterministic) {
                std::printf("[ info   ] %s default mode: dq differed from the first run in %d of %d runs\n",
                            case_name(c).c_str(), dq_differs, kRuns - 1);
            }
            EXPECT_EQ(ws.check("workspace"), "");
        }
    }
}

TEST(BackwardDeterminism, RepeatedRunsUnderContentionAreBitwiseIdentical) {
    FC_REQUIRE_GPU();
    expect_repeated_runs_bitwise_identical(determinism_cases());
}

// The same on the 99 KB configurations (sm_86, sm_89): at head dim 256 32 x
// 32 tiles (every 32 keys take a turn at each query block's dQ), at 128 one
// stage and 64 keys, at 64 64 query rows.
TEST(BackwardDeterminism, Sm86SharedMemoryRunsAreBitwiseIdentical) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kSm86SmemPerBlock}});
    expect_repeated_runs_bitwise_identical({
        FwdCase{fp16, 256, true, 2, 8, 2, 700, 900, Layout::kBSHD},
        FwdCase{bf16, 128, false, 1, 4, 4, 1024, 1024, Layout::kBHSD},
        FwdCase{bf16, 64, true, 1, 8, 1, 1, 1, Layout::kBSHD}.with_varlen_q({300, 0, 517}).with_varlen_k(
            {400, 1, 517}),
    });
}

// A backward call captured into a CUDA graph gives, replayed twice on a
// workspace that is never cleared, what a direct call gives, bit for bit.
// A thread may have no context current though cudaGetDevice answers the
// handle's device: PyTorch runs the backward on such a thread of its own.
// The calls there must bind one before their driver calls (the sm_90a
// kernels' cuTensorMapEncodeTiled refused with CUDA_ERROR_INVALID_CONTEXT,
// every such call returning INTERNAL). The forward and the backward each on
// a fresh thread whose context is cleared first (cuCtxSetCurrent(NULL), as
// such a thread has it), at a shape both Hopper kernels take (fp16 d64; the
// portable ones on other GPUs), chunks and sinks included; the gradients
// against the float64 reference.
void clear_current_context() {
    using CtxSetCurrent = int (*)(void *);
    void *function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FC_CHECK_CUDA(cudaGetDriverEntryPoint("cuCtxSetCurrent", &function, cudaEnableDefault, &found));
    ASSERT_NE(function, nullptr);
    ASSERT_EQ(reinterpret_cast<CtxSetCurrent>(function)(nullptr), 0);
}

TEST(BackwardThreads, ForwardAndBackwardOnThreadsWithoutAContext) {
    FC_REQUIRE_GPU();
    // Unsplit: the forward then needs no workspace. Everything the calls
    // need is allocated here, so that the threads make no runtime call (which
    // would bind the primary context) before the library's.
    const FwdCase c = FwdCase{fp16, 64, true, 1, 4, 2, 300, 300, Layout::kBHSD}.with_chunk(128).with_sinks().with_splits(1);
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    BwdWorkload w(c, rng);
    size_t ws_bytes = 0;
    ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    GuardedBuffer ws(ws_bytes);
    flashcore_status forward = FLASHCORE_STATUS_INTERNAL, backward = FLASHCORE_STATUS_INTERNAL;
    std::string forward_error, backward_error;
    w.fwd.poison_outputs();
    std::thread([&] {
        clear_current_context();
        forward = flashcore_forward(handle.get(), &w.fwd.params, nullptr, 0, nullptr);
        forward_error = flashcore_last_error_message();
    }).join();
    ASSERT_EQ(forward, FLASHCORE_STATUS_SUCCESS) << forward_error;
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    const ReferenceGradients ref = reference_gradients(w);
    w.poison_gradients();
    std::thread([&] {
        clear_current_context();
        backward = flashcore_backward(handle.get(), &w.params, ws.data, ws_bytes, nullptr);
        backward_error = flashcore_last_error_message();
    }).join();
    ASSERT_EQ(backward, FLASHCORE_STATUS_SUCCESS) << backward_error;
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(gradient_differences(w, ref, case_name(c) + " seed=" + std::to_string(seed) + " (fresh threads)"), "");
}

TEST(BackwardGraph, CapturedCallReplaysAsADirectCall) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{bf16, 128, true, 2, 4, 2, 300, 421, Layout::kBSHD};
    std::mt19937_64 rng(fresh_seed());
    BwdWorkload w(c, rng);
    ASSERT_EQ(w.run_forward_pass(handle.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    w.params.deterministic = 1;
    ASSERT_EQ(run_backward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const GradientBits expected = w.gradient_bits();

    size_t ws_bytes = 0;
    ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    GuardedBuffer ws(ws_bytes);
    Stream s;
    cudaGraph_t graph;
    FC_CHECK_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal));
    const flashcore_status status = flashcore_backward(handle.get(), &w.params, ws.data, ws_bytes, s.stream);
    FC_CHECK_CUDA(cudaStreamEndCapture(s.stream, &graph));
    ASSERT_EQ(status, FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    cudaGraphExec_t exec;
    FC_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
        w.poison_gradients();
        FC_CHECK_CUDA(cudaGraphLaunch(exec, s.stream));
        FC_CHECK_CUDA(cudaStreamSynchronize(s.stream));
        const GradientBits got = w.gradient_bits();
        EXPECT_EQ(describe_bit_differences(got.dq, expected.dq), "") << "dq, replay " << replay;
        EXPECT_EQ(describe_bit_differences(got.dk, expected.dk), "") << "dk, replay " << replay;
        EXPECT_EQ(describe_bit_differences(got.dv, expected.dv), "") << "dv, replay " << replay;
    }
    EXPECT_EQ(ws.check("workspace"), "");
    FC_CHECK_CUDA(cudaGraphExecDestroy(exec));
    FC_CHECK_CUDA(cudaGraphDestroy(graph));
}

// ---------------------------------------------------------------------------
// The workspace and calls refused before any work.
// ---------------------------------------------------------------------------

// The workspace is the fp32 dQ accumulator, align16(4 * rows * num_heads_q
// * head_dim) bytes: rows batch * seqlen_q, or total_seqlen_q when packed;
// the call's head_dim, not its kernel's; 0 without queries or in an empty
// call.
TEST(BackwardApi, WorkspaceIsTheFp32DqAccumulator) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    const FwdCase cases[] = {
        FwdCase{fp16, 64, false, 2, 4, 2, 100, 130, Layout::kBSHD},
        FwdCase{bf16, 128, true, 1, 8, 1, 77, 300, Layout::kBHSD},
        FwdCase{fp16, 40, false, 1, 2, 2, 33, 50, Layout::kBSHD, 24},
        FwdCase{bf16, 192, true, 1, 2, 1, 65, 65, Layout::kPadded, 128},
        FwdCase{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD}.with_varlen_q({0, 17, 200}).with_varlen_k({5, 17, 300}),
        FwdCase{fp16, 64, false, 2, 4, 2, 0, 77, Layout::kBSHD},
    };
    for (const FwdCase &c : cases) {
        SCOPED_TRACE(case_name(c));
        BwdWorkload w(c, rng);
        size_t ws_bytes = 1;
        ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        EXPECT_EQ(ws_bytes, w.expected_workspace_bytes());
        if (c.seqlen_q == 0) EXPECT_EQ(ws_bytes, 0u);
        flashcore_backward_params empty = w.params;
        empty.batch_size = 0;
        ws_bytes = 1;
        ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &empty, &ws_bytes), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        EXPECT_EQ(ws_bytes, 0u) << "a call with batch_size 0";
    }
}

// Workspaces too small, NULL or misaligned, and bad parameters, are refused
// with their status before anything is queued: the gradients keep their
// poison. A workspace of exactly the size asked for, and a larger one, work.
TEST(BackwardApi, RejectedCallsWriteNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{fp16, 64, true, 2, 4, 2, 100, 130, Layout::kBSHD};
    std::mt19937_64 rng(fresh_seed());
    BwdWorkload w(c, rng);
    ASSERT_EQ(w.run_forward_pass(handle.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    w.poison_gradients();
    const GradientBits poisoned = w.gradient_bits();

    size_t ws_bytes = 0;
    ASSERT_EQ(flashcore_backward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(ws_bytes, w.expected_workspace_bytes());
    ASSERT_GT(ws_bytes, size_t(FLASHCORE_ALIGNMENT));
    // Room for a misaligned pointer to the whole size.
    GuardedBuffer ws(ws_bytes + FLASHCORE_ALIGNMENT);
    char *const base = static_cast<char *>(ws.data);
    const flashcore_backward_params &p = w.params;
    EXPECT_EQ(flashcore_backward(handle.get(), &p, base, ws_bytes - 1, nullptr), FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("workspace"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(flashcore_backward(handle.get(), &p, base, ws_bytes - FLASHCORE_ALIGNMENT, nullptr),
              FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_EQ(flashcore_backward(handle.get(), &p, nullptr, 0, nullptr), FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_EQ(flashcore_backward(handle.get(), &p, nullptr, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_backward(handle.get(), &p, base + 4, ws_bytes, nullptr), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(flashcore_backward(nullptr, &p, base, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);

    flashcore_backward_params bad = p;
    bad.lse = nullptr;  // required
    EXPECT_EQ(flashcore_backward(handle.get(), &bad, base, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    bad = p;
    bad.dq = const_cast<void *>(p.q);  // an output over an input
    EXPECT_EQ(flashcore_backward(handle.get(), &bad, base, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    bad = p;
    bad.dv = p.dk;  // two outputs over one another
    EXPECT_EQ(flashcore_backward(handle.get(), &bad, base, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    bad = p;
    bad.dk = static_cast<char *>(p.dk) + 2;
    EXPECT_EQ(flashcore_backward(handle.get(), &bad, base, ws_bytes, nullptr), FLASHCORE_STATUS_MISALIGNED);
    bad = p;
    bad.num_heads_kv = 3;
    EXPECT_EQ(flashcore_backward(handle.get(), &bad, base, ws_bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    expect_gradients_untouched(w, poisoned, "a rejected call");
    EXPECT_EQ(ws.check("workspace"), "");

    // Exactly the size asked for, then more than that.
    for (const size_t bytes : {ws_bytes, ws_bytes + FLASHCORE_ALIGNMENT}) {
        w.poison_gradients();
        EXPECT_EQ(flashcore_backward(handle.get(), &p, base, bytes, nullptr), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(w.gradient_bits().dq != poisoned.dq) << "workspace of " << bytes << " bytes: dq not written";
    }
    EXPECT_EQ(ws.check("workspace"), "");
}

// A call that fails at its main kernel's shared-memory opt-in writes
// nothing: the opt-in comes before the preprocess, which writes each query
// row's stats into dq (audit item 9 of issue 59; at 6b7ad35 the opt-in came
// after it). FLASHCORE_TEST_FAIL_OPT_IN makes every opt-in fail.
TEST(BackwardApi, AFailedOptInWritesNothing) {
    FC_REQUIRE_GPU();
    for (const FwdCase &c : {FwdCase{bf16, 128, true, 2, 4, 2, 200, 300, Layout::kBSHD},
                             FwdCase{fp16, 64, false, 1, 8, 2, 130, 130, Layout::kBHSD}}) {
        SCOPED_TRACE(case_name(c));
        UniqueHandle plain = make_handle();
        ASSERT_TRUE(plain);
        std::mt19937_64 rng(fresh_seed());
        BwdWorkload w(c, rng);
        ASSERT_EQ(w.run_forward_pass(plain.get()), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        size_t ws_bytes = 0;
        ASSERT_EQ(flashcore_backward_workspace_size(plain.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
        GuardedBuffer ws(ws_bytes);
        ScopedEnv env({{"FLASHCORE_TEST_FAIL_OPT_IN", "1"}});
        UniqueHandle failing = make_handle();
        ASSERT_TRUE(failing);
        w.poison_gradients();
        const GradientBits poisoned = w.gradient_bits();
        const flashcore_status status = flashcore_backward(failing.get(), &w.params, ws.data, ws_bytes, nullptr);
        EXPECT_EQ(status, FLASHCORE_STATUS_CUDA_ERROR) << flashcore_last_error_message();
        EXPECT_NE(std::string(flashcore_last_error_message()).find("FLASHCORE_TEST_FAIL_OPT_IN"), std::string::npos)
            << flashcore_last_error_message();
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        expect_gradients_untouched(w, poisoned, "a failed call");
        // The handle without the variable runs the same call.
        EXPECT_EQ(flashcore_backward(plain.get(), &w.params, ws.data, ws_bytes, nullptr), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(w.gradient_bits().dq != poisoned.dq);
    }
}

}  // namespace
