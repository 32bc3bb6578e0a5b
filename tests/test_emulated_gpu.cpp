// Planning tested for every GPU without one (issue 59): handles made under
// FLASHCORE_TEST_EMULATE_GPU stand for an A100, an A10 (sm_86), an L4
// (sm_89), an H100 and an H200 without a driver. Their calls are planned,
// their kernels chosen and their workspaces, shared memory and grids
// checked as on that GPU, and where they would launch they return
// FLASHCORE_STATUS_NO_DEVICE with a message naming the plan. What
// flashcore_*_check accepts must plan on every GPU: never INTERNAL, never a
// device-dependent refusal but the documented ones (fp8 queries need the
// sm_90a kernels). Fake device addresses: nothing is dereferenced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "flashcore.h"
#include "scoped_env.h"

namespace {



// The GPUs the variable takes, with their compute capability major.
const struct {
    const char *name;
    int cc_major;
    size_t max_smem_per_block;  // what a block may opt in to
} kGpus[] = {{"a100", 8, 166912}, {"a10", 8, 101376}, {"l4", 8, 101376}, {"h100", 9, 232448}, {"h200", 9, 232448}};

// 2^40 bytes apart: more than any tensor here (a decode cache of 131072 keys), so none overlap.
void *fake_tensor(int i) { return reinterpret_cast<void *>((uintptr_t(i) + 1) << 40); }

// A handle for an emulated GPU, destroyed with the object.
struct EmulatedHandle {
    flashcore_handle handle = nullptr;
    explicit EmulatedHandle(const char *gpu) {
        ScopedEnv env({{"FLASHCORE_TEST_EMULATE_GPU", gpu}});
        EXPECT_EQ(flashcore_create(&handle), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    }
    ~EmulatedHandle() { EXPECT_EQ(flashcore_destroy(handle), FLASHCORE_STATUS_SUCCESS); }
};

std::vector<std::pair<int32_t, int32_t>> supported_pairs() {
    size_t count = 0;
    EXPECT_EQ(flashcore_supported_head_dims(nullptr, nullptr, 0, &count), FLASHCORE_STATUS_SUCCESS);
    std::vector<int32_t> dims(count), dims_v(count);
    EXPECT_EQ(flashcore_supported_head_dims(dims.data(), dims_v.data(), count, &count), FLASHCORE_STATUS_SUCCESS);
    std::vector<std::pair<int32_t, int32_t>> pairs;
    for (size_t i = 0; i < count; ++i) pairs.push_back({dims[i], dims_v[i]});
    return pairs;
}

// Whether a call on an emulated handle reached the launch: the status and
// message emulated_launch gives.
testing::AssertionResult planned(flashcore_status status, const char *gpu) {
    const std::string message = flashcore_last_error_message();
    const std::string expected = std::string("emulated ") + gpu + " (FLASHCORE_TEST_EMULATE_GPU): planned ";
    if (status == FLASHCORE_STATUS_NO_DEVICE && message.rfind(expected, 0) == 0) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "status " << status << ": " << message;
}

// The forms of a forward call the tests plan: each a change to dense,
// contiguous [B, S, H, D] params.
struct ForwardForm {
    const char *name;
    int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    bool causal = false;
    int32_t num_splits = 0;
    bool varlen = false;
    int32_t page_size = 0;
    bool window = false;
    float softcap = 0.f;
    bool fp8_kv = false;
    bool fp8_q = false;
    bool seqused_k = false;
    int32_t attention_chunk = 0;  // 0.9
    bool sinks = false;           // 0.9
};

const ForwardForm kForwardForms[] = {
    {"prefill", 2, 1024, 1024, 8, 8, true},
    {"prefill_gqa", 1, 4096, 4096, 32, 8, true},
    {"short_ragged", 3, 100, 333, 8, 2},
    {"decode_gqa", 4, 1, 8192, 32, 8},
    {"decode_long", 1, 1, 131072, 8, 1},
    {"split4", 2, 64, 4096, 8, 2, false, 4},
    {"varlen", 3, 700, 900, 8, 2, true, 0, true},
    {"varlen_decode", 8, 1, 4096, 16, 4, false, 0, true},
    {"paged", 2, 128, 2048, 8, 2, true, 0, false, 64},
    {"paged_decode", 16, 1, 4096, 32, 8, false, 0, false, 16},
    {"varlen_paged", 2, 128, 2048, 8, 8, true, 0, true, 256},
    {"window", 2, 2048, 2048, 8, 8, true, 0, false, 0, true},
    {"softcap", 2, 512, 512, 8, 8, false, 0, false, 0, false, 30.f},
    {"seqused_k", 4, 16, 2048, 8, 2, false, 0, false, 0, false, 0.f, false, false, true},
    {"fp8_kv_decode", 4, 1, 4096, 32, 8, false, 0, false, 0, false, 0.f, true},
    {"fp8_kv_prefill", 1, 1024, 1024, 8, 8, true, 0, false, 0, false, 0.f, true},
    {"fp8_prefill", 2, 1024, 1024, 8, 8, true, 0, false, 0, false, 0.f, true, true},
    // 0.9: chunked attention (Llama 4's, causal) and learnable sinks (gpt-oss's), with GQA, splits, pages and
    // windows; a chunk shorter than a tile; an fp8 cache and fp8 queries.
    {"chunked", 1, 4096, 4096, 32, 8, true, 0, false, 0, false, 0.f, false, false, false, 1024},
    {"chunked_decode", 4, 1, 16384, 32, 8, false, 0, false, 0, false, 0.f, false, false, true, 8192},
    {"chunked_short", 2, 300, 300, 8, 8, true, 0, false, 0, false, 0.f, false, false, false, 5},
    {"sinks", 2, 512, 512, 64, 8, true, 0, false, 0, false, 0.f, false, false, false, 0, true},
    {"sinks_split4", 2, 64, 4096, 8, 2, false, 4, false, 0, false, 0.f, false, false, false, 0, true},
    {"sinks_window", 2, 2048, 2048, 8, 8, true, 0, false, 0, true, 0.f, false, false, false, 0, true},
    {"chunked_sinks_paged", 2, 128, 2048, 8, 2, true, 0, false, 64, false, 0.f, false, false, false, 512, true},
    {"chunked_sinks_varlen", 3, 700, 900, 8, 2, true, 0, true, 0, false, 0.f, false, false, false, 256, true},
    {"chunked_sinks_fp8_kv", 4, 1, 4096, 32, 8, false, 0, false, 0, false, 0.f, true, false, false, 1024, true},
    {"chunked_sinks_fp8", 2, 1024, 1024, 8, 8, true, 0, false, 0, false, 0.f, true, true, false, 256, true},
};

// The sizes and options forward and backward params share, from a form.
template <typename Params, typename Form>
void set_shape(Params &p, const Form &f, int32_t d, int32_t dv) {
    p.batch_size = f.batch;
    p.seqlen_q = f.seqlen_q;
    p.seqlen_k = f.seqlen_k;
    p.num_heads_q = f.heads_q;
    p.num_heads_kv = f.heads_kv;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.causal = f.causal;
    p.softcap = f.softcap;
}

// The params of form f at head dims (d, dv), dtype `dtype`.
flashcore_forward_params forward_params(const ForwardForm &f, int32_t d, int32_t dv, int32_t dtype) {
    flashcore_forward_params p;
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.dtype = f.fp8_q ? FLASHCORE_DTYPE_FP8_E4M3 : dtype;
    set_shape(p, f, d, dv);
    p.num_splits = f.num_splits;
    if (f.window) {
        p.use_window = 1;
        p.window_left = 256;
        p.window_right = 0;
    }
    if (f.fp8_kv || f.fp8_q) {
        p.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
        p.k_descale = static_cast<const float *>(fake_tensor(10));
        p.v_descale = static_cast<const float *>(fake_tensor(11));
    }
    if (f.fp8_q) {
        p.out_dtype = FLASHCORE_DTYPE_BF16;
        p.q_descale = static_cast<const float *>(fake_tensor(12));
    }
    p.q = fake_tensor(0);
    p.k = fake_tensor(1);
    p.v = fake_tensor(2);
    p.out = fake_tensor(3);
    p.lse = static_cast<float *>(fake_tensor(4));
    if (f.varlen) {
        p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(5));
        p.total_seqlen_q = f.batch * f.seqlen_q * 2 / 3 + 1;
        if (f.page_size == 0) {
            p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(6));
            p.total_seqlen_k = f.batch * f.seqlen_k * 2 / 3 + 1;
        }
    }
    if (f.page_size > 0) {
        p.block_table = static_cast<const int32_t *>(fake_tensor(7));
        p.page_size = f.page_size;
        p.num_pages = f.batch * (f.seqlen_k / f.page_size) + 3;
        p.block_table_batch_stride = (f.seqlen_k + f.page_size - 1) / f.page_size;
        p.seqused_k = static_cast<const int32_t *>(fake_tensor(8));
    }
    if (f.seqused_k) p.seqused_k = static_cast<const int32_t *>(fake_tensor(8));
    p.attention_chunk = f.attention_chunk;
    if (f.sinks) p.sinks = static_cast<const float *>(fake_tensor(9));
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << f.name << ": " << flashcore_last_error_message();
    if (d > dv && dv >= 512) {  // MLA's latent cache (576 x 512): v is k's view
        p.v = p.k;
        p.v_batch_stride = p.k_batch_stride;
        p.v_seq_stride = p.k_seq_stride;
        p.v_head_stride = p.k_head_stride;
    }
    return p;
}

