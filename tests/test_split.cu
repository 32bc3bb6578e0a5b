// GPU tests of split-KV and of merging partial results:
//   - flashcore_forward with every kind of split count (1, 2, 3, odd, more
//     than the key blocks, the heuristic's) on decode shapes (seqlen_q 1..16,
//     GQA ratios 1/4/8/16, packed query heads) and small prefill grids,
//     causal with seqlen_q < seqlen_k, lengths that are not tile multiples,
//     against the float64 reference with LSE; and a full grid of decode
//     over sequences of their own lengths, which the library splits long
//     sequences of and leaves short ones whole (dense and paged caches, 16-
//     bit and e4m3);
//   - the workspace contract of flashcore.h (size, stability, too small, NULL,
//     misaligned, graph capture);
//   - flashcore_merge_states against a float64 merge, with -inf partials,
//     strided partials and every dtype, and end to end: attention over two
//     halves of the keys merged equals attention over all of them;
//   - decode on an fp8 (e4m3) K/V cache with split counts 1, 3 and the
//     heuristic's: dense and paged caches (pages of 16 and 256 keys,
//     shuffled tables whose last entry is the pool's last page), seqused_k
//     with NaN bytes past it, descale factors per tensor and per (batch,
//     head);
//   - fp8 prefill (q, k and v e4m3, out bf16, compute capability 9.0) with
//     split counts 1, 3 and the heuristic's: the merge writes bf16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "fwd/sm80/config.cuh"
#include "forward_workload.h"
#include "reference.h"
#include "test_skip.h"

using namespace flashcore_test;

