// The C API without launching anything: versions, status strings, error
// messages, parameter helpers, and validation of every parameter. Runs on
// machines with and without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"

namespace {

// Plausible, suitably aligned device addresses: flashcore_forward_check never
// dereferences them.
void *fake_pointer(uintptr_t address) { return reinterpret_cast<void *>(address); }

flashcore_forward_params valid_params() {
    flashcore_forward_params p;
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.batch_size = 2;
    p.seqlen_q = 100;
    p.seqlen_k = 300;
    p.num_heads_q = 8;
    p.num_heads_kv = 2;
    p.head_dim = 64;
    p.q = fake_pointer(0x10000);
    p.k = fake_pointer(0x20000);
    p.v = fake_pointer(0x30000);
    p.out = fake_pointer(0x40000);
    p.lse = static_cast<float *>(fake_pointer(0x50000));
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    return p;
}

TEST(Version, RuntimeMatchesHeader) {
    EXPECT_EQ(flashcore_version_number(), unsigned(FLASHCORE_VERSION_NUMBER));
    EXPECT_EQ(FLASHCORE_VERSION_NUMBER, 100);
    EXPECT_STREQ(flashcore_version_string(), "0.1.0");
}

TEST(Status, EveryStatusHasItsOwnString) {
    const flashcore_status all[] = {FLASHCORE_STATUS_SUCCESS,        FLASHCORE_STATUS_INVALID_ARGUMENT,
                                    FLASHCORE_STATUS_UNSUPPORTED,    FLASHCORE_STATUS_MISALIGNED,
                                    FLASHCORE_STATUS_WORKSPACE_TOO_SMALL, FLASHCORE_STATUS_NO_DEVICE,
                                    FLASHCORE_STATUS_CUDA_ERROR,     FLASHCORE_STATUS_OUT_OF_MEMORY,
                                    FLASHCORE_STATUS_INTERNAL};
    std::set<std::string> seen;
    for (flashcore_status s : all) {
        const char *text = flashcore_status_string(s);
        ASSERT_NE(text, nullptr);
        EXPECT_STRNE(text, "");
        EXPECT_STRNE(text, "unknown status") << int(s);
        EXPECT_TRUE(seen.insert(text).second) << "duplicate string " << text;
    }
    EXPECT_STREQ(flashcore_status_string(static_cast<flashcore_status>(999)), "unknown status");
    // The numbering is part of the ABI.
    EXPECT_EQ(int(FLASHCORE_STATUS_SUCCESS), 0);
    EXPECT_EQ(int(FLASHCORE_STATUS_INTERNAL), 8);
}

TEST(ErrorMessage, SetOnFailureClearedOnSuccess) {
    flashcore_forward_params p = valid_params();
    p.num_heads_q = 12;
    p.num_heads_kv = 5;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "num_heads_q (12) must be a multiple of num_heads_kv (5)");
    p = valid_params();
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_STREQ(flashcore_last_error_message(), "");
}

TEST(ErrorMessage, IsPerThread) {
    flashcore_forward_params p = valid_params();
    p.head_dim = 80;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED);
    std::string other_thread_message = "unset";
    std::thread([&] { other_thread_message = flashcore_last_error_message(); }).join();
    EXPECT_EQ(other_thread_message, "");
    EXPECT_NE(std::string(flashcore_last_error_message()).find("head_dim 80"), std::string::npos);
}

TEST(Params, InitSetsSizeAndDefaults) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.struct_size, sizeof(flashcore_forward_params));
    EXPECT_EQ(p.dtype, FLASHCORE_DTYPE_FP16);
    EXPECT_EQ(p.softmax_scale, FLASHCORE_SOFTMAX_SCALE_DEFAULT);
    EXPECT_EQ(p.causal, 0);
    EXPECT_EQ(p.q, nullptr);
    EXPECT_EQ(p.lse, nullptr);
    EXPECT_EQ(p.out_head_stride, 0);
    EXPECT_EQ(flashcore_forward_params_init(nullptr, sizeof p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p - 8), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("smaller than flashcore_forward_params"),
              std::string::npos);
}

