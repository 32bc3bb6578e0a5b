// The C API without launching anything: versions, status strings, error
// messages, parameter helpers, and validation of every parameter. Runs on
// machines with and without a GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <dlfcn.h>

#include "device_tensors.h"
#include "flashcore.h"

// tests/enum_calls.c: the enum arguments as any int.
extern "C" const char *status_string_of_int(int value);
extern "C" flashcore_status set_contiguous_strides_of_int(flashcore_forward_params *params, int value);

namespace {

// flashcore_forward_params as a 0.1 caller compiled it: it ended before
// head_dim_v.
constexpr size_t kParamsSizeV0_1 = offsetof(flashcore_forward_params, head_dim_v);
// As a 0.3 caller compiled it: it ended after num_splits, before the window.
constexpr size_t kParamsSizeV0_3 = offsetof(flashcore_forward_params, use_window);
// As a 0.4 caller compiled it: it ended after softcap, before seqused_k.
constexpr size_t kParamsSizeV0_4 = offsetof(flashcore_forward_params, seqused_k);
// As a 0.5 caller compiled it: it ended after seqused_k.
constexpr size_t kParamsSizeV0_5 = offsetof(flashcore_forward_params, cu_seqlens_q);
// As a 0.6 or 0.7 caller compiled it: it ended after num_pages.
constexpr size_t kParamsSizeV0_6 = offsetof(flashcore_forward_params, num_pages) + sizeof(int32_t);
// As a 0.8 caller compiled it: it ended after v_descale_head_stride (an
// 8-byte field: its end is its sizeof too).
constexpr size_t kParamsSizeV0_8 = offsetof(flashcore_forward_params, v_descale_head_stride) + sizeof(int64_t);
// Where the last field of this header (sm_margin, 0.9) ends: bytes of a
// larger struct past it belong to a newer header's fields.
constexpr size_t kParamsKnownEnd = offsetof(flashcore_forward_params, sm_margin) + sizeof(int32_t);

// flashcore_merge_params as a 0.3 to 0.8 caller compiled it: it ended after
// out_head_stride (an 8-byte field: its end is its sizeof too); and where
// the last field of this header's (sinks, 0.9) ends.
constexpr size_t kMergeSizeV0_3 = offsetof(flashcore_merge_params, out_head_stride) + sizeof(int64_t);
constexpr size_t kMergeKnownEnd = offsetof(flashcore_merge_params, sinks) + sizeof(void *);
// flashcore_backward_params as a 0.7 or 0.8 caller compiled it: it ended
// after total_seqlen_k (at an 8-byte boundary: its end is its sizeof too);
// and where the last field of this header's (sm_margin, 0.9) ends.
constexpr size_t kBackwardSizeV0_7 = offsetof(flashcore_backward_params, total_seqlen_k) + sizeof(int32_t);
constexpr size_t kBackwardKnownEnd = offsetof(flashcore_backward_params, sm_margin) + sizeof(int32_t);

// Plausible, suitably aligned device addresses: flashcore_forward_check never
// dereferences them.
void *fake_pointer(uintptr_t address) { return reinterpret_cast<void *>(address); }

// The i-th of some fake tensors, 2^36 bytes apart: larger than any tensor of
// these tests, so they never overlap.
void *fake_tensor(int i) { return fake_pointer((uintptr_t(i) + 1) << 36); }

flashcore_forward_params valid_params() {
    flashcore_forward_params p;
    EXPECT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.batch_size = 2;
    p.seqlen_q = 100;
    p.seqlen_k = 300;
    p.num_heads_q = 8;
    p.num_heads_kv = 2;
    p.head_dim = 64;
    p.q = fake_tensor(0);
    p.k = fake_tensor(1);
    p.v = fake_tensor(2);
    p.out = fake_tensor(3);
    p.lse = static_cast<float *>(fake_tensor(4));
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    return p;
}

// A caller's struct S of an older header's `size` in memory filled with
// 0xAB bytes (what lies past its end), initialised by the library's
// init_struct, then given `valid`'s fields up to that size.
template <typename S>
struct OlderCaller {
    alignas(S) unsigned char memory[sizeof(S) + 16];
    S *p = reinterpret_cast<S *>(memory);

    // Returns "" or what went wrong.
    std::string init(size_t size, flashcore_status (*init_struct)(S *, size_t), const S &valid) {
        std::memset(memory, 0xAB, sizeof memory);
        if (init_struct(p, size) != FLASHCORE_STATUS_SUCCESS) return flashcore_last_error_message();
        if (p->struct_size != size) return "struct_size " + std::to_string(p->struct_size);
        const std::string written = written_past(size);
        if (!written.empty()) return "init: " + written;
        constexpr size_t kFirstField = sizeof(size_t);  // all but struct_size, which every struct begins with
        std::memcpy(memory + kFirstField, reinterpret_cast<const unsigned char *>(&valid) + kFirstField,
                    size - kFirstField);
        return "";
    }

    // Whether any byte past the caller's `size` bytes was written.
    std::string written_past(size_t size) const {
        for (size_t i = size; i < sizeof memory; ++i)
            if (memory[i] != 0xAB) return "byte " + std::to_string(i) + " was written";
        return "";
    }
};

// A newer header's S: ours and 16 bytes more, holding `valid`'s fields.
// `check` accepts it while the bytes past ours are zero, and refuses it as
// UNSUPPORTED, naming `known_end` (the bytes this library knows), when any
// one of them is set.
template <typename S>
void expect_newer_fields_refused(const S &valid, flashcore_status (*check)(const S *), size_t known_end) {
    struct Newer {
        S base;
        unsigned char future[16];
    } newer{};
    static_assert(offsetof(Newer, future) == sizeof(S), "the newer header's fields follow ours");
    newer.base = valid;
    newer.base.struct_size = sizeof newer;
    EXPECT_EQ(check(&newer.base), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    for (unsigned char &byte : newer.future) {
        byte = 1;
        EXPECT_EQ(check(&newer.base), FLASHCORE_STATUS_UNSUPPORTED) << "byte " << (&byte - newer.future);
        EXPECT_EQ(std::string(flashcore_last_error_message()),
                  "params sets fields beyond the " + std::to_string(known_end) + " bytes this library (version " +
                      flashcore_version_string() + ") knows; it was built against a newer flashcore.h");
        byte = 0;
    }
}

// Every struct_size of a struct S holding `valid`'s fields, from `ends`'
// first (where S first appeared) to 64 bytes past ours: accepted exactly
// where a released header's S ended (`ends`, in release order) or at that
// end padded to S's alignment (that header's sizeof), and at our sizeof or
// more (a newer header's); any other size ends inside a field and is
// refused, by `check` and by `init`, as INVALID_ARGUMENT with the message
// that lists the released sizes (`released`, as the message writes them)
// and ours. Returns how many sizes were refused.
template <typename S>
size_t expect_released_sizes_only(const S &valid, flashcore_status (*check)(const S *),
                                  flashcore_status (*init)(S *, size_t), const std::string &name,
                                  std::initializer_list<size_t> ends, const std::string &released) {
    std::set<size_t> accepted;
    for (size_t end : ends) {
        accepted.insert(end);
        accepted.insert((end + alignof(S) - 1) / alignof(S) * alignof(S));
    }
    alignas(S) unsigned char memory[sizeof(S) + 64] = {};
    std::memcpy(memory, &valid, sizeof valid);
    S *p = reinterpret_cast<S *>(memory);
    size_t refused = 0;
    for (size_t size = *ends.begin(); size <= sizeof memory; ++size) {
        p->struct_size = size;
        const flashcore_status status = check(p);
        const std::string message = flashcore_last_error_message();
        if (accepted.count(size) != 0 || size >= sizeof(S)) {
            EXPECT_EQ(status, FLASHCORE_STATUS_SUCCESS) << name << " of " << size << " bytes: " << message;
            continue;
        }
        ++refused;
        EXPECT_EQ(status, FLASHCORE_STATUS_INVALID_ARGUMENT) << name << " of " << size << " bytes";
        EXPECT_EQ(message, "params->struct_size (" + std::to_string(size) + ") is not the size of " + name +
                               " in any flashcore.h (released sizes: " + released + "; a newer header's is at least " +
                               std::to_string(sizeof(S)) + "); pass sizeof(" + name + ") to " + name + "_init");
        S fresh;
        std::memset(&fresh, 0xAB, sizeof fresh);
        EXPECT_EQ(init(&fresh, size), FLASHCORE_STATUS_INVALID_ARGUMENT) << name << " of " << size << " bytes";
        EXPECT_EQ(fresh.struct_size, size_t(0xABABABABABABABABull)) << "a refused init wrote the struct";
    }
    return refused;
}

using HeadDimPair = std::pair<int32_t, int32_t>;  // (head_dim, head_dim_v)

// What flashcore_supported_head_dims lists, read the documented way: a
// sizing call, then a call with room for every pair.
std::vector<HeadDimPair> supported_pairs() {
    size_t count = 0;
    EXPECT_EQ(flashcore_supported_head_dims(nullptr, nullptr, 0, &count), FLASHCORE_STATUS_SUCCESS);
    std::vector<int32_t> dims(count), dims_v(count);
    size_t again = 0;
    EXPECT_EQ(flashcore_supported_head_dims(dims.data(), dims_v.data(), count, &again), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(again, count);
    std::vector<HeadDimPair> pairs;
    for (size_t i = 0; i < count; ++i) pairs.emplace_back(dims[i], dims_v[i]);
    return pairs;
}

// "(32, 32), (64, 64)": how the messages list the pairs.
std::string pairs_text(const std::vector<HeadDimPair> &pairs) {
    std::string text;
    for (const HeadDimPair &p : pairs) {
        if (!text.empty()) text += ", ";
        text += "(" + std::to_string(p.first) + ", " + std::to_string(p.second) + ")";
    }
    return text;
}

// The header's documented list for the default build (every line of
// fwd line of kernels/kernels.list).
const std::vector<HeadDimPair> kDefaultHeadDims = {{32, 32},   {64, 64},   {96, 96},   {128, 128},
                                                   {192, 128}, {256, 256}, {512, 512}, {576, 512}};

// Whether this build lists the default head dims; a build configured with
// FLASHCORE_HEAD_DIMS lists fewer.
bool default_head_dims_built() { return supported_pairs() == kDefaultHeadDims; }

// The documented covering rule, from the listed pairs.
bool covered(const std::vector<HeadDimPair> &pairs, int32_t head_dim, int32_t head_dim_v) {
    return head_dim % 8 == 0 && head_dim_v % 8 == 0 &&
           std::any_of(pairs.begin(), pairs.end(),
                       [&](const HeadDimPair &p) { return p.first >= head_dim && p.second >= head_dim_v; });
}

// Whether the documented rule runs (head_dim, head_dim_v) on MLA's
// latent-cache kernel, (576, 512), which takes v only as k's view (the
// header's head_dim_v): the first covering pair is that one.
bool latent_cache_pair(const std::vector<HeadDimPair> &pairs, int32_t head_dim, int32_t head_dim_v) {
    for (const HeadDimPair &p : pairs) {
        if (p.first >= head_dim && p.second >= head_dim_v) return p == HeadDimPair(576, 512);
    }
    return false;
}

// Skips the calling test where this build cannot run those head dims (it was
// configured with FLASHCORE_HEAD_DIMS).
#define SKIP_UNLESS_BUILT_FOR(head_dim, head_dim_v)                                                    \
    if (!covered(supported_pairs(), head_dim, head_dim_v))                                             \
    GTEST_SKIP() << "this build has no kernel for head dims (" << (head_dim) << ", " << (head_dim_v)   \
                 << "); it lists " << pairs_text(supported_pairs())

// The sm80 head dims of the generated kernel lists (on the include path where
// the build puts them there): what the query must list (the forward's), and
// what flashcore_backward_check takes (the backward's), however the build
// was configured.
#if defined(__has_include)
#if __has_include("fwd_kernels.inc") && __has_include("bwd_kernels.inc")
#define FLASHCORE_TEST_HAS_KERNEL_LIST 1
// One line of a generated list: FLASHCORE_KERNEL(path, input, kv, output,
// head_dim, head_dim_v, tile).
struct KernelLine {
    const char *path;
    const char *input;  // the DType enumerator: kFp16, kBf16, kE4m3
    int32_t head_dim, head_dim_v;
};
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile) \
    KernelLine{#path, #input, head_dim, head_dim_v},

std::vector<HeadDimPair> sm80_head_dims(std::initializer_list<KernelLine> lines) {
    std::set<HeadDimPair> pairs;
    for (const KernelLine &line : lines) {
        if (std::string(line.path) == "sm80") pairs.emplace(line.head_dim, line.head_dim_v);
    }
    return {pairs.begin(), pairs.end()};
}

std::vector<HeadDimPair> generated_head_dims() {
    return sm80_head_dims({
#include "fwd_kernels.inc"
    });
}

std::vector<HeadDimPair> generated_bwd_head_dims() {
    return sm80_head_dims({
#include "bwd_kernels.inc"
    });
}

// The head dims of the forward kernels on e4m3 queries (fp8 prefill: sm90
// lines only), sorted; empty in a build without the sm_90a kernels.
std::vector<HeadDimPair> generated_fp8_head_dims() {
    const std::initializer_list<KernelLine> lines = {
#include "fwd_kernels.inc"
    };
    std::set<HeadDimPair> pairs;
    for (const KernelLine &line : lines) {
        if (std::string(line.input) == "kE4m3") pairs.emplace(line.head_dim, line.head_dim_v);
    }
    return {pairs.begin(), pairs.end()};
}
#undef FLASHCORE_KERNEL
#endif
#endif

TEST(Version, RuntimeMatchesHeader) {
    EXPECT_EQ(flashcore_version_number(), unsigned(FLASHCORE_VERSION_NUMBER));
    EXPECT_EQ(FLASHCORE_VERSION_NUMBER, 900);
    EXPECT_STREQ(flashcore_version_string(), "0.9.0");
}

TEST(Version, CudaRuntimeIsTheToolkits) {
    // The toolkit that built the library (tests/CMakeLists.txt), e.g. 12040
    // for the CUDA 12 build; no driver needed.
    EXPECT_EQ(flashcore_cuda_runtime_version(), FLASHCORE_TOOLKIT_RUNTIME_VERSION);
    EXPECT_GE(flashcore_cuda_runtime_version(), 12040);
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
    // Out-of-range values are passed from C (tests/enum_calls.c): in C++ the
    // cast itself would be undefined.
    EXPECT_STREQ(status_string_of_int(999), "unknown status");
    EXPECT_STREQ(status_string_of_int(-1), "unknown status");
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
    p.head_dim = 100;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED);
    std::string other_thread_message = "unset";
    std::thread([&] { other_thread_message = flashcore_last_error_message(); }).join();
    EXPECT_EQ(other_thread_message, "");
    EXPECT_NE(std::string(flashcore_last_error_message()).find("head_dim 100"), std::string::npos);
}

// Every function may be called from several threads at once (flashcore.h):
// threads validating different params, creating handles (with a GPU) or
// failing to (without), listing head dims and reading their own messages,
// all at once, each see their own results. CI runs the Threads tests under
// ThreadSanitizer too (.ci/run).
TEST(Threads, ConcurrentCallsKeepTheirOwnResultsAndMessages) {
    constexpr int kThreads = 8;
    constexpr int kRounds = 200;
    std::string reason;
    const bool have_gpu = flashcore_test::cuda_device_available(&reason);
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, have_gpu, &failures] {
            std::string &failure = failures[t];
            for (int round = 0; round < kRounds && failure.empty(); ++round) {
                // Thread t's own refusal: an odd num_heads_q of its own.
                flashcore_forward_params p = valid_params();
                p.num_heads_q = 2 * t + 3;
                p.num_heads_kv = 2;
                if (flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD) != FLASHCORE_STATUS_SUCCESS) {
                    failure = "strides: " + std::string(flashcore_last_error_message());
                }
                const std::string expected = "num_heads_q (" + std::to_string(p.num_heads_q) +
                                             ") must be a multiple of num_heads_kv (2)";
                if (flashcore_forward_check(&p) != FLASHCORE_STATUS_INVALID_ARGUMENT ||
                    flashcore_last_error_message() != expected) {
                    failure = "check: " + std::string(flashcore_last_error_message());
                }
                size_t count = 0;
                if (flashcore_supported_head_dims(nullptr, nullptr, 0, &count) != FLASHCORE_STATUS_SUCCESS ||
                    count == 0) {
                    failure = "supported_head_dims";
                }
                if (round % 20 == 0) {
                    flashcore_handle h = nullptr;
                    const flashcore_status status = flashcore_create(&h);
                    if (status != (have_gpu ? FLASHCORE_STATUS_SUCCESS : FLASHCORE_STATUS_NO_DEVICE)) {
                        failure = "create: " + std::string(flashcore_last_error_message());
                    }
                    flashcore_destroy(h);
                }
                p = valid_params();
                if (flashcore_forward_check(&p) != FLASHCORE_STATUS_SUCCESS ||
                    std::string(flashcore_last_error_message()) != "") {
                    failure = "valid check: " + std::string(flashcore_last_error_message());
                }
            }
        });
    }
    for (std::thread &thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
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
    EXPECT_EQ(p.head_dim_v, 0);  // same as head_dim
    EXPECT_EQ(p.attention_chunk, 0);  // no chunks (0.9)
    EXPECT_EQ(p.sinks, nullptr);
    EXPECT_EQ(flashcore_forward_params_init(nullptr, sizeof p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_forward_params_init(&p, kParamsSizeV0_1 - 8), FLASHCORE_STATUS_INVALID_ARGUMENT);
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
    EXPECT_EQ(set_contiguous_strides_of_int(&p, 7), FLASHCORE_STATUS_INVALID_ARGUMENT);
    p.seqlen_k = 0;
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("seqlen_k"), std::string::npos);
    EXPECT_EQ(flashcore_set_contiguous_strides(nullptr, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

// v and out have head_dim_v columns, q and k head_dim.
TEST(Params, ContiguousStridesWithHeadDimV) {
    SKIP_UNLESS_BUILT_FOR(192, 128);
    flashcore_forward_params p = valid_params();  // B=2, Sq=100, Sk=300, Hq=8, Hkv=2
    p.head_dim = 192;
    p.head_dim_v = 128;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.q_seq_stride, 192);
    EXPECT_EQ(p.q_head_stride, 100 * 192);
    EXPECT_EQ(p.k_head_stride, 300 * 192);
    EXPECT_EQ(p.k_batch_stride, 2 * 300 * 192);
    EXPECT_EQ(p.v_seq_stride, 128);
    EXPECT_EQ(p.v_head_stride, 300 * 128);
    EXPECT_EQ(p.v_batch_stride, 2 * 300 * 128);
    EXPECT_EQ(p.out_seq_stride, 128);
    EXPECT_EQ(p.out_head_stride, 100 * 128);
    EXPECT_EQ(p.out_batch_stride, 8 * 100 * 128);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.q_head_stride, 192);
    EXPECT_EQ(p.q_seq_stride, 8 * 192);
    EXPECT_EQ(p.k_seq_stride, 2 * 192);
    EXPECT_EQ(p.v_head_stride, 128);
    EXPECT_EQ(p.v_seq_stride, 2 * 128);
    EXPECT_EQ(p.v_batch_stride, 300 * 2 * 128);
    EXPECT_EQ(p.out_head_stride, 128);
    EXPECT_EQ(p.out_seq_stride, 8 * 128);
    EXPECT_EQ(p.out_batch_stride, 100 * 8 * 128);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // 0: the same as head_dim.
    p.head_dim_v = 0;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.v_seq_stride, 2 * 192);
    EXPECT_EQ(p.out_seq_stride, 8 * 192);
    p.head_dim_v = -8;
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("head_dim_v (-8)"), std::string::npos);
}

TEST(Validation, ValidParamsPass) {
    flashcore_forward_params p = valid_params();
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.lse = nullptr;  // optional
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS);
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.head_dim = covered(supported_pairs(), 128, 128) ? 128 : 64;
    p.causal = 1;
    p.softmax_scale = 0.3f;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Broadcast inputs (stride 0) are allowed: only the output must not overlap.
    p.k_batch_stride = 0;
    p.v_batch_stride = 0;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// Head dims without a kernel of their own run on the first listed pair that