namespace {

// ---------------------------------------------------------------------------
// Split-KV forward against the float64 reference.
// ---------------------------------------------------------------------------

class SplitKvTest : public testing::TestWithParam<FwdCase> {};

TEST_P(SplitKvTest, MatchesFloat64Reference) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// More than any test shape's key blocks: most splits are empty.
constexpr int kManySplits = FLASHCORE_MAX_NUM_SPLITS;

// Decode over a batch of sequences of their own lengths (seqused_k) that
// fills an H100's grid (14 x 8 packed blocks) under a bound long enough for
// the library to split anyway (src/fwd/dispatch.cpp, kRaggedDecodePartKeys):
// the long sequences are cut into parts, the short ones stay whole and
// their other splits are empty. Dense, and paged (16 and 256 keys).
std::vector<FwdCase> ragged_decode_cases(flashcore_dtype dtype, int head_dim) {
    const FwdCase ragged{dtype, head_dim, false, 14, 16, 8, 1, 8500, Layout::kBSHD};
    const std::vector<int> used = {8500, 100, 3000, 4097, 2047, 6000, 0, 1, 2049, 8000, 5000, 700, 4100, 8191};
    std::vector<FwdCase> cases;
    for (int page : {0, 16, 256}) cases.push_back(ragged.with_seqused_k(used).with_pages(page).with_splits(0));
    return cases;
}

std::vector<FwdCase> split_cases() {
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        // Decode: one query per sequence, GQA 1, 4, 8, 16 (packed heads).
        {2, 8, 8, 1, 1000, Layout::kBSHD},
        {1, 16, 4, 1, 4099, Layout::kBHSD},
        {2, 16, 2, 1, 777, Layout::kPadded},
        {1, 16, 1, 1, 300, Layout::kBSHD},
        // A few queries per sequence (speculative decoding, small chunks).
        {1, 16, 4, 3, 777, Layout::kBHSD},
        {2, 16, 2, 16, 1531, Layout::kBSHD},
        {1, 8, 8, 5, 64, Layout::kBSHD},
        // Small prefill grids (the sm_90a kernel splits these).
        {1, 4, 2, 300, 1100, Layout::kBSHD},
        {1, 2, 2, 200, 200, Layout::kBHSD},
    };
    struct HeadDims {
        int qk, v;
        bool every_split;  // else splits 2 and kManySplits only
    };
    const HeadDims head_dims[] = {{64, 64, true}, {128, 128, true}, {32, 32, false},
                                  {96, 96, false}, {192, 128, false}, {256, 256, false}};
    const int all_splits[] = {0, 1, 2, 3, 7, kManySplits};
    const int few_splits[] = {2, kManySplits};
    std::vector<FwdCase> cases;
    for (flashcore_dtype dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
        for (const HeadDims &d : head_dims)
            for (bool causal : {false, true})
                for (const Shape &s : shapes) {
                    const auto add = [&](int splits) {
                        FwdCase c{dtype, d.qk, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                  s.layout, d.v == d.qk ? 0 : d.v};
                        c.num_splits = splits;
                        cases.push_back(c);
                    };
                    if (d.every_split) {
                        for (int splits : all_splits) add(splits);
                    } else if (dtype == FLASHCORE_DTYPE_BF16) {
                        for (int splits : few_splits) add(splits);
                    }
                }
    for (const FwdCase &c : ragged_decode_cases(FLASHCORE_DTYPE_FP16, 64)) cases.push_back(c);
    // Sinks (counted once, by the merge) and chunks over every split count:
    // packed GQA decode, a few queries, a small prefill grid.
    for (int splits : all_splits) {
        FwdCase decode{FLASHCORE_DTYPE_BF16, 64, false, 2, 16, 2, 1, 1531, Layout::kBSHD};
        FwdCase few{FLASHCORE_DTYPE_FP16, 128, true, 1, 16, 4, 3, 777, Layout::kBHSD};
        FwdCase prefill{FLASHCORE_DTYPE_BF16, 128, true, 1, 4, 2, 300, 1100, Layout::kBSHD};
        decode.num_splits = few.num_splits = prefill.num_splits = splits;
        cases.push_back(decode.with_sinks());
        cases.push_back(few.with_sinks().with_chunk(256));
        cases.push_back(prefill.with_chunk(200));
        cases.push_back(prefill.with_window(128, 0).with_sinks());
    }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Splits, SplitKvTest, testing::ValuesIn(split_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// Split-KV decode on an fp8 K/V cache (kv_dtype FLASHCORE_DTYPE_FP8_E4M3),
// against the float64 attention of the dequantized cache, within the 16-bit
// dtype's bounds (support/forward_workload.h, Tolerance).
// ---------------------------------------------------------------------------

class SplitKvFp8Test : public testing::TestWithParam<FwdCase> {};

TEST_P(SplitKvFp8Test, MatchesFloat64ReferenceOfTheDequantizedCache) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// Splits 1 (none), 3 (forced, parts of uneven lengths) and 0 (the
// heuristic's) over decode shapes (GQA 1, 4, 8; packed query heads; a few
// queries per sequence, causal), fp16 and bf16 q, every kernel head dim
// (64 and 128 with every split count), each descale layout in turn; then a
// serving cache: per-sequence lengths (seqused_k: 0, 1, a page's worth plus
// one, the whole cache) whose rows past them hold NaN bytes (0x7f, 0xff),
// dense or in pages of 16 or 256 keys, shuffled, the table of the longest
// sequence ending on the pool's last page, with factors per tensor or per
// (batch, head).
std::vector<FwdCase> fp8_split_cases() {
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        {2, 8, 8, 1, 1000, Layout::kBSHD},
        {1, 16, 4, 1, 4099, Layout::kBHSD},
        {2, 16, 2, 16, 1531, Layout::kPadded},
        {1, 16, 1, 3, 300, Layout::kBSHD},
    };
    struct HeadDims {
        int qk, v;
        bool every_split;  // else 3 splits only, bf16 only
    };
    const HeadDims head_dims[] = {{64, 64, true},  {128, 128, true},  {32, 32, false},
                                  {96, 96, false}, {192, 128, false}, {256, 256, false}};
    std::vector<FwdCase> cases;
    size_t turn = 0;
    for (flashcore_dtype dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
        for (const HeadDims &d : head_dims)
            for (bool causal : {false, true})
                for (const Shape &s : shapes) {
                    if (!d.every_split && dtype != FLASHCORE_DTYPE_BF16) continue;
                    const FwdCase c{dtype, d.qk, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                    s.layout, d.v == d.qk ? 0 : d.v};
                    for (int splits : {1, 3, 0}) {
                        if (!d.every_split && splits != 3) continue;
                        cases.push_back(c.with_splits(splits).with_fp8_kv(descale_turn(turn++)));
                    }
                }

    const FwdCase serving{FLASHCORE_DTYPE_BF16, 128, false, 4, 8, 2, 1, 2048, Layout::kBSHD};
    const FwdCase serving_fp16{FLASHCORE_DTYPE_FP16, 64, true, 3, 16, 2, 2, 1000, Layout::kPadded};
    for (int splits : {1, 3, 0})
        for (int page : {0, 16, 256})
            for (Descale descale : {Descale::kPerTensor, Descale::kPerBatchHead}) {
                for (const FwdCase &c : {serving.with_seqused_k({0, 1, 257, 2048}),
                                         serving_fp16.with_seqused_k({999, 17, 1000})})
                    cases.push_back(c.with_pages(page).with_splits(splits).with_fp8_kv(descale));
            }
    for (const FwdCase &c : ragged_decode_cases(FLASHCORE_DTYPE_BF16, 128))
        cases.push_back(c.with_fp8_kv(Descale::kPerTensor));
    return cases;
}

// Instantiated as "Splits" too, so that the runs on each path
// (tests/CMakeLists.txt, TEST_FILTER "Splits/*") cover the fp8 cache.
INSTANTIATE_TEST_SUITE_P(Splits, SplitKvFp8Test, testing::ValuesIn(fp8_split_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// Split-KV fp8 prefill (dtype FLASHCORE_DTYPE_FP8_E4M3: q, k and v e4m3, out
// bf16), on compute capability 9.0 (elsewhere refused: the tests skip),
// against the float64 attention of the dequantized inputs within the fp8
// bounds (support/reference.h, kFp8PrefillModel and kFp8PrefillRelL2). The
// parts' fp32 partial results are merged into the bf16 out.
// ---------------------------------------------------------------------------

class SplitFp8PrefillTest : public testing::TestWithParam<FwdCase> {};

TEST_P(SplitFp8PrefillTest, MatchesFloat64ReferenceOfTheDequantizedInputs) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// Splits 1 (none), 3 (forced, parts of uneven lengths) and 0 (the
// heuristic's, which splits grids this small) over the fp8 kernels' head
// dims (64, 128, 256; 256 with 3 splits only), causal and not: a query
// block of a few heads over many keys, a single query row per sequence
// with GQA, a square call with lengths that are no multiple of a tile and
// padded strides; each descale layout in turn. Then a serving shape:
// seqused_k (NaN bytes past it), dense or in pages of 16 or 256 keys.
std::vector<FwdCase> fp8_prefill_split_cases() {
    constexpr auto e4m3 = FLASHCORE_DTYPE_FP8_E4M3;
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        {1, 4, 2, 300, 1100, Layout::kBSHD},
        {2, 8, 2, 1, 1531, Layout::kBHSD},
        {1, 2, 2, 200, 333, Layout::kPadded},
    };
    std::vector<FwdCase> cases;
    size_t turn = 0;
    for (int head_dim : {64, 128, 256})
        for (bool causal : {false, true})
            for (const Shape &s : shapes) {
                const FwdCase c{e4m3, head_dim, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                s.layout};
                for (int splits : {1, 3, 0}) {
                    if (head_dim == 256 && splits != 3) continue;
                    cases.push_back(c.with_splits(splits).with_fp8_q(descale_turn(turn)));
                    ++turn;
                }
            }
    const FwdCase serving{e4m3, 128, true, 3, 8, 2, 130, 2048, Layout::kBSHD};
    for (int splits : {1, 3, 0})
        for (int page : {0, 16, 256}) {
            const Descale descale = page == 16 ? Descale::kPerTensor : Descale::kPerBatchHead;
            cases.push_back(serving.with_seqused_k({2048, 129, 1000}).with_pages(page).with_splits(splits).with_fp8_q(
                descale, splits == 3));
        }
    return cases;
}

// Instantiated as "Splits" too, so that the sm_90a path's run
// (tests/CMakeLists.txt, TEST_FILTER "Splits/*") covers it.
INSTANTIATE_TEST_SUITE_P(Splits, SplitFp8PrefillTest, testing::ValuesIn(fp8_prefill_split_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// The workspace contract.
// ---------------------------------------------------------------------------

FwdCase decode_case(int num_splits) {
    FwdCase c{FLASHCORE_DTYPE_FP16, 128, false, 2, 16, 4, 1, 2000, Layout::kBSHD};
    c.num_splits = num_splits;
    return c;
}

size_t workspace_size(flashcore_handle h, const flashcore_forward_params &p) {
    size_t bytes = 0;
    EXPECT_EQ(flashcore_forward_workspace_size(h, &p, &bytes), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    return bytes;
}

// Device memory between guard bands (support/device_tensors.h).
using DeviceBuffer = GuardedBuffer;

TEST(SplitWorkspace, SizeFollowsTheSplitAndIsStable) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    Workload w(decode_case(4), rng);
    const FwdCase &c = w.c;
    const size_t bytes = workspace_size(handle.get(), w.params);
    // Four parts of every row's fp32 output and LSE.
    const size_t rows = size_t(c.batch) * c.heads_q * c.seqlen_q;
    EXPECT_GE(bytes, 4 * rows * (c.value_dim() + 1) * sizeof(float));
    EXPECT_EQ(workspace_size(handle.get(), w.params), bytes) << "same params, same size";
    // Pointers, strides and the scale do not change it.
    flashcore_forward_params moved = w.params;
    moved.q = nullptr;
    moved.out = nullptr;
    moved.softmax_scale = 0.3f;
    moved.q_seq_stride += 64;
    EXPECT_EQ(workspace_size(handle.get(), moved), bytes);
    // More splits, more workspace; none without a split.
    flashcore_forward_params more = w.params;
    more.num_splits = 8;
    EXPECT_GT(workspace_size(handle.get(), more), bytes);
    flashcore_forward_params unsplit = w.params;
    unsplit.num_splits = 1;
    EXPECT_EQ(workspace_size(handle.get(), unsplit), 0u);
}

// One query per sequence, GQA 32/8, head dim 128: a decode call's
// parameters for workspace queries (no tensors).
flashcore_forward_params decode_params(int batch, int seqlen_k) {
    flashcore_forward_params p;
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.batch_size = batch;
    p.num_heads_q = 32;
    p.num_heads_kv = 8;
    p.seqlen_q = 1;
    p.seqlen_k = seqlen_k;
    p.head_dim = 128;
    return p;
}

TEST(SplitWorkspace, HeuristicSplitsDecodeButNotAFullGrid) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    flashcore_forward_params p = decode_params(1, 32768);
    EXPECT_GT(workspace_size(handle.get(), p), 0u) << "one query over 32k keys should split";
    p.batch_size = 16;
    p.seqlen_q = p.seqlen_k = 4096;
    EXPECT_EQ(workspace_size(handle.get(), p), 0u) << "a grid of many waves should not split";
}

// The shared memory per block calls on this device are planned with: the
// device's opt-in limit, or FLASHCORE_TEST_SMEM_PER_BLOCK's where set.
size_t planning_smem_per_block() {
    int device = 0, optin = 0;
    FC_CHECK_CUDA(cudaGetDevice(&device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const char *lowered = std::getenv("FLASHCORE_TEST_SMEM_PER_BLOCK");
    return lowered != nullptr && *lowered != '\0' ? std::strtoull(lowered, nullptr, 10) : size_t(optin);
}

// Splits by length are the decode tiles' (src/fwd/dispatch.cpp,
// ragged_decode_splits): where those do not fit at head dim 128 (an
// A100's 163 KiB, sm_86/sm_89's 99 KiB), decode runs on the key split,
// unsplit by length, and the premise of this test does not hold.
TEST(SplitWorkspace, HeuristicSplitsRaggedDecodeOverLongBounds) {
    FC_REQUIRE_GPU();
    using DecodeTile = flashcore::FwdConfig<flashcore::DType::kFp16, flashcore::DType::kFp16, flashcore::DType::kFp16,
                                            128, 128, flashcore::FwdVariant::kDecode>::Traits;
    if (planning_smem_per_block() < DecodeTile::kSmemBytes) {
        GTEST_SKIP() << "GPU test skipped: the head-dim-128 decode tiles need " << DecodeTile::kSmemBytes
                     << " bytes of shared memory per block; calls here are planned with " << planning_smem_per_block();
    }
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    flashcore_forward_params p = decode_params(32, 16384);
    EXPECT_EQ(workspace_size(handle.get(), p), 0u) << "a full grid of equal sequences should not split";
    DeviceBuffer seqused(size_t(p.batch_size) * sizeof(int32_t));
    p.seqused_k = static_cast<const int32_t *>(seqused.data);
    EXPECT_GT(workspace_size(handle.get(), p), 0u)
        << "sequences of their own lengths up to 16k keys should split (the longest sets an unsplit grid's time)";
    p.seqlen_k = 2048;
    EXPECT_EQ(workspace_size(handle.get(), p), 0u) << "sequences of at most 2k keys should not split a full grid";
}

// Poisons a workload's outputs and, at the end of a test of refused calls,
// checks that none of them wrote out or lse.
class OutputsUntouched {
  public:
    explicit OutputsUntouched(Workload &w) : w_(w) {
        w_.poison_outputs();
        out_ = w_.out_bits();
        lse_ = w_.lse_host();
    }
    void expect_untouched() const {
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(w_.out_bits() == out_) << "a refused call wrote out";
        const std::vector<float> lse_after = w_.lse_host();
        EXPECT_EQ(std::memcmp(lse_after.data(), lse_.data(), lse_after.size() * sizeof(float)), 0)
            << "a refused call wrote lse";
    }

  private:
    Workload &w_;
    std::vector<uint16_t> out_;
    std::vector<float> lse_;
};

TEST(SplitWorkspace, TooSmallNullAndMisalignedAreRefusedWritingNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    Workload w(decode_case(3), rng);
    const size_t bytes = workspace_size(handle.get(), w.params);
    ASSERT_GT(bytes, 0u);
    DeviceBuffer ws(bytes + 64);
    const OutputsUntouched outputs(w);

    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, ws.data, bytes - 1, nullptr),
              FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("workspace_bytes (" + std::to_string(bytes - 1)),
              std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, 0, nullptr), FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("workspace is NULL"), std::string::npos);
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, static_cast<char *>(ws.data) + 8, bytes, nullptr),
              FLASHCORE_STATUS_MISALIGNED);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("16-byte aligned"), std::string::npos);
    outputs.expect_untouched();

    // A larger, aligned workspace works; an unsplit call needs none.
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, static_cast<char *>(ws.data) + 16, bytes + 48, nullptr),
              FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    w.params.num_splits = 1;
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, 0, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());
}

