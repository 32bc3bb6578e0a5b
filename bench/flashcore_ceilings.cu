// flashcore_ceilings: the hardware limits flashcore's kernels are judged
// against, measured on the GPU at hand rather than taken from a data sheet
// (boost clocks, power limits and ECC make the sheet optimistic).
//
//   mma.sync     m16n8k16 fp16 and bf16 inputs, fp32 accumulators: the
//                tensor-core instruction of the portable (sm_80+) kernel.
//                Its peak bounds that kernel's TFLOP/s on every GPU.
//   DRAM read    streaming 16-byte loads over a buffer far larger than L2.
//   L2 read      the same loads, repeated over a buffer that fits in L2:
//                what small problems, whose K/V stay in L2, are bound by.
//
// Each figure is the median of several timed launches (CUDA events) after a
// warm-up launch. Usage: flashcore_ceilings [--json]
// Exit status: 0 ok, 1 a CUDA call failed, 2 no usable GPU, 3 bad command line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitNoGpu = 2;
constexpr int kExitUsage = 3;

constexpr int kTimedLaunches = 9;

// mma.sync: each warp keeps this many independent accumulators so the
// tensor pipe always has work while one MMA's result is pending.
constexpr int kMmaChains = 8;
constexpr int kMmaIterations = 4096;
constexpr int kMmaThreadsPerCta = 256;
constexpr int kMmaCtasPerSm = 4;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;

// Memory: 16-byte loads, a grid that fills every SM several times over.
constexpr size_t kDramBytes = size_t(4) << 30;  // far beyond any L2
constexpr size_t kL2Bytes = size_t(16) << 20;   // fits the L2 of every sm_80+ part
constexpr int kL2Passes = 64;
constexpr int kMemThreadsPerCta = 512;
constexpr int kMemCtasPerSm = 4;

struct CudaError {
    std::string what;
};

void check(cudaError_t status, const char *call) {
    if (status != cudaSuccess) throw CudaError{std::string(call) + ": " + cudaGetErrorString(status)};
}
#define CHECK_CUDA(call) check((call), #call)

template <bool kBf16>
__global__ void mma_throughput_kernel(float *sink, int iterations) {
    // Operands vary by lane so no two MMAs are provably equal; their values
    // do not matter to the timing.
    const uint32_t seed = threadIdx.x * 0x9e3779b9u;
    uint32_t a[4] = {seed, seed ^ 1u, seed ^ 2u, seed ^ 3u};
    uint32_t b[2] = {seed ^ 4u, seed ^ 5u};
    float acc[kMmaChains][4] = {};
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int c = 0; c < kMmaChains; ++c) {
            if constexpr (kBf16) {
                asm volatile(
                    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                    "{%0,%1,%2,%3};\n"
                    : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
            } else {
                asm volatile(
                    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                    "{%0,%1,%2,%3};\n"
                    : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
            }
        }
    }
    float total = 0.f;
#pragma unroll
    for (int c = 0; c < kMmaChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    // Keeps the MMAs alive; a real store would almost never happen.
    if (total == 1234.5f) sink[threadIdx.x] = total;
}

// Each thread reads 16-byte vectors at a grid stride, `passes` times over
// the buffer, and folds them into one word that is stored only if it takes
// an unlikely value (so the loads cannot be removed, and nothing is written).
__global__ void read_bandwidth_kernel(const uint4 *buffer, size_t vectors, int passes, uint32_t *sink) {
    uint32_t fold = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (int pass = 0; pass < passes; ++pass) {
        for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
            const uint4 v = __ldcg(buffer + i);  // L2 only: the L1 must not serve repeats
            fold ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (fold == 0x9e3779b9u) sink[0] = fold;
}

__global__ void fill_kernel(uint4 *buffer, size_t vectors) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
        const uint32_t x = uint32_t(i) * 2654435761u;
        buffer[i] = make_uint4(x, x + 1, x + 2, x + 3);
    }
}

