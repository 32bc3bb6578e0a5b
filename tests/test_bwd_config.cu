// The portable backward kernel's configurations per shared-memory limit
// (kernels/bwd/sm80/config.cuh: BwdConfig's BwdTiers), on the host (no GPU
// needed), for every backward kernel of this build (the generated
// bwd_kernels.inc, which the registry is made of), through the function
// whose address the registry holds (bwd_info_sm80) and the chooser that
// function and the launch share (BwdTiers::index_for):
// - every head dims up to 256 has a configuration within sm_86's and
//   sm_89's 99 KiB per block (past 256 none, which the dispatcher refuses
//   there);
// - for limits from below the smallest configuration to above an H100's,
//   the one chosen fits the limit and is the largest that does (where none
//   does, the smallest, which the dispatcher then refuses), and a larger
//   limit never chooses a smaller one;
// - the configurations of the A100 and H100 limits are those the kernels
//   had before the 99 KiB ones were added.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bwd/sm80/config.cuh"
#include "bwd/sm80/launch.cuh"

namespace {

using flashcore::BwdKernelInfo;
using flashcore::DType;

// The shared memory an sm_86 / sm_89 (99 KiB), an A100 (163 KiB) and an
// H100 (227 KiB) let a block opt in to.
constexpr size_t kSm86Limit = 101376;
constexpr size_t kA100Limit = 166912;
constexpr size_t kH100Limit = 232448;

// One backward kernel of the build: its configurations, and its registry
// entry's info function.
struct KernelConfigs {
    DType input;
    int head_dim;
    int head_dim_v;
    std::vector<BwdKernelInfo> tiers;  // BwdTiers' order: most shared memory first
    int (*index_for)(size_t);
    BwdKernelInfo (*info)(size_t);