// covers them (the default build: 80 on (96, 96), 112 on (128, 128),
// (160, 128) on (192, 128), (64, 128) on (128, 128), 8 on (32, 32)).
TEST(Validation, HeadDimsRoundUpToACoveringKernel) {
    if (!default_head_dims_built()) {
        GTEST_SKIP() << "this build was configured with FLASHCORE_HEAD_DIMS and lists only "
                     << pairs_text(supported_pairs()) << "; Validation.EveryHeadDimPair covers it";
    }
    const HeadDimPair calls[] = {{80, 0}, {112, 0}, {160, 128}, {64, 128}, {8, 0}, {8, 256}, {248, 8}, {256, 0}};
    for (const HeadDimPair &call : calls) {
        flashcore_forward_params p = valid_params();
        p.head_dim = call.first;
        p.head_dim_v = call.second;
        ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
            << "head_dim " << call.first << ", head_dim_v " << call.second << ": " << flashcore_last_error_message();
    }
}

// Every pair of head dims up to past the largest listed: accepted exactly
// when the documented rule finds a covering pair; otherwise UNSUPPORTED with a
// message that lists the pairs this build has.
TEST(Validation, EveryHeadDimPair) {
    const std::vector<HeadDimPair> pairs = supported_pairs();
    ASSERT_FALSE(pairs.empty());
    int32_t largest = 0;
    for (const HeadDimPair &p : pairs) largest = std::max({largest, p.first, p.second});
    const std::string listed = pairs_text(pairs);
    for (int32_t head_dim = 4; head_dim <= largest + 16; head_dim += 4) {
        for (int32_t head_dim_v = 4; head_dim_v <= largest + 16; head_dim_v += 4) {
            flashcore_forward_params p = valid_params();
            p.head_dim = head_dim;
            p.head_dim_v = head_dim_v;
            ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
            const flashcore_status status = flashcore_forward_check(&p);
            const std::string message = flashcore_last_error_message();
            if (covered(pairs, head_dim, head_dim_v) && latent_cache_pair(pairs, head_dim, head_dim_v)) {
                // MLA's latent-cache kernel: v only as k's view.
                EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << head_dim << "/" << head_dim_v;
                EXPECT_NE(message.find("pass v = k with k's strides"), std::string::npos)
                    << head_dim << "/" << head_dim_v << ": " << message;
                flashcore_forward_params view = p;
                view.v = view.k;
                view.v_batch_stride = view.k_batch_stride;
                view.v_seq_stride = view.k_seq_stride;
                view.v_head_stride = view.k_head_stride;
                if (head_dim_v <= head_dim) {
                    EXPECT_EQ(flashcore_forward_check(&view), FLASHCORE_STATUS_SUCCESS)
                        << head_dim << "/" << head_dim_v << " with v as k's view: " << flashcore_last_error_message();
                }
            } else if (covered(pairs, head_dim, head_dim_v)) {
                EXPECT_EQ(status, FLASHCORE_STATUS_SUCCESS) << head_dim << "/" << head_dim_v << ": " << message;
            } else {
                EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << head_dim << "/" << head_dim_v;
                EXPECT_NE(message.find("supported (head_dim, head_dim_v): " + listed + ", and any pair of multiples "
                                       "of 8 that one of these covers"),
                          std::string::npos)
                    << head_dim << "/" << head_dim_v << ": " << message;
            }
        }
    }
}

// The messages say what is wrong with the call, with this build's limits.
TEST(Validation, UnsupportedHeadDimMessages) {
    const std::vector<HeadDimPair> pairs = supported_pairs();
    int32_t largest = 0, largest_v = 0;
    for (const HeadDimPair &p : pairs) {
        largest = std::max(largest, p.first);
        largest_v = std::max(largest_v, p.second);
    }
    const struct {
        int32_t head_dim, head_dim_v;
        std::string expected;
    } cases[] = {
        {100, 0, "head_dim 100 is not a multiple of 8; supported (head_dim, head_dim_v): " + pairs_text(pairs)},
        {64, 300, "head_dim_v 300 is not a multiple of 8; supported"},
        {100, 300, "head_dim 100 is not a multiple of 8;"},
        {largest + 8, 0, "head_dim " + std::to_string(largest + 8) + " exceeds " + std::to_string(largest) + ";"},
        {8, largest_v + 8,
         "head_dim_v " + std::to_string(largest_v + 8) + " exceeds " + std::to_string(largest_v) + ";"},
    };
    for (const auto &c : cases) {
        flashcore_forward_params p = valid_params();
        p.head_dim = c.head_dim;
        p.head_dim_v = c.head_dim_v;
        ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED);
        EXPECT_NE(std::string(flashcore_last_error_message()).find(c.expected), std::string::npos)
            << "expected: " << c.expected << "\nmessage:  " << flashcore_last_error_message();
    }
}