// flashcore_forward of checked params on an emulated handle: the workspace
// query and the call, with a fake workspace of the size asked for.
flashcore_status forward_on(flashcore_handle h, const flashcore_forward_params &p, size_t *workspace_bytes) {
    flashcore_status status = flashcore_forward_workspace_size(h, &p, workspace_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    return flashcore_forward(h, &p, *workspace_bytes ? fake_tensor(20) : nullptr, *workspace_bytes, nullptr);
}

}  // namespace

TEST(EmulatedGpu, HandlesStandForTheirGpuWithoutADriver) {
    for (const auto &gpu : kGpus) {
        EmulatedHandle h(gpu.name);
        ASSERT_NE(h.handle, nullptr);
        int device = -1;
        EXPECT_EQ(flashcore_handle_device(h.handle, &device), FLASHCORE_STATUS_SUCCESS);
        EXPECT_EQ(device, 0);
    }
    ScopedEnv env({{"FLASHCORE_TEST_EMULATE_GPU", "v100"}});
    flashcore_handle h = nullptr;
    EXPECT_EQ(flashcore_create(&h), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(),
                 "FLASHCORE_TEST_EMULATE_GPU=v100 is not a GPU flashcore emulates; it takes a100, a10, l4, h100, "
                 "h200 (tests only)");
    EXPECT_EQ(h, nullptr);
}

// Every forward form at every head-dim pair and 16-bit dtype that
// flashcore_forward_check accepts plans on every GPU; fp8 queries (fp8
// prefill) only where the sm_90a kernels run, and are refused elsewhere
// with the documented message.
TEST(EmulatedGpu, EveryCheckedForwardCallPlans) {
    std::map<std::string, int> planned_per_gpu;
    for (const auto &gpu : kGpus) {
        EmulatedHandle h(gpu.name);
        ASSERT_NE(h.handle, nullptr);
        for (const auto &[d, dv] : supported_pairs()) {
            for (int32_t dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
                for (const ForwardForm &f : kForwardForms) {
                    if (f.fp8_q && dtype == FLASHCORE_DTYPE_FP16) continue;
                    const flashcore_forward_params p = forward_params(f, d, dv, dtype);
                    SCOPED_TRACE(std::string(gpu.name) + " " + f.name + " d" + std::to_string(d) + "/" +
                                 std::to_string(dv) + " dtype " + std::to_string(dtype));
                    if (flashcore_forward_check(&p) != FLASHCORE_STATUS_SUCCESS) {
                        // Only what the library has no kernels for: fp8 at head dims without them.
                        EXPECT_TRUE(f.fp8_q || f.fp8_kv) << flashcore_last_error_message();
                        continue;
                    }
                    size_t workspace_bytes = 0;
                    const flashcore_status status = forward_on(h.handle, p, &workspace_bytes);
                    if (f.fp8_q && gpu.cc_major != 9) {
                        EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << flashcore_last_error_message();
                        continue;
                    }
                    EXPECT_TRUE(planned(status, gpu.name));
                    ++planned_per_gpu[gpu.name];
                }
            }
        }
    }
    for (const auto &gpu : kGpus) {
        EXPECT_GT(planned_per_gpu[gpu.name], 0) << gpu.name;
        RecordProperty(std::string("planned_") + gpu.name, std::to_string(planned_per_gpu[gpu.name]));
        std::printf("[ planned ] %s: %d forward calls\n", gpu.name, planned_per_gpu[gpu.name]);
    }
}

