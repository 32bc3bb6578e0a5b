// Races and stray writes under pressure, after FlashAttention's race tests:
// large grids (many CTAs per SM, persistent CTAs walking many blocks, split
// calls), device memory nearly full so that the test's buffers have
// neighbours, and each call repeated: every repetition must give the same
// bits, and nothing outside the caller's buffers (guard bands, strided
// padding, the workspace's bands) may change. Run alone (RUN_SERIAL, and last
// in tests/run_gpu_suite.sh): it takes most of the device's memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "forward_workload.h"
#include "test_skip.h"

using namespace flashcore_test;

namespace {

// Calls per case: a race that shows one time in a few dozen still fails.
constexpr int kRepetitions = 20;
// Repetitions between full checks of the buffers' guard bands and padding
// (host copies of every tensor: the slow part of the test).
constexpr int kRepetitionsPerCheck = 5;
// Free memory left after the ballast: the test's own buffers, the library's
// workspace and the CUDA context's growth.
constexpr size_t kHeadroomBytes = size_t(3) << 30;

// Takes all but kHeadroomBytes of the device's free memory while it lives.
class Ballast {
   public:
    Ballast() {
        size_t free_bytes = 0, total_bytes = 0;
        FC_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
        if (free_bytes > kHeadroomBytes) {
            bytes_ = free_bytes - kHeadroomBytes;
            if (cudaMalloc(&data_, bytes_) != cudaSuccess) {
                (void)cudaGetLastError();
                data_ = nullptr;
                bytes_ = 0;
            }
        }
        std::printf("[ ballast ] %.1f of %.1f GiB taken\n", double(bytes_) / (1 << 30),
                    double(total_bytes) / (1 << 30));
    }
    ~Ballast() {
        if (data_ != nullptr) cudaFree(data_);
    }
    Ballast(const Ballast &) = delete;
    Ballast &operator=(const Ballast &) = delete;

   private:
    void *data_ = nullptr;
    size_t bytes_ = 0;
};

class RaceTest : public testing::TestWithParam<FwdCase> {};

TEST_P(RaceTest, RepeatedCallsAreBitwiseIdenticalAndStayInBounds) {
    FC_REQUIRE_GPU();
    const FwdCase c = GetParam();
    const Ballast ballast;
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    Workload w(c, rng);
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const std::vector<uint16_t> first = w.out_bits();
    const std::vector<float> first_lse = w.lse_host();
    ASSERT_EQ(w.check_untouched(), "") << "seed " << seed;
    for (int rep = 1; rep < kRepetitions; ++rep) {
        w.poison_outputs();
        ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        ASSERT_TRUE(w.out_bits() == first) << "repetition " << rep << " differs from the first (seed " << seed << ")";
        const std::vector<float> lse = w.lse_host();
        ASSERT_EQ(std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)), 0)
            << "repetition " << rep << ": lse differs from the first";
        // The guard bands keep their bytes across repetitions, so any
        // repetition's stray write shows at the next check; the padding of
        // out is poisoned again each time, so only the checked one counts.
        if (rep % kRepetitionsPerCheck == 0 || rep == kRepetitions - 1) {
            ASSERT_EQ(w.check_untouched(), "") << "repetition " << rep << " (seed " << seed << ")";
        }
    }
}

std::vector<FwdCase> race_cases() {
    const flashcore_dtype fp16 = FLASHCORE_DTYPE_FP16, bf16 = FLASHCORE_DTYPE_BF16;
    return {
        // Large grids: many CTAs per SM (portable) or persistent CTAs that
        // walk many blocks and pair causal ones (sm_90a), ragged lengths.
        {fp16, 64, false, 16, 16, 16, 1000, 1000, Layout::kBSHD},
        {bf16, 128, true, 8, 32, 8, 1537, 2049, Layout::kBHSD},
        {fp16, 192, true, 4, 16, 4, 777, 1201, Layout::kPadded, 128},
        {bf16, 256, false, 2, 16, 16, 513, 700, Layout::kPadded},
        // Split-KV: decode with GQA packing and chunked prefill, forced to
        // many parts, so the merge kernel runs on a full grid.
        {bf16, 128, false, 64, 32, 8, 1, 4097, Layout::kBHSD, 0, 16},
        {fp16, 64, true, 2, 16, 4, 300, 5000, Layout::kBSHD, 0, 8},
    };
}

std::string race_case_name(const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Race, RaceTest, testing::ValuesIn(race_cases()), race_case_name);

}  // namespace