// A caller built against a newer header passes a larger struct: init writes
// exactly its struct_size bytes (zeroing the fields this library does not
// know) and not one byte more.
TEST(Params, InitWritesExactlyTheCallersSize) {
    struct Newer {
        flashcore_forward_params base;
        int64_t future_field;
        unsigned char guard[16];
    } newer;
    std::memset(&newer, 0xAB, sizeof newer);
    const size_t size = offsetof(Newer, guard);
    ASSERT_EQ(flashcore_forward_params_init(&newer.base, size), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(newer.base.struct_size, size);
    EXPECT_EQ(newer.future_field, 0);
    for (unsigned char byte : newer.guard) EXPECT_EQ(byte, 0xAB) << "init wrote past struct_size";
    EXPECT_EQ(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_INVALID_ARGUMENT);  // sizes still unset
}

TEST(Params, ContiguousStrides) {
    flashcore_forward_params p = valid_params();  // B=2, Sq=100, Sk=300, Hq=8, Hkv=2, D=64
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.q_seq_stride, 64);
    EXPECT_EQ(p.q_head_stride, 100 * 64);
    EXPECT_EQ(p.q_batch_stride, 8 * 100 * 64);
    EXPECT_EQ(p.k_head_stride, 300 * 64);
    EXPECT_EQ(p.v_batch_stride, 2 * 300 * 64);
    EXPECT_EQ(p.out_head_stride, 100 * 64);
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.q_head_stride, 64);
    EXPECT_EQ(p.q_seq_stride, 8 * 64);
    EXPECT_EQ(p.k_seq_stride, 2 * 64);
    EXPECT_EQ(p.v_batch_stride, 300 * 2 * 64);
    EXPECT_EQ(p.out_batch_stride, 100 * 8 * 64);
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, static_cast<flashcore_layout>(7)),
              FLASHCORE_STATUS_INVALID_ARGUMENT);
    p.seqlen_k = 0;
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("seqlen_k"), std::string::npos);
    EXPECT_EQ(flashcore_set_contiguous_strides(nullptr, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

TEST(Validation, ValidParamsPass) {
    flashcore_forward_params p = valid_params();
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.lse = nullptr;  // optional
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS);
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.head_dim = 128;
    p.causal = 1;
    p.softmax_scale = 0.3f;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Broadcast inputs (stride 0) are allowed: only the output must not overlap.
    p.k_batch_stride = 0;
    p.v_batch_stride = 0;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

struct InvalidCase {
    const char *name;
    std::function<void(flashcore_forward_params &)> mutate;
    flashcore_status expected;
    const char *message_part;
};

class InvalidParams : public testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidParams, ReturnSpecificStatusAndMessage) {
    const InvalidCase &c = GetParam();
    flashcore_forward_params p = valid_params();
    c.mutate(p);
    EXPECT_EQ(flashcore_forward_check(&p), c.expected) << flashcore_last_error_message();
    const std::string message = flashcore_last_error_message();
    EXPECT_NE(message.find(c.message_part), std::string::npos) << "message: " << message;
    // Without a handle the forward call fails on the handle first; with NULL
    // params it must still not crash.
    EXPECT_EQ(flashcore_forward(nullptr, &p, nullptr, 0, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

const InvalidCase kInvalidCases[] = {
    {"struct_size_zero", [](auto &p) { p.struct_size = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "struct_size (0)"},
    {"struct_size_too_small", [](auto &p) { p.struct_size = sizeof(p) - 8; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "sizeof(flashcore_forward_params)"},
    {"struct_size_garbage", [](auto &p) { p.struct_size = size_t(1) << 40; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "not a valid size"},
    {"dtype_zero", [](auto &p) { p.dtype = 0; }, FLASHCORE_STATUS_UNSUPPORTED, "dtype 0 is not supported"},
    {"dtype_unknown", [](auto &p) { p.dtype = 7; }, FLASHCORE_STATUS_UNSUPPORTED, "FLASHCORE_DTYPE_BF16"},
    {"batch_zero", [](auto &p) { p.batch_size = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "batch_size (0) must be >= 1"},
    {"batch_negative", [](auto &p) { p.batch_size = -3; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "batch_size (-3)"},
    {"seqlen_q_zero", [](auto &p) { p.seqlen_q = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_q (0)"},
    {"seqlen_k_negative", [](auto &p) { p.seqlen_k = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_k (-1)"},
    {"heads_q_zero", [](auto &p) { p.num_heads_q = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (0)"},
    {"heads_kv_zero", [](auto &p) { p.num_heads_kv = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_kv (0)"},
    {"head_dim_zero", [](auto &p) { p.head_dim = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim (0)"},
    {"heads_do_not_divide", [](auto &p) { p.num_heads_q = 12; p.num_heads_kv = 5; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (12) must be a multiple of num_heads_kv (5)"},
    {"more_kv_heads_than_q", [](auto &p) { p.num_heads_q = 2; p.num_heads_kv = 8; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "multiple of num_heads_kv (8)"},
    {"head_dim_80", [](auto &p) { p.head_dim = 80; }, FLASHCORE_STATUS_UNSUPPORTED, "supported head dims: 64, 128"},
    {"head_dim_256", [](auto &p) { p.head_dim = 256; }, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 256"},
    {"seqlen_too_long", [](auto &p) { p.seqlen_k = (1 << 30) + 1; }, FLASHCORE_STATUS_UNSUPPORTED, "at most"},
    {"scale_negative", [](auto &p) { p.softmax_scale = -0.5f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softmax_scale (-0.5)"},
    {"scale_nan", [](auto &p) { p.softmax_scale = NAN; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "finite"},
    {"scale_inf", [](auto &p) { p.softmax_scale = INFINITY; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "finite"},
    {"q_null", [](auto &p) { p.q = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "q is NULL"},
    {"k_null", [](auto &p) { p.k = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "k is NULL"},
    {"v_null", [](auto &p) { p.v = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "v is NULL"},
    {"out_null", [](auto &p) { p.out = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "out is NULL"},
    {"q_misaligned", [](auto &p) { p.q = fake_pointer(0x10002); }, FLASHCORE_STATUS_MISALIGNED, "16-byte aligned"},
    {"out_misaligned", [](auto &p) { p.out = fake_pointer(0x40008); }, FLASHCORE_STATUS_MISALIGNED, "out ("},
    {"lse_misaligned", [](auto &p) { p.lse = static_cast<float *>(fake_pointer(0x50002)); },
     FLASHCORE_STATUS_MISALIGNED, "lse ("},
    {"stride_negative", [](auto &p) { p.k_seq_stride = -128; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "k_seq_stride (-128) must be >= 0"},
    {"stride_not_multiple_of_8", [](auto &p) { p.v_head_stride = 100; }, FLASHCORE_STATUS_MISALIGNED,
     "v_head_stride (100) must be a multiple of 8"},
    {"batch_stride_misaligned", [](auto &p) { p.q_batch_stride += 4; }, FLASHCORE_STATUS_MISALIGNED,
     "q_batch_stride"},
    {"out_rows_overlap", [](auto &p) { p.out_seq_stride = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "make elements overlap"},
    {"out_heads_overlap", [](auto &p) { p.out_head_stride = 32; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "make elements overlap"},
    {"strides_overflow", [](auto &p) { p.q_batch_stride = int64_t(1) << 62; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "2^63 bytes"},
};

INSTANTIATE_TEST_SUITE_P(AllParameters, InvalidParams, testing::ValuesIn(kInvalidCases),
                         [](const testing::TestParamInfo<InvalidCase> &info) { return std::string(info.param.name); });

TEST(Validation, NullParams) {
    EXPECT_EQ(flashcore_forward_check(nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "params is NULL");
}

// A struct from a newer header: accepted when the fields this library does
// not know are zero, refused when they are set.
TEST(Validation, StructFromNewerHeader) {
    struct Newer {
        flashcore_forward_params base;
        int64_t future_field;
    } newer;
    newer.base = valid_params();
    newer.base.struct_size = sizeof(Newer);
    newer.future_field = 0;
    EXPECT_EQ(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    newer.future_field = 42;
    EXPECT_EQ(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_UNSUPPORTED);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("newer flashcore.h"), std::string::npos);
}

TEST(Handle, NullArguments) {
    EXPECT_EQ(flashcore_create(nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_create_for_device(nullptr, 0), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_destroy(nullptr), FLASHCORE_STATUS_SUCCESS);
    int device = 0;
    EXPECT_EQ(flashcore_handle_device(nullptr, &device), FLASHCORE_STATUS_INVALID_ARGUMENT);
    size_t bytes = 0;
    flashcore_forward_params p = valid_params();
    EXPECT_EQ(flashcore_forward_workspace_size(nullptr, &p, &bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "handle is NULL");
}

// Without a GPU, creation reports the missing device; with one, it works.
TEST(Handle, CreateMatchesDevicePresence) {
    std::string reason;
    const bool have_gpu = flashcore_test::cuda_device_available(&reason);
    flashcore_handle h = reinterpret_cast<flashcore_handle>(fake_pointer(0x1234));
    const flashcore_status status = flashcore_create(&h);
    if (have_gpu) {
        ASSERT_EQ(status, FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        ASSERT_NE(h, nullptr);
        EXPECT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_SUCCESS);
    } else {
        EXPECT_EQ(status, FLASHCORE_STATUS_NO_DEVICE) << flashcore_last_error_message();
        EXPECT_EQ(h, nullptr) << "the handle must be set to NULL on failure";
        EXPECT_NE(std::string(flashcore_last_error_message()).find("CUDA"), std::string::npos)
            << flashcore_last_error_message();
        std::printf("no GPU here: flashcore_create said: %s\n", flashcore_last_error_message());
    }
}

}  // namespace