// Audit item 1 of issue 59: packed (varlen) and paged calls at head dim 256
// on an A100, and at 96-256 on sm_86/sm_89, returned INTERNAL ("no portable
// kernel") while flashcore_forward_check said SUCCESS: the ragged filter
// dropped the large tiles, the shared-memory filter the others.
TEST(EmulatedGpu, RaggedCallsPlanOnGpusWithLessSharedMemory) {
    const auto pairs = supported_pairs();
    const auto covered = [&pairs](int32_t d) {
        for (const auto &pair : pairs) {
            if (pair.first >= d && pair.second >= d) return true;
        }
        return false;
    };
    int planned_calls = 0;
    for (const char *gpu : {"a100", "a10", "l4"}) {
        EmulatedHandle h(gpu);
        for (int32_t d : {96, 128, 192, 256}) {
            if (!covered(d)) continue;  // a build of fewer head dims (-DFLASHCORE_HEAD_DIMS)
            flashcore_forward_params p;
            ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
            p.dtype = FLASHCORE_DTYPE_BF16;
            p.batch_size = 2;
            p.seqlen_q = p.seqlen_k = 128;
            p.num_heads_q = p.num_heads_kv = 8;
            p.head_dim = d;
            p.q = fake_tensor(0), p.k = fake_tensor(1), p.v = fake_tensor(2), p.out = fake_tensor(3);
            p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(5));
            p.total_seqlen_q = 200;
            ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
            ASSERT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
            size_t workspace_bytes = 0;
            EXPECT_TRUE(planned(forward_on(h.handle, p, &workspace_bytes), gpu)) << gpu << " d" << d;
            ++planned_calls;
        }
    }
    if (planned_calls == 0) GTEST_SKIP() << "this build has no kernels at head dims 96 to 256";
}

// Audit item 2 of issue 59: GQA heads are packed into a tile's rows only
// where the packed rows (seqlen_q * Hq / Hkv) fit the kernels' 32-bit row
// counts; B1 Sq63 Hq 34,087,043 Hkv1 used to pack, and the count wrapped.
TEST(EmulatedGpu, GqaPackingKeepsRowCountsWithin32Bits) {
    EmulatedHandle h("h100");
    flashcore_forward_params p;
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.batch_size = 1;
    p.seqlen_q = 63;
    p.seqlen_k = 64;
    p.num_heads_q = 34087043;
    p.num_heads_kv = 1;
    p.head_dim = 64;
    p.q = fake_tensor(0), p.k = fake_tensor(1), p.v = fake_tensor(2), p.out = fake_tensor(3);
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    size_t workspace_bytes = 0;
    ASSERT_TRUE(planned(forward_on(h.handle, p, &workspace_bytes), "h100"));
    const std::string message = flashcore_last_error_message();
    EXPECT_NE(message.find(", 1 query head(s) packed per tile"), std::string::npos) << message;
    // A group that fits still packs.
    p.num_heads_q = 8;
    p.num_heads_kv = 1;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    ASSERT_TRUE(planned(forward_on(h.handle, p, &workspace_bytes), "h100"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find(", 8 query head(s) packed per tile"),
              std::string::npos)
        << flashcore_last_error_message();
}

// The backward pass at every head-dim pair, dtype and form that
// flashcore_backward_check accepts plans on every GPU. The backward's kernels
// stop at head dim 512 (MLA's 576 has the forward only): those pairs are
// refused as UNSUPPORTED, saying so. Past 256 they need more shared memory
// than sm_86 and sm_89 have (kMaxSm86BackwardHeadDim): refused there at the
// launch, saying how much.
constexpr int32_t kMaxBackwardHeadDim = 512;
constexpr int32_t kMaxSm86BackwardHeadDim = 256;
constexpr size_t kSm86SmemPerBlock = 101376;
TEST(EmulatedGpu, EveryCheckedBackwardCallPlans) {
    const struct {
        const char *name;
        int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
        bool causal, varlen, window, deterministic;
        float softcap;
        int32_t attention_chunk = 0;  // 0.9
        bool sinks = false;           // 0.9: with dsinks
    } forms[] = {
        {"dense", 2, 1024, 1024, 8, 8, false, false, false, false, 0.f},
        {"causal_gqa", 1, 2048, 2048, 16, 4, true, false, false, false, 0.f},
        {"ragged", 3, 100, 333, 8, 2, false, false, false, false, 0.f},
        {"varlen", 3, 700, 900, 8, 2, true, true, false, false, 0.f},
        {"window", 2, 1024, 1024, 8, 8, true, false, true, false, 0.f},
        {"softcap", 2, 512, 512, 8, 8, false, false, false, false, 30.f},
        {"deterministic", 2, 1024, 1024, 8, 2, true, false, false, true, 0.f},
        {"chunked", 1, 4096, 4096, 16, 4, true, false, false, false, 0.f, 1024},
        {"sinks", 2, 512, 512, 8, 2, true, false, false, false, 0.f, 0, true},
        {"chunked_sinks_varlen", 3, 700, 900, 8, 2, true, true, false, true, 0.f, 100, true},
    };
    std::map<std::string, int> planned_per_gpu;
    for (const auto &gpu : kGpus) {
        EmulatedHandle h(gpu.name);
        for (const auto &[d, dv] : supported_pairs()) {
            for (int32_t dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
                for (const auto &f : forms) {
                    SCOPED_TRACE(std::string(gpu.name) + " " + f.name + " d" + std::to_string(d) + "/" +
                                 std::to_string(dv));
                    flashcore_backward_params p;
                    ASSERT_EQ(flashcore_backward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
                    p.dtype = dtype;
                    set_shape(p, f, d, dv);
                    p.deterministic = f.deterministic;
                    if (f.window) p.use_window = 1, p.window_left = 128, p.window_right = 0;
                    p.attention_chunk = f.attention_chunk;
                    if (f.sinks) {
                        p.sinks = static_cast<const float *>(fake_tensor(11));
                        p.dsinks = static_cast<float *>(fake_tensor(12));
                    }
                    p.q = fake_tensor(0), p.k = fake_tensor(1), p.v = fake_tensor(2), p.out = fake_tensor(3);
                    p.dout = fake_tensor(4);
                    p.lse = static_cast<const float *>(fake_tensor(5));
                    p.dq = fake_tensor(6), p.dk = fake_tensor(7), p.dv = fake_tensor(8);
                    if (f.varlen) {
                        p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(9));
                        p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(10));
                        p.total_seqlen_q = f.batch * f.seqlen_q / 2 + 1;
                        p.total_seqlen_k = f.batch * f.seqlen_k / 2 + 1;
                    }
                    ASSERT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD),
                              FLASHCORE_STATUS_SUCCESS);
                    if (d > kMaxBackwardHeadDim) {
                        EXPECT_EQ(flashcore_backward_check(&p), FLASHCORE_STATUS_UNSUPPORTED);
                        EXPECT_NE(std::string(flashcore_last_error_message()).find(" exceeds "), std::string::npos)
                            << flashcore_last_error_message();
                        continue;
                    }
                    ASSERT_EQ(flashcore_backward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
                    size_t workspace_bytes = 0;
                    ASSERT_EQ(flashcore_backward_workspace_size(h.handle, &p, &workspace_bytes),
                              FLASHCORE_STATUS_SUCCESS);
                    const flashcore_status status =
                        flashcore_backward(h.handle, &p, fake_tensor(20), workspace_bytes, nullptr);
                    if (d > kMaxSm86BackwardHeadDim && gpu.max_smem_per_block == kSm86SmemPerBlock) {
                        EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED);
                        EXPECT_NE(std::string(flashcore_last_error_message()).find("bytes of shared memory per block"),
                                  std::string::npos)
                            << flashcore_last_error_message();
                        continue;
                    }
                    EXPECT_TRUE(planned(status, gpu.name));
                    ++planned_per_gpu[gpu.name];
                }
            }
        }
    }
    for (const auto &gpu : kGpus) {
        EXPECT_GT(planned_per_gpu[gpu.name], 0) << gpu.name;
        std::printf("[ planned ] %s: %d backward calls\n", gpu.name, planned_per_gpu[gpu.name]);
    }
}

