// Which ways of handing a shared-memory buffer back from its readers to its
// writer compute-sanitizer's racecheck and synccheck both accept
// (docs/log/hopper.md, "Backward on Hopper (issue 37): racecheck and the
// hand-overs"). A reproducer for that table, not part of the build: run it
// on a GPU whenever compute-sanitizer changes, e.g.
//
//   nvcc -std=c++17 -arch=sm_90a -lineinfo -o /tmp/handover tests/tools/racecheck_handover_patterns.cu
//   for release in 0 1 2 3; do for late in 0 1 2; do
//     compute-sanitizer --tool racecheck --racecheck-report all /tmp/handover $release $late
//     compute-sanitizer --tool synccheck /tmp/handover $release $late
//   done; done
//
// Producer warp 0 writes a two-stage buffer each step; four consumer warps
// read it. The acquire (writer -> readers) is a named barrier: the writer
// arrives, the readers sync. The release (readers -> writer), by argv[1]:
//   0  named barrier: readers bar.arrive, writer bar.sync
//   1  mbarrier: every reader thread arrives, the writer waits
//   2  mbarrier: lane 0 of each reader warp arrives after __syncwarp
//   3  bar.sync on both sides, in one __noinline__ function
// argv[2]: 1 the writer comes late (sleeps before each store), 2 the readers
// do, 0 neither. CUDA 13 on an H200 (2026-11-26): 0 reports WAR hazards
// when the readers come last, 2 always, 3 fails synccheck ("divergent
// threads"), 1 is clean in both tools; the kernel's row stats use 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kStages = 2;
constexpr int kSteps = 8;
constexpr int kReaderThreads = 128;
constexpr int kThreads = 32 + kReaderThreads;
constexpr int kFullBarrier = 1;   // + stage
constexpr int kEmptyBarrier = 3;  // + stage
constexpr unsigned kLateNanoseconds = 20000;

__device__ __forceinline__ void bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __noinline__ void bar_sync_one_place(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ uint32_t shared_address(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarrier_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra wait;\n}" ::"r"(
            shared_address(bar)),
        "r"(parity)
        : "memory");
}

__global__ void handover(int release, int late, float *out) {
    __shared__ float buffer[kStages][kReaderThreads];
    __shared__ uint64_t empty[kStages];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) mbarrier_init(&empty[s], release == 1 ? kReaderThreads : kReaderThreads / 32);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    float sum = 0.f;
    if (warp == 0) {
        for (int j = 0; j < kSteps; ++j) {
            const int s = j % kStages;
            if (j >= kStages) {
                if (release == 0) bar_sync(kEmptyBarrier + s, kThreads);
                else if (release == 3) bar_sync_one_place(kEmptyBarrier + s, kThreads);
                else mbarrier_wait(&empty[s], (j / kStages - 1) & 1);
            }
            if (late & 1) __nanosleep(kLateNanoseconds);
            for (int i = lane; i < kReaderThreads; i += 32) buffer[s][i] = float(j + i);
            bar_arrive(kFullBarrier + s, kThreads);
        }
    } else {
        const int reader = threadIdx.x - 32;
        for (int j = 0; j < kSteps; ++j) {
            const int s = j % kStages;
            if (late & 2) __nanosleep(kLateNanoseconds);
            bar_sync(kFullBarrier + s, kThreads);
            sum += buffer[s][reader];
            if (j + kStages < kSteps) {
                if (release == 0) {
                    bar_arrive(kEmptyBarrier + s, kThreads);
                } else if (release == 3) {
                    bar_sync_one_place(kEmptyBarrier + s, kThreads);
                } else if (release == 1) {
                    mbarrier_arrive(&empty[s]);
                } else {
                    __syncwarp();
                    if (lane == 0) mbarrier_arrive(&empty[s]);
                }
            }
        }
    }
    out[threadIdx.x] = sum;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s RELEASE(0..3) LATE(0..2)\n", argv[0]);
        return 2;
    }
    const int release = std::atoi(argv[1]);
    const int late = std::atoi(argv[2]);
    float *out = nullptr;
    if (const cudaError_t status = cudaMalloc(&out, kThreads * sizeof(float)); status != cudaSuccess) {
        std::fprintf(stderr, "cudaMalloc: %s\n", cudaGetErrorString(status));
        return 1;
    }
    handover<<<1, kThreads>>>(release, late, out);
    cudaError_t status = cudaGetLastError();
    if (status == cudaSuccess) status = cudaDeviceSynchronize();
    float host[kThreads];
    if (status == cudaSuccess) status = cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int t = 32; status == cudaSuccess && t < kThreads; ++t) {
        // Reader t - 32 reads j + (t - 32) at steps j = 0 .. kSteps - 1.
        const float expected = float(kSteps * (kSteps - 1) / 2 + kSteps * (t - 32));
        wrong += host[t] != expected;
    }
    std::printf("release %d late %d: %s, %d wrong sums\n", release, late, cudaGetErrorString(status), wrong);
    cudaFree(out);
    return status == cudaSuccess && wrong == 0 ? 0 : 1;
}