// Median milliseconds of kTimedLaunches runs of `launch`, after one warm-up.
template <typename Launch>
double median_ms(Launch &&launch) {
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    launch();
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> times;
    for (int i = 0; i < kTimedLaunches; ++i) {
        CHECK_CUDA(cudaEventRecord(start));
        launch();
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaEventRecord(stop));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0.f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

struct Ceiling {
    const char *name;
    double value;
    const char *unit;
};

template <bool kBf16>
Ceiling measure_mma(int num_sms, float *sink) {
    const int ctas = num_sms * kMmaCtasPerSm;
    const double ms = median_ms(
        [&] { mma_throughput_kernel<kBf16><<<ctas, kMmaThreadsPerCta>>>(sink, kMmaIterations); });
    const double mmas = double(ctas) * (kMmaThreadsPerCta / 32) * kMmaIterations * kMmaChains;
    return {kBf16 ? "mma.sync bf16->fp32" : "mma.sync fp16->fp32", mmas * kFlopsPerMma / (ms * 1e-3) * 1e-12,
            "TFLOP/s"};
}

Ceiling measure_read(const char *name, const uint4 *buffer, size_t bytes, int passes, int num_sms, uint32_t *sink) {
    const size_t vectors = bytes / sizeof(uint4);
    const int ctas = num_sms * kMemCtasPerSm;
    const double ms =
        median_ms([&] { read_bandwidth_kernel<<<ctas, kMemThreadsPerCta>>>(buffer, vectors, passes, sink); });
    return {name, double(bytes) * passes / (ms * 1e-3) * 1e-9, "GB/s"};
}

int run(bool json) {
    int device = 0;
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDevice(&device));
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8) {
        std::fprintf(stderr, "flashcore_ceilings: %s is sm_%d%d; flashcore needs sm_80 or newer\n", prop.name,
                     prop.major, prop.minor);
        return kExitNoGpu;
    }
    int clock_khz = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));

    float *mma_sink = nullptr;
    uint32_t *read_sink = nullptr;
    uint4 *buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&mma_sink, kMmaThreadsPerCta * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&read_sink, sizeof(uint32_t)));
    CHECK_CUDA(cudaMalloc(&buffer, kDramBytes));
    fill_kernel<<<prop.multiProcessorCount * kMemCtasPerSm, kMemThreadsPerCta>>>(buffer, kDramBytes / sizeof(uint4));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());

    const int sms = prop.multiProcessorCount;
    const std::vector<Ceiling> ceilings = {
        measure_mma<false>(sms, mma_sink),
        measure_mma<true>(sms, mma_sink),
        measure_read("DRAM read", buffer, kDramBytes, 1, sms, read_sink),
        measure_read("L2 read", buffer, kL2Bytes, kL2Passes, sms, read_sink),
    };
    CHECK_CUDA(cudaFree(buffer));
    CHECK_CUDA(cudaFree(read_sink));
    CHECK_CUDA(cudaFree(mma_sink));

    if (json) {
        std::printf("{\"device\": \"%s\", \"sm\": %d%d, \"num_sms\": %d, \"max_clock_mhz\": %d, \"ceilings\": [", prop.name,
                    prop.major, prop.minor, sms, clock_khz / 1000);
        for (size_t i = 0; i < ceilings.size(); ++i) {
            std::printf("%s{\"name\": \"%s\", \"value\": %.1f, \"unit\": \"%s\"}", i ? ", " : "", ceilings[i].name,
                        ceilings[i].value, ceilings[i].unit);
        }
        std::printf("]}\n");
    } else {
        std::printf("%s (sm_%d%d, %d SMs, max clock %d MHz)\n", prop.name, prop.major, prop.minor, sms,
                    clock_khz / 1000);
        for (const Ceiling &c : ceilings) std::printf("  %-22s %9.1f %s\n", c.name, c.value, c.unit);
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
            std::printf("usage: flashcore_ceilings [--json]\n"
                        "Measures mma.sync throughput and DRAM/L2 read bandwidth on the current GPU.\n"
                        "Exit status: 0 ok, 1 a CUDA call failed, 2 no usable GPU, 3 bad command line.\n");
            return 0;
        } else {
            std::fprintf(stderr, "flashcore_ceilings: unknown option '%s' (try --help)\n", argv[i]);
            return kExitUsage;
        }
    }
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        std::fprintf(stderr, "flashcore_ceilings: no usable GPU: %s\n",
                     status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device found");
        return kExitNoGpu;
    }
    try {
        return run(json);
    } catch (const CudaError &e) {
        std::fprintf(stderr, "flashcore_ceilings: %s\n", e.what.c_str());
        return kExitFailure;
    }
}