namespace {

// Whether a call on an emulated handle reached the launch with a plan on
// `kernel` ("sm_90a" or "portable").
testing::AssertionResult planned_on(flashcore_status status, const char *gpu, const char *kernel) {
    const testing::AssertionResult reached = planned(status, gpu);
    if (!reached) return reached;
    const std::string message = flashcore_last_error_message();
    if (message.find(kernel) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "expected the " << kernel << " kernel: " << message;
}

// A grid the sm_90a kernels take: 1 x 16 heads x 64 blocks of 128 rows,
// bf16, at head dim 64 (both families have sm_90a kernels there, and so do
// the sanitizer builds, whose only head dim it is).
constexpr int32_t kSm90HeadDim = 64;
const struct {
    int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    bool causal;
    float softcap;
} kOneLongBatch{1, 8192, 8192, 16, 16, false, 0.f};

flashcore_forward_params one_long_batch_forward() {
    flashcore_forward_params p;
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.dtype = FLASHCORE_DTYPE_BF16;
    set_shape(p, kOneLongBatch, kSm90HeadDim, kSm90HeadDim);
    p.q = fake_tensor(0), p.k = fake_tensor(1), p.v = fake_tensor(2), p.out = fake_tensor(3);
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    return p;
}

flashcore_backward_params one_long_batch_backward() {
    flashcore_backward_params b;
    EXPECT_EQ(flashcore_backward_params_init(&b, sizeof b), FLASHCORE_STATUS_SUCCESS);
    b.dtype = FLASHCORE_DTYPE_BF16;
    set_shape(b, kOneLongBatch, kSm90HeadDim, kSm90HeadDim);
    b.q = fake_tensor(0), b.k = fake_tensor(1), b.v = fake_tensor(2), b.out = fake_tensor(3);
    b.dout = fake_tensor(4);
    b.lse = static_cast<const float *>(fake_tensor(5));
    b.dq = fake_tensor(6), b.dk = fake_tensor(7), b.dv = fake_tensor(8);
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&b, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    return b;
}

// Whether this build has the sm_90a kernels (an emulated H100 handle may
// then pin them); the sanitizer builds for sm_80 alone have none.
bool build_has_sm90_kernels() {
    ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "hopper"}, {"FLASHCORE_TEST_EMULATE_GPU", "h100"}});
    flashcore_handle h = nullptr;
    const flashcore_status status = flashcore_create(&h);
    if (h != nullptr) flashcore_destroy(h);
    return status == FLASHCORE_STATUS_SUCCESS;
}

// flashcore_backward of checked params on an emulated handle, as forward_on.
flashcore_status backward_on(flashcore_handle h, const flashcore_backward_params &b, size_t *workspace_bytes) {
    flashcore_status status = flashcore_backward_workspace_size(h, &b, workspace_bytes);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    return flashcore_backward(h, &b, fake_tensor(20), *workspace_bytes, nullptr);
}

}  // namespace