// The tensor checks size v and out by head_dim_v, q and k by head_dim.
TEST(Validation, TensorsOfVAndOutHaveHeadDimV) {
    SKIP_UNLESS_BUILT_FOR(192, 128);
    SKIP_UNLESS_BUILT_FOR(64, 128);
    flashcore_forward_params p = valid_params();
    p.head_dim = 192;
    p.head_dim_v = 128;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    // Packed heads 128 apart: distinct for 128 columns (they would overlap
    // were out 192 wide).
    EXPECT_EQ(p.out_head_stride, 128);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.out_head_stride = 120;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("make elements overlap"), std::string::npos);
    // Narrow q/k, wide v/out: out heads 64 apart overlap at 128 columns.
    p = valid_params();
    p.head_dim = 64;
    p.head_dim_v = 128;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.out_head_stride = 64;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("out strides"), std::string::npos);
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
    {"struct_size_too_small", [](auto &p) { p.struct_size = kParamsSizeV0_1 - 8; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "sizeof(flashcore_forward_params)"},
    {"struct_size_garbage", [](auto &p) { p.struct_size = size_t(1) << 40; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "not a valid size"},
    {"dtype_zero", [](auto &p) { p.dtype = 0; }, FLASHCORE_STATUS_UNSUPPORTED, "dtype 0 is not supported"},
    {"dtype_unknown", [](auto &p) { p.dtype = 7; }, FLASHCORE_STATUS_UNSUPPORTED, "FLASHCORE_DTYPE_BF16"},
    {"batch_negative", [](auto &p) { p.batch_size = -3; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "batch_size (-3) must be >= 0"},
    {"seqlen_q_negative", [](auto &p) { p.seqlen_q = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_q (-1)"},
    {"seqlen_k_negative", [](auto &p) { p.seqlen_k = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_k (-1)"},
    {"seqlen_k_zero", [](auto &p) { p.seqlen_k = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "seqlen_k (0) must be >= 1 where the output is not empty"},
    {"heads_q_negative", [](auto &p) { p.num_heads_q = -8; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (-8)"},
    {"heads_kv_zero", [](auto &p) { p.num_heads_kv = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "num_heads_kv (0) must be >= 1 where num_heads_q (8) is not 0"},
    {"head_dim_zero", [](auto &p) { p.head_dim = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim (0)"},
    {"head_dim_zero_in_empty_call", [](auto &p) { p.head_dim = 0; p.batch_size = 0; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "head_dim (0) must be >= 1"},
    {"heads_do_not_divide", [](auto &p) { p.num_heads_q = 12; p.num_heads_kv = 5; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (12) must be a multiple of num_heads_kv (5)"},
    {"more_kv_heads_than_q", [](auto &p) { p.num_heads_q = 2; p.num_heads_kv = 8; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "multiple of num_heads_kv (8)"},
    {"head_dim_100", [](auto &p) { p.head_dim = 100; }, FLASHCORE_STATUS_UNSUPPORTED,
     "head_dim 100 is not a multiple of 8"},
    {"head_dim_4", [](auto &p) { p.head_dim = 4; }, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 4 is not a multiple of 8"},
    {"head_dim_584", [](auto &p) { p.head_dim = 584; }, FLASHCORE_STATUS_UNSUPPORTED,
     "head_dim 584 exceeds"},
    {"head_dim_v_300", [](auto &p) { p.head_dim_v = 300; }, FLASHCORE_STATUS_UNSUPPORTED,
     "head_dim_v 300 is not a multiple of 8"},
    {"head_dim_v_520", [](auto &p) { p.head_dim_v = 520; }, FLASHCORE_STATUS_UNSUPPORTED,
     "head_dim_v 520 exceeds"},
    {"head_dim_v_negative", [](auto &p) { p.head_dim_v = -8; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "head_dim_v (-8) must be >= 1, or 0 for the same as head_dim"},
    {"seqlen_too_long", [](auto &p) { p.seqlen_k = (1 << 30) + 1; }, FLASHCORE_STATUS_UNSUPPORTED, "at most"},
    {"scale_negative", [](auto &p) { p.softmax_scale = -0.5f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softmax_scale (-0.5)"},
    {"scale_nan", [](auto &p) { p.softmax_scale = NAN; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "finite"},
    {"scale_inf", [](auto &p) { p.softmax_scale = INFINITY; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "finite"},
    // Finite, but times log2(e) it is +inf in float (issue 15, item 5).
    {"scale_log2_overflows", [](auto &p) { p.softmax_scale = 3e38f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softmax_scale (3e+38) times log2(e) overflows a float"},
    {"q_null", [](auto &p) { p.q = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "q is NULL"},
    {"k_null", [](auto &p) { p.k = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "k is NULL"},
    {"v_null", [](auto &p) { p.v = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "v is NULL"},
    {"out_null", [](auto &p) { p.out = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "out is NULL"},
    {"q_misaligned", [](auto &p) { p.q = static_cast<const char *>(fake_tensor(0)) + 2; }, FLASHCORE_STATUS_MISALIGNED, "16-byte aligned"},
    {"out_misaligned", [](auto &p) { p.out = static_cast<char *>(fake_tensor(3)) + 8; }, FLASHCORE_STATUS_MISALIGNED, "out ("},
    {"lse_misaligned", [](auto &p) { p.lse = reinterpret_cast<float *>(static_cast<char *>(fake_tensor(4)) + 2); },
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
    {"num_splits_negative", [](auto &p) { p.num_splits = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "num_splits (-1) must be 0 (chosen per call), 1 (no split) or at most FLASHCORE_MAX_NUM_SPLITS (128)"},
    {"num_splits_too_many", [](auto &p) { p.num_splits = FLASHCORE_MAX_NUM_SPLITS + 1; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "num_splits (129)"},
    // Fields added in 0.4 (Window.* and Softcap.* go through more values).
    {"window_left_minus_2", [](auto &p) { p.use_window = 1; p.window_left = -2; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "window_left (-2) must be -1 (unbounded) or >= 0"},
    {"window_right_int32_min", [](auto &p) { p.use_window = 1; p.window_right = INT32_MIN; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "window_right (-2147483648) must be -1 (unbounded) or >= 0"},
    {"window_right_1_with_causal", [](auto &p) { p.use_window = 1; p.causal = 1; p.window_right = 1; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "window_right (1) must be -1 or 0 with causal"},
    {"softcap_negative", [](auto &p) { p.softcap = -30.f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softcap (-30) must be finite and > 0, or 0 for none"},
    {"softcap_nan", [](auto &p) { p.softcap = NAN; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "must be finite and > 0, or 0 for none"},
    {"softcap_inf", [](auto &p) { p.softcap = INFINITY; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softcap (inf) must be finite and > 0"},
    {"softcap_log2_overflows", [](auto &p) { p.softcap = FLT_MAX; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softcap (3.40282e+38) times log2(e) overflows a float"},
    {"softcap_quotient_underflows", [](auto &p) { p.softmax_scale = 1e-30f; p.softcap = 1e30f; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "softmax_scale / softcap (1e-30 / 1e+30) is not a finite float > 0"},
    // Fields added in 0.9 (AttentionChunk.* and Sinks.* go further).
    {"attention_chunk_negative", [](auto &p) { p.attention_chunk = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "attention_chunk (-1) must be 0 (no chunks) or the chunk length in keys (> 0)"},
    {"sinks_misaligned",
     [](auto &p) { p.sinks = reinterpret_cast<const float *>(static_cast<char *>(fake_tensor(9)) + 2); },
     FLASHCORE_STATUS_MISALIGNED, "sinks ("},
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

// A 0.1 caller's struct ends before head_dim_v: it is accepted, whatever
// lies in memory after it is never read or written, and head_dim_v is
// head_dim for it.
TEST(Validation, StructFromVersion0_1) {
    alignas(flashcore_forward_params) unsigned char memory[sizeof(flashcore_forward_params) + 16];
    std::memset(memory, 0xAB, sizeof memory);  // as head_dim_v, 0xABABABAB is negative
    flashcore_forward_params *p = reinterpret_cast<flashcore_forward_params *>(memory);
    ASSERT_EQ(flashcore_forward_params_init(p, kParamsSizeV0_1), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(p->struct_size, kParamsSizeV0_1);
    for (size_t i = kParamsSizeV0_1; i < sizeof memory; ++i) ASSERT_EQ(memory[i], 0xAB) << "init wrote byte " << i;
    p->batch_size = 2;
    p->seqlen_q = 100;
    p->seqlen_k = 300;
    p->num_heads_q = 8;
    p->num_heads_kv = 2;
    p->head_dim = 64;
    p->q = fake_tensor(0);
    p->k = fake_tensor(1);
    p->v = fake_tensor(2);
    p->out = fake_tensor(3);
    ASSERT_EQ(flashcore_set_contiguous_strides(p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(p->v_seq_stride, 2 * 64);
    EXPECT_EQ(p->out_seq_stride, 8 * 64);
    EXPECT_EQ(p->out_batch_stride, 100 * 8 * 64);
    for (size_t i = kParamsSizeV0_1; i < sizeof memory; ++i) ASSERT_EQ(memory[i], 0xAB) << "strides wrote byte " << i;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Its out is head_dim wide: heads 32 apart overlap.
    p->out_head_stride = 32;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("make elements overlap"), std::string::npos);
    // One byte less than 0.1's struct is not a struct of any version.
    p->struct_size = kParamsSizeV0_1 - 1;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

// A 0.2 caller's struct ends before num_splits: it is accepted and chooses
// its splits per call (num_splits 0), whatever lies in memory after it.
TEST(Validation, StructFromVersion0_2) {
    constexpr size_t kParamsSizeV0_2 = offsetof(flashcore_forward_params, num_splits);
    alignas(flashcore_forward_params) unsigned char memory[sizeof(flashcore_forward_params) + 16];
    std::memset(memory, 0xAB, sizeof memory);  // as num_splits, 0xABABABAB is negative
    const flashcore_forward_params valid = valid_params();
    std::memcpy(memory, &valid, kParamsSizeV0_2);
    flashcore_forward_params *p = reinterpret_cast<flashcore_forward_params *>(memory);
    p->struct_size = kParamsSizeV0_2;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    flashcore_forward_params fresh;
    std::memset(&fresh, 0xAB, sizeof fresh);
    ASSERT_EQ(flashcore_forward_params_init(&fresh, kParamsSizeV0_2), FLASHCORE_STATUS_SUCCESS);
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&fresh);
    for (size_t i = kParamsSizeV0_2; i < sizeof fresh; ++i) ASSERT_EQ(bytes[i], 0xAB) << "init wrote byte " << i;
}

TEST(Params, InitSetsNumSplitsToTheHeuristic) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.num_splits, 0);
}

TEST(MergeParams, InitSetsSizeAndDefaults) {
    flashcore_merge_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_merge_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.struct_size, sizeof p);
    EXPECT_EQ(p.partial_dtype, FLASHCORE_DTYPE_FP16);
    EXPECT_EQ(p.out_dtype, FLASHCORE_DTYPE_FP16);
    EXPECT_EQ(p.num_states, 0);
    EXPECT_EQ(p.partial_out, nullptr);
    EXPECT_EQ(p.lse, nullptr);
    EXPECT_EQ(p.out_head_stride, 0);
    EXPECT_EQ(p.sinks, nullptr);
    EXPECT_EQ(flashcore_merge_params_init(nullptr, sizeof p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    // Smaller than 0.3's struct, where it first appeared: no header's.
    EXPECT_EQ(flashcore_merge_params_init(&p, kMergeSizeV0_3 - 8), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(flashcore_last_error_message()),
              "struct_size (" + std::to_string(kMergeSizeV0_3 - 8) +
                  ") is not a valid size of flashcore_merge_params (at least " + std::to_string(kMergeSizeV0_3) +
                  ", its size in 0.3, where it first appeared); pass sizeof(flashcore_merge_params) to "
                  "flashcore_merge_params_init");
}

// A merge whose fake tensors are densely packed and far apart.
flashcore_merge_params valid_merge_params(int32_t num_states, int32_t head_dim) {
    flashcore_merge_params m;
    EXPECT_EQ(flashcore_merge_params_init(&m, sizeof m), FLASHCORE_STATUS_SUCCESS);
    m.num_states = num_states;
    m.batch_size = m.num_heads = m.seqlen = 1;
    m.head_dim = head_dim;
    m.partial_out = fake_tensor(0);
    m.partial_lse = static_cast<const float *>(fake_tensor(1));
    m.out = fake_tensor(2);
    m.lse = static_cast<float *>(fake_tensor(3));
    m.partial_state_stride = m.partial_batch_stride = m.partial_head_stride = m.partial_seq_stride = head_dim;
    m.lse_state_stride = m.lse_batch_stride = m.lse_head_stride = m.lse_seq_stride = 1;
    m.out_batch_stride = m.out_head_stride = m.out_seq_stride = head_dim;
    return m;
}

// The merge kernel counts states and columns in 32-bit ints: the documented
// bounds are accepted, one more is refused naming the bound, and so are
// values whose counters would wrap (2^31 - 8 columns used to pass).
TEST(MergeParams, NumStatesAndHeadDimHaveUpperBounds) {
    flashcore_merge_params m = valid_merge_params(FLASHCORE_MERGE_MAX_NUM_STATES, 64);
    EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    m = valid_merge_params(2, FLASHCORE_MERGE_MAX_HEAD_DIM);
    EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const struct {
        int32_t num_states, head_dim;
        const char *message;
    } refused[] = {
        {FLASHCORE_MERGE_MAX_NUM_STATES + 1, 64, "num_states (65537) must be at most FLASHCORE_MERGE_MAX_NUM_STATES (65536)"},
        {INT32_MAX, 64, "num_states (2147483647) must be at most FLASHCORE_MERGE_MAX_NUM_STATES (65536)"},
        {1, FLASHCORE_MERGE_MAX_HEAD_DIM + 8, "head_dim (65544) must be at most FLASHCORE_MERGE_MAX_HEAD_DIM (65536)"},
        {1, 2147483640, "head_dim (2147483640) must be at most FLASHCORE_MERGE_MAX_HEAD_DIM (65536)"},
    };
    for (const auto &r : refused) {
        m = valid_merge_params(r.num_states, r.head_dim);
        EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_INVALID_ARGUMENT) << r.message;
        EXPECT_STREQ(flashcore_last_error_message(), r.message);
        // Also in a call with nothing to merge: the bounds are the struct's.
        m.batch_size = 0;
        EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_INVALID_ARGUMENT) << r.message;
    }
}

// head_dim's range is the header's, 8 to FLASHCORE_MERGE_MAX_HEAD_DIM: below
// it is refused as out of range, naming 8 (audit item 4: 4 was UNSUPPORTED
// "not a multiple of 8" and 0 "must be >= 1"); 12 is in range but not a
// multiple of 8.
TEST(MergeParams, HeadDimRangeIsTheHeaders) {
    for (int32_t head_dim : {0, 4, -8}) {
        flashcore_merge_params m = valid_merge_params(2, head_dim);
        EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_INVALID_ARGUMENT) << head_dim;
        EXPECT_EQ(std::string(flashcore_last_error_message()),
                  "head_dim (" + std::to_string(head_dim) + ") must be >= 8");
    }
    flashcore_merge_params m = valid_merge_params(2, 12);
    EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_UNSUPPORTED);
    EXPECT_STREQ(flashcore_last_error_message(), "head_dim 12 is not a multiple of 8");
    m = valid_merge_params(2, 8);
    EXPECT_EQ(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

TEST(MergeParams, NullHandleOrParamsAreRejected) {
    flashcore_merge_params p;
    ASSERT_EQ(flashcore_merge_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(flashcore_merge_states(nullptr, &p, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "handle is NULL");
}

// A 0.3 to 0.8 caller's struct ends after out_head_stride (its sizeof too):
// accepted without sinks, whatever lies in memory after it (0xAB... as
// sinks is a misaligned pointer), and init writes none of it (OlderCaller
// checks); the same bytes inside a 0.9 struct are read, and refused.
TEST(MergeParams, StructFromVersion0_3) {
    static_assert(kMergeSizeV0_3 % alignof(flashcore_merge_params) == 0, "0.3's end is its sizeof");
    OlderCaller<flashcore_merge_params> older;
    ASSERT_EQ(older.init(kMergeSizeV0_3, flashcore_merge_params_init, valid_merge_params(2, 64)), "");
    EXPECT_EQ(flashcore_merge_check(older.p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    older.p->struct_size = sizeof(flashcore_merge_params);
    EXPECT_EQ(flashcore_merge_check(older.p), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("sinks ("), 0u) << flashcore_last_error_message();
}

// Between 0.3's struct (160 bytes on LP64) and this header's (168) no size
// is any header's: it would end inside sinks.
TEST(MergeParams, StructSizeBetweenReleasedSizesIsRefused) {
    static_assert(kMergeSizeV0_3 == 160 && sizeof(flashcore_merge_params) == 168, "LP64 layout");
    EXPECT_EQ(expect_released_sizes_only(valid_merge_params(2, 64), flashcore_merge_check,
                                         flashcore_merge_params_init, "flashcore_merge_params", {kMergeSizeV0_3},
                                         "160"),
              sizeof(flashcore_merge_params) - kMergeSizeV0_3 - 1);
}

// A newer header's struct: refused (UNSUPPORTED) where it sets a byte past
// sinks, the last field this library knows; its sinks are read as ours.
TEST(MergeParams, StructFromNewerHeader) {
    expect_newer_fields_refused(valid_merge_params(2, 64), flashcore_merge_check, kMergeKnownEnd);
    struct Newer {
        flashcore_merge_params base;
        int64_t future_field;
    } newer{};
    newer.base = valid_merge_params(2, 64);
    newer.base.struct_size = sizeof newer;
    newer.base.sinks = reinterpret_cast<const float *>(static_cast<char *>(fake_tensor(5)) + 2);
    EXPECT_EQ(flashcore_merge_check(&newer.base), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("sinks ("), 0u) << flashcore_last_error_message();
}

// A newer header may put a field where this library's struct has only
// padding: a caller whose struct is larger than ours is refused when it sets
// any byte past sm_margin, the last field this library knows; one of our
// own size is not (its padding is not looked at: 0.9's 4 bytes after
// sm_margin).
TEST(Validation, StructFromNewerHeaderWithAFieldInOurPadding) {
    constexpr size_t kKnownEnd = kParamsKnownEnd;
    alignas(flashcore_forward_params) unsigned char memory[sizeof(flashcore_forward_params) + 16] = {};
    const flashcore_forward_params valid = valid_params();
    std::memcpy(memory, &valid, kKnownEnd);
    flashcore_forward_params *p = reinterpret_cast<flashcore_forward_params *>(memory);
    p->struct_size = sizeof memory;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    for (size_t at : {kKnownEnd, sizeof(flashcore_forward_params), sizeof memory - 1}) {
        memory[at] = 1;
        EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_UNSUPPORTED) << "byte " << at;
        EXPECT_NE(std::string(flashcore_last_error_message()).find("newer flashcore.h"), std::string::npos);
        memory[at] = 0;
    }
    if (kKnownEnd < sizeof(flashcore_forward_params)) {
        p->struct_size = sizeof(flashcore_forward_params);
        memory[kKnownEnd] = 0xAB;
        EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    }
}

// struct_size must end where a released header's struct ends (after its
// last field, or at its sizeof) or be at least ours: a size in between
// would end inside a field and read part of it (186 ended in head_dim_v;
// 348, 352 and 356 end in or after 0.9's attention_chunk, inside its sinks
// or their padding; 364 is past sm_margin, inside the struct's padding).
TEST(Validation, StructSizeBetweenReleasedSizesIsRefused) {
    static_assert(offsetof(flashcore_forward_params, head_dim_v) == 184 && kParamsSizeV0_8 == 344 &&
                      sizeof(flashcore_forward_params) == 368,
                  "LP64 layout");
    const size_t refused = expect_released_sizes_only(
        valid_params(), flashcore_forward_check, flashcore_forward_params_init, "flashcore_forward_params",
        {
            kParamsSizeV0_1,                                                    // 0.1
            offsetof(flashcore_forward_params, head_dim_v) + sizeof(int32_t),   // 0.2
            offsetof(flashcore_forward_params, num_splits) + sizeof(int32_t),   // 0.3
            offsetof(flashcore_forward_params, softcap) + sizeof(float),        // 0.4
            offsetof(flashcore_forward_params, seqused_k) + sizeof(void *),     // 0.5
            kParamsSizeV0_6,                                                    // 0.6, 0.7
            kParamsSizeV0_8,                                                    // 0.8
        },
        "184, 192, 208, 216, 264, 344");
    EXPECT_GT(refused, 0u);
    // The audit's example: 186 bytes end two bytes into head_dim_v.
    flashcore_forward_params p = valid_params();
    p.struct_size = 186;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

// -0 is not the default scale (+0): most likely a negative scale that
// underflowed, so it is refused.
TEST(Validation, NegativeZeroSoftmaxScaleIsRefused) {
    flashcore_forward_params p = valid_params();
    p.softmax_scale = 0.0f;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.softmax_scale = -0.0f;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("softmax_scale is -0.0"), 0u)
        << flashcore_last_error_message();
}

// ---------------------------------------------------------------------------
// Fields added in 0.4: the sliding window and the softcap.
// ---------------------------------------------------------------------------

// Whether flashcore_forward_check refuses p with INVALID_ARGUMENT and a
// message that begins with `message_start` (which names the field).
testing::AssertionResult refused_naming(const flashcore_forward_params &p, const std::string &message_start) {
    const flashcore_status status = flashcore_forward_check(&p);
    const std::string message = flashcore_last_error_message();
    if (status == FLASHCORE_STATUS_INVALID_ARGUMENT && message.rfind(message_start, 0) == 0) {
        return testing::AssertionSuccess();
    }
    return testing::AssertionFailure() << "status " << int(status) << ", message \"" << message
                                       << "\"; expected INVALID_ARGUMENT (" << int(FLASHCORE_STATUS_INVALID_ARGUMENT)
                                       << ") and a message beginning \"" << message_start << "\"";
}

TEST(Params, InitSetsWindowAndSoftcapOff) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.use_window, 0);
    EXPECT_EQ(p.window_left, 0);
    EXPECT_EQ(p.window_right, 0);
    EXPECT_EQ(p.softcap, 0.f);
    EXPECT_FALSE(std::signbit(p.softcap)) << "zeroed, not -0";
}

// use_window 0 (the default): the bounds are ignored, whatever they hold,
// with causal or without.
TEST(Window, BoundsAreIgnoredWithoutUseWindow) {
    const int32_t garbage[] = {-2, INT32_MIN, 1, INT32_MAX, int32_t(0xABABABAB)};
    for (int32_t causal : {0, 1}) {
        for (int32_t left : garbage) {
            for (int32_t right : garbage) {
                flashcore_forward_params p = valid_params();
                p.causal = causal;
                p.use_window = 0;
                p.window_left = left;
                p.window_right = right;
                EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
                    << "causal " << causal << ", window (" << left << ", " << right
                    << "): " << flashcore_last_error_message();
            }
        }
    }
}

// Each bound -1 (unbounded) or >= 0, however large; any non-zero use_window
// turns the window on.
TEST(Window, AcceptedBounds) {
    const int32_t bounds[] = {-1, 0, 1, 127, 1 << 30, INT32_MAX};
    for (int32_t use_window : {1, 2, -1, INT32_MIN, INT32_MAX}) {
        for (int32_t left : bounds) {
            for (int32_t right : bounds) {
                flashcore_forward_params p = valid_params();
                p.use_window = use_window;
                p.window_left = left;
                p.window_right = right;
                EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
                    << "use_window " << use_window << ", window (" << left << ", " << right
                    << "): " << flashcore_last_error_message();
            }
        }
    }
}

// causal is window_right 0: with it, window_right -1 and 0 are accepted
// (any window_left), larger ones refused naming window_right.
TEST(Window, CausalAllowsWindowRightMinus1And0Only) {
    for (int32_t left : {-1, 0, 5, INT32_MAX}) {
        for (int32_t right : {-1, 0}) {
            flashcore_forward_params p = valid_params();
            p.causal = 1;
            p.use_window = 1;
            p.window_left = left;
            p.window_right = right;
            EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
                << "causal, window (" << left << ", " << right << "): " << flashcore_last_error_message();
        }
        for (int32_t right : {1, 2, 1 << 30, INT32_MAX}) {
            flashcore_forward_params p = valid_params();
            p.causal = 1;
            p.use_window = 1;
            p.window_left = left;
            p.window_right = right;
            EXPECT_TRUE(refused_naming(p, "window_right (" + std::to_string(right) +
                                              ") must be -1 or 0 with causal, which is window_right 0"))
                << "window (" << left << ", " << right << ")";
        }
    }
    // Any non-zero causal is causal.
    flashcore_forward_params p = valid_params();
    p.causal = -7;
    p.use_window = 1;
    p.window_right = 1;
    EXPECT_TRUE(refused_naming(p, "window_right (1) must be -1 or 0 with causal"));
}

// A bound below -1 is refused, naming the bound, with any non-zero
// use_window, with causal or without.
TEST(Window, BoundsBelowMinus1AreRefused) {
    for (int32_t use_window : {1, 2, -1, INT32_MIN}) {
        for (int32_t causal : {0, 1}) {
            for (int32_t bad : {-2, -1000, INT32_MIN}) {
                const std::string why = ") must be -1 (unbounded) or >= 0 (keys seen on that side of the diagonal)";
                flashcore_forward_params p = valid_params();
                p.use_window = use_window;
                p.causal = causal;
                p.window_left = bad;
                p.window_right = causal != 0 ? 0 : 3;
                EXPECT_TRUE(refused_naming(p, "window_left (" + std::to_string(bad) + why))
                    << "use_window " << use_window << ", causal " << causal;
                p.window_left = 3;
                p.window_right = bad;
                EXPECT_TRUE(refused_naming(p, "window_right (" + std::to_string(bad) + why))
                    << "use_window " << use_window << ", causal " << causal;
            }
        }
    }
}

// An empty call reads no pointers or strides, but the window and the softcap
// are checked as for any call (the workspace query reads them).
TEST(Window, CheckedInEmptyCalls) {
    flashcore_forward_params p = valid_params();
    p.batch_size = 0;
    p.q = p.k = p.v = p.out = nullptr;
    p.use_window = 1;
    p.window_left = 0;
    p.window_right = -1;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.window_left = -2;
    EXPECT_TRUE(refused_naming(p, "window_left (-2)"));
    p.window_left = 0;
    p.softcap = -1.f;
    EXPECT_TRUE(refused_naming(p, "softcap (-1)"));
}

// 0 (and -0, which equals it) is off; any finite softcap > 0 whose product
// with log2(e) and whose quotient scale / softcap are finite floats > 0 is
// accepted: tiny ones, and large ones where the quotient is subnormal.
TEST(Softcap, AcceptedValues) {
    const struct {
        float softmax_scale, softcap;
    } accepted[] = {
        {0.f, 0.f},     {0.f, -0.f},    {0.f, 30.f},  {0.f, 50.f},   {0.f, 1.f},     {0.f, 1e-30f},
        {0.f, FLT_MIN}, {0.f, 2.3e38f}, {0.f, 1e30f}, {1.f, 1e-38f}, {2.3e38f, 1.f}, {1e-30f, 1e8f},
        {0.3f, 30.f},   {FLT_MIN, 1.f}, {1e-45f, 1e-30f},
    };
    for (const auto &a : accepted) {
        flashcore_forward_params p = valid_params();
        p.softmax_scale = a.softmax_scale;
        p.softcap = a.softcap;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
            << "softmax_scale " << a.softmax_scale << ", softcap " << a.softcap << ": "
            << flashcore_last_error_message();
    }
}

TEST(Softcap, RefusedValuesNameTheRule) {
    const struct {
        float softmax_scale, softcap;
        const char *message_start;
    } refused[] = {
        {0.f, -1.f, "softcap (-1) must be finite and > 0, or 0 for none"},
        {0.f, -FLT_MIN, "softcap (-1.17549e-38) must be finite and > 0"},
        {0.f, -INFINITY, "softcap (-inf) must be finite and > 0"},
        {0.f, INFINITY, "softcap (inf) must be finite and > 0"},
        {0.f, NAN, "softcap ("},  // "nan" or "-nan", as printf writes it
        // Finite, but times log2(e) +inf in float.
        {0.f, FLT_MAX, "softcap (3.40282e+38) times log2(e) overflows a float; it must be at most"},
        {0.f, 2.4e38f, "softcap (2.4e+38) times log2(e) overflows a float"},
        // The quotient underflows to 0 ...
        {1e-30f, 1e30f, "softmax_scale / softcap (1e-30 / 1e+30) is not a finite float > 0"},
        {1e-45f, 30.f, "softmax_scale / softcap (1.4013e-45 / 30) is not a finite float > 0"},
        // ... or overflows to +inf.
        {0.f, 1e-45f, "softmax_scale / softcap (0.125 / 1.4013e-45) is not a finite float > 0"},
        {2.3e38f, 0.5f, "softmax_scale / softcap (2.3e+38 / 0.5) is not a finite float > 0"},
    };
    for (const auto &r : refused) {
        flashcore_forward_params p = valid_params();
        p.softmax_scale = r.softmax_scale;
        p.softcap = r.softcap;
        EXPECT_TRUE(refused_naming(p, r.message_start))
            << "softmax_scale " << r.softmax_scale << ", softcap " << r.softcap;
        if (std::isnan(r.softcap)) {
            EXPECT_NE(std::string(flashcore_last_error_message()).find("nan) must be finite and > 0"),
                      std::string::npos)
                << flashcore_last_error_message();
        }
    }
}

// An older caller's flashcore_forward_params, given valid_params()'s fields.
struct OlderStruct : OlderCaller<flashcore_forward_params> {
    std::string init(size_t size) { return OlderCaller::init(size, flashcore_forward_params_init, valid_params()); }
};

// A 0.3 caller's struct ends after num_splits: it is accepted, with no
// window and no softcap, whatever lies in memory after it (as use_window,
// 0xABABABAB is non-zero and a bound < -1; as softcap, a negative float).
TEST(Validation, StructFromVersion0_3) {
    OlderStruct older;
    ASSERT_EQ(older.init(kParamsSizeV0_3), "");
    unsigned char *memory = older.memory;
    flashcore_forward_params *p = older.p;
    ASSERT_EQ(flashcore_set_contiguous_strides(p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    ASSERT_EQ(older.written_past(kParamsSizeV0_3), "") << "by flashcore_set_contiguous_strides";
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p->causal = 1;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // The same bytes inside a 0.4 struct are read, and refused (the 0.8 and
    // 0.9 fields, which would be refused first, zeroed).
    p->struct_size = sizeof(flashcore_forward_params);
    std::memset(memory + offsetof(flashcore_forward_params, kv_dtype), 0, kParamsKnownEnd - kParamsSizeV0_6);
    EXPECT_TRUE(refused_naming(*p, "window_left (" + std::to_string(int32_t(0xABABABAB)) + ")"));
}

// The 0.4 fields of a struct larger than ours (a newer header's) are read as
// ours, not taken for unknown fields; the bytes past them are the unknown
// ones.
TEST(Validation, StructFromNewerHeaderReadsTheWindowAndSoftcap) {
    struct Newer {
        flashcore_forward_params base;
        int64_t future_field;
    } newer;
    static_assert(offsetof(Newer, future_field) >= kParamsKnownEnd, "the future field starts after the last field this header knows");
    newer.base = valid_params();
    newer.base.struct_size = sizeof(Newer);
    newer.future_field = 0;
    newer.base.use_window = 1;
    newer.base.window_left = 16;
    newer.base.window_right = 0;
    newer.base.softcap = 30.f;
    EXPECT_EQ(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    newer.base.softcap = -30.f;
    EXPECT_TRUE(refused_naming(newer.base, "softcap (-30)"));
    newer.base.softcap = 30.f;
    newer.base.window_right = -2;
    EXPECT_TRUE(refused_naming(newer.base, "window_right (-2)"));
    newer.base.window_right = 0;
    for (int shift : {0, 63}) {
        newer.future_field = int64_t(uint64_t(1) << shift);
        EXPECT_EQ(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_UNSUPPORTED) << "bit " << shift;
        EXPECT_NE(std::string(flashcore_last_error_message())
                      .find("params sets fields beyond the " + std::to_string(kParamsKnownEnd) + " bytes"),
                  std::string::npos)
            << flashcore_last_error_message();
    }
}

// With a GPU: the workspace query checks the window and the softcap as
// flashcore_forward_check does, and its size does not depend on the
// softcap (flashcore.h, "Workspace").
TEST(Workspace, QueryChecksTheWindowAndIgnoresTheSoftcap) {
    std::string reason;
    if (!flashcore_test::cuda_device_available(&reason)) GTEST_SKIP() << "needs a GPU: " << reason;
    flashcore_handle h = nullptr;
    ASSERT_EQ(flashcore_create(&h), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Decode-like calls, which the heuristic splits, and a windowed one.
    for (int32_t seqlen_q : {1, 100}) {
        for (int32_t use_window : {0, 1}) {
            flashcore_forward_params p = valid_params();
            p.batch_size = 1;
            p.num_heads_q = p.num_heads_kv = 1;
            p.seqlen_q = seqlen_q;
            p.seqlen_k = 8192;
            p.use_window = use_window;
            p.window_left = 256;
            p.window_right = 0;
            size_t uncapped = 1;
            ASSERT_EQ(flashcore_forward_workspace_size(h, &p, &uncapped), FLASHCORE_STATUS_SUCCESS)
                << flashcore_last_error_message();
            for (float softcap : {30.f, 1e-30f, 2.3e38f}) {
                p.softcap = softcap;
                size_t capped = 1;
                EXPECT_EQ(flashcore_forward_workspace_size(h, &p, &capped), FLASHCORE_STATUS_SUCCESS)
                    << flashcore_last_error_message();
                EXPECT_EQ(capped, uncapped) << "softcap " << softcap << ", seqlen_q " << seqlen_q << ", use_window "
                                            << use_window;
            }
            p.softcap = NAN;
            size_t bytes = 77;
            EXPECT_EQ(flashcore_forward_workspace_size(h, &p, &bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
            EXPECT_EQ(bytes, 77u) << "a refused query wrote the size";
            p.softcap = 0.f;
            p.use_window = 1;
            p.causal = 1;
            p.window_right = 1;
            EXPECT_EQ(flashcore_forward_workspace_size(h, &p, &bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
            EXPECT_EQ(std::string(flashcore_last_error_message()).rfind("window_right (1)", 0), 0u)
                << flashcore_last_error_message();
            EXPECT_EQ(bytes, 77u) << "a refused query wrote the size";
        }
    }
    EXPECT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_SUCCESS);
}

TEST(SupportedHeadDims, SizingCallWritesOnlyTheCount) {
    size_t count = 12345;
    EXPECT_EQ(flashcore_supported_head_dims(nullptr, nullptr, 0, &count), FLASHCORE_STATUS_SUCCESS);
    EXPECT_GE(count, 1u);
    EXPECT_LT(count, 12345u);
    EXPECT_STREQ(flashcore_last_error_message(), "");
    // Arrays with capacity 0 are not written either.
    int32_t dims[1] = {-1}, dims_v[1] = {-1};
    size_t again = 0;
    EXPECT_EQ(flashcore_supported_head_dims(dims, dims_v, 0, &again), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(again, count);
    EXPECT_EQ(dims[0], -1);
    EXPECT_EQ(dims_v[0], -1);
}

TEST(SupportedHeadDims, FullCallListsSortedDistinctPairs) {
    size_t count = 0;
    ASSERT_EQ(flashcore_supported_head_dims(nullptr, nullptr, 0, &count), FLASHCORE_STATUS_SUCCESS);
    // Room for two more than needed: they stay untouched.
    std::vector<int32_t> dims(count + 2, -1), dims_v(count + 2, -1);
    size_t written = 0;
    ASSERT_EQ(flashcore_supported_head_dims(dims.data(), dims_v.data(), dims.size(), &written),
              FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(written, count);
    for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(dims[i] % 8, 0) << i;
        EXPECT_EQ(dims_v[i] % 8, 0) << i;
        EXPECT_GE(dims[i], 8) << i;
        EXPECT_LE(dims[i], 576) << i;
        EXPECT_GE(dims_v[i], 8) << i;
        EXPECT_LE(dims_v[i], 512) << i;
        if (i > 0) {
            EXPECT_LT(HeadDimPair(dims[i - 1], dims_v[i - 1]), HeadDimPair(dims[i], dims_v[i])) << "unsorted at " << i;
        }
    }
    for (size_t i = count; i < dims.size(); ++i) {
        EXPECT_EQ(dims[i], -1) << "wrote past the pairs, at " << i;
        EXPECT_EQ(dims_v[i], -1) << "wrote past the pairs, at " << i;
    }
    // Every listed pair runs (the latent cache's with v as k's view).
    const std::vector<HeadDimPair> listed = supported_pairs();
    for (size_t i = 0; i < count; ++i) {
        flashcore_forward_params p = valid_params();
        p.head_dim = dims[i];
        p.head_dim_v = dims_v[i];
        ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
        if (latent_cache_pair(listed, dims[i], dims_v[i])) {
            p.v = p.k;
            p.v_batch_stride = p.k_batch_stride;
            p.v_seq_stride = p.k_seq_stride;
            p.v_head_stride = p.k_head_stride;
        }
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    }
}

TEST(SupportedHeadDims, TruncatedCallWritesCapacityPairs) {
    const std::vector<HeadDimPair> pairs = supported_pairs();
    ASSERT_GE(pairs.size(), 1u);
    const size_t capacity = pairs.size() - 1;
    std::vector<int32_t> dims(pairs.size(), -1), dims_v(pairs.size(), -1);
    size_t count = 0;
    ASSERT_EQ(flashcore_supported_head_dims(dims.data(), dims_v.data(), capacity, &count),
              FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(count, pairs.size());
    for (size_t i = 0; i < capacity; ++i) EXPECT_EQ(HeadDimPair(dims[i], dims_v[i]), pairs[i]) << i;
    EXPECT_EQ(dims[capacity], -1);
    EXPECT_EQ(dims_v[capacity], -1);
}

TEST(SupportedHeadDims, NullArguments) {
    int32_t dims[8], dims_v[8];
    EXPECT_EQ(flashcore_supported_head_dims(dims, dims_v, 8, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "count is NULL");
    size_t count = 12345;
    EXPECT_EQ(flashcore_supported_head_dims(nullptr, dims_v, 8, &count), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("head_dims is NULL"), std::string::npos);
    EXPECT_EQ(flashcore_supported_head_dims(dims, nullptr, 8, &count), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("head_dims_v is NULL"), std::string::npos);
    EXPECT_EQ(count, 12345u) << "a failed call wrote the count";
}

// The default build has exactly the header's documented list; a build
// configured with FLASHCORE_HEAD_DIMS has a part of it.
TEST(SupportedHeadDims, ListsThisBuildsKernels) {
    const std::vector<HeadDimPair> pairs = supported_pairs();
#ifdef FLASHCORE_TEST_HAS_KERNEL_LIST
    EXPECT_EQ(pairs, generated_head_dims()) << pairs_text(pairs) << " vs " << pairs_text(generated_head_dims());
#endif
    if (pairs != kDefaultHeadDims) {
        for (const HeadDimPair &p : pairs) {
            EXPECT_NE(std::find(kDefaultHeadDims.begin(), kDefaultHeadDims.end(), p), kDefaultHeadDims.end())
                << "(" << p.first << ", " << p.second << ") is not in the default list";
        }
        GTEST_SKIP() << "this build lists " << pairs_text(pairs) << ", a part of the default "
                     << pairs_text(kDefaultHeadDims) << " (configured with FLASHCORE_HEAD_DIMS)";
    }
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
// FLASHCORE_TEST_EXPECT_NO_DEVICE (ctest's api.fake_old_driver): there must be
// no device, and the message must start with this text.
TEST(Handle, CreateMatchesDevicePresence) {
    std::string reason;
    const bool have_gpu = flashcore_test::cuda_device_available(&reason);
    const char *expected = std::getenv("FLASHCORE_TEST_EXPECT_NO_DEVICE");
    if (expected != nullptr && *expected != '\0') {
        ASSERT_FALSE(have_gpu) << "FLASHCORE_TEST_EXPECT_NO_DEVICE is set, but a device is available";
    }
    flashcore_handle h = reinterpret_cast<flashcore_handle>(fake_pointer(0x1234));
    const flashcore_status status = flashcore_create(&h);
    if (have_gpu) {
        ASSERT_EQ(status, FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        ASSERT_NE(h, nullptr);
        EXPECT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_SUCCESS);
    } else {
        EXPECT_EQ(status, FLASHCORE_STATUS_NO_DEVICE) << flashcore_last_error_message();
        EXPECT_EQ(h, nullptr) << "the handle must be set to NULL on failure";
        // Where the driver itself is missing, the message says so (not the
        // runtime's "driver version is insufficient").
        void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        const std::string message = flashcore_last_error_message();
        if (expected != nullptr && *expected != '\0') {
            EXPECT_EQ(message.rfind(expected, 0), 0u) << message;
        }
        if (driver == nullptr) {
            EXPECT_EQ(message.rfind("no NVIDIA driver found (libcuda.so.1 could not be loaded: ", 0), 0u) << message;
        } else {
            dlclose(driver);
            EXPECT_EQ(message.find("no NVIDIA driver found (libcuda.so.1 could not be loaded"), std::string::npos)
                << message;
            EXPECT_NE(message.find("driver"), std::string::npos) << message;
        }
        std::printf("no GPU here: flashcore_create said: %s\n", flashcore_last_error_message());
    }
}

// ---------------------------------------------------------------------------
// Issue 15 (hardening): one test per item, each failing before its fix.
// ---------------------------------------------------------------------------

flashcore_forward_params one_head(int32_t batch, int32_t seqlen) {
    flashcore_forward_params p = valid_params();
    p.batch_size = batch;
    p.seqlen_q = seqlen;
    p.num_heads_q = p.num_heads_kv = 1;
    p.head_dim = 64;
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    return p;
}

// Item 2: the self-overlap check takes a dimension's span as
// (extent - 1) x stride + the span below (not stride x extent), and tells
// interleaved layouts that overlap from those that do not.
TEST(Hardening, OutputStridesThatDoNotOverlapAreAccepted) {
    // Every other token of a packed [B, 9, 1, 64] buffer: rows 128 apart,
    // batches 576 apart, the last row of a batch ending at 4 x 128 + 64.
    flashcore_forward_params p = one_head(2, 5);
    p.out_seq_stride = 128;
    p.out_batch_stride = 9 * 64;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Every other token of a packed [B, 5, 1, 64] buffer: the batches
    // interleave (batch 1 starts at row 2.5 of batch 0), no element shared.
    p.out_batch_stride = 5 * 64;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Batches 4 rows apart: batch 1's row 0 is batch 0's row 2.
    p.out_batch_stride = 4 * 64;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("make elements overlap"), std::string::npos)
        << flashcore_last_error_message();
    // Three interleaved dimensions: heads 64 apart, rows 3 heads apart,
    // batches 1.5 rows apart.
    p = valid_params();
    p.batch_size = 2;
    p.seqlen_q = 4;
    p.num_heads_q = 2;
    p.num_heads_kv = 1;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    p.out_head_stride = 64;
    p.out_seq_stride = 4 * 64;
    p.out_batch_stride = 2 * 64;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.out_batch_stride = 4 * 64;  // batch 1's row 0 is batch 0's row 1
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
}

// Item 3: the stride products are checked, not wrapped.
TEST(Hardening, ContiguousStridesThatOverflowAreRefused) {
    flashcore_forward_params p = valid_params();
    p.num_heads_q = p.num_heads_kv = INT32_MAX;
    p.seqlen_q = p.seqlen_k = 1 << 30;
    p.head_dim = 128;
    const flashcore_forward_params before = p;
    EXPECT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("more than 2^63 bytes"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(std::memcmp(&p, &before, sizeof p), 0) << "a refused call wrote strides";
    // Just below the limit: [1, 2^20, 2^20, 2^20] x 2 bytes is 2^61 bytes.
    p = valid_params();
    p.batch_size = 1;
    p.num_heads_q = p.num_heads_kv = 1 << 20;
    p.seqlen_q = p.seqlen_k = 1 << 20;
    p.head_dim = 1 << 20;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(p.q_batch_stride, int64_t(1) << 60);
    EXPECT_GT(p.k_seq_stride, 0);
}

// Item 4: enum arguments are read as ints, so any value is refused by name
// (in a UBSan build of the library, loading them as C++ enums aborts).
TEST(Hardening, EnumArgumentsOutsideTheirRange) {
    for (int layout : {2, -1, 7, INT32_MAX}) {
        flashcore_forward_params p = valid_params();
        EXPECT_EQ(set_contiguous_strides_of_int(&p, layout), FLASHCORE_STATUS_INVALID_ARGUMENT);
        EXPECT_EQ(std::string(flashcore_last_error_message()).find("layout " + std::to_string(layout) + " is not one of"),
                  0u)
            << flashcore_last_error_message();
    }
    for (int status : {9, -1, 999, INT32_MIN}) EXPECT_STREQ(status_string_of_int(status), "unknown status");
    EXPECT_STREQ(status_string_of_int(int(FLASHCORE_STATUS_MISALIGNED)), "misaligned");
    // The dtype field is an int32_t: the same.
    flashcore_forward_params p = valid_params();
    p.dtype = 7;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED);
}

// ---------------------------------------------------------------------------
// Fields added in 0.5: seqused_k.
// ---------------------------------------------------------------------------

TEST(SequsedK, InitLeavesItNull) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.seqused_k, nullptr);
}

// Any 4-byte-aligned array that overlaps nothing the call writes; it is
// read on the device only, so its values are not looked at here.
TEST(SequsedK, AlignedArrayIsAccepted) {
    flashcore_forward_params p = valid_params();
    p.seqused_k = static_cast<const int32_t *>(fake_tensor(5));
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.seqused_k = reinterpret_cast<const int32_t *>(static_cast<char *>(fake_tensor(5)) + 4);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // An input like q, k and v: it may share their memory.
    p.seqused_k = static_cast<const int32_t *>(p.q);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

TEST(SequsedK, MisalignedIsRefused) {
    flashcore_forward_params p = valid_params();
    p.seqused_k = reinterpret_cast<const int32_t *>(static_cast<char *>(fake_tensor(5)) + 2);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_MISALIGNED);
    const std::string message = flashcore_last_error_message();
    EXPECT_EQ(message.find("seqused_k ("), 0u) << message;
    EXPECT_NE(message.find("must be 4-byte aligned"), std::string::npos) << message;
}

// What the call writes must not overlap it: out over its last entry, lse
// over its first.
TEST(SequsedK, OverlappingAnOutputIsRefused) {
    flashcore_forward_params p = valid_params();
    p.seqused_k = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * (p.batch_size - 1));
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    std::string message = flashcore_last_error_message();
    EXPECT_EQ(message.find("seqused_k (bytes 0x"), 0u) << message;
    EXPECT_NE(message.find(") overlaps out (bytes 0x"), std::string::npos) << message;
    p.seqused_k = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * p.batch_size);  // adjacent
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.seqused_k = reinterpret_cast<const int32_t *>(p.lse);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    message = flashcore_last_error_message();
    EXPECT_NE(message.find("seqused_k (bytes 0x"), std::string::npos) << message;
    EXPECT_NE(message.find("lse (bytes 0x"), std::string::npos) << message;
}

// An empty call looks at no pointers, seqused_k included.
TEST(SequsedK, EmptyCallIgnoresIt) {
    flashcore_forward_params p = valid_params();
    p.batch_size = 0;
    p.seqused_k = reinterpret_cast<const int32_t *>(uintptr_t(3));
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// A 0.4 caller's struct ends after softcap: accepted with no seqused_k,
// whatever lies in memory after it (0xAB... would be a misaligned pointer);
// the same bytes inside a 0.5 struct are read, and refused.
TEST(Validation, StructFromVersion0_4) {
    OlderStruct older;
    ASSERT_EQ(older.init(kParamsSizeV0_4), "");
    flashcore_forward_params *p = older.p;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // (The 0.6 fields zero: seqused_k's bytes are the point here.)
    std::memset(older.memory + kParamsSizeV0_5, 0, sizeof(flashcore_forward_params) - kParamsSizeV0_5);
    p->struct_size = sizeof(flashcore_forward_params);
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("seqused_k ("), 0u) << flashcore_last_error_message();
}

// A 0.5 caller's struct ends after seqused_k: accepted without packing or
// pages, whatever lies in memory after it (0xAB... would be misaligned
// arrays); the same bytes inside a 0.6 struct are read, and refused.
TEST(Validation, StructFromVersion0_5) {
    OlderStruct older;
    ASSERT_EQ(older.init(kParamsSizeV0_5), "");
    flashcore_forward_params *p = older.p;
    EXPECT_EQ(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p->struct_size = sizeof(flashcore_forward_params);
    EXPECT_NE(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS);
}

// ---------------------------------------------------------------------------
// Fields added in 0.6: variable-length batches and paged caches.
// ---------------------------------------------------------------------------

TEST(Varlen, InitLeavesThemZero) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.cu_seqlens_q, nullptr);
    EXPECT_EQ(p.cu_seqlens_k, nullptr);
    EXPECT_EQ(p.total_seqlen_q, 0);
    EXPECT_EQ(p.total_seqlen_k, 0);
    EXPECT_EQ(p.block_table, nullptr);
    EXPECT_EQ(p.block_table_batch_stride, 0);
    EXPECT_EQ(p.page_size, 0);
    EXPECT_EQ(p.num_pages, 0);
}

// Packed [total, heads, dim] q, k, v and out (BSHD strides of one batch).
flashcore_forward_params varlen_params(int32_t total_q, int32_t total_k) {
    flashcore_forward_params p = valid_params();
    p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(5));
    p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(6));
    p.total_seqlen_q = total_q;
    p.total_seqlen_k = total_k;
    return p;
}

TEST(Varlen, PackedTensorsAreAccepted) {
    flashcore_forward_params p = varlen_params(150, 500);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // The batch strides of packed tensors are not used.
    p.q_batch_stride = -8;
    p.out_batch_stride = 3;
    p.k_batch_stride = p.v_batch_stride = -1;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // No rows at all: an empty call.
    p.total_seqlen_q = 0;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

TEST(Varlen, TotalsAreChecked) {
    flashcore_forward_params p = valid_params();
    p.total_seqlen_q = 10;
    EXPECT_TRUE(refused_naming(p, "total_seqlen_q (10) is set but cu_seqlens_q is NULL"));
    p = valid_params();
    p.total_seqlen_k = 10;
    EXPECT_TRUE(refused_naming(p, "total_seqlen_k (10) is set but cu_seqlens_k is NULL"));
    p = varlen_params(-1, 10);
    EXPECT_TRUE(refused_naming(p, "total_seqlen_q (-1) must be in [0, 1073741824]"));
    p = varlen_params(10, (1 << 30) + 1);
    EXPECT_TRUE(refused_naming(p, "total_seqlen_k (1073741825) must be in [0, 1073741824]"));
    p = varlen_params(10, 0);
    EXPECT_TRUE(refused_naming(p, "total_seqlen_k (0) must be >= 1 where the output is not empty"));
}

// Packed out spans total_seqlen_q rows, lse num_heads_q * total_seqlen_q
// floats: the aliasing rule sees those extents.
TEST(Varlen, ExtentsFollowTheTotals) {
    flashcore_forward_params p = varlen_params(150, 500);
    const size_t q_bytes = size_t(150) * p.num_heads_q * p.head_dim * 2;
    p.out = static_cast<char *>(const_cast<void *>(p.q)) + q_bytes - 16;
    EXPECT_TRUE(refused_naming(p, "out (bytes 0x"));
    p.out = static_cast<char *>(const_cast<void *>(p.q)) + q_bytes;  // adjacent
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p = varlen_params(150, 500);
    p.lse = reinterpret_cast<float *>(static_cast<char *>(p.out) - size_t(150) * p.num_heads_q * 4 + 4);
    EXPECT_TRUE(refused_naming(p, "lse (bytes 0x"));
    p.lse = reinterpret_cast<float *>(static_cast<char *>(p.out) - size_t(150) * p.num_heads_q * 4);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // cu_seqlens_q holds batch_size + 1 entries.
    p = varlen_params(150, 500);
    p.cu_seqlens_q = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * p.batch_size);
    EXPECT_TRUE(refused_naming(p, "cu_seqlens_q (bytes 0x"));
    p.cu_seqlens_q = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * (p.batch_size + 1));
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.cu_seqlens_k = reinterpret_cast<const int32_t *>(static_cast<char *>(fake_tensor(6)) + 2);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("cu_seqlens_k ("), 0u) << flashcore_last_error_message();
}

// A pool of num_pages pages of page_size keys: [pages, page, heads, dim].
flashcore_forward_params paged_params(int32_t page_size, int32_t num_pages) {
    flashcore_forward_params p = valid_params();
    p.block_table = static_cast<const int32_t *>(fake_tensor(7));
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.block_table_batch_stride = (p.seqlen_k + page_size - 1) / page_size;
    p.k_seq_stride = p.v_seq_stride = int64_t(p.num_heads_kv) * p.head_dim;
    p.k_batch_stride = p.v_batch_stride = int64_t(page_size) * p.k_seq_stride;
    return p;
}

TEST(Paged, PoolIsAccepted) {
    for (int32_t page : {16, 48, 64, 256, 4096}) {
        flashcore_forward_params p = paged_params(page, 3);
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << page << ": " << flashcore_last_error_message();
    }
}

TEST(Paged, PageSizeMustBeAMultipleOf16) {
    // A size <= 0 is an invalid argument, as for every size.
    for (int32_t page : {0, -16, INT32_MIN}) {
        flashcore_forward_params p = paged_params(16, 3);
        p.page_size = page;
        EXPECT_TRUE(refused_naming(p, "page_size (" + std::to_string(page) + ") must be >= 1 with a block_table"));
    }
    for (int32_t page : {8, 24, 100}) {
        flashcore_forward_params p = paged_params(16, 3);
        p.page_size = page;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED) << page;
        EXPECT_EQ(std::string(flashcore_last_error_message())
                      .find("page_size (" + std::to_string(page) + ") is not supported; pages must hold a multiple of 16 keys"),
                  0u)
            << flashcore_last_error_message();
    }
}

// An empty call's strides are not looked at (flashcore.h, "Empty calls"):
// the block table's row stride neither.
TEST(Paged, EmptyCallIgnoresTheTableStride) {
    for (int64_t stride : {int64_t(-1), int64_t(0), int64_t(1)}) {
        flashcore_forward_params p = paged_params(16, 3);
        p.block_table_batch_stride = stride;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT) << stride;
        p.seqlen_q = 0;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << stride << ": " << flashcore_last_error_message();
    }
}

// The table's row stride has an upper bound as the tensors' strides do: its
// last entry must be addressable in bytes (audit item 3 of issue 59: 2^62
// and INT64_MAX were accepted, and the kernels' offsets wrap).
TEST(Paged, TableStrideHasAnUpperBound) {
    for (int64_t stride : {int64_t(1) << 62, INT64_MAX, (int64_t(1) << 61) + 5}) {
        flashcore_forward_params p = paged_params(64, 4);
        p.block_table_batch_stride = stride;
        EXPECT_TRUE(refused_naming(p, "block_table_batch_stride (" + std::to_string(stride) +
                                          ") addresses more than 2^63 bytes over batch_size (2)"))
            << stride;
    }
    // The largest that passes: (batch_size - 1) * stride + 4 entries of 4 bytes within 2^63.
    flashcore_forward_params p = paged_params(64, 4);
    p.block_table_batch_stride = (INT64_MAX / 4) - 4;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

TEST(Paged, TableAndPoolAreChecked) {
    flashcore_forward_params p = paged_params(64, 0);
    EXPECT_TRUE(refused_naming(p, "num_pages (0) must be >= 1 with a block_table"));
    p = paged_params(64, 4);
    p.block_table_batch_stride = 4;  // ceil(300 / 64) = 5
    EXPECT_TRUE(refused_naming(p, "block_table_batch_stride (4) must be at least ceil(seqlen_k / page_size) = 5"));
    p = paged_params(64, 4);
    p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(6));
    p.total_seqlen_k = 100;
    EXPECT_TRUE(refused_naming(p, "cu_seqlens_k and block_table cannot be combined"));
    p = valid_params();
    p.page_size = 16;
    EXPECT_TRUE(refused_naming(p, "page_size (16), num_pages (0) and block_table_batch_stride (0) describe a paged"));
    p = paged_params(64, 4);
    p.block_table = reinterpret_cast<const int32_t *>(static_cast<char *>(fake_tensor(7)) + 1);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_MISALIGNED);
    // The table's last row ends ceil(seqlen_k / page_size) entries in.
    p = paged_params(64, 4);
    p.block_table = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * (5 + 5) + 4);
    EXPECT_TRUE(refused_naming(p, "block_table (bytes 0x"));
    p.block_table = reinterpret_cast<const int32_t *>(static_cast<char *>(p.out) - 4 * (5 + 5));
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // Queries may be packed over a paged cache (chunked prefill).
    p = paged_params(64, 4);
    p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(5));
    p.total_seqlen_q = 77;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// k and v span the pool: num_pages pages, not batch_size sequences.
TEST(Paged, KvExtentIsThePool) {
    flashcore_forward_params p = paged_params(64, 10);
    const size_t pool_bytes = size_t(10) * 64 * p.num_heads_kv * p.head_dim * 2;
    p.out = static_cast<char *>(const_cast<void *>(p.k)) + pool_bytes - 16;
    EXPECT_TRUE(refused_naming(p, "out (bytes 0x"));
    p.out = static_cast<char *>(const_cast<void *>(p.k)) + pool_bytes;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// Item 5: the largest scales whose product with log2(e) is still finite pass.
TEST(Hardening, SoftmaxScaleTimesLog2eMustBeFinite) {
    flashcore_forward_params p = valid_params();
    p.softmax_scale = 2.3e38f;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    for (float scale : {2.4e38f, 3e38f, 3.4e38f}) {
        p.softmax_scale = scale;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT) << scale;
        EXPECT_NE(std::string(flashcore_last_error_message()).find("times log2(e) overflows a float; it must be at most"),
                  std::string::npos)
            << flashcore_last_error_message();
    }
}

// Item 1: outputs must not overlap inputs or each other; inputs may alias.
TEST(Hardening, OutputsMustNotOverlapOtherTensors) {
    const auto expect_overlap = [](const flashcore_forward_params &p, const std::string &written,
                                   const std::string &other) {
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
        const std::string message = flashcore_last_error_message();
        EXPECT_EQ(message.find(written + " (bytes 0x"), 0u) << message;
        EXPECT_NE(message.find(") overlaps " + other + " (bytes 0x"), std::string::npos) << message;
        EXPECT_NE(message.find("); what the call writes (out"), std::string::npos) << message;
        EXPECT_NE(message.find(") must not overlap what it reads (q, k, v"),
                  std::string::npos)
            << message;
    };
    flashcore_forward_params p = valid_params();
    p.out = const_cast<void *>(p.k);  // out and k the same buffer
    expect_overlap(p, "out", "k");
    p = valid_params();
    p.lse = static_cast<float *>(p.out);
    expect_overlap(p, "lse", "out");
    // The last byte of q is the first of out: overlap by one 16-byte chunk.
    p = valid_params();
    const size_t q_bytes = size_t(p.batch_size) * p.seqlen_q * p.num_heads_q * p.head_dim * 2;
    p.out = static_cast<char *>(const_cast<void *>(p.q)) + q_bytes - 16;
    expect_overlap(p, "out", "q");
    p.out = static_cast<char *>(const_cast<void *>(p.q)) + q_bytes;  // adjacent: fine
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // lse in the middle of v.
    p = valid_params();
    p.lse = reinterpret_cast<float *>(static_cast<char *>(const_cast<void *>(p.v)) + 4096);
    expect_overlap(p, "lse", "v");
    // q, k and v may alias one another (self-attention over one buffer).
    p = valid_params();
    p.num_heads_kv = p.num_heads_q;
    p.seqlen_k = p.seqlen_q;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    p.k = p.v = p.q;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// Empty calls: batch, seqlen_q or heads 0 succeed with nothing looked at.
TEST(Hardening, EmptyCallsSucceedWithoutPointers) {
    const std::function<void(flashcore_forward_params &)> empties[] = {
        [](flashcore_forward_params &p) { p.batch_size = 0; },
        [](flashcore_forward_params &p) { p.seqlen_q = 0; },
        [](flashcore_forward_params &p) { p.num_heads_q = 0; p.num_heads_kv = 0; },
        [](flashcore_forward_params &p) { p.num_heads_q = 0; },
        [](flashcore_forward_params &p) { p.batch_size = 0; p.seqlen_k = 0; },
    };
    for (size_t i = 0; i < std::size(empties); ++i) {
        flashcore_forward_params p = valid_params();
        empties[i](p);
        ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS)
            << i << ": " << flashcore_last_error_message();
        p.q = p.k = p.v = p.out = nullptr;
        p.lse = nullptr;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << i << ": " << flashcore_last_error_message();
        // Strides are not looked at either (frameworks give empty tensors any).
        p.out_seq_stride = 3;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << i << ": " << flashcore_last_error_message();
        // What does not depend on the pointers is still checked.
        p.head_dim = 100;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_UNSUPPORTED) << i;
    }
    // Keys missing where rows need them: refused.
    flashcore_forward_params p = valid_params();
    p.seqlen_k = 0;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("seqlen_k (0)"), std::string::npos);
}

// Item 9: a made-up or destroyed handle is refused by every call that takes
// one. (Memory that never held a handle: reading a freed one would be the
// use-after-free the check guards against.)
TEST(Hardening, CallsRefuseAHandleThatIsNotLive) {
    alignas(64) unsigned char memory[512];
    for (unsigned char fill : {0x00, 0xAB}) {
        std::memset(memory, fill, sizeof memory);
        const flashcore_handle h = reinterpret_cast<flashcore_handle>(memory);
        const auto expect_refused = [&](flashcore_status status, const char *call) {
            EXPECT_EQ(status, FLASHCORE_STATUS_INVALID_ARGUMENT) << call;
            EXPECT_NE(std::string(flashcore_last_error_message()).find("is not a live flashcore handle"),
                      std::string::npos)
                << call << ": " << flashcore_last_error_message();
        };
        int device = -5;
        expect_refused(flashcore_handle_device(h, &device), "flashcore_handle_device");
        EXPECT_EQ(device, -5);
        flashcore_forward_params p = valid_params();
        size_t bytes = 77;
        expect_refused(flashcore_forward_workspace_size(h, &p, &bytes), "flashcore_forward_workspace_size");
        EXPECT_EQ(bytes, 77u);
        expect_refused(flashcore_forward(h, &p, nullptr, 0, nullptr), "flashcore_forward");
        flashcore_merge_params m;
        ASSERT_EQ(flashcore_merge_params_init(&m, sizeof m), FLASHCORE_STATUS_SUCCESS);
        expect_refused(flashcore_merge_states(h, &m, nullptr), "flashcore_merge_states");
        flashcore_backward_params b;
        ASSERT_EQ(flashcore_backward_params_init(&b, sizeof b), FLASHCORE_STATUS_SUCCESS);
        expect_refused(flashcore_backward_workspace_size(h, &b, &bytes), "flashcore_backward_workspace_size");
        EXPECT_EQ(bytes, 77u);
        expect_refused(flashcore_backward(h, &b, nullptr, 0, nullptr), "flashcore_backward");
        expect_refused(flashcore_destroy(h), "flashcore_destroy");
    }
}

// With a GPU: a destroyed handle is refused (as long as its memory still
// reads, which glibc's allocator keeps for a freed block this small).
TEST(Hardening, DestroyedHandleIsRefused) {
    std::string reason;
    if (!flashcore_test::cuda_device_available(&reason)) GTEST_SKIP() << "needs a GPU: " << reason;
    flashcore_handle h = nullptr;
    ASSERT_EQ(flashcore_create(&h), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    int device = -1;
    EXPECT_EQ(flashcore_handle_device(h, &device), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_SUCCESS);
    // The reads of the freed handle are deliberate: ASan and TSan (which
    // CI's sanitizer builds use) report them as use after free.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    EXPECT_EQ(flashcore_handle_device(h, &device), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_INVALID_ARGUMENT) << "a double destroy must be refused";
#endif
}

// Item 7: without a driver the message says so, in these words (the
// runtime alone would say "driver version is insufficient").
TEST(Hardening, MissingDriverIsNamed) {
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver != nullptr) {
        dlclose(driver);
        GTEST_SKIP() << "libcuda.so.1 loads here: this test is for machines without the NVIDIA driver";
    }
    flashcore_handle h = reinterpret_cast<flashcore_handle>(fake_pointer(0x1234));
    EXPECT_EQ(flashcore_create(&h), FLASHCORE_STATUS_NO_DEVICE);
    EXPECT_EQ(h, nullptr);
    const std::string message = flashcore_last_error_message();
    EXPECT_EQ(message.find("no NVIDIA driver found (libcuda.so.1 could not be loaded: "), 0u) << message;
    EXPECT_EQ(message.find("insufficient"), std::string::npos) << message;
    EXPECT_EQ(flashcore_create_for_device(&h, 0), FLASHCORE_STATUS_NO_DEVICE);
    EXPECT_EQ(std::string(flashcore_last_error_message()).find("no NVIDIA driver found"), 0u);
}

// ---------------------------------------------------------------------------
// The backward pass (0.7): flashcore_backward_params and its calls.
// ---------------------------------------------------------------------------

// q, k, v, out, lse, dout, dq, dk and dv: fake_tensor(0 .. 8).
flashcore_backward_params valid_backward_params() {
    flashcore_backward_params p;
    EXPECT_EQ(flashcore_backward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    p.batch_size = 2;
    p.seqlen_q = 100;
    p.seqlen_k = 300;
    p.num_heads_q = 8;
    p.num_heads_kv = 2;
    p.head_dim = 64;
    p.q = fake_tensor(0);
    p.k = fake_tensor(1);
    p.v = fake_tensor(2);
    p.out = fake_tensor(3);
    p.lse = static_cast<const float *>(fake_tensor(4));
    p.dout = fake_tensor(5);
    p.dq = fake_tensor(6);
    p.dk = fake_tensor(7);
    p.dv = fake_tensor(8);
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    return p;
}

// Whether flashcore_backward_check returns `expected` with a message that
// contains `message_part`.
testing::AssertionResult backward_refused(const flashcore_backward_params &p, flashcore_status expected,
                                          const std::string &message_part) {
    const flashcore_status status = flashcore_backward_check(&p);
    const std::string message = flashcore_last_error_message();
    if (status == expected && message.find(message_part) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "status " << int(status) << ", message \"" << message << "\"; expected "
                                       << int(expected) << " and a message containing \"" << message_part << "\"";
}

testing::AssertionResult backward_accepted(const flashcore_backward_params &p) {
    const flashcore_status status = flashcore_backward_check(&p);
    const std::string message = flashcore_last_error_message();
    if (status == FLASHCORE_STATUS_SUCCESS && message.empty()) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "status " << int(status) << ", message \"" << message << "\"";
}

// A struct's bytes, padding included: the calls must write exactly what
// they document, and nothing when they refuse.
std::vector<unsigned char> bytes_of(const flashcore_backward_params &p) {
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&p);
    return {bytes, bytes + sizeof p};
}

TEST(BackwardParams, InitSetsSizeAndDefaults) {
    flashcore_backward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_backward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.struct_size, sizeof(flashcore_backward_params));
    EXPECT_EQ(p.dtype, FLASHCORE_DTYPE_FP16);
    EXPECT_EQ(p.softmax_scale, FLASHCORE_SOFTMAX_SCALE_DEFAULT);
    EXPECT_FALSE(std::signbit(p.softmax_scale));
    EXPECT_EQ(p.head_dim_v, 0);
    EXPECT_EQ(p.causal, 0);
    EXPECT_EQ(p.use_window, 0);
    EXPECT_EQ(p.softcap, 0.f);
    EXPECT_EQ(p.deterministic, 0);
    EXPECT_EQ(p.q, nullptr);
    EXPECT_EQ(p.lse, nullptr);
    EXPECT_EQ(p.dv, nullptr);
    EXPECT_EQ(p.dv_head_stride, 0);
    EXPECT_EQ(p.cu_seqlens_k, nullptr);
    EXPECT_EQ(p.total_seqlen_k, 0);
    EXPECT_EQ(p.attention_chunk, 0);
    EXPECT_EQ(p.sinks, nullptr);
    EXPECT_EQ(p.dsinks, nullptr);
    EXPECT_EQ(flashcore_last_error_message(), std::string());
    EXPECT_EQ(flashcore_backward_params_init(nullptr, sizeof p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "params is NULL");
    // The struct first appeared in 0.7: no smaller size is any header's.
    for (size_t size : {size_t(0), kBackwardSizeV0_7 - 8, size_t(1) << 40}) {
        std::memset(&p, 0xAB, sizeof p);
        EXPECT_EQ(flashcore_backward_params_init(&p, size), FLASHCORE_STATUS_INVALID_ARGUMENT) << size;
        EXPECT_NE(std::string(flashcore_last_error_message()).find("is not a valid size of flashcore_backward_params"),
                  std::string::npos)
            << flashcore_last_error_message();
        EXPECT_EQ(p.struct_size, size_t(0xABABABABABABABABull)) << "a refused init wrote the struct";
    }
}

// A newer header's larger struct: init writes exactly its struct_size bytes.
// The backward pass takes fp16 and bf16 only: a dtype it does not take is
// refused with its own list, never the forward's, which names e4m3 (audit
// item 5), whatever else is wrong with the call.
TEST(BackwardParams, DtypeMessagesNameTheBackwardsDtypes) {
    for (int32_t dtype : {0, 7, int32_t(FLASHCORE_DTYPE_FP8_E4M3)}) {
        for (bool bad_head_dim : {false, true}) {
            flashcore_backward_params p = valid_backward_params();
            p.dtype = dtype;
            if (bad_head_dim) p.head_dim = 100;
            EXPECT_EQ(flashcore_backward_check(&p), FLASHCORE_STATUS_UNSUPPORTED) << dtype;
            const std::string message = flashcore_last_error_message();
            EXPECT_NE(message.find("the backward pass takes FLASHCORE_DTYPE_FP16 (1) or FLASHCORE_DTYPE_BF16 (2)"),
                      std::string::npos)
                << message;
            EXPECT_EQ(message.find("FLASHCORE_DTYPE_FP8_E4M3 (4, sm_90"), std::string::npos) << message;
        }
    }
}

TEST(BackwardParams, InitWritesExactlyTheCallersSize) {
    struct Newer {
        flashcore_backward_params base;
        int64_t future_field;
        unsigned char guard[16];
    } newer;
    std::memset(&newer, 0xAB, sizeof newer);
    const size_t size = offsetof(Newer, guard);
    ASSERT_EQ(flashcore_backward_params_init(&newer.base, size), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(newer.base.struct_size, size);
    EXPECT_EQ(newer.future_field, 0);
    for (unsigned char byte : newer.guard) EXPECT_EQ(byte, 0xAB) << "init wrote past struct_size";
}

TEST(BackwardParams, StructSizeIsCheckedByEveryCall) {
    flashcore_backward_params p = valid_backward_params();
    EXPECT_TRUE(backward_accepted(p));
    // Short of 0.7's, inside 0.9's fields, and past 64 KiB.
    for (size_t size : {size_t(0), kBackwardSizeV0_7 - 4, sizeof p - 4, size_t(1) << 40}) {
        p.struct_size = size;
        EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT,
                                     "params->struct_size (" + std::to_string(size) + ") is not "));
        const std::vector<unsigned char> before = bytes_of(p);
        EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD),
                  FLASHCORE_STATUS_INVALID_ARGUMENT);
        EXPECT_EQ(bytes_of(p), before);
    }
    EXPECT_EQ(flashcore_backward_check(nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "params is NULL");
}

// A struct from a newer header: accepted when the fields this library does
// not know are zero, refused (UNSUPPORTED) when one is set.
TEST(BackwardParams, StructFromNewerHeader) {
    struct Newer {
        flashcore_backward_params base;
        int64_t future_field;
    } newer;
    newer.base = valid_backward_params();
    newer.base.struct_size = sizeof(Newer);
    newer.future_field = 0;
    EXPECT_TRUE(backward_accepted(newer.base));
    newer.future_field = 42;
    EXPECT_TRUE(backward_refused(newer.base, FLASHCORE_STATUS_UNSUPPORTED, "newer flashcore.h"));
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&newer.base, FLASHCORE_LAYOUT_BSHD),
              FLASHCORE_STATUS_UNSUPPORTED);
    // Every byte past sm_margin, the last field this library knows.
    expect_newer_fields_refused(valid_backward_params(), flashcore_backward_check, kBackwardKnownEnd);
    // The 0.9 fields of a newer caller's struct are read as ours.
    newer.future_field = 0;
    newer.base.attention_chunk = -3;
    EXPECT_TRUE(backward_refused(newer.base, FLASHCORE_STATUS_INVALID_ARGUMENT, "attention_chunk (-3)"));
    newer.base.attention_chunk = 0;
    newer.base.dsinks = static_cast<float *>(fake_tensor(12));
    EXPECT_TRUE(backward_refused(newer.base, FLASHCORE_STATUS_INVALID_ARGUMENT, "dsinks is set but sinks is NULL"));
}

// A 0.7 or 0.8 caller's struct ends after total_seqlen_k (its sizeof too):
// accepted without chunks or sinks, whatever lies in memory after it
// (0xAB... as attention_chunk and sm_margin are negative, as sinks and
// dsinks misaligned pointers); neither init nor the stride helper writes
// past it; the same
// bytes inside a 0.9 struct are read, and refused.
TEST(BackwardParams, StructFromVersion0_7) {
    static_assert(kBackwardSizeV0_7 % alignof(flashcore_backward_params) == 0, "0.7's end is its sizeof");
    OlderCaller<flashcore_backward_params> older;
    ASSERT_EQ(older.init(kBackwardSizeV0_7, flashcore_backward_params_init, valid_backward_params()), "");
    flashcore_backward_params *p = older.p;
    EXPECT_TRUE(backward_accepted(*p));
    ASSERT_EQ(flashcore_backward_set_contiguous_strides(p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(older.written_past(kBackwardSizeV0_7), "") << "by flashcore_backward_set_contiguous_strides";
    EXPECT_TRUE(backward_accepted(*p));
    p->causal = 1;
    p->seqlen_q = 0;  // without query rows: dsinks, had it been set, would be written
    EXPECT_TRUE(backward_accepted(*p));
    p->struct_size = sizeof(flashcore_backward_params);
    EXPECT_TRUE(backward_refused(*p, FLASHCORE_STATUS_INVALID_ARGUMENT,
                                 "attention_chunk (" + std::to_string(int32_t(0xABABABAB)) + ") must be 0"));
    p->attention_chunk = 0;
    EXPECT_TRUE(backward_refused(*p, FLASHCORE_STATUS_INVALID_ARGUMENT,
                                 "sm_margin (" + std::to_string(int32_t(0xABABABAB)) + ") must be >= 0"));
    p->sm_margin = 0;
    EXPECT_TRUE(backward_refused(*p, FLASHCORE_STATUS_MISALIGNED, "sinks ("));
    p->sinks = static_cast<const float *>(fake_tensor(11));
    EXPECT_TRUE(backward_refused(*p, FLASHCORE_STATUS_MISALIGNED, "dsinks ("));
}

// Past 0.7's struct (368 bytes on LP64), only this header's sizeof (400)
// and more: 0.9 appended attention_chunk, sinks, dsinks and sm_margin at once.
TEST(BackwardParams, StructSizeBetweenReleasedSizesIsRefused) {
    static_assert(kBackwardSizeV0_7 == 368 && sizeof(flashcore_backward_params) == 400, "LP64 layout");
    EXPECT_EQ(expect_released_sizes_only(valid_backward_params(), flashcore_backward_check,
                                         flashcore_backward_params_init, "flashcore_backward_params",
                                         {kBackwardSizeV0_7}, "368"),
              sizeof(flashcore_backward_params) - kBackwardSizeV0_7 - 1);
}

// dq like q, dk like k, dv like v and dout like out, each as the forward's
// strides of the same shapes.
TEST(BackwardParams, ContiguousStrides) {
    flashcore_backward_params p = valid_backward_params();  // B=2, Sq=100, Sk=300, Hq=8, Hkv=2
    p.head_dim = 192;  // only the sizes are checked here
    p.head_dim_v = 128;
    // Each tensor's strides against the packed strides of its (seqlen,
    // heads, dim) in `layout`.
    const auto expect_packed = [](const flashcore_backward_params &s, flashcore_layout layout) {
        const struct {
            const char *name;
            int64_t batch, seq, head;
            int64_t seqlen, heads, dim;
        } tensors[] = {
            {"q", s.q_batch_stride, s.q_seq_stride, s.q_head_stride, 100, 8, 192},
            {"dq", s.dq_batch_stride, s.dq_seq_stride, s.dq_head_stride, 100, 8, 192},
            {"k", s.k_batch_stride, s.k_seq_stride, s.k_head_stride, 300, 2, 192},
            {"dk", s.dk_batch_stride, s.dk_seq_stride, s.dk_head_stride, 300, 2, 192},
            {"v", s.v_batch_stride, s.v_seq_stride, s.v_head_stride, 300, 2, 128},
            {"dv", s.dv_batch_stride, s.dv_seq_stride, s.dv_head_stride, 300, 2, 128},
            {"out", s.out_batch_stride, s.out_seq_stride, s.out_head_stride, 100, 8, 128},
            {"dout", s.dout_batch_stride, s.dout_seq_stride, s.dout_head_stride, 100, 8, 128},
        };
        const bool bhsd = layout == FLASHCORE_LAYOUT_BHSD;
        for (const auto &t : tensors) {
            EXPECT_EQ(t.seq, bhsd ? t.dim : t.heads * t.dim) << t.name << ", layout " << int(layout);
            EXPECT_EQ(t.head, bhsd ? t.seqlen * t.dim : t.dim) << t.name << ", layout " << int(layout);
            EXPECT_EQ(t.batch, t.heads * t.seqlen * t.dim) << t.name << ", layout " << int(layout);
        }
    };
    for (flashcore_layout layout : {FLASHCORE_LAYOUT_BHSD, FLASHCORE_LAYOUT_BSHD}) {
        ASSERT_EQ(flashcore_backward_set_contiguous_strides(&p, layout), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        expect_packed(p, layout);
    }
    // A call without query rows is not empty: it needs keys.
    p.seqlen_q = 0;
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(p.dq_batch_stride, 0);
    p.seqlen_k = 0;
    const std::vector<unsigned char> before = bytes_of(p);
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("seqlen_k (0) must be >= 1 unless the call is empty"),
              std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(bytes_of(p), before) << "a refused call wrote strides";
    p.batch_size = 0;  // empty: no keys needed
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(nullptr, FLASHCORE_LAYOUT_BHSD),
              FLASHCORE_STATUS_INVALID_ARGUMENT);
}

// Strides too large for 2^63 bytes: refused, nothing written.
TEST(BackwardParams, ContiguousStridesThatOverflowAreRefused) {
    flashcore_backward_params p = valid_backward_params();
    p.batch_size = INT32_MAX;
    p.seqlen_k = 1 << 30;
    p.num_heads_q = p.num_heads_kv = 1 << 20;
    const std::vector<unsigned char> before = bytes_of(p);
    EXPECT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("would span more than 2^63 bytes"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(bytes_of(p), before);
}

TEST(Backward, ValidParamsPass) {
    flashcore_backward_params p = valid_backward_params();
    EXPECT_TRUE(backward_accepted(p));
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.causal = 1;
    p.deterministic = 1;
    p.softmax_scale = 0.3f;
    EXPECT_TRUE(backward_accepted(p));
    p.deterministic = -7;  // any non-zero value
    p.use_window = 1;
    p.window_left = 64;
    p.window_right = 0;
    p.softcap = 30.f;
    EXPECT_TRUE(backward_accepted(p));
    // GQA 1, 4 (above) and 8; q, k and v may alias one another.
    p = valid_backward_params();
    p.num_heads_kv = p.num_heads_q;
    p.seqlen_k = p.seqlen_q;
    ASSERT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    p.k = p.v = p.q;
    EXPECT_TRUE(backward_accepted(p));
    p.num_heads_kv = 1;
    ASSERT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_TRUE(backward_accepted(p));
}

// The read tensors are read only: out and dout may overlap themselves and
// one another, lse may lie inside an input.
TEST(Backward, InputsMayShareMemory) {
    flashcore_backward_params p = valid_backward_params();
    p.out_seq_stride = 0;
    p.dout_head_stride = 0;
    EXPECT_TRUE(backward_accepted(p));
    p.dout = p.out;
    p.lse = static_cast<const float *>(p.q);
    EXPECT_TRUE(backward_accepted(p));
}

struct InvalidBackwardCase {
    const char *name;
    std::function<void(flashcore_backward_params &)> mutate;
    flashcore_status expected;
    const char *message_part;
};

class InvalidBackwardParams : public testing::TestWithParam<InvalidBackwardCase> {};

TEST_P(InvalidBackwardParams, ReturnSpecificStatusAndMessage) {
    const InvalidBackwardCase &c = GetParam();
    flashcore_backward_params p = valid_backward_params();
    c.mutate(p);
    const std::vector<unsigned char> before = bytes_of(p);
    EXPECT_TRUE(backward_refused(p, c.expected, c.message_part));
    EXPECT_EQ(bytes_of(p), before) << "the check wrote its input";
    // Without a handle the backward call fails on the handle first.
    EXPECT_EQ(flashcore_backward(nullptr, &p, nullptr, 0, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(flashcore_last_error_message(), "handle is NULL");
}

// An address `bytes` into the tensor at `pointer`.
template <typename T>
T *offset(T *pointer, size_t bytes) {
    using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T *>(reinterpret_cast<Byte *>(pointer) + bytes);
}

const InvalidBackwardCase kInvalidBackwardCases[] = {
    {"dtype_unknown", [](auto &p) { p.dtype = FLASHCORE_DTYPE_FP32; }, FLASHCORE_STATUS_UNSUPPORTED,
     "dtype 3 is not supported: the backward pass takes FLASHCORE_DTYPE_FP16 (1) or FLASHCORE_DTYPE_BF16 (2)"},
    {"batch_negative", [](auto &p) { p.batch_size = -3; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "batch_size (-3) must be >= 0"},
    {"seqlen_q_negative", [](auto &p) { p.seqlen_q = -1; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_q (-1)"},
    {"seqlen_k_zero", [](auto &p) { p.seqlen_k = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "seqlen_k (0) must be >= 1"},
    // Without query rows a backward call is not empty (dk, dv are written).
    {"seqlen_k_zero_without_queries", [](auto &p) { p.seqlen_k = 0; p.seqlen_q = 0; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "seqlen_k (0) must be >= 1 unless the call is empty"},
    {"heads_kv_zero", [](auto &p) { p.num_heads_kv = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "num_heads_kv (0) must be >= 1 where num_heads_q (8) is not 0"},
    {"heads_do_not_divide", [](auto &p) { p.num_heads_q = 12; p.num_heads_kv = 5; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "num_heads_q (12) must be a multiple of num_heads_kv (5)"},
    {"head_dim_zero", [](auto &p) { p.head_dim = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "head_dim (0) must be >= 1"},
    {"head_dim_100", [](auto &p) { p.head_dim = 100; }, FLASHCORE_STATUS_UNSUPPORTED,
     "head_dim 100 is not a multiple of 8; supported (head_dim, head_dim_v): ("},
    {"head_dim_520", [](auto &p) { p.head_dim = 520; }, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 520 exceeds"},
    {"head_dim_v_520", [](auto &p) { p.head_dim_v = 520; }, FLASHCORE_STATUS_UNSUPPORTED, "head_dim_v 520 exceeds"},
    {"head_dim_v_negative", [](auto &p) { p.head_dim_v = -8; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "head_dim_v (-8) must be >= 1, or 0 for the same as head_dim"},
    {"seqlen_too_long", [](auto &p) { p.seqlen_k = (1 << 30) + 1; }, FLASHCORE_STATUS_UNSUPPORTED, "at most"},
    {"scale_negative", [](auto &p) { p.softmax_scale = -0.5f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softmax_scale (-0.5)"},
    {"scale_negative_zero", [](auto &p) { p.softmax_scale = -0.f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softmax_scale is -0.0"},
    {"scale_log2_overflows", [](auto &p) { p.softmax_scale = 3e38f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "times log2(e) overflows a float"},
    {"window_left_minus_2", [](auto &p) { p.use_window = 1; p.window_left = -2; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "window_left (-2) must be -1 (unbounded) or >= 0"},
    {"window_right_1_with_causal", [](auto &p) { p.use_window = 1; p.causal = 1; p.window_right = 1; },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "window_right (1) must be -1 or 0 with causal"},
    {"softcap_negative", [](auto &p) { p.softcap = -30.f; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softcap (-30) must be finite and > 0, or 0 for none"},
    {"softcap_inf", [](auto &p) { p.softcap = INFINITY; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "softcap (inf) must be finite and > 0"},
    {"q_null", [](auto &p) { p.q = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "q is NULL"},
    {"k_null", [](auto &p) { p.k = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "k is NULL"},
    {"v_null", [](auto &p) { p.v = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "v is NULL"},
    {"out_null", [](auto &p) { p.out = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "out is NULL"},
    {"dout_null", [](auto &p) { p.dout = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "dout is NULL"},
    {"dq_null", [](auto &p) { p.dq = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "dq is NULL"},
    {"dk_null", [](auto &p) { p.dk = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "dk is NULL"},
    {"dv_null", [](auto &p) { p.dv = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT, "dv is NULL"},
    {"lse_null", [](auto &p) { p.lse = nullptr; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "lse is NULL: the backward pass needs the forward's log-sum-exp"},
    {"dout_misaligned", [](auto &p) { p.dout = offset(p.dout, 8); }, FLASHCORE_STATUS_MISALIGNED,
     "must be 16-byte aligned"},
    {"dq_misaligned", [](auto &p) { p.dq = offset(p.dq, 2); }, FLASHCORE_STATUS_MISALIGNED, "dq ("},
    {"lse_misaligned", [](auto &p) { p.lse = offset(p.lse, 2); }, FLASHCORE_STATUS_MISALIGNED,
     "must be 4-byte aligned"},
    {"dq_stride_negative", [](auto &p) { p.dq_seq_stride = -8; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "dq_seq_stride (-8) must be >= 0"},
    {"dk_stride_not_multiple_of_8", [](auto &p) { p.dk_head_stride = 100; }, FLASHCORE_STATUS_MISALIGNED,
     "dk_head_stride (100) must be a multiple of 8"},
    {"dout_batch_stride_misaligned", [](auto &p) { p.dout_batch_stride += 4; }, FLASHCORE_STATUS_MISALIGNED,
     "dout_batch_stride"},
    {"dv_strides_overflow", [](auto &p) { p.dv_batch_stride = int64_t(1) << 62; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "dv strides address more than 2^63 bytes"},
    {"dq_rows_overlap", [](auto &p) { p.dq_seq_stride = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "dq strides (batch 51200, seq 0, head 64) make elements overlap"},
    {"dk_heads_overlap", [](auto &p) { p.dk_head_stride = 32; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "dk strides"},
    {"dv_batches_overlap", [](auto &p) { p.dv_batch_stride = 0; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "dv strides (batch 0,"},
    {"dq_is_q", [](auto &p) { p.dq = const_cast<void *>(p.q); }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     ") overlaps q (bytes 0x"},
    {"dk_overlaps_dv", [](auto &p) { p.dk = offset(p.dv, 4096); }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     ") overlaps dk (bytes 0x"},
    {"dv_overlaps_lse", [](auto &p) { p.dv = const_cast<float *>(p.lse); }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     ") overlaps dv (bytes 0x"},
    {"dq_overlaps_dout", [](auto &p) { p.dq = offset(const_cast<void *>(p.dout), 16); },
     FLASHCORE_STATUS_INVALID_ARGUMENT, ") overlaps dout (bytes 0x"},
    {"seqused_k_misaligned", [](auto &p) { p.seqused_k = offset(static_cast<const int32_t *>(fake_tensor(11)), 2); },
     FLASHCORE_STATUS_MISALIGNED, "seqused_k ("},
    {"seqused_k_in_dk", [](auto &p) { p.seqused_k = static_cast<const int32_t *>(p.dk); },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "seqused_k (bytes 0x"},
    {"total_seqlen_q_without_cu_seqlens_q", [](auto &p) { p.total_seqlen_q = 5; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "total_seqlen_q (5) is set but cu_seqlens_q is NULL"},
    {"total_seqlen_q_negative",
     [](auto &p) {
         p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(9));
         p.total_seqlen_q = -1;
     },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "total_seqlen_q (-1) must be in [0, 1073741824]"},
    {"total_seqlen_k_zero",
     [](auto &p) {
         p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(10));
         p.total_seqlen_k = 0;
     },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "total_seqlen_k (0) must be >= 1"},
    // Packed queries of no rows: not empty either.
    {"total_seqlen_k_zero_without_queries",
     [](auto &p) {
         p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(9));
         p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(10));
         p.total_seqlen_k = 0;
     },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "total_seqlen_k (0) must be >= 1 unless the call is empty"},
    {"cu_seqlens_k_misaligned",
     [](auto &p) {
         p.cu_seqlens_k = offset(static_cast<const int32_t *>(fake_tensor(10)), 1);
         p.total_seqlen_k = 10;
     },
     FLASHCORE_STATUS_MISALIGNED, "cu_seqlens_k ("},
    // Fields added in 0.9 (AttentionChunk.*, Sinks.* and Dsinks.* go further).
    {"attention_chunk_int32_min", [](auto &p) { p.attention_chunk = INT32_MIN; }, FLASHCORE_STATUS_INVALID_ARGUMENT,
     "attention_chunk (-2147483648) must be 0 (no chunks) or the chunk length in keys (> 0)"},
    {"sinks_misaligned", [](auto &p) { p.sinks = offset(static_cast<const float *>(fake_tensor(11)), 2); },
     FLASHCORE_STATUS_MISALIGNED, "sinks ("},
    {"dsinks_without_sinks", [](auto &p) { p.dsinks = static_cast<float *>(fake_tensor(12)); },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "dsinks is set but sinks is NULL"},
    {"dsinks_misaligned",
     [](auto &p) {
         p.sinks = static_cast<const float *>(fake_tensor(11));
         p.dsinks = offset(static_cast<float *>(fake_tensor(12)), 1);
     },
     FLASHCORE_STATUS_MISALIGNED, "dsinks ("},
    {"dsinks_is_dq",
     [](auto &p) {
         p.sinks = static_cast<const float *>(fake_tensor(11));
         p.dsinks = static_cast<float *>(p.dq);
     },
     FLASHCORE_STATUS_INVALID_ARGUMENT, "dsinks (bytes 0x"},
};

INSTANTIATE_TEST_SUITE_P(AllParameters, InvalidBackwardParams, testing::ValuesIn(kInvalidBackwardCases),
                         [](const testing::TestParamInfo<InvalidBackwardCase> &info) {
                             return std::string(info.param.name);
                         });

// The aliasing rule at its edges: a gradient one 16-byte chunk into another
// tensor is refused, one adjacent to it accepted; the message names both.
TEST(Backward, GradientsMustNotOverlapAnything) {
    flashcore_backward_params p = valid_backward_params();
    const size_t q_bytes = size_t(p.batch_size) * p.seqlen_q * p.num_heads_q * p.head_dim * 2;
    p.dq = offset(const_cast<void *>(p.q), q_bytes - 16);
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "dq (bytes 0x"));
    EXPECT_EQ(std::string(flashcore_last_error_message()).rfind("dq (bytes 0x", 0), 0u);
    EXPECT_NE(std::string(flashcore_last_error_message()).find(") overlaps q (bytes 0x"), std::string::npos);
    p.dq = offset(const_cast<void *>(p.q), q_bytes);
    EXPECT_TRUE(backward_accepted(p));
    // dk right after dv: adjacent is fine, one chunk back is not.
    p = valid_backward_params();
    const size_t dv_bytes = size_t(p.batch_size) * p.seqlen_k * p.num_heads_kv * p.head_dim * 2;
    p.dk = offset(p.dv, dv_bytes);
    EXPECT_TRUE(backward_accepted(p));
    p.dk = offset(p.dv, dv_bytes - 16);
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, ") overlaps dk (bytes 0x"));
    // lse holds batch_size * num_heads_q * seqlen_q floats.
    p = valid_backward_params();
    const size_t lse_bytes = size_t(p.batch_size) * p.num_heads_q * p.seqlen_q * 4;
    p.dq = offset(const_cast<float *>(p.lse), lse_bytes - 16);
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, ") overlaps dq (bytes 0x"));
    p.dq = offset(const_cast<float *>(p.lse), lse_bytes);
    EXPECT_TRUE(backward_accepted(p));
}

// Empty calls (batch_size or num_heads_q 0) look at no pointer or stride;
// what does not depend on them is still checked.
TEST(Backward, EmptyCallsSucceedWithoutPointers) {
    const std::function<void(flashcore_backward_params &)> empties[] = {
        [](flashcore_backward_params &p) { p.batch_size = 0; },
        [](flashcore_backward_params &p) { p.num_heads_q = 0; p.num_heads_kv = 0; },
        [](flashcore_backward_params &p) { p.num_heads_q = 0; },
        [](flashcore_backward_params &p) { p.batch_size = 0; p.seqlen_k = 0; },
    };
    for (size_t i = 0; i < std::size(empties); ++i) {
        flashcore_backward_params p = valid_backward_params();
        empties[i](p);
        p.q = p.k = p.v = p.out = p.dout = nullptr;
        p.dq = p.dk = p.dv = nullptr;
        p.lse = nullptr;
        p.dq_seq_stride = 3;
        EXPECT_TRUE(backward_accepted(p)) << i;
        p.head_dim = 100;
        EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 100")) << i;
    }
}

// Without query rows (seqlen_q 0, or total_seqlen_q 0 with cu_seqlens_q) a
// call writes dk and dv: their tensors and k, v are checked, the empty q,
// out, dout, dq and lse are not looked at.
TEST(Backward, CallsWithoutQueryRowsCheckTheKeySide) {
    for (bool packed : {false, true}) {
        flashcore_backward_params p = valid_backward_params();
        if (packed) {
            p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(9));
            p.total_seqlen_q = 0;
        } else {
            p.seqlen_q = 0;
        }
        p.q = p.out = p.dout = nullptr;
        p.dq = nullptr;
        p.lse = nullptr;
        p.q_seq_stride = p.dq_head_stride = 3;
        EXPECT_TRUE(backward_accepted(p)) << packed;
        flashcore_backward_params q = p;
        q.dk = nullptr;
        EXPECT_TRUE(backward_refused(q, FLASHCORE_STATUS_INVALID_ARGUMENT, "dk is NULL")) << packed;
        q = p;
        q.dv = const_cast<void *>(q.k);
        EXPECT_TRUE(backward_refused(q, FLASHCORE_STATUS_INVALID_ARGUMENT, "dv (bytes 0x")) << packed;
        q = p;
        q.v_head_stride = 4;
        EXPECT_TRUE(backward_refused(q, FLASHCORE_STATUS_MISALIGNED, "v_head_stride (4)")) << packed;
    }
}

// Packed (variable-length) tensors: q, out, dout, dq and lse span
// total_seqlen_q rows, k, v, dk and dv total_seqlen_k; batch strides ignored.
flashcore_backward_params varlen_backward_params(int32_t total_q, int32_t total_k) {
    flashcore_backward_params p = valid_backward_params();
    p.cu_seqlens_q = static_cast<const int32_t *>(fake_tensor(9));
    p.cu_seqlens_k = static_cast<const int32_t *>(fake_tensor(10));
    p.total_seqlen_q = total_q;
    p.total_seqlen_k = total_k;
    return p;
}

TEST(Backward, PackedTensorsFollowTheTotals) {
    flashcore_backward_params p = varlen_backward_params(150, 500);
    EXPECT_TRUE(backward_accepted(p));
    p.dq_batch_stride = p.dout_batch_stride = -8;
    p.dk_batch_stride = p.dv_batch_stride = 3;
    EXPECT_TRUE(backward_accepted(p));
    // dq spans 150 rows of 8 heads x 64 (BSHD).
    const size_t dq_bytes = size_t(150) * p.num_heads_q * p.head_dim * 2;
    p.dout = offset(static_cast<const void *>(p.dq), dq_bytes - 16);
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "overlaps dout"));
    p.dout = offset(static_cast<const void *>(p.dq), dq_bytes);
    EXPECT_TRUE(backward_accepted(p));
    // dk spans 500 rows of 2 heads x 64.
    p = varlen_backward_params(150, 500);
    const size_t dk_bytes = size_t(500) * p.num_heads_kv * p.head_dim * 2;
    p.cu_seqlens_k = static_cast<const int32_t *>(offset(p.dk, dk_bytes - 4));
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "cu_seqlens_k (bytes 0x"));
    p.cu_seqlens_k = static_cast<const int32_t *>(offset(p.dk, dk_bytes));
    EXPECT_TRUE(backward_accepted(p));
    // lse: [num_heads_q][total_seqlen_q].
    p = varlen_backward_params(150, 500);
    const size_t lse_bytes = size_t(150) * p.num_heads_q * 4;
    p.lse = static_cast<const float *>(p.dv) - lse_bytes / 4 + 1;
    EXPECT_TRUE(backward_refused(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "lse (bytes 0x"));
    p.lse = static_cast<const float *>(p.dv) - lse_bytes / 4;
    EXPECT_TRUE(backward_accepted(p));
}

// The head dims are those of the backward kernels, named as the forward's
// message names them.
TEST(Backward, HeadDimsAreTheBackwardKernels) {
    flashcore_backward_params p = valid_backward_params();
    p.head_dim = 100;
    const flashcore_status status = flashcore_backward_check(&p);
    EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED);
    const std::string message = flashcore_last_error_message();
#ifdef FLASHCORE_TEST_HAS_KERNEL_LIST
    EXPECT_NE(message.find("supported (head_dim, head_dim_v): " + pairs_text(generated_bwd_head_dims()) + ", and any"),
              std::string::npos)
        << message;
    for (const HeadDimPair &pair : generated_bwd_head_dims()) {
        p.head_dim = pair.first;
        p.head_dim_v = pair.second;
        ASSERT_EQ(flashcore_backward_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
        EXPECT_TRUE(backward_accepted(p)) << pair.first << ", " << pair.second;
    }
#else
    EXPECT_NE(message.find("supported (head_dim, head_dim_v): ("), std::string::npos) << message;
#endif
}

// Needs a handle, hence a GPU: the workspace is the fp32 dQ accumulator,
// 4 * rows * num_heads_q * head_dim bytes rounded up to FLASHCORE_ALIGNMENT,
// whatever the pointers, strides and options; and flashcore_backward
// checks the workspace it is given before it launches anything.
TEST(Backward, WorkspaceIsTheDqAccumulator) {
    std::string reason;
    if (!flashcore_test::cuda_device_available(&reason)) GTEST_SKIP() << "needs a GPU: " << reason;
    flashcore_handle h = nullptr;
    ASSERT_EQ(flashcore_create(&h), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const auto workspace_of = [h](const flashcore_backward_params &p) {
        size_t bytes = 7;
        EXPECT_EQ(flashcore_backward_workspace_size(h, &p, &bytes), FLASHCORE_STATUS_SUCCESS)
            << flashcore_last_error_message();
        return bytes;
    };
    flashcore_backward_params p = valid_backward_params();  // B=2, Sq=100, Hq=8, D=64
    EXPECT_EQ(workspace_of(p), size_t(4) * 2 * 100 * 8 * 64);
    p.causal = 1;
    p.deterministic = 1;
    p.softcap = 20.f;
    p.q = nullptr;  // not looked at
    p.dq_seq_stride = 3;
    EXPECT_EQ(workspace_of(p), size_t(4) * 2 * 100 * 8 * 64);
    // head_dim_v does not count (rows of a multiple of 8 floats need no
    // rounding up to FLASHCORE_ALIGNMENT).
    p = valid_backward_params();
    p.seqlen_q = 3;
    p.num_heads_q = p.num_heads_kv = 1;
    p.head_dim = 8;
    p.batch_size = 1;
    if (covered(supported_pairs(), 8, 8)) {
        EXPECT_EQ(workspace_of(p), size_t(4) * 3 * 8);  // a multiple of FLASHCORE_ALIGNMENT already
    }
    // Packed queries: total_seqlen_q rows, whatever batch_size and seqlen_q.
    p = varlen_backward_params(150, 500);
    EXPECT_EQ(workspace_of(p), size_t(4) * 150 * 8 * 64);
    // No rows: none; an empty call: none.
    p = valid_backward_params();
    p.seqlen_q = 0;
    EXPECT_EQ(workspace_of(p), 0u);
    p = valid_backward_params();
    p.batch_size = 0;
    EXPECT_EQ(workspace_of(p), 0u);
    // A refused query writes nothing.
    p = valid_backward_params();
    p.head_dim = 100;
    size_t bytes = 77;
    EXPECT_EQ(flashcore_backward_workspace_size(h, &p, &bytes), FLASHCORE_STATUS_UNSUPPORTED);
    EXPECT_EQ(bytes, 77u);
    EXPECT_EQ(flashcore_backward_workspace_size(h, &p, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);

    // The workspace given to flashcore_backward, checked before any launch
    // (the tensors are fake addresses: nothing may be queued).
    p = valid_backward_params();
    const size_t needed = workspace_of(p);
    void *workspace = fake_tensor(12);
    EXPECT_EQ(flashcore_backward(h, &p, workspace, needed - 1, nullptr), FLASHCORE_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("flashcore_backward_workspace_size"), std::string::npos);
    EXPECT_EQ(flashcore_backward(h, &p, nullptr, needed, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_backward(h, &p, offset(workspace, 8), needed, nullptr), FLASHCORE_STATUS_MISALIGNED);
    EXPECT_EQ(flashcore_backward(h, &p, p.dq, needed, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("the workspace (bytes 0x"), std::string::npos)
        << flashcore_last_error_message();
    EXPECT_EQ(flashcore_backward(h, &p, offset(const_cast<void *>(p.k), 64), needed, nullptr),
              FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_destroy(h), FLASHCORE_STATUS_SUCCESS);
}

}  // namespace

// ---------------------------------------------------------------------------
// Fields added in 0.8: quantized K/V (kv_dtype, out_dtype) and descale factors.
// ---------------------------------------------------------------------------

namespace {

// valid_params with an e4m3 K/V cache: one-byte elements, the same element
// strides (multiples of 16), per-(batch, K/V head) descale factors.
flashcore_forward_params valid_fp8_kv_params() {
    flashcore_forward_params p = valid_params();
    p.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
    p.k_descale = static_cast<const float *>(fake_tensor(5));
    p.v_descale = static_cast<const float *>(fake_tensor(6));
    p.k_descale_batch_stride = p.v_descale_batch_stride = p.num_heads_kv;
    p.k_descale_head_stride = p.v_descale_head_stride = 1;
    return p;
}

// Whether flashcore_forward_check returns `status` with a message containing
// `part`.
testing::AssertionResult refused_with(const flashcore_forward_params &p, flashcore_status status,
                                      const std::string &part) {
    const flashcore_status got = flashcore_forward_check(&p);
    const std::string message = flashcore_last_error_message();
    if (got == status && message.find(part) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "status " << int(got) << ", message \"" << message << "\"; expected status "
                                       << int(status) << " and a message containing \"" << part << "\"";
}

}  // namespace

TEST(QuantizedKv, InitLeavesKvAndOutOfQsTypeAndNoDescales) {
    flashcore_forward_params p;
    std::memset(&p, 0xAB, sizeof p);
    ASSERT_EQ(flashcore_forward_params_init(&p, sizeof p), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(p.kv_dtype, 0);
    EXPECT_EQ(p.out_dtype, 0);
    EXPECT_EQ(p.q_descale, nullptr);
    EXPECT_EQ(p.k_descale, nullptr);
    EXPECT_EQ(p.v_descale, nullptr);
    EXPECT_EQ(p.k_descale_batch_stride, 0);
    EXPECT_EQ(p.v_descale_head_stride, 0);
}

TEST(QuantizedKv, E4m3CacheUnderBothQueryTypesIsAccepted) {
    for (int32_t dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
        flashcore_forward_params p = valid_fp8_kv_params();
        p.dtype = dtype;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        // Per-tensor factors, and none (1).
        p.k_descale_batch_stride = p.k_descale_head_stride = 0;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        p.k_descale = p.v_descale = nullptr;
        p.k_descale_head_stride = p.v_descale_head_stride = p.v_descale_batch_stride = 0;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        // out_dtype and kv_dtype may name q's type.
        p.out_dtype = dtype;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        p = valid_params();
        p.dtype = dtype;
        p.kv_dtype = dtype;
        EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    }
}

TEST(QuantizedKv, UnsupportedDtypeCombinationsAreNamed) {
    flashcore_forward_params p = valid_params();
    p.kv_dtype = FLASHCORE_DTYPE_BF16;  // under fp16 queries
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "kv_dtype 2 is not supported with dtype 1"));
    for (int32_t kv : {-1, 3, 5, 99}) {
        p.kv_dtype = kv;
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "kv_dtype " + std::to_string(kv)));
    }
    p = valid_fp8_kv_params();
    p.out_dtype = FLASHCORE_DTYPE_BF16;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "out_dtype 2 is not supported with dtype 1"));
    p.out_dtype = FLASHCORE_DTYPE_FP32;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "out is written in q's type"));
}

TEST(QuantizedKv, HeadDimsAndStridesAreWholeVectorsOfOneByteElements) {
    flashcore_forward_params p = valid_fp8_kv_params();
    // 8 fp16 elements are a vector of q, but half a vector of k.
    p.head_dim = 56;
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 56 is not a multiple of 16"));
    p = valid_fp8_kv_params();
    p.k_seq_stride += 8;  // 8 bytes: not 16-byte aligned
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_MISALIGNED, "k"));
    p = valid_fp8_kv_params();
    p.v = static_cast<const unsigned char *>(p.v) + 8;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_MISALIGNED) << flashcore_last_error_message();
    // A k stride of 16 one-byte elements is aligned (it would not be of 16-bit ones: 32 bytes, also aligned; 24
    // elements is 24 bytes for e4m3).
    p = valid_fp8_kv_params();
    p.k_head_stride = 64 + 16;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// The descale factors' strides have an upper bound as the tensors' do
// (audit item 3 of issue 59).
TEST(QuantizedKv, DescaleStridesHaveAnUpperBound) {
    for (int64_t stride : {int64_t(1) << 62, INT64_MAX}) {
        flashcore_forward_params p = valid_fp8_kv_params();
        p.k_descale_batch_stride = stride;
        EXPECT_TRUE(refused_naming(p, "k_descale_batch_stride (" + std::to_string(stride) +
                                          ") and k_descale_head_stride (1) address more than 2^63 bytes"))
            << stride;
        p = valid_fp8_kv_params();
        p.v_descale_head_stride = stride;
        EXPECT_TRUE(refused_naming(p, "v_descale_batch_stride (2) and v_descale_head_stride (" +
                                          std::to_string(stride) + ") address more than 2^63 bytes"))
            << stride;
    }
}

// An overlap message prints the byte ranges whole: a tensor near the top of
// the address space ends past 2^64, and its end printed in 64 bits came
// out below its start (audit item 3).
TEST(Validation, OverlapMessagePrintsRangesPast2Pow64) {
    flashcore_forward_params p = valid_params();
    void *const top = reinterpret_cast<void *>(uintptr_t(0xFFFFFFFFFFFF0000ull));
    p.q = top;
    p.out = top;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error_message();
    // q: B=2, Hq=8, Sq=100, D=64 fp16 densely packed, 204800 bytes from 0xffffffffffff0000.
    EXPECT_NE(message.find("(bytes 0xffffffffffff0000 to 0x10000000000021fff)"), std::string::npos) << message;
}

TEST(QuantizedKv, DescaleFactorsAreChecked) {
    flashcore_forward_params p = valid_fp8_kv_params();
    p.q_descale = static_cast<const float *>(fake_tensor(7));
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "q_descale is set but q is not quantized (dtype 1)"));
    p = valid_fp8_kv_params();
    p.k_descale_head_stride = -1;
    EXPECT_TRUE(refused_naming(p, "k_descale_batch_stride (2) and k_descale_head_stride (-1) must be >= 0"));
    p = valid_fp8_kv_params();
    p.v_descale = nullptr;
    EXPECT_TRUE(refused_naming(p, "v_descale_batch_stride (2) and v_descale_head_stride (1) are set but v_descale"));
    p = valid_fp8_kv_params();
    p.q_descale_batch_stride = 1;
    EXPECT_TRUE(refused_naming(p, "q_descale_batch_stride (1)"));
    // Descales of 16-bit K/V.
    p = valid_fp8_kv_params();
    p.kv_dtype = 0;
    EXPECT_TRUE(refused_naming(p, "k_descale is set but k and v are not quantized"));
    p.k_descale = nullptr;
    p.k_descale_batch_stride = p.k_descale_head_stride = 0;
    EXPECT_TRUE(refused_naming(p, "v_descale is set but k and v are not quantized"));
    // Alignment of a float array.
    p = valid_fp8_kv_params();
    p.k_descale = reinterpret_cast<const float *>(reinterpret_cast<uintptr_t>(p.k_descale) + 2);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_MISALIGNED, "k_descale"));
}

TEST(QuantizedKv, OutputsMayNotOverlapTheDescaleFactors) {
    flashcore_forward_params p = valid_fp8_kv_params();
    // The last factor read: batch 1, K/V head 1 of a [2][2] array.
    p.v_descale = static_cast<const float *>(p.out);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "v_descale"));
    p = valid_fp8_kv_params();
    p.k_descale = p.lse - 3;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "k_descale"));
    p.k_descale = p.lse - 4;  // ends where lse begins
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// ---------------------------------------------------------------------------
// fp8 queries (fp8 prefill): dtype FLASHCORE_DTYPE_FP8_E4M3, q, k and v e4m3
// with descale factors, out bf16; run by the sm_90a kernels only.
// ---------------------------------------------------------------------------

namespace {

// valid_params with fp8 queries: q, k and v of one-byte elements (the same
// element strides, multiples of 16), kv_dtype and out_dtype left 0 (e4m3
// and bf16), descale factors per (batch, K/V head) for all three.
flashcore_forward_params valid_fp8_q_params() {
    flashcore_forward_params p = valid_fp8_kv_params();
    p.dtype = FLASHCORE_DTYPE_FP8_E4M3;
    p.kv_dtype = 0;
    p.q_descale = static_cast<const float *>(fake_tensor(7));
    p.q_descale_batch_stride = p.num_heads_kv;
    p.q_descale_head_stride = 1;
    return p;
}

// The fp8 kernels' head dims in this build (generated_fp8_head_dims), or
// false where the test cannot read the generated kernel list.
bool fp8_head_dims_of_build(std::vector<HeadDimPair> *pairs) {
#ifdef FLASHCORE_TEST_HAS_KERNEL_LIST
    *pairs = generated_fp8_head_dims();
    return true;
#else
    (void)pairs;
    return false;
#endif
}

// Skips the calling test unless this build has the fp8 prefill kernels
// (elsewhere every fp8 query is refused first for their absence:
// Fp8Queries.RefusedWithoutTheSm90aKernels); *pairs gets their head dims.
#define SKIP_UNLESS_FP8_KERNELS_BUILT(pairs)                                                                   \
    if (!fp8_head_dims_of_build(&(pairs))) GTEST_SKIP() << "the generated kernel list is not on the include path"; \
    if ((pairs).empty())                                                                                       \
    GTEST_SKIP() << "this build has no sm_90a kernels (CMAKE_CUDA_ARCHITECTURES without 90); every fp8 query is " \
                    "refused for that first (Fp8Queries.RefusedWithoutTheSm90aKernels)"

}  // namespace

// The pairs the sm_90a fp8 kernels are built for (kernels/kernels.list):
// (64, 64), (128, 128), (256, 256), those of them that FLASHCORE_HEAD_DIMS
// selects.
TEST(Fp8Queries, KernelsAreThoseOfTheList) {
    std::vector<HeadDimPair> pairs;
    SKIP_UNLESS_FP8_KERNELS_BUILT(pairs);
    for (const HeadDimPair &pair : pairs) {
        EXPECT_TRUE(pair == HeadDimPair(64, 64) || pair == HeadDimPair(128, 128) || pair == HeadDimPair(256, 256))
            << "(" << pair.first << ", " << pair.second << ")";
    }
}

// A build without the sm_90a kernels (CPU-only or sm_80 builds) refuses
// every fp8 query as UNSUPPORTED, naming the kernels and how to get them;
// kv_dtype and out_dtype named as the defaults change nothing.
TEST(Fp8Queries, RefusedWithoutTheSm90aKernels) {
    std::vector<HeadDimPair> pairs;
    if (fp8_head_dims_of_build(&pairs) && !pairs.empty()) {
        GTEST_SKIP() << "this build has the sm_90a fp8 kernels (" << pairs_text(pairs)
                     << "): Fp8Queries.AcceptedWithTheSm90aKernels covers it";
    }
    flashcore_forward_params p = valid_fp8_q_params();
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "run on the sm_90a kernels"));
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "built without them"));
    p.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
    p.out_dtype = FLASHCORE_DTYPE_BF16;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "sm_90a"));
    p.q_descale = p.k_descale = p.v_descale = nullptr;
    p.q_descale_batch_stride = p.q_descale_head_stride = 0;
    p.k_descale_batch_stride = p.k_descale_head_stride = 0;
    p.v_descale_batch_stride = p.v_descale_head_stride = 0;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "sm_90a"));
}

// With the sm_90a kernels: descale factors per (batch, K/V head) either way
// round, per tensor, or none; kv_dtype and out_dtype 0 or named as e4m3 and
// bf16; causal, a window, split-KV, GQA.
TEST(Fp8Queries, AcceptedWithTheSm90aKernels) {
    std::vector<HeadDimPair> pairs;
    SKIP_UNLESS_FP8_KERNELS_BUILT(pairs);
    SKIP_UNLESS_BUILT_FOR(64, 64);
    flashcore_forward_params p = valid_fp8_q_params();
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.q_descale_batch_stride = 1;
    p.q_descale_head_stride = p.batch_size;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.q_descale_batch_stride = p.q_descale_head_stride = 0;
    p.k_descale = nullptr;
    p.k_descale_batch_stride = p.k_descale_head_stride = 0;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    p.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
    p.out_dtype = FLASHCORE_DTYPE_BF16;
    p.causal = 1;
    p.use_window = 1;
    p.window_left = 64;
    p.window_right = 0;
    p.num_splits = 3;
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// What fp8 queries cannot have, refused (before the build's kernels are
// looked at, so in every build) as UNSUPPORTED naming the field: 16-bit K/V,
// an out other than bf16, a softcap.
TEST(Fp8Queries, UnsupportedCombinationsAreNamed) {
    for (int32_t kv : {int32_t(FLASHCORE_DTYPE_FP16), int32_t(FLASHCORE_DTYPE_BF16), int32_t(FLASHCORE_DTYPE_FP32), 99}) {
        flashcore_forward_params p = valid_fp8_q_params();
        p.kv_dtype = kv;
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED,
                                 "kv_dtype " + std::to_string(kv) + " is not supported with fp8 queries"));
    }
    for (int32_t out : {int32_t(FLASHCORE_DTYPE_FP16), int32_t(FLASHCORE_DTYPE_FP8_E4M3), int32_t(FLASHCORE_DTYPE_FP32),
                        -1}) {
        flashcore_forward_params p = valid_fp8_q_params();
        p.out_dtype = out;
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED,
                                 "out_dtype " + std::to_string(out) + " is not supported with fp8 queries"));
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "out is bf16"));
    }
    flashcore_forward_params p = valid_fp8_q_params();
    p.softcap = 30.f;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "softcap (30) is not supported with fp8 queries"));
}

// q_descale is for fp8 queries: with 16-bit ones (an fp8 cache or not) it
// is an INVALID_ARGUMENT naming q's dtype.
TEST(Fp8Queries, QDescaleNeedsFp8Queries) {
    for (int32_t dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
        flashcore_forward_params p = valid_params();
        p.dtype = dtype;
        p.q_descale = static_cast<const float *>(fake_tensor(7));
        const std::string expected = "q_descale is set but q is not quantized (dtype " + std::to_string(dtype) + ")";
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, expected));
        p = valid_fp8_kv_params();
        p.dtype = dtype;
        p.q_descale = static_cast<const float *>(fake_tensor(7));
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, expected));
    }
}

// q_descale's strides follow the rules of k_descale's and v_descale's.
TEST(Fp8Queries, QDescaleStridesAreChecked) {
    std::vector<HeadDimPair> pairs;
    SKIP_UNLESS_FP8_KERNELS_BUILT(pairs);
    SKIP_UNLESS_BUILT_FOR(64, 64);
    flashcore_forward_params p = valid_fp8_q_params();
    p.q_descale_batch_stride = -2;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "q_descale_batch_stride (-2)"));
    p = valid_fp8_q_params();
    p.q_descale = nullptr;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "are set but q_descale is NULL"));
    p = valid_fp8_q_params();
    p.q_descale = reinterpret_cast<const float *>(reinterpret_cast<uintptr_t>(p.q_descale) + 2);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_MISALIGNED, "q_descale"));
    // out on top of q's factors (the last one read: batch 1, K/V head 1).
    p = valid_fp8_q_params();
    p.q_descale = static_cast<const float *>(p.out);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "q_descale"));
}

// The head dims of fp8 queries: multiples of 16 (one-byte elements) that an
// fp8 kernel covers (flashcore.h's rule, over the fp8 kernels' pairs);
// others UNSUPPORTED with the fp8 list. 96 runs on the (128, 128) kernel.
TEST(Fp8Queries, HeadDimsAreThoseTheFp8KernelsCover) {
    std::vector<HeadDimPair> pairs;
    SKIP_UNLESS_FP8_KERNELS_BUILT(pairs);
    const std::string listed = pairs_text(pairs);
    int32_t largest = 0;
    for (const HeadDimPair &pair : pairs) largest = std::max(largest, pair.first);
    for (int32_t head_dim = 8; head_dim <= largest + 32; head_dim += 8) {
        flashcore_forward_params p = valid_fp8_q_params();
        p.head_dim = head_dim;
        ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
        const bool covered_by_fp8 =
            head_dim % 16 == 0 && std::any_of(pairs.begin(), pairs.end(), [&](const HeadDimPair &pair) {
                return pair.first >= head_dim && pair.second >= head_dim;
            });
        if (covered_by_fp8) {
            EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)
                << "head_dim " << head_dim << ": " << flashcore_last_error_message();
        } else {
            EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "supported (head_dim, head_dim_v): " + listed))
                << "head_dim " << head_dim;
        }
    }
    flashcore_forward_params p = valid_fp8_q_params();
    p.head_dim = 40;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED, "head_dim 40 is not a multiple of 16"));
    p.head_dim = largest + 16;
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_UNSUPPORTED,
                             "head_dim " + std::to_string(largest + 16) + " exceeds " + std::to_string(largest)));
}

// Strides and pointers: q's, k's and v's whole 16-byte vectors of one-byte
// elements (a multiple of 8 elements is not enough), out's of bf16 ones
// (8 elements are); out's extent in bf16 elements.
TEST(Fp8Queries, StridesAreWholeVectorsOfTheirElements) {
    std::vector<HeadDimPair> pairs;
    SKIP_UNLESS_FP8_KERNELS_BUILT(pairs);
    SKIP_UNLESS_BUILT_FOR(64, 64);
    const struct {
        const char *tensor;
        void (*mutate)(flashcore_forward_params &p);
    } misaligned[] = {
        {"q", [](flashcore_forward_params &p) { p.q_seq_stride += 8; }},
        {"q", [](flashcore_forward_params &p) { p.q = static_cast<const char *>(p.q) + 8; }},
        {"k", [](flashcore_forward_params &p) { p.k_head_stride += 8; }},
        {"v", [](flashcore_forward_params &p) { p.v_batch_stride += 24; }},
        {"out", [](flashcore_forward_params &p) { p.out_seq_stride += 4; }},
    };
    for (const auto &m : misaligned) {
        flashcore_forward_params p = valid_fp8_q_params();
        m.mutate(p);
        EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_MISALIGNED, m.tensor));
    }
    flashcore_forward_params p = valid_fp8_q_params();
    p.q_batch_stride += 16;
    p.k_batch_stride += 16;
    p.out_batch_stride += 8;  // 16 bytes of bf16
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    // out is bf16: two bytes an element, so an lse placed one element of
    // one-byte out past out's end would overlap it.
    p = valid_fp8_q_params();
    const int64_t out_elements = int64_t(p.batch_size) * p.seqlen_q * p.num_heads_q * p.head_dim;
    p.lse = reinterpret_cast<float *>(static_cast<char *>(p.out) + out_elements);
    EXPECT_TRUE(refused_with(p, FLASHCORE_STATUS_INVALID_ARGUMENT, "lse"));
    p.lse = reinterpret_cast<float *>(static_cast<char *>(p.out) + 2 * out_elements);
    EXPECT_EQ(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
}

// There is no backward pass of fp8 queries: flashcore_backward_check refuses
// dtype FLASHCORE_DTYPE_FP8_E4M3 as UNSUPPORTED, in every build.
TEST(Fp8Queries, BackwardIsRefused) {
    flashcore_backward_params p = valid_backward_params();
    p.dtype = FLASHCORE_DTYPE_FP8_E4M3;
    const flashcore_status status = flashcore_backward_check(&p);
    EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << flashcore_last_error_message();
}

// ---------------------------------------------------------------------------
// Fields added in 0.9: chunked attention (attention_chunk) and learnable
// sinks (sinks; the backward's dsinks, their gradient), in the forward,
// backward and merge structs.
// ---------------------------------------------------------------------------

namespace {

// Whether a call returned `expected`, with a message containing each of
// `parts` (and none when it succeeded).
testing::AssertionResult returned(flashcore_status got, flashcore_status expected,
                                  std::initializer_list<std::string> parts = {}) {
    const std::string message = flashcore_last_error_message();
    bool ok = got == expected && message.empty() == (expected == FLASHCORE_STATUS_SUCCESS);
    for (const std::string &part : parts) ok &= message.find(part) != std::string::npos;
    if (ok) return testing::AssertionSuccess();
    testing::AssertionResult failure = testing::AssertionFailure();
    failure << "status " << int(got) << ", message \"" << message << "\"; expected " << int(expected);
    for (const std::string &part : parts) failure << ", \"" << part << "\"";
    return failure;
}

// `count` floats that end where `tensor` begins (`overlap` floats into it).
template <typename T>
T *floats_before(T *tensor, int32_t count, int32_t overlap = 0) {
    return reinterpret_cast<T *>(reinterpret_cast<uintptr_t>(tensor) - 4 * uintptr_t(count - overlap));
}

// A merge of 4 heads (its sinks are 4 floats) whose tensors are far apart.
flashcore_merge_params merge_of_four_heads() {
    flashcore_merge_params m = valid_merge_params(2, 64);
    m.num_heads = 4;
    return m;
}

}  // namespace

// A 0.8 caller's struct ends after v_descale_head_stride (its sizeof too):
// accepted without chunks or sinks, whatever lies in memory after it
// (0xAB... as attention_chunk and sm_margin are negative, as sinks a
// misaligned pointer), and neither init nor the stride helper writes past
// it; the same bytes inside a 0.9 struct are read, and refused.
TEST(Validation, StructFromVersion0_8) {
    static_assert(kParamsSizeV0_8 % alignof(flashcore_forward_params) == 0, "0.8's end is its sizeof");
    OlderStruct older;
    ASSERT_EQ(older.init(kParamsSizeV0_8), "");
    flashcore_forward_params *p = older.p;
    EXPECT_TRUE(returned(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS));
    ASSERT_EQ(flashcore_set_contiguous_strides(p, FLASHCORE_LAYOUT_BHSD), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    EXPECT_EQ(older.written_past(kParamsSizeV0_8), "") << "by flashcore_set_contiguous_strides";
    p->causal = 1;
    p->num_splits = 3;
    EXPECT_TRUE(returned(flashcore_forward_check(p), FLASHCORE_STATUS_SUCCESS));
    p->struct_size = sizeof(flashcore_forward_params);
    EXPECT_TRUE(refused_naming(*p, "attention_chunk (" + std::to_string(int32_t(0xABABABAB)) + ") must be 0"));
    p->attention_chunk = 0;
    EXPECT_TRUE(refused_naming(*p, "sm_margin (" + std::to_string(int32_t(0xABABABAB)) + ") must be >= 0"));
    p->sm_margin = 0;
    EXPECT_TRUE(refused_with(*p, FLASHCORE_STATUS_MISALIGNED, "sinks ("));
}

// The 0.9 fields of a newer header's (larger) struct are read as ours, not
// taken for fields this library does not know.
TEST(Validation, StructFromNewerHeaderReadsChunksAndSinks) {
    struct Newer {
        flashcore_forward_params base;
        int64_t future_field;
    } newer{};
    newer.base = valid_params();
    newer.base.struct_size = sizeof newer;
    newer.base.attention_chunk = 64;
    newer.base.sinks = static_cast<const float *>(fake_tensor(9));
    EXPECT_TRUE(returned(flashcore_forward_check(&newer.base), FLASHCORE_STATUS_SUCCESS));
    newer.base.attention_chunk = -64;
    EXPECT_TRUE(refused_naming(newer.base, "attention_chunk (-64)"));
    newer.base.attention_chunk = 64;
    newer.base.sinks = floats_before(static_cast<const float *>(newer.base.out), newer.base.num_heads_q, 1);
    EXPECT_TRUE(refused_with(newer.base, FLASHCORE_STATUS_INVALID_ARGUMENT, ") overlaps out (bytes 0x"));
}

// Any chunk length > 0 (one key, fewer keys than a tile, Llama 4's 8192,
// INT32_MAX), with causal, a window and GQA, forward and backward; 0 is off.
TEST(AttentionChunk, AnyLengthAbove0IsAccepted) {
    for (int32_t chunk : {0, 1, 7, 64, 8192, INT32_MAX}) {
        for (int32_t causal : {0, 1}) {
            flashcore_forward_params p = valid_params();
            p.attention_chunk = chunk;
            p.causal = causal;
            EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)) << chunk;
            p.use_window = 1;
            p.window_left = 100;
            p.window_right = causal ? 0 : 5;
            EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)) << chunk;
            flashcore_backward_params b = valid_backward_params();
            b.attention_chunk = chunk;
            b.causal = causal;
            EXPECT_TRUE(backward_accepted(b)) << chunk;
        }
    }
}

// A negative chunk length is refused by the forward and the backward check,
// with the message flashcore.h's rule gives; in empty calls too, as the
// window's bounds are (it is no pointer or stride).
TEST(AttentionChunk, NegativeIsRefusedInEveryCall) {
    for (int32_t chunk : {-1, -8192, INT32_MIN}) {
        const std::string message = "attention_chunk (" + std::to_string(chunk) +
                                    ") must be 0 (no chunks) or the chunk length in keys (> 0)";
        for (bool empty : {false, true}) {
            flashcore_forward_params p = valid_params();
            p.attention_chunk = chunk;
            if (empty) p.batch_size = 0, p.q = p.k = p.v = p.out = nullptr;
            EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT, {message}));
            EXPECT_STREQ(flashcore_last_error_message(), message.c_str());
            flashcore_backward_params b = valid_backward_params();
            b.attention_chunk = chunk;
            if (empty) b.num_heads_q = 0, b.q = b.dq = nullptr;
            EXPECT_TRUE(returned(flashcore_backward_check(&b), FLASHCORE_STATUS_INVALID_ARGUMENT, {message}));
            EXPECT_STREQ(flashcore_last_error_message(), message.c_str());
        }
    }
}

// sinks: any 4-byte aligned array of num_heads_q floats (num_heads for the
// merge) that overlaps nothing the call writes; an input, it may share the
// other inputs' memory, and end where an output begins.
TEST(Sinks, AlignedArraysApartFromTheOutputsAreAccepted) {
    flashcore_forward_params p = valid_params();
    flashcore_backward_params b = valid_backward_params();
    flashcore_merge_params m = merge_of_four_heads();
    const float *apart = static_cast<const float *>(fake_tensor(11));
    for (const float *sinks : {apart, apart + 1, apart + 3, static_cast<const float *>(p.q),
                               floats_before(static_cast<const float *>(p.out), p.num_heads_q)}) {
        p.sinks = sinks;
        EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)) << sinks;
    }
    for (const float *sinks : {apart, apart + 1, b.lse, static_cast<const float *>(b.dout),
                               floats_before(static_cast<const float *>(b.dq), b.num_heads_q)}) {
        b.sinks = sinks;
        EXPECT_TRUE(backward_accepted(b)) << sinks;
        b.dsinks = static_cast<float *>(fake_tensor(12));
        EXPECT_TRUE(backward_accepted(b)) << sinks;
        b.dsinks = nullptr;
    }
    for (const float *sinks : {apart, apart + 1, m.partial_lse, static_cast<const float *>(m.partial_out),
                               floats_before(static_cast<const float *>(m.out), m.num_heads)}) {
        m.sinks = sinks;
        EXPECT_TRUE(returned(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS)) << sinks;
    }
}

// check_pointer's rule for a float array: MISALIGNED, naming it.
TEST(Sinks, MisalignedIsRefused) {
    for (uintptr_t off : {1, 2, 3, 6}) {
        const float *sinks = reinterpret_cast<const float *>(reinterpret_cast<uintptr_t>(fake_tensor(11)) + off);
        flashcore_forward_params p = valid_params();
        p.sinks = sinks;
        EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_MISALIGNED, {"must be 4-byte aligned"}));
        EXPECT_EQ(std::string(flashcore_last_error_message()).find("sinks ("), 0u) << flashcore_last_error_message();
        flashcore_backward_params b = valid_backward_params();
        b.sinks = sinks;
        EXPECT_TRUE(returned(flashcore_backward_check(&b), FLASHCORE_STATUS_MISALIGNED, {"must be 4-byte aligned"}));
        EXPECT_EQ(std::string(flashcore_last_error_message()).find("sinks ("), 0u) << flashcore_last_error_message();
        b.sinks = static_cast<const float *>(fake_tensor(11));
        b.dsinks = reinterpret_cast<float *>(reinterpret_cast<uintptr_t>(fake_tensor(12)) + off);
        EXPECT_TRUE(returned(flashcore_backward_check(&b), FLASHCORE_STATUS_MISALIGNED, {"must be 4-byte aligned"}));
        EXPECT_EQ(std::string(flashcore_last_error_message()).find("dsinks ("), 0u) << flashcore_last_error_message();
        flashcore_merge_params m = merge_of_four_heads();
        m.sinks = sinks;
        EXPECT_TRUE(returned(flashcore_merge_check(&m), FLASHCORE_STATUS_MISALIGNED, {"must be 4-byte aligned"}));
        EXPECT_EQ(std::string(flashcore_last_error_message()).find("sinks ("), 0u) << flashcore_last_error_message();
    }
}

// What a call writes must not overlap the sinks it reads: their last float
// the first of out, or one inside lse, is refused naming both (the range is
// num_heads_q floats, num_heads for the merge), and listing sinks among
// what the call reads.
TEST(Sinks, OverlappingWhatTheCallWritesIsRefused) {
    flashcore_forward_params p = valid_params();
    p.sinks = floats_before(static_cast<const float *>(p.out), p.num_heads_q, 1);
    EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"sinks (bytes 0x", ") overlaps out (bytes 0x", "what it reads (q, k, v, sinks)"}));
    p.sinks = p.lse + 5;
    EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"sinks (bytes 0x", ") overlaps lse (bytes 0x"}));

    flashcore_backward_params b = valid_backward_params();
    for (void *written : {b.dq, b.dk, b.dv}) {
        b.sinks = floats_before(static_cast<const float *>(written), b.num_heads_q, 1);
        EXPECT_TRUE(returned(flashcore_backward_check(&b), FLASHCORE_STATUS_INVALID_ARGUMENT,
                             {"sinks (bytes 0x", ") overlaps d"}));
    }

    flashcore_merge_params m = merge_of_four_heads();
    m.sinks = floats_before(static_cast<const float *>(m.out), m.num_heads, 1);
    EXPECT_TRUE(returned(flashcore_merge_check(&m), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"sinks (bytes 0x", ") overlaps out (bytes 0x", "sinks)"}));
    m.sinks = m.lse + 1;
    EXPECT_TRUE(returned(flashcore_merge_check(&m), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"sinks (bytes 0x", ") overlaps lse (bytes 0x"}));
}