// A workspace that overlaps any tensor of the call (from its first byte on,
// or ending 16 bytes into it) is refused, naming it and what it overlaps,
// before anything is queued.
TEST(SplitWorkspace, OverlappingATensorIsRefusedWritingNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    Workload w(decode_case(3), rng);
    const size_t bytes = workspace_size(handle.get(), w.params);
    ASSERT_GT(bytes, 0u);
    ASSERT_NE(w.params.lse, nullptr);
    const OutputsUntouched outputs(w);
    const struct {
        const char *name;
        const void *data;
    } tensors[] = {{"q", w.params.q}, {"k", w.params.k}, {"v", w.params.v}, {"out", w.params.out},
                   {"lse", w.params.lse}};
    for (const auto &t : tensors) {
        const uintptr_t at = reinterpret_cast<uintptr_t>(t.data);
        ASSERT_EQ(at % FLASHCORE_ALIGNMENT, 0u) << t.name;
        // The workspace starting at the tensor, and ending 16 bytes into it.
        for (uintptr_t begin : {at, at + FLASHCORE_ALIGNMENT - ((bytes + FLASHCORE_ALIGNMENT - 1) /
                                                                FLASHCORE_ALIGNMENT * FLASHCORE_ALIGNMENT)}) {
            void *workspace = reinterpret_cast<void *>(begin);
            EXPECT_EQ(flashcore_forward(handle.get(), &w.params, workspace, bytes, nullptr),
                      FLASHCORE_STATUS_INVALID_ARGUMENT)
                << t.name << " at " << begin - at;
            // It names the workspace and the first tensor it overlaps (which
            // may be another one: the workspace reaches past this one, and
            // the allocations lie in no set order).
            const std::string message = flashcore_last_error_message();
            EXPECT_EQ(message.rfind("the workspace (bytes 0x", 0), 0u) << message;
            EXPECT_NE(message.find(") overlaps "), std::string::npos) << message;
        }
    }
    outputs.expect_untouched();
}