    std::string name() const {
        return std::string(input == DType::kFp16 ? "fp16" : "bf16") + " d" + std::to_string(head_dim) + "x" +
               std::to_string(head_dim_v);
    }
};

template <typename Tiers>
std::vector<BwdKernelInfo> tier_infos() {
    std::vector<BwdKernelInfo> infos;
    for (int i = 0; i < Tiers::kCount; ++i) {
        infos.push_back({Tiers::kSmemBytes[i], Tiers::kBlockM[i], Tiers::kBlockN[i]});
    }
    return infos;
}

template <DType kInput, DType kOutput, int kHeadDim, int kHeadDimV, flashcore::BwdVariant kTile>
KernelConfigs kernel_configs() {
    using Tiers = typename flashcore::BwdConfig<kInput, kHeadDim, kHeadDimV, kTile>::Tiers;
    return {kInput,
            kHeadDim,
            kHeadDimV,
            tier_infos<Tiers>(),
            &Tiers::index_for,
            &flashcore::bwd_info_sm80<kInput, kOutput, kHeadDim, kHeadDimV, kTile>};
}

// The build's sm80 backward kernels (sm90 lines have one configuration).
#define FLASHCORE_BWD_CONFIGS_sm80(input, output, head_dim, head_dim_v, tile)                                      \
    kernel_configs<DType::input, DType::output, head_dim, head_dim_v, flashcore::BwdVariant::tile>(),
#define FLASHCORE_BWD_CONFIGS_sm90(input, output, head_dim, head_dim_v, tile)
#define FLASHCORE_KERNEL(path, input, kv, output, head_dim, head_dim_v, tile) \
    FLASHCORE_BWD_CONFIGS_##path(input, output, head_dim, head_dim_v, tile)
std::vector<KernelConfigs> build_kernels() {
    return {
#include "bwd_kernels.inc"
    };
}
#undef FLASHCORE_KERNEL
#undef FLASHCORE_BWD_CONFIGS_sm90
#undef FLASHCORE_BWD_CONFIGS_sm80

bool operator==(const BwdKernelInfo &a, const BwdKernelInfo &b) {
    return a.smem_bytes == b.smem_bytes && a.block_m == b.block_m && a.block_n == b.block_n;
}

std::string describe(const BwdKernelInfo &i) {
    return std::to_string(i.smem_bytes) + " bytes, " + std::to_string(i.block_m) + " x " + std::to_string(i.block_n);
}

TEST(BwdConfig, BuildHasBackwardKernels) { EXPECT_FALSE(build_kernels().empty()); }

// The largest head dim whose backward runs on sm_86 and sm_89.
constexpr int kMaxSm86HeadDim = 256;

TEST(BwdConfig, EveryHeadDimUpTo256FitsSm86SharedMemory) {
    static_assert(flashcore::kMinSmemPerBlock == kSm86Limit, "kMinSmemPerBlock is sm_86's limit");
    for (const KernelConfigs &k : build_kernels()) {
        SCOPED_TRACE(k.name());
        ASSERT_FALSE(k.tiers.empty());
        const BwdKernelInfo info = k.info(kSm86Limit);
        if (k.head_dim > kMaxSm86HeadDim) {
            // Chosen all the same (the smallest), for check_kernel_smem to refuse.
            EXPECT_GT(info.smem_bytes, kSm86Limit) << describe(info);
            EXPECT_TRUE(info == k.tiers.back()) << describe(info);
            continue;
        }
        EXPECT_LE(info.smem_bytes, kSm86Limit) << describe(info);
        EXPECT_LE(k.tiers.back().smem_bytes, kSm86Limit) << describe(k.tiers.back());
    }
}

TEST(BwdConfig, ChosenConfigurationIsTheLargestThatFits) {
    std::vector<size_t> limits = {0,          1,          48 * 1024,  64 * 1024, 69887,         69888,
                                  80 * 1024,  kSm86Limit - 1, kSm86Limit, kSm86Limit + 1, 128 * 1024, 147967,
                                  147968,     150 * 1024, kA100Limit - 1, kA100Limit, kA100Limit + 1, 200 * 1024,
                                  214015,     214016,     kH100Limit - 1, kH100Limit, 256 * 1024, SIZE_MAX};
    const std::vector<KernelConfigs> kernels = build_kernels();
    for (const KernelConfigs &k : kernels) {
        for (const BwdKernelInfo &t : k.tiers) {
            limits.push_back(t.smem_bytes - 1);
            limits.push_back(t.smem_bytes);
            limits.push_back(t.smem_bytes + 1);
        }
    }
    for (const KernelConfigs &k : kernels) {
        SCOPED_TRACE(k.name());
        for (size_t i = 1; i < k.tiers.size(); ++i) {
            EXPECT_LT(k.tiers[i].smem_bytes, k.tiers[i - 1].smem_bytes) << "tiers not by decreasing shared memory";
        }
        std::vector<size_t> sorted = limits;
        std::sort(sorted.begin(), sorted.end());
        size_t previous_smem = 0;  // chosen at the largest limit so far that any fits
        for (const size_t limit : sorted) {
            SCOPED_TRACE("limit " + std::to_string(limit));
            const int index = k.index_for(limit);
            ASSERT_GE(index, 0);
            ASSERT_LT(index, int(k.tiers.size()));
            const BwdKernelInfo info = k.info(limit);
            // What the dispatcher checks is what the launch runs.
            EXPECT_TRUE(info == k.tiers[size_t(index)]) << describe(info);
            size_t largest_fitting = 0;
            for (const BwdKernelInfo &t : k.tiers) {
                if (t.smem_bytes <= limit) largest_fitting = std::max(largest_fitting, t.smem_bytes);
            }
            if (largest_fitting == 0) {
                // None fits (or the limit is unknown: 0): the smallest,
                // which the dispatcher's check_kernel_smem refuses.
                EXPECT_EQ(index, int(k.tiers.size()) - 1);
                EXPECT_GT(info.smem_bytes, limit);
                continue;
            }
            EXPECT_LE(info.smem_bytes, limit) << describe(info);
            EXPECT_EQ(info.smem_bytes, largest_fitting) << describe(info);
            EXPECT_GE(info.smem_bytes, previous_smem) << "a larger limit chose a smaller configuration";
            previous_smem = info.smem_bytes;
        }
    }
}

// The configurations per GPU, as kernels.list's head dims have them: the
// A100's and H100's are those before the 99 KiB configurations existed
// (their machine code unchanged); sm_86's the smaller tiles (config.cuh).
// Head dim 512 came later, with 32-key blocks.
TEST(BwdConfig, KnownGpusRunTheExpectedConfigurations) {
    struct Expected {
        int head_dim, head_dim_v;
        BwdKernelInfo h100, a100, sm86;
    };
    const Expected expected[] = {
        {32, 32, {116736, 128, 128}, {116736, 128, 128}, {66560, 64, 128}},
        {64, 64, {165888, 128, 128}, {165888, 128, 128}, {99328, 64, 128}},
        {96, 96, {91136, 64, 64}, {91136, 64, 64}, {91136, 64, 64}},
        {128, 128, {164864, 64, 128}, {164864, 64, 128}, {82432, 64, 64}},
        {192, 128, {140288, 64, 64}, {140288, 64, 64}, {98816, 64, 64}},
        {256, 256, {214016, 64, 64}, {147968, 64, 64}, {69888, 32, 32}},
        // sm_86: none fits; the A100's, which the dispatcher refuses.
        {512, 512, {205312, 64, 32}, {135424, 32, 32}, {135424, 32, 32}},
    };
    int checked = 0;
    for (const KernelConfigs &k : build_kernels()) {
        for (const Expected &e : expected) {
            if (k.head_dim != e.head_dim || k.head_dim_v != e.head_dim_v) continue;
            SCOPED_TRACE(k.name());
            ++checked;
            EXPECT_TRUE(k.info(kH100Limit) == e.h100) << describe(k.info(kH100Limit));
            EXPECT_TRUE(k.info(kA100Limit) == e.a100) << describe(k.info(kA100Limit));
            EXPECT_TRUE(k.info(kSm86Limit) == e.sm86) << describe(k.info(kSm86Limit));
        }
    }
    std::printf("[ info   ] %d kernels of this build checked against the table\n", checked);
}

}  // namespace