// dsinks is the gradient of the sinks the forward took: without them it is
// refused, with the message that says so.
TEST(Dsinks, NeedSinks) {
    flashcore_backward_params b = valid_backward_params();
    b.dsinks = static_cast<float *>(fake_tensor(12));
    EXPECT_TRUE(returned(flashcore_backward_check(&b), FLASHCORE_STATUS_INVALID_ARGUMENT));
    EXPECT_STREQ(flashcore_last_error_message(),
                 "dsinks is set but sinks is NULL: dsinks is the gradient of the sinks the forward call took (pass "
                 "them, or dsinks NULL)");
    b.sinks = static_cast<const float *>(fake_tensor(11));
    EXPECT_TRUE(backward_accepted(b));
}

// dsinks is written, as dq, dk and dv are: its num_heads_q floats must not
// overlap them, nor any input (sinks, lse, q, ...); adjacent is fine. The
// message names both.
TEST(Dsinks, MustNotOverlapAnythingElse) {
    flashcore_backward_params b = valid_backward_params();
    b.sinks = static_cast<const float *>(fake_tensor(11));
    const struct {
        const char *name;
        const void *tensor;
    } others[] = {{"dq", b.dq}, {"dk", b.dk}, {"dv", b.dv}, {"sinks", b.sinks},
                  {"lse", b.lse}, {"q", b.q},   {"dout", b.dout}};
    for (const auto &other : others) {
        flashcore_backward_params c = b;
        c.dsinks = floats_before(static_cast<float *>(const_cast<void *>(other.tensor)), c.num_heads_q);
        EXPECT_TRUE(backward_accepted(c)) << "dsinks ending where " << other.name << " begins";
        c.dsinks = floats_before(static_cast<float *>(const_cast<void *>(other.tensor)), c.num_heads_q, 1);
        EXPECT_TRUE(returned(flashcore_backward_check(&c), FLASHCORE_STATUS_INVALID_ARGUMENT,
                             {"dsinks (bytes 0x", ") overlaps " + std::string(other.name) + " (bytes 0x",
                              "what the call writes (dq, dk, dv, dsinks)"}))
            << other.name;
    }
}