// A split call captured into a graph replays to the same bits as a direct
// call: both kernels and the workspace are captured.
TEST(SplitWorkspace, CapturedSplitCallReplaysIdentically) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    std::mt19937_64 rng(fresh_seed());
    Workload w(decode_case(5), rng);
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const std::vector<uint16_t> direct = w.out_bits();

    const size_t bytes = workspace_size(handle.get(), w.params);
    DeviceBuffer ws(bytes);
    cudaStream_t stream;
    FC_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    FC_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const flashcore_status status = flashcore_forward(handle.get(), &w.params, ws.data, bytes, stream);
    FC_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(status, FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    cudaGraphExec_t exec;
    FC_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
        w.poison_outputs();
        FC_CHECK_CUDA(cudaGraphLaunch(exec, stream));
        FC_CHECK_CUDA(cudaStreamSynchronize(stream));
        EXPECT_TRUE(w.out_bits() == direct) << "replay " << replay;
    }
    FC_CHECK_CUDA(cudaGraphExecDestroy(exec));
    FC_CHECK_CUDA(cudaGraphDestroy(graph));
    FC_CHECK_CUDA(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------
// flashcore_merge_states.
// ---------------------------------------------------------------------------

size_t dtype_bytes(flashcore_dtype dtype) { return dtype == FLASHCORE_DTYPE_FP32 ? 4 : 2; }

const char *dtype_name(flashcore_dtype dtype) {
    switch (dtype) {
        case FLASHCORE_DTYPE_FP16: return "fp16";
        case FLASHCORE_DTYPE_BF16: return "bf16";
        case FLASHCORE_DTYPE_FP32: return "fp32";
        case FLASHCORE_DTYPE_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

float round_value(flashcore_dtype dtype, float x) {
    return dtype == FLASHCORE_DTYPE_FP32 ? x : round_to(dtype, x);
}

// Host values of `dtype` as the bytes the device reads.
std::vector<unsigned char> encode(flashcore_dtype dtype, const std::vector<float> &values) {
    std::vector<unsigned char> bytes(values.size() * dtype_bytes(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == FLASHCORE_DTYPE_FP32) {
            std::memcpy(&bytes[i * 4], &values[i], 4);
        } else {
            const uint16_t bits = to_bits(dtype, values[i]);
            std::memcpy(&bytes[i * 2], &bits, 2);
        }
    }
    return bytes;
}

std::vector<float> decode(flashcore_dtype dtype, const std::vector<unsigned char> &bytes) {
    std::vector<float> values(bytes.size() / dtype_bytes(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == FLASHCORE_DTYPE_FP32) {
            std::memcpy(&values[i], &bytes[i * 4], 4);
        } else {
            uint16_t bits;
            std::memcpy(&bits, &bytes[i * 2], 2);
            values[i] = from_bits(dtype, bits);
        }
    }
    return values;
}

// The rounding error a merged value of magnitude <= 1 may carry in `dtype`,
// plus the fp32 accumulation's.
double merge_tolerance(flashcore_dtype dtype) {
    switch (dtype) {
        case FLASHCORE_DTYPE_FP16: return 1e-3;  // half an ulp at 1 is 4.9e-4
        case FLASHCORE_DTYPE_BF16: return 8e-3;  // 3.9e-3
        case FLASHCORE_DTYPE_FP32: return 1e-5;
        case FLASHCORE_DTYPE_FP8_E4M3: break;  // not a merge dtype
    }
    return 0;
}

struct MergeCase {
    int num_states;
    flashcore_dtype partial_dtype;
    flashcore_dtype out_dtype;
    bool write_lse;
    // flashcore_merge_params::sinks: a logit per head (head 0 none: -inf).
    bool sinks = false;
};

std::string merge_case_name(const MergeCase &c) {
    return "k" + std::to_string(c.num_states) + "_" + dtype_name(c.partial_dtype) + "_to_" + dtype_name(c.out_dtype) +
           (c.write_lse ? "_lse" : "_nolse") + (c.sinks ? "_sinks" : "");
}

class MergeTest : public testing::TestWithParam<MergeCase> {};

// Partials laid out [batch][seqlen][state][head][dim] (the state between
// the other dimensions, as a gather from several devices gives), LSE
// [state][batch][head][seqlen]. About a fifth of the partial rows are empty
// (LSE -inf, O NaN: never read), and one row is empty in every state (out
// 0, lse -inf, or the head's sink with sinks: one more state of output 0,
// counted once).
TEST_P(MergeTest, MatchesFloat64Merge) {
    FC_REQUIRE_GPU();
    const MergeCase c = GetParam();
    const int batch = 2, heads = 3, seqlen = 37, dim = 72;
    const int k = c.num_states;
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> value(-1.f, 1.f), lse_value(-4.f, 6.f), chance(0.f, 1.f);

    const int64_t p_head = dim, p_state = int64_t(heads) * dim, p_seq = k * p_state, p_batch = seqlen * p_seq;
    const int64_t l_seq = 1, l_head = seqlen, l_batch = int64_t(heads) * seqlen, l_state = batch * l_batch;
    std::vector<float> partial(size_t(batch) * p_batch), lse(size_t(k) * l_state);
    for (float &x : partial) x = round_value(c.partial_dtype, value(rng));
    for (float &x : lse) x = chance(rng) < 0.2f && k > 1 ? -INFINITY : lse_value(rng);
    std::vector<float> sinks(heads, -INFINITY);
    for (int h = 1; h < heads && c.sinks; ++h) sinks[h] = lse_value(rng);
    const int empty_b = 1, empty_h = 2, empty_s = 5;
    for (int s = 0; s < k; ++s) lse[s * l_state + empty_b * l_batch + empty_h * l_head + empty_s * l_seq] = -INFINITY;
    for (int s = 0; s < k; ++s)
        for (int b = 0; b < batch; ++b)
            for (int h = 0; h < heads; ++h)
                for (int i = 0; i < seqlen; ++i) {
                    if (lse[s * l_state + b * l_batch + h * l_head + i * l_seq] != -INFINITY) continue;
                    for (int d = 0; d < dim; ++d) {
                        partial[b * p_batch + i * p_seq + s * p_state + h * p_head + d] =
                            std::numeric_limits<float>::quiet_NaN();
                    }
                }

    // float64 merge.
    const size_t rows = size_t(batch) * heads * seqlen;
    std::vector<double> ref_out(rows * dim), ref_lse(rows);
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < seqlen; ++i) {
                const size_t row = (size_t(b) * heads + h) * seqlen + i;
                double max_lse = sinks[h];
                for (int s = 0; s < k; ++s)
                    max_lse = std::max(max_lse, double(lse[s * l_state + b * l_batch + h * l_head + i * l_seq]));
                double total = std::exp(double(sinks[h]) - max_lse);
                for (int s = 0; s < k; ++s)
                    total += std::exp(double(lse[s * l_state + b * l_batch + h * l_head + i * l_seq]) - max_lse);
                const double merged = max_lse == -INFINITY ? -INFINITY : max_lse + std::log(total);
                ref_lse[row] = merged;
                for (int d = 0; d < dim; ++d) {
                    double acc = 0;
                    for (int s = 0; s < k && merged != -INFINITY; ++s) {
                        const double w = std::exp(double(lse[s * l_state + b * l_batch + h * l_head + i * l_seq]) - merged);
                        if (w > 0) acc += w * partial[b * p_batch + i * p_seq + s * p_state + h * p_head + d];
                    }
                    ref_out[row * dim + d] = acc;
                }
            }

    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const std::vector<unsigned char> partial_bytes = encode(c.partial_dtype, partial);
    DeviceBuffer d_partial(partial_bytes.size()), d_lse(lse.size() * 4), d_out(rows * dim * dtype_bytes(c.out_dtype)),
        d_out_lse(rows * 4), d_sinks(heads * 4);
    FC_CHECK_CUDA(cudaMemcpy(d_sinks.data, sinks.data(), heads * 4, cudaMemcpyHostToDevice));
    FC_CHECK_CUDA(cudaMemcpy(d_partial.data, partial_bytes.data(), partial_bytes.size(), cudaMemcpyHostToDevice));
    FC_CHECK_CUDA(cudaMemcpy(d_lse.data, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
    FC_CHECK_CUDA(cudaMemset(d_out.data, 0xFF, rows * dim * dtype_bytes(c.out_dtype)));
    FC_CHECK_CUDA(cudaMemset(d_out_lse.data, 0xFF, rows * 4));

    flashcore_merge_params p;
    ASSERT_EQ(flashcore_merge_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.partial_dtype = c.partial_dtype;
    p.out_dtype = c.out_dtype;
    p.num_states = k;
    p.batch_size = batch;
    p.num_heads = heads;
    p.seqlen = seqlen;
    p.head_dim = dim;
    p.partial_out = d_partial.data;
    p.partial_lse = static_cast<const float *>(d_lse.data);
    p.out = d_out.data;
    p.lse = c.write_lse ? static_cast<float *>(d_out_lse.data) : nullptr;
    p.sinks = c.sinks ? static_cast<const float *>(d_sinks.data) : nullptr;
    p.partial_state_stride = p_state;
    p.partial_batch_stride = p_batch;
    p.partial_seq_stride = p_seq;
    p.partial_head_stride = p_head;
    p.lse_state_stride = l_state;
    p.lse_batch_stride = l_batch;
    p.lse_seq_stride = l_seq;
    p.lse_head_stride = l_head;
    p.out_head_stride = int64_t(seqlen) * dim;  // [batch][head][seqlen][dim]
    p.out_seq_stride = dim;
    p.out_batch_stride = int64_t(heads) * seqlen * dim;
    ASSERT_EQ(flashcore_merge_states(handle.get(), &p, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());

    std::vector<unsigned char> out_bytes(rows * dim * dtype_bytes(c.out_dtype));
    FC_CHECK_CUDA(cudaMemcpy(out_bytes.data(), d_out.data, out_bytes.size(), cudaMemcpyDeviceToHost));
    const std::vector<float> out = decode(c.out_dtype, out_bytes);
    const ErrorStats e = compare(out, ref_out);
    std::printf("[ errors ] merge %s seed=%llu max_abs=%.3e\n", merge_case_name(c).c_str(),
                static_cast<unsigned long long>(seed), e.max_abs);
    EXPECT_EQ(e.non_finite, 0u) << "NaN from an empty partial leaked, or an element was not written";
    EXPECT_LE(e.max_abs, merge_tolerance(c.out_dtype));
    const size_t empty_row = (size_t(empty_b) * heads + empty_h) * seqlen + empty_s;
    for (int d = 0; d < dim; ++d) EXPECT_EQ(out[empty_row * dim + d], 0.f) << "a row no state saw is 0";
    std::vector<float> out_lse(rows);
    FC_CHECK_CUDA(cudaMemcpy(out_lse.data(), d_out_lse.data, rows * 4, cudaMemcpyDeviceToHost));
    if (c.write_lse) {
        const ErrorStats e_lse = compare(out_lse, ref_lse);
        EXPECT_EQ(e_lse.non_finite, 0u);
        EXPECT_EQ(e_lse.mismatched_inf, 0u) << "the row no state saw has lse -inf (no sink)";
        EXPECT_LE(e_lse.max_abs, 1e-5);
    } else {
        for (float x : out_lse) ASSERT_TRUE(std::isnan(x)) << "lse was written although NULL was passed";
    }
    EXPECT_EQ(d_out.check("out"), "");
    EXPECT_EQ(d_out_lse.check("lse"), "");
    EXPECT_EQ(d_partial.check("partial_out"), "");
    EXPECT_EQ(d_lse.check("partial_lse"), "");
}

std::vector<MergeCase> merge_cases() {
    std::vector<MergeCase> cases;
    for (int k : {1, 2, 3, 5})
        for (flashcore_dtype in : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
            for (flashcore_dtype out : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP32})
                cases.push_back({k, in, out, !(k == 3 && out == FLASHCORE_DTYPE_FP32)});
    for (int k : {1, 3})
        for (flashcore_dtype in : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_BF16})
            cases.push_back({k, in, FLASHCORE_DTYPE_BF16, true, true});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(States, MergeTest, testing::ValuesIn(merge_cases()),
                         [](const testing::TestParamInfo<MergeCase> &info) { return merge_case_name(info.param); });

// Attention over all the keys equals attention over each half of them
// (separate calls, each with its LSE) merged. The partials pass through fp16
// once more than a direct call's output, so the bound is twice the usual.
TEST(MergeStates, TwoHalvesOfTheKeysMergeToTheWhole) {
    FC_REQUIRE_GPU();
    const flashcore_dtype dtype = FLASHCORE_DTYPE_FP16;
    FwdCase c{dtype, 128, false, 2, 16, 4, 7, 1500, Layout::kBSHD};
    const int first_keys = 611;
    std::mt19937_64 rng(fresh_seed());
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    Workload w(c, rng);

    const size_t rows = size_t(c.batch) * c.heads_q * c.seqlen_q;
    const int dv = c.value_dim();
    // Both halves' outputs stacked as [2][batch][head][seqlen][dv], their LSE
    // as [2][batch][head][seqlen].
    DeviceBuffer parts(2 * rows * dv * 2), part_lse(2 * rows * 4);
    for (int half = 0; half < 2; ++half) {
        flashcore_forward_params p = w.params;
        const int first = half == 0 ? 0 : first_keys;
        p.seqlen_k = half == 0 ? first_keys : c.seqlen_k - first_keys;
        p.k = static_cast<const __half *>(w.dk.data) + first * w.dk.seq_stride;
        p.v = static_cast<const __half *>(w.dv.data) + first * w.dv.seq_stride;
        p.out = static_cast<__half *>(parts.data) + half * rows * dv;
        p.out_seq_stride = dv;
        p.out_head_stride = int64_t(c.seqlen_q) * dv;
        p.out_batch_stride = int64_t(c.heads_q) * c.seqlen_q * dv;
        p.lse = static_cast<float *>(part_lse.data) + half * rows;
        ASSERT_EQ(run_forward(handle.get(), p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    }
    flashcore_merge_params m;
    ASSERT_EQ(flashcore_merge_params_init(&m, sizeof m), FLASHCORE_STATUS_SUCCESS);
    m.partial_dtype = dtype;
    m.out_dtype = dtype;
    m.num_states = 2;
    m.batch_size = c.batch;
    m.num_heads = c.heads_q;
    m.seqlen = c.seqlen_q;
    m.head_dim = dv;
    m.partial_out = parts.data;
    m.partial_lse = static_cast<const float *>(part_lse.data);
    m.partial_state_stride = int64_t(rows) * dv;
    m.partial_batch_stride = int64_t(c.heads_q) * c.seqlen_q * dv;
    m.partial_head_stride = int64_t(c.seqlen_q) * dv;
    m.partial_seq_stride = dv;
    m.lse_state_stride = int64_t(rows);
    m.lse_batch_stride = int64_t(c.heads_q) * c.seqlen_q;
    m.lse_head_stride = c.seqlen_q;
    m.lse_seq_stride = 1;
    m.out = w.params.out;
    m.out_batch_stride = w.params.out_batch_stride;
    m.out_seq_stride = w.params.out_seq_stride;
    m.out_head_stride = w.params.out_head_stride;
    m.lse = w.params.lse;
    w.poison_outputs();
    ASSERT_EQ(flashcore_merge_states(handle.get(), &m, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());

    std::vector<double> ref_out, ref_lse;
    reference_attention(w.problem, w.q, w.k, w.v, ref_out, ref_lse);
    const ErrorStats e = compare(w.dout.download(dtype), ref_out);
    const ErrorStats e_lse = compare(w.lse_host(), ref_lse);
    const Tolerance tol = tolerance_for(dtype);
    EXPECT_EQ(e.non_finite, 0u);
    EXPECT_LE(e.rel_l2, 2 * tol.rel_l2);
    EXPECT_LE(e.max_abs, 2 * tol.max_abs);
    EXPECT_LE(e_lse.max_abs, tol.lse_max_abs);
}

// Bad merge parameters: a specific status and message, nothing queued.
TEST(MergeStates, BadParametersAreRefused) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    DeviceBuffer partial(4096), lse(1024), out(4096);
    flashcore_merge_params good;
    ASSERT_EQ(flashcore_merge_params_init(&good, sizeof good), FLASHCORE_STATUS_SUCCESS);
    good.num_states = 2;
    good.batch_size = 1;
    good.num_heads = 2;
    good.seqlen = 4;
    good.head_dim = 16;
    good.partial_out = partial.data;
    good.partial_lse = static_cast<const float *>(lse.data);
    good.out = out.data;
    good.partial_state_stride = 2 * 4 * 16;
    good.partial_head_stride = 4 * 16;
    good.partial_seq_stride = 16;
    good.lse_state_stride = 8;
    good.lse_head_stride = 4;
    good.lse_seq_stride = 1;
    good.out_head_stride = 4 * 16;
    good.out_seq_stride = 16;
    FC_CHECK_CUDA(cudaMemset(out.data, 0x7F, 4096));
    ASSERT_EQ(flashcore_merge_states(handle.get(), &good, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    FC_CHECK_CUDA(cudaMemset(out.data, 0x7F, 4096));

    struct Bad {
        const char *what;
        void (*mutate)(flashcore_merge_params &);
        flashcore_status expected;
        const char *message_part;
    };
    const Bad bad[] = {
        {"null params", nullptr, FLASHCORE_STATUS_INVALID_ARGUMENT, "params is NULL"},
        {"partial dtype", [](auto &p) { p.partial_dtype = 9; }, FLASHCORE_STATUS_UNSUPPORTED, "partial_dtype 9"},
        {"out dtype", [](auto &p) { p.out_dtype = 0; }, FLASHCORE_STATUS_UNSUPPORTED, "FLASHCORE_DTYPE_FP32"},
        {"no states", [](auto &p) { p.num_states = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "num_states (0)"},
        {"head dim", [](auto &p) { p.head_dim = 12; }, FLASHCORE_STATUS_UNSUPPORTED, "multiple of 8"},
        {"null partial", [](auto &p) { p.partial_out = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
         "partial_out is NULL"},
        {"null lse", [](auto &p) { p.partial_lse = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
         "partial_lse is NULL"},
        {"null out", [](auto &p) { p.out = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "out is NULL"},
        {"misaligned out", [](auto &p) { p.out = static_cast<char *>(p.out) + 8; }, FLASHCORE_STATUS_MISALIGNED,
         "16-byte aligned"},
        {"misaligned stride", [](auto &p) { p.partial_seq_stride = 20; }, FLASHCORE_STATUS_MISALIGNED,
         "partial_seq_stride (20)"},
        {"negative lse stride", [](auto &p) { p.lse_head_stride = -4; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
         "lse_head_stride (-4)"},
        {"overlapping out", [](auto &p) { p.out_seq_stride = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
         "make elements overlap"},
        {"struct size", [](auto &p) { p.struct_size = 8; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
         "sizeof(flashcore_merge_params)"},
    };
    for (const Bad &b : bad) {
        flashcore_merge_params p = good;
        if (b.mutate != nullptr) b.mutate(p);
        EXPECT_EQ(flashcore_merge_states(handle.get(), b.mutate != nullptr ? &p : nullptr, nullptr), b.expected)
            << b.what;
        EXPECT_NE(std::string(flashcore_last_error_message()).find(b.message_part), std::string::npos)
            << b.what << ": " << flashcore_last_error_message();
    }
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<unsigned char> host(4096);
    FC_CHECK_CUDA(cudaMemcpy(host.data(), out.data, host.size(), cudaMemcpyDeviceToHost));
    for (unsigned char byte : host) ASSERT_EQ(byte, 0x7F) << "a refused merge wrote out";
}

}  // namespace
