// warp_mma (kernels/sm80/warp_gemm.cuh) on the GPU with an odd count of n8
// tiles, whose last tile is read alone (ldmatrix .x2: load_b_single), and
// with an even count for comparison: one warp multiplies swizzled shared
// tiles of small integers (products and sums exact in fp32) and its
// fragments are compared with the host's product. B is K-major (rows along
// N: the backward's K and V in S = Q K^T, dP = dO V^T, whose 32 x 32 tiles
// give a warp one n8 tile) and MN-major (rows along K, read transposed: an
// odd tile's vector n0 / 8 may be odd), in rows of whole swizzle groups
// (64 elements) and of half groups (32, and 96: a whole group then a half
// one), from column origins that put a lone tile at an odd vector.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"
#include "test_skip.h"

namespace {

using Element = __half;
constexpr int kMTiles = 2;
constexpr int kM = kMTiles * flashcore::kMmaM;

// A: [kM][kK] K-major. B: K-major [kBRows = N][kK], or MN-major
// [kK][kBRowElems = N]. out: the warp's accumulators, [m][n][e] per lane.
template <int kK, int kBRows, int kBRowElems, bool kBKMajor, int kNTiles>
__global__ void warp_mma_kernel(const float *a, const float *b, int n0, float *out) {
    using namespace flashcore;
    __shared__ __align__(128) Element smem_a[kM * kK];
    __shared__ __align__(128) Element smem_b[kBRows * kBRowElems];
    constexpr int kVec = kElemsPerVector<Element>;
    for (int i = threadIdx.x; i < kM * kK; i += kWarpSize) {
        const int row = i / kK, col = i % kK;
        smem_a[swizzled_offset<Element, kK>(row, col / kVec) + col % kVec] = __float2half(a[i]);
    }
    for (int i = threadIdx.x; i < kBRows * kBRowElems; i += kWarpSize) {
        const int row = i / kBRowElems, col = i % kBRowElems;
        smem_b[swizzled_offset<Element, kBRowElems>(row, col / kVec) + col % kVec] = __float2half(b[i]);
    }
    __syncwarp();
    const int lane = threadIdx.x;
    float acc[kMTiles][kNTiles][4];
    zero_fragments(acc);
    warp_mma<Element, kMTiles, kNTiles, kK / kMmaK>(acc, SmemOperand<Element, kK, true>::a_of(smem_a, lane), 0,
                                                    SmemOperand<Element, kBRowElems, kBKMajor>::b_of(smem_b, lane),
                                                    n0);
    for (int m = 0; m < kMTiles; ++m) {
        for (int n = 0; n < kNTiles; ++n) {
            for (int e = 0; e < 4; ++e) out[((m * kNTiles + n) * 4 + e) * kWarpSize + lane] = acc[m][n][e];
        }
    }
}

// Runs one product; "" if every element of the warp's tiles (columns n0 ..
// n0 + 8 kNTiles) is the host's, else the first that is not.
template <int kK, int kN, bool kBKMajor, int kNTiles>
std::string check_product(int n0) {
    constexpr int kBRows = kBKMajor ? kN : kK;
    constexpr int kBRowElems = kBKMajor ? kK : kN;
    std::vector<float> a(kM * kK), b(kBRows * kBRowElems);
    // Small integers: every product and sum is exact in fp16 inputs and fp32 sums.
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(int((i * 7 + 3) % 5) - 2);
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(int((i * 11 + 1) % 7) - 3);
    const auto b_at = [&](int k, int n) { return kBKMajor ? b[n * kK + k] : b[k * kN + n]; };
    const size_t out_floats = size_t(kMTiles) * kNTiles * 4 * flashcore::kWarpSize;
    float *d_a = nullptr, *d_b = nullptr, *d_out = nullptr;
    FC_CHECK_CUDA(cudaMalloc(&d_a, a.size() * sizeof(float)));
    FC_CHECK_CUDA(cudaMalloc(&d_b, b.size() * sizeof(float)));
    FC_CHECK_CUDA(cudaMalloc(&d_out, out_floats * sizeof(float)));
    FC_CHECK_CUDA(cudaMemcpy(d_a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    FC_CHECK_CUDA(cudaMemcpy(d_b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    warp_mma_kernel<kK, kBRows, kBRowElems, kBKMajor, kNTiles><<<1, flashcore::kWarpSize>>>(d_a, d_b, n0, d_out);
    FC_CHECK_CUDA(cudaGetLastError());
    std::vector<float> out(out_floats);
    FC_CHECK_CUDA(cudaMemcpy(out.data(), d_out, out_floats * sizeof(float), cudaMemcpyDeviceToHost));
    FC_CHECK_CUDA(cudaFree(d_a));
    FC_CHECK_CUDA(cudaFree(d_b));
    FC_CHECK_CUDA(cudaFree(d_out));
    for (int lane = 0; lane < flashcore::kWarpSize; ++lane) {
        for (int m = 0; m < kMTiles; ++m) {
            for (int n = 0; n < kNTiles; ++n) {
                for (int e = 0; e < 4; ++e) {
                    // The m16n8 accumulator layout (fragment_layout.cuh).
                    const int row = m * flashcore::kMmaM + lane / 4 + (e / 2) * 8;
                    const int col = n0 + n * flashcore::kMmaN + 2 * (lane % 4) + e % 2;
                    float expected = 0.f;
                    for (int k = 0; k < kK; ++k) expected += a[row * kK + k] * b_at(k, col);
                    const float got = out[((m * kNTiles + n) * 4 + e) * flashcore::kWarpSize + lane];
                    if (got != expected) {
                        char buf[160];
                        std::snprintf(buf, sizeof buf, "row %d column %d: %g, expected %g", row, col, double(got),
                                      double(expected));
                        return buf;
                    }
                }
            }
        }
    }
    return "";
}

TEST(WarpMma, OddTileCountWithKMajorB) {
    FC_REQUIRE_GPU();
    // K = 64: rows of whole swizzle groups; K = 32, 96: half groups.
    EXPECT_EQ((check_product<64, 32, true, 1>(8)), "");
    EXPECT_EQ((check_product<64, 32, true, 1>(24)), "");
    EXPECT_EQ((check_product<64, 32, true, 3>(0)), "");
    EXPECT_EQ((check_product<32, 32, true, 1>(16)), "");
    EXPECT_EQ((check_product<96, 32, true, 3>(8)), "");
    EXPECT_EQ((check_product<64, 32, true, 2>(16)), "");
}

TEST(WarpMma, OddTileCountWithMNMajorB) {
    FC_REQUIRE_GPU();
    // N = 64: rows of whole swizzle groups; N = 32 and 96: half groups (96:
    // vectors 8-11). A lone tile at odd vectors 1, 7, 3, 11; after pairs
    // (which start at even vectors, as load_b takes them) at vectors 2, 4,
    // 10.
    EXPECT_EQ((check_product<32, 64, false, 1>(8)), "");
    EXPECT_EQ((check_product<32, 64, false, 1>(56)), "");
    EXPECT_EQ((check_product<32, 64, false, 3>(0)), "");
    EXPECT_EQ((check_product<32, 64, false, 3>(16)), "");
    EXPECT_EQ((check_product<32, 32, false, 1>(24)), "");
    EXPECT_EQ((check_product<32, 96, false, 1>(88)), "");
    EXPECT_EQ((check_product<32, 96, false, 3>(64)), "");
    EXPECT_EQ((check_product<32, 64, false, 2>(16)), "");
}

}  // namespace