// A backward call without query rows (seqlen_q 0) is not empty: it writes
// dk, dv and dsinks (no row adds to it), so sinks and dsinks are checked.
TEST(Dsinks, CheckedInCallsWithoutQueryRows) {
    flashcore_backward_params b = valid_backward_params();
    b.seqlen_q = 0;
    b.q = b.out = b.dout = b.dq = nullptr;
    b.lse = nullptr;
    b.sinks = static_cast<const float *>(fake_tensor(11));
    b.dsinks = static_cast<float *>(fake_tensor(12));
    EXPECT_TRUE(backward_accepted(b));
    flashcore_backward_params c = b;
    c.sinks = nullptr;
    EXPECT_TRUE(returned(flashcore_backward_check(&c), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"dsinks is set but sinks is NULL"}));
    c = b;
    c.dsinks = static_cast<float *>(b.dk);
    EXPECT_TRUE(returned(flashcore_backward_check(&c), FLASHCORE_STATUS_INVALID_ARGUMENT,
                         {"dsinks (bytes 0x", ") overlaps dk (bytes 0x"}));
    c = b;
    c.sinks = offset(b.sinks, 2);
    EXPECT_TRUE(returned(flashcore_backward_check(&c), FLASHCORE_STATUS_MISALIGNED, {"sinks ("}));
}