// Whether the TMA unit can describe the tensors is planning's to decide
// (the plan is final before anything launches): on an H100, a batch of one
// whose batch strides are 2^40 bytes (the stride of a dimension of extent 1
// is the caller's to choose) plans on the portable kernels, forward and
// backward; the same call with contiguous strides on the sm_90a ones.
TEST(EmulatedGpu, PlanningDecidesWhatTheTmaUnitCanDescribe) {
    if (!build_has_sm90_kernels()) GTEST_SKIP() << "this build has no sm_90a kernels";
    EmulatedHandle h("h100");
    constexpr int64_t kUndescribableBatchStride = int64_t(1) << 39;  // elements: 2^40 bytes of bf16
    flashcore_forward_params p = one_long_batch_forward();
    size_t workspace_bytes = 0;
    EXPECT_TRUE(planned_on(forward_on(h.handle, p, &workspace_bytes), "h100", "sm_90a"));
    for (int64_t *stride : {&p.q_batch_stride, &p.k_batch_stride, &p.v_batch_stride, &p.out_batch_stride}) {
        const int64_t contiguous = *stride;
        // 2^40 bytes, and the largest stride validation takes (whole 16-byte
        // vectors), whose bytes do not fit an int64: computed without
        // overflow, never wrapped to a stride the unit would take.
        constexpr int64_t kLargestStride = std::numeric_limits<int64_t>::max() / 8 * 8;
        for (const int64_t undescribable : {kUndescribableBatchStride, kLargestStride}) {
            *stride = undescribable;
            ASSERT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
            EXPECT_TRUE(planned_on(forward_on(h.handle, p, &workspace_bytes), "h100", "portable")) << undescribable;
        }
        *stride = contiguous;
    }

    flashcore_backward_params b = one_long_batch_backward();
    EXPECT_TRUE(planned_on(backward_on(h.handle, b, &workspace_bytes), "h100", "sm_90a"));
    for (int64_t *stride : {&b.q_batch_stride, &b.k_batch_stride, &b.v_batch_stride, &b.dout_batch_stride}) {
        const int64_t contiguous = *stride;
        *stride = kUndescribableBatchStride;
        ASSERT_EQ(flashcore_backward_check(&b), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        size_t bytes = 0;
        EXPECT_TRUE(planned_on(backward_on(h.handle, b, &bytes), "h100", "portable"));
        EXPECT_EQ(bytes, workspace_bytes) << "the workspace depends on the shapes only";
        *stride = contiguous;
    }
}

// The sm_90a backward serves every call whose head dims one of its kernels
// covers, columns past the call's zero (1.3-2.5x the portable kernel at d32
// to d96 on an H200: docs/log/hopper.md, 2026-11-30): d80 on the d96
// kernel, d112 on the d128 one, d40 / 24 and d32 on the d64 one; past 128
// (192, 128) and d256 on their own kernels (225 KiB at d256: within an
// H100's 227), (160, 128) on the (192, 128) one and d160 on the d256 one.
// With a softcap, or on an A100, the portable kernel covering them.
TEST(EmulatedGpu, BackwardPlansTheHopperKernelCoveringTheHeadDims) {
    if (!build_has_sm90_kernels()) GTEST_SKIP() << "this build has no sm_90a kernels";
    struct Case {
        int32_t head_dim, head_dim_v;
        const char *hopper_kernel, *portable_kernel;
    };
    std::vector<Case> cases = {{96, 96, "(96, 96)", "(96, 96)"},
                               {80, 80, "(96, 96)", "(96, 96)"},
                               {112, 112, "(128, 128)", "(128, 128)"},
                               {40, 24, "(64, 64)", "(64, 64)"},
                               {32, 32, "(64, 64)", "(32, 32)"}};
    const auto pairs = supported_pairs();
    const auto has = [&](int32_t head_dim, int32_t head_dim_v) {
        return std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{head_dim, head_dim_v}) != pairs.end();
    };
    if (!has(128, 128)) GTEST_SKIP() << "this build has no kernels at head dim 128 (nor 96)";
    if (has(192, 128) && has(256, 256)) {
        cases.insert(cases.end(), {{192, 128, "(192, 128)", "(192, 128)"},
                                   {256, 256, "(256, 256)", "(256, 256)"},
                                   {160, 128, "(192, 128)", "(192, 128)"},
                                   {160, 160, "(256, 256)", "(256, 256)"}});
    }
    for (const auto &c : cases) {
        flashcore_backward_params b = one_long_batch_backward();
        set_shape(b, kOneLongBatch, c.head_dim, c.head_dim_v);
        ASSERT_EQ(flashcore_backward_set_contiguous_strides(&b, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
        size_t bytes = 0;
        {
            EmulatedHandle h("h100");
            EXPECT_TRUE(planned_on(backward_on(h.handle, b, &bytes), "h100", "sm_90a")) << c.head_dim;
            EXPECT_NE(std::string(flashcore_last_error_message()).find(c.hopper_kernel), std::string::npos)
                << flashcore_last_error_message();
            b.softcap = 30.f;
            EXPECT_TRUE(planned_on(backward_on(h.handle, b, &bytes), "h100", "portable")) << c.head_dim;
            b.softcap = 0.f;
        }
        EmulatedHandle a100("a100");
        EXPECT_TRUE(planned_on(backward_on(a100.handle, b, &bytes), "a100", "portable")) << c.head_dim;
        EXPECT_NE(std::string(flashcore_last_error_message()).find(c.portable_kernel), std::string::npos)
            << flashcore_last_error_message();
    }
}

// Head dims past 256: on sm_90 the 64-row blocks run on the wide tile's
// wgmma twin (widewgmma), blocks of at most 16 rows on the portable 16-row
// tile. MLA decode on the latent cache (576 / 512, v as k's view; 16-bit or
// e4m3): the portable path (pinned) takes the portable 64-row tile, an A100
// (whose 163 KB it exceeds) the 16-row one. d512: prefill and decode.
TEST(EmulatedGpu, WideHeadDimsPlanTheWgmmaTileOnHopper) {
    const auto pairs = supported_pairs();
    if (std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{576, 512}) == pairs.end()) {
        GTEST_SKIP() << "this build has no kernels at head dims 576 / 512";
    }
    const auto mla = [](int32_t heads_q, bool fp8_cache) {
        ForwardForm f{"mla", 4, 1, 4096, heads_q, 1};
        f.fp8_kv = fp8_cache;
        return forward_params(f, 576, 512, FLASHCORE_DTYPE_BF16);
    };
    size_t workspace_bytes = 0;
    {
        EmulatedHandle h("h100");
        const bool hopper = build_has_sm90_kernels();
        EXPECT_TRUE(planned_on(forward_on(h.handle, mla(128, false), &workspace_bytes), "h100",
                               hopper ? "sm_90a widewgmma" : "portable wide "));
        EXPECT_TRUE(planned_on(forward_on(h.handle, mla(64, false), &workspace_bytes), "h100",
                               hopper ? "sm_90a widewgmma" : "portable wide "));
        EXPECT_TRUE(planned_on(forward_on(h.handle, mla(16, false), &workspace_bytes), "h100", "portable widedecode"));
        EXPECT_TRUE(planned_on(forward_on(h.handle, mla(128, true), &workspace_bytes), "h100",
                               hopper ? "sm_90a widewgmma" : "portable wide "));
    }
    {
        ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "portable"}});
        EmulatedHandle h("h100");
        EXPECT_TRUE(planned_on(forward_on(h.handle, mla(128, false), &workspace_bytes), "h100", "portable wide "));
    }
    EmulatedHandle a100("a100");
    EXPECT_TRUE(planned_on(forward_on(a100.handle, mla(128, false), &workspace_bytes), "a100", "portable widedecode"));
    if (std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{512, 512}) != pairs.end()) {
        EmulatedHandle h("h100");
        const ForwardForm prefill{"d512_prefill", 1, 4096, 4096, 16, 8, true};
        const ForwardForm decode{"d512_decode", 32, 1, 8192, 16, 8};
        EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(prefill, 512, 512, FLASHCORE_DTYPE_BF16),
                                          &workspace_bytes),
                               "h100", build_has_sm90_kernels() ? "sm_90a widewgmma" : "portable wide "));
        EXPECT_TRUE(planned_on(
            forward_on(h.handle, forward_params(decode, 512, 512, FLASHCORE_DTYPE_BF16), &workspace_bytes), "h100",
            "portable widedecode"));
    }
}

// Decode grids past a wave of the decode tile's CTAs (one an SM) that do
// not split run on its paired twin (two an SM) where the build has it (head
// dims 64 and 128), the dense call and its cache-length and paged forms
// alike; so do grids whose CTAs fill fewer than half the SMs where the twin
// (tiles of half the keys) splits them into more. A grid within a wave
// keeps the decode tile (and splits), as do a grid that splits by its
// sequences' lengths (cache lengths of up to 16k keys: parts of 4096, here
// 2 for the CTA cap of 8 waves), a small grid the twin would not split
// further, and a pinned tile. An A100, where the decode tile does not fit
// at head dim 128, plans as before.
TEST(EmulatedGpu, DecodeGridsPastAWavePlanThePairedTile) {
    const auto pairs = supported_pairs();
    if (std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{128, 128}) == pairs.end()) {
        GTEST_SKIP() << "this build has no kernels at head dim 128";
    }
    const ForwardForm full{"decode_b64", 64, 1, 1024, 32, 8};          // 512 packed blocks
    const ForwardForm one_wave{"decode_b16", 16, 1, 4096, 32, 8};      // 128 packed blocks
    ForwardForm cache_lengths = full;
    cache_lengths.seqused_k = true;
    ForwardForm paged = full;
    paged.page_size = 64;
    size_t bytes = 0;
    EmulatedHandle h("h100");
    for (const ForwardForm &f : {full, cache_lengths, paged}) {
        SCOPED_TRACE(f.name);
        EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(f, 128, 128, FLASHCORE_DTYPE_BF16), &bytes),
                               "h100", "portable decodepair kernel"));
    }
    EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(one_wave, 128, 128, FLASHCORE_DTYPE_BF16), &bytes),
                           "h100", "portable decode kernel"));
    ForwardForm long_lengths{"decode_b64_16k", 64, 1, 16384, 32, 8};
    long_lengths.seqused_k = true;
    EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(long_lengths, 128, 128, FLASHCORE_DTYPE_BF16), &bytes),
                           "h100", "portable decode kernel"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("2 split(s)"), std::string::npos)
        << flashcore_last_error_message();
    // 8 packed blocks over 2048 keys: the decode tile's 16 steps of 128 keys
    // split 2 ways (16 CTAs), the twin's 32 steps of 64 keys 4 ways.
    const ForwardForm small{"decode_b1_2k", 1, 1, 2048, 32, 8};
    EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(small, 128, 128, FLASHCORE_DTYPE_BF16), &bytes), "h100",
                           "portable decodepair kernel"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("4 split(s)"), std::string::npos)
        << flashcore_last_error_message();
    // 32 packed blocks over 1024 keys at head dim 64: unsplit on either.
    const ForwardForm small_d64{"decode_d64_1k", 16, 1, 1024, 16, 2};
    EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(small_d64, 64, 64, FLASHCORE_DTYPE_BF16), &bytes), "h100",
                           "portable decode kernel"));
    // An e4m3 cache has the decode tile only.
    ForwardForm fp8 = full;
    fp8.fp8_kv = true;
    EXPECT_TRUE(planned_on(forward_on(h.handle, forward_params(fp8, 128, 128, FLASHCORE_DTYPE_BF16), &bytes), "h100",
                           "portable decode kernel"));
    {
        ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "decode"}});
        EmulatedHandle pinned("h100");
        EXPECT_TRUE(planned_on(forward_on(pinned.handle, forward_params(full, 128, 128, FLASHCORE_DTYPE_BF16), &bytes),
                               "h100", "portable decode kernel"));
    }
    EmulatedHandle a100("a100");
    const flashcore_status status = forward_on(a100.handle, forward_params(full, 128, 128, FLASHCORE_DTYPE_BF16), &bytes);
    EXPECT_TRUE(planned(status, "a100"));
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("decodepair"), std::string::npos)
        << flashcore_last_error_message();
}

// A decode call of one sequence through cache lengths splits as the dense
// call does: its blocks all see the same keys, and parts of at most 4096
// keys would take a 128k-key cache into 32 parts, two waves of the decode
// tile where the dense call's 16 take one. Two sequences may differ in
// length, and keep those parts.
TEST(EmulatedGpu, OneSequenceThroughCacheLengthsSplitsAsTheDenseCall) {
    const auto pairs = supported_pairs();
    if (std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{128, 128}) == pairs.end()) {
        GTEST_SKIP() << "this build has no kernels at head dim 128";
    }
    EmulatedHandle h("h200");
    const auto expect_splits = [&](const ForwardForm &f, const char *splits) {
        SCOPED_TRACE(f.name);
        size_t bytes = 0;
        EXPECT_TRUE(planned(forward_on(h.handle, forward_params(f, 128, 128, FLASHCORE_DTYPE_BF16), &bytes), "h200"));
        EXPECT_NE(std::string(flashcore_last_error_message()).find(std::string(", ") + splits + " split(s)"),
                  std::string::npos)
            << flashcore_last_error_message();
    };
    const ForwardForm dense{"decode_b1_128k", 1, 1, 131072, 32, 8};
    ForwardForm cache_lengths = dense;
    cache_lengths.seqused_k = true;
    ForwardForm two_sequences = cache_lengths;
    two_sequences.batch = 2;
    expect_splits(dense, "16");
    expect_splits(cache_lengths, "16");
    expect_splits(two_sequences, "32");
}