// Empty calls read nothing, and their pointers are not looked at: sinks
// and dsinks that would be refused in any other call (misaligned, on top
// of an output, dsinks without sinks) are not.
TEST(Sinks, EmptyCallsDoNotLookAtThem) {
    const float *misaligned = reinterpret_cast<const float *>(uintptr_t(3));
    const std::function<void(flashcore_forward_params &)> forward_empties[] = {
        [](flashcore_forward_params &p) { p.batch_size = 0; },
        [](flashcore_forward_params &p) { p.seqlen_q = 0; },
        [](flashcore_forward_params &p) { p.num_heads_q = p.num_heads_kv = 0; },
    };
    for (const auto &empty : forward_empties) {
        flashcore_forward_params p = valid_params();
        empty(p);
        for (const float *sinks : {misaligned, static_cast<const float *>(p.out), static_cast<const float *>(p.lse)}) {
            p.sinks = sinks;
            EXPECT_TRUE(returned(flashcore_forward_check(&p), FLASHCORE_STATUS_SUCCESS)) << sinks;
        }
    }
    const std::function<void(flashcore_backward_params &)> backward_empties[] = {
        [](flashcore_backward_params &b) { b.batch_size = 0; },
        [](flashcore_backward_params &b) { b.num_heads_q = b.num_heads_kv = 0; },
    };
    for (const auto &empty : backward_empties) {
        flashcore_backward_params b = valid_backward_params();
        empty(b);
        b.dsinks = const_cast<float *>(misaligned);  // without sinks, misaligned
        EXPECT_TRUE(backward_accepted(b));
        b.sinks = misaligned;
        b.dsinks = static_cast<float *>(b.dq);
        EXPECT_TRUE(backward_accepted(b));
    }
    const std::function<void(flashcore_merge_params &)> merge_empties[] = {
        [](flashcore_merge_params &m) { m.batch_size = 0; },
        [](flashcore_merge_params &m) { m.num_heads = 0; },
        [](flashcore_merge_params &m) { m.seqlen = 0; },
    };
    for (const auto &empty : merge_empties) {
        flashcore_merge_params m = merge_of_four_heads();
        empty(m);
        for (const float *sinks : {misaligned, static_cast<const float *>(m.out)}) {
            m.sinks = sinks;
            EXPECT_TRUE(returned(flashcore_merge_check(&m), FLASHCORE_STATUS_SUCCESS)) << sinks;
        }
    }
}