// sm_margin leaves SMs to other streams: the plans count the SMs left (the
// message names them), so a small decode grid that splits over 132 SMs
// does not split over 8 (and needs no workspace); a margin that leaves no
// SM is refused by the workspace query and the call, forward and backward,
// naming the device's SMs.
TEST(EmulatedGpu, SmMarginLeavesSmsToOtherStreams) {
    EmulatedHandle h("h100");
    size_t bytes = 0;
    flashcore_forward_params p = one_long_batch_forward();
    p.sm_margin = 32;
    EXPECT_TRUE(planned(forward_on(h.handle, p, &bytes), "h100"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("on 100 of 132 SMs"), std::string::npos)
        << flashcore_last_error_message();
    flashcore_backward_params b = one_long_batch_backward();
    b.sm_margin = 131;
    EXPECT_TRUE(planned(backward_on(h.handle, b, &bytes), "h100"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("on 1 of 132 SMs"), std::string::npos)
        << flashcore_last_error_message();
    const std::string none = "sm_margin (132) leaves none of device 0's 132 SMs to the call; it must be at most 131";
    p.sm_margin = b.sm_margin = 132;
    EXPECT_EQ(flashcore_forward_workspace_size(h.handle, &p, &bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_last_error_message(), none + " (0: every SM)");
    EXPECT_EQ(flashcore_forward(h.handle, &p, nullptr, 0, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_backward_workspace_size(h.handle, &b, &bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_last_error_message(), none + " (0: every SM)");
    EXPECT_EQ(flashcore_backward(h.handle, &b, fake_tensor(20), 1 << 20, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    // (An empty call plans nothing: it succeeds whatever the margin.)
    const auto pairs = supported_pairs();
    if (std::find(pairs.begin(), pairs.end(), std::pair<int32_t, int32_t>{128, 128}) == pairs.end()) {
        GTEST_SKIP() << "this build has no kernels at head dim 128";
    }
    // 8 packed blocks over 2048 keys: 4 splits on every SM
    // (DecodeGridsPastAWavePlanThePairedTile), none on 8.
    const ForwardForm small{"decode_b1_2k", 1, 1, 2048, 32, 8};
    flashcore_forward_params decode = forward_params(small, 128, 128, FLASHCORE_DTYPE_BF16);
    EXPECT_TRUE(planned(forward_on(h.handle, decode, &bytes), "h100"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("4 split(s)"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_GT(bytes, 0u);
    decode.sm_margin = 124;
    EXPECT_TRUE(planned(forward_on(h.handle, decode, &bytes), "h100"));
    EXPECT_NE(std::string(flashcore_last_error_message()).find("1 split(s)"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_NE(std::string(flashcore_last_error_message()).find("on 8 of 132 SMs"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(bytes, 0u);
}

// FLASHCORE_FWD_VARIANT and FLASHCORE_BWD_VARIANT take the same path names,
// portable and hopper (the forward's old name for hopper, sm90, until 0.9),
// and hopper is refused where the sm_90a kernels cannot run.
TEST(EmulatedGpu, VariantVariablesTakeTheSamePathNames) {
    const flashcore_forward_params p = one_long_batch_forward();
    const flashcore_backward_params b = one_long_batch_backward();
    flashcore_forward_params short_call = p;
    short_call.seqlen_q = short_call.seqlen_k = 64;
    short_call.num_heads_q = short_call.num_heads_kv = 1;
    ASSERT_EQ(flashcore_set_contiguous_strides(&short_call, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    size_t bytes = 0;
    const bool has_sm90_kernels = build_has_sm90_kernels();
    for (const char *hopper : {"hopper", "sm90"}) {
        if (!has_sm90_kernels) break;
        ScopedEnv env({{"FLASHCORE_FWD_VARIANT", hopper}});
        EmulatedHandle h("h100");
        // Forced: even a call too short to fill the GPU.
        EXPECT_TRUE(planned_on(forward_on(h.handle, short_call, &bytes), "h100", "sm_90a")) << hopper;
    }
    for (const auto &[variable, value] : {std::pair{"FLASHCORE_FWD_VARIANT", "portable"},
                                          std::pair{"FLASHCORE_BWD_VARIANT", "portable"},
                                          std::pair{"FLASHCORE_BWD_VARIANT", "kvblock"}}) {
        ScopedEnv env({{variable, value}});
        EmulatedHandle h("h100");
        const bool forward = std::strcmp(variable, "FLASHCORE_FWD_VARIANT") == 0;
        EXPECT_TRUE(planned_on(forward ? forward_on(h.handle, p, &bytes) : backward_on(h.handle, b, &bytes), "h100",
                               "portable"))
            << variable << "=" << value;
    }
    if (has_sm90_kernels) {
        ScopedEnv env({{"FLASHCORE_BWD_VARIANT", "hopper"}});
        EmulatedHandle h("h100");
        EXPECT_TRUE(planned_on(backward_on(h.handle, b, &bytes), "h100", "sm_90a"));
    }
    for (const char *variable : {"FLASHCORE_FWD_VARIANT", "FLASHCORE_BWD_VARIANT"}) {
        ScopedEnv env({{variable, "hopper"}, {"FLASHCORE_TEST_EMULATE_GPU", "a100"}});
        flashcore_handle h = nullptr;
        EXPECT_EQ(flashcore_create(&h), FLASHCORE_STATUS_UNSUPPORTED) << variable;
        EXPECT_NE(std::string(flashcore_last_error_message()).find(std::string(variable) + "=hopper"),
                  std::string::npos)
            << flashcore_last_error_message();
        EXPECT_EQ(h, nullptr);
    }
    // Anything else is refused, naming the values taken; the backward never
    // took the forward's old name, sm90.
    for (const auto &[variable, value] : {std::pair{"FLASHCORE_FWD_VARIANT", "sm91"},
                                          std::pair{"FLASHCORE_FWD_VARIANT", "Hopper"},
                                          std::pair{"FLASHCORE_BWD_VARIANT", "sm90"},
                                          std::pair{"FLASHCORE_BWD_VARIANT", "portables"},
                                          std::pair{"FLASHCORE_BWD_VARIANT", "kvblock "}}) {
        ScopedEnv env({{variable, value}, {"FLASHCORE_TEST_EMULATE_GPU", "h100"}});
        flashcore_handle h = nullptr;
        EXPECT_EQ(flashcore_create(&h), FLASHCORE_STATUS_INVALID_ARGUMENT) << variable << "=" << value;
        const std::string message = flashcore_last_error_message();
        EXPECT_NE(message.find("'portable', 'hopper'"), std::string::npos) << message;
        EXPECT_EQ(h, nullptr);
    }
}

// The workspace (flashcore.h, "Workspace") depends on attention_chunk,
// not on the sinks, which the query does not look at (a misaligned pointer
// there is no refusal of it); a negative chunk length is refused by it as
// by the check, writing nothing; num_splits 1 needs none, chunks or not.
// The backward's depends on the shapes only: neither chunks nor sinks nor
// dsinks change it. A 0.8 caller's struct (memory past it garbage) sizes
// as a 0.9 one without chunks or sinks.
TEST(EmulatedGpu, WorkspaceOfChunksAndSinks) {
    for (const auto &gpu : kGpus) {
        EmulatedHandle h(gpu.name);
        for (const ForwardForm &f : kForwardForms) {
            SCOPED_TRACE(std::string(gpu.name) + " " + f.name);
            flashcore_forward_params p = forward_params(f, 64, 64, FLASHCORE_DTYPE_BF16);
            if (f.fp8_q || flashcore_forward_check(&p) != FLASHCORE_STATUS_SUCCESS) continue;
            size_t bytes = 1;
            ASSERT_EQ(flashcore_forward_workspace_size(h.handle, &p, &bytes), FLASHCORE_STATUS_SUCCESS)
                << flashcore_last_error_message();
            for (const uintptr_t sinks : {uintptr_t(0), reinterpret_cast<uintptr_t>(fake_tensor(13)), uintptr_t(3)}) {
                p.sinks = reinterpret_cast<const float *>(sinks);
                size_t with_sinks = 7;
                EXPECT_EQ(flashcore_forward_workspace_size(h.handle, &p, &with_sinks), FLASHCORE_STATUS_SUCCESS)
                    << flashcore_last_error_message();
                EXPECT_EQ(with_sinks, bytes) << "sinks " << sinks;
            }
            p.attention_chunk = -1;
            size_t untouched = 77;
            EXPECT_EQ(flashcore_forward_workspace_size(h.handle, &p, &untouched), FLASHCORE_STATUS_INVALID_ARGUMENT);
            EXPECT_EQ(std::string(flashcore_last_error_message()).rfind("attention_chunk (-1)", 0), 0u)
                << flashcore_last_error_message();
            EXPECT_EQ(untouched, 77u) << "a refused query wrote the size";
            p.attention_chunk = f.attention_chunk != 0 ? f.attention_chunk : 64;
            p.num_splits = 1;
            EXPECT_EQ(flashcore_forward_workspace_size(h.handle, &p, &untouched), FLASHCORE_STATUS_SUCCESS);
            EXPECT_EQ(untouched, 0u);
        }

        // A 0.8 caller's struct, the bytes past it garbage (as attention_chunk,
        // negative; as sinks, misaligned).
        flashcore_forward_params dense = forward_params(kForwardForms[3], 64, 64, FLASHCORE_DTYPE_BF16);  // decode_gqa
        constexpr size_t kSizeV0_8 = offsetof(flashcore_forward_params, attention_chunk);
        flashcore_forward_params older = dense;
        std::memset(reinterpret_cast<unsigned char *>(&older) + kSizeV0_8, 0xAB, sizeof older - kSizeV0_8);
        older.struct_size = kSizeV0_8;
        size_t dense_bytes = 1, older_bytes = 2;
        ASSERT_EQ(flashcore_forward_workspace_size(h.handle, &dense, &dense_bytes), FLASHCORE_STATUS_SUCCESS);
        EXPECT_EQ(flashcore_forward_workspace_size(h.handle, &older, &older_bytes), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        EXPECT_EQ(older_bytes, dense_bytes);

        flashcore_backward_params b;
        ASSERT_EQ(flashcore_backward_params_init(&b, sizeof b), FLASHCORE_STATUS_SUCCESS);
        b.dtype = FLASHCORE_DTYPE_BF16;
        set_shape(b, kForwardForms[0], 64, 64);
        size_t plain = 1;
        ASSERT_EQ(flashcore_backward_workspace_size(h.handle, &b, &plain), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        b.attention_chunk = 100;
        b.sinks = static_cast<const float *>(fake_tensor(11));
        b.dsinks = static_cast<float *>(fake_tensor(12));
        size_t with_chunks_and_sinks = 2;
        EXPECT_EQ(flashcore_backward_workspace_size(h.handle, &b, &with_chunks_and_sinks), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        EXPECT_EQ(with_chunks_and_sinks, plain);
    }
}

// The workspace is written: it must not overlap the sinks a call reads, nor
// the dsinks a backward call writes (the call refuses it before launching,
// naming both).
TEST(EmulatedGpu, WorkspaceMustNotOverlapSinksOrDsinks) {
    EmulatedHandle h("a100");
    ForwardForm split = kForwardForms[5];  // split4: a workspace of its own
    split.sinks = true;
    const flashcore_forward_params p = forward_params(split, 64, 64, FLASHCORE_DTYPE_FP16);
    ASSERT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    size_t bytes = 0;
    ASSERT_EQ(flashcore_forward_workspace_size(h.handle, &p, &bytes), FLASHCORE_STATUS_SUCCESS);
    ASSERT_GT(bytes, 0u);
    EXPECT_TRUE(planned(flashcore_forward(h.handle, &p, fake_tensor(20), bytes, nullptr), "a100"));
    void *on_sinks = const_cast<float *>(p.sinks);
    EXPECT_EQ(flashcore_forward(h.handle, &p, on_sinks, bytes, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    std::string message = flashcore_last_error_message();
    EXPECT_EQ(message.rfind("the workspace (bytes 0x", 0), 0u) << message;
    EXPECT_NE(message.find(") overlaps sinks (bytes 0x"), std::string::npos) << message;

    flashcore_backward_params b;
    ASSERT_EQ(flashcore_backward_params_init(&b, sizeof b), FLASHCORE_STATUS_SUCCESS);
    set_shape(b, kForwardForms[2], 64, 64);  // short_ragged
    b.q = fake_tensor(0), b.k = fake_tensor(1), b.v = fake_tensor(2), b.out = fake_tensor(3);
    b.dout = fake_tensor(4);
    b.lse = static_cast<const float *>(fake_tensor(5));
    b.dq = fake_tensor(6), b.dk = fake_tensor(7), b.dv = fake_tensor(8);
    b.sinks = static_cast<const float *>(fake_tensor(11));
    b.dsinks = static_cast<float *>(fake_tensor(12));
    ASSERT_EQ(flashcore_backward_set_contiguous_strides(&b, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(flashcore_backward_check(&b), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    ASSERT_EQ(flashcore_backward_workspace_size(h.handle, &b, &bytes), FLASHCORE_STATUS_SUCCESS);
    EXPECT_TRUE(planned(flashcore_backward(h.handle, &b, fake_tensor(20), bytes, nullptr), "a100"));
    for (const auto &[name, at] : {std::pair{"sinks", static_cast<const void *>(b.sinks)},
                                   std::pair{"dsinks", static_cast<const void *>(b.dsinks)}}) {
        EXPECT_EQ(flashcore_backward(h.handle, &b, const_cast<void *>(at), bytes, nullptr),
                  FLASHCORE_STATUS_INVALID_ARGUMENT)
            << name;
        message = flashcore_last_error_message();
        EXPECT_NE(message.find(std::string(") overlaps ") + name + " (bytes 0x"), std::string::npos) << message;
    }
}

TEST(EmulatedGpu, MergePlans) {
    EmulatedHandle h("a10");
    flashcore_merge_params m;
    ASSERT_EQ(flashcore_merge_params_init(&m, sizeof m), FLASHCORE_STATUS_SUCCESS);
    m.num_states = 4;
    m.batch_size = m.num_heads = m.seqlen = 2;
    m.head_dim = 64;
    m.partial_out = fake_tensor(0);
    m.partial_lse = static_cast<const float *>(fake_tensor(1));
    m.out = fake_tensor(2);
    m.partial_seq_stride = 64, m.partial_head_stride = 128, m.partial_batch_stride = 256, m.partial_state_stride = 512;
    m.lse_seq_stride = 1, m.lse_head_stride = 2, m.lse_batch_stride = 4, m.lse_state_stride = 8;
    m.out_seq_stride = 64, m.out_head_stride = 128, m.out_batch_stride = 256;
    ASSERT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    EXPECT_TRUE(planned(flashcore_merge_states(h.handle, &m, nullptr), "a10"));
    // With sinks (0.9), one per head.
    m.sinks = static_cast<const float *>(fake_tensor(3));
    ASSERT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    EXPECT_TRUE(planned(flashcore_merge_states(h.handle, &m, nullptr), "a10"));
}
