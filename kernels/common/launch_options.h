// Launch settings that are not kernel arguments, and how a launcher reports
// a failed runtime call: what every family's launchers take.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flashcore {

// The shared memory per block that every GPU the library supports lets a
// block opt in to: sm_86's and sm_89's (RTX 30xx/40xx, A10, A40, L4, L40S;
// sm_80 and sm_87 allow 163 KiB, sm_90 227 KiB). Each family asserts that
// every call has a kernel configuration within it (fwd/sm80/config.cuh: the
// large tiles and the quantized cache's decode tiles; bwd/sm80/config.cuh:
// every head dim's last configuration), so a kernels.list line that could
// not run there fails to build.
constexpr size_t kMinSmemPerBlock = 99 * 1024;

// Launch settings that are not kernel arguments.
struct LaunchOptions {
    // A persistent kernel launches at most this many CTAs: one per SM, or
    // fewer where a test asks (FLASHCORE_PERSISTENT_CTAS).
    int max_persistent_ctas;
    // Where a launcher names the runtime call that failed (when not null;
    // written only on failure), for the caller's message.
    const char **failed_call = nullptr;
    // Where a persistent kernel's count of K/V tiles starts: 0, or where a
    // test asks (FLASHCORE_TEST_KV_POSITION) to cross 2^32 within one call.
    uint64_t first_kv_position = 0;
    // The device the launch is on (current while it runs): what a kernel's
    // shared-memory opt-in is remembered for (dynamic_smem.cuh). -1: unknown,
    // opted in on every launch.
    int device = -1;
    // The dynamic shared memory a block may opt in to on that device, which
    // picks between configurations of one kernel (the portable backward's:
    // bwd/sm80/config.cuh; the forward's wide sm_90a configuration at head
    // dim 64 runs only where it fits): the handle's limit, which
    // FLASHCORE_TEST_SMEM_PER_BLOCK may lower. 0: unknown, the configuration
    // every supported GPU runs.
    size_t max_smem_per_block = 0;
    // FLASHCORE_TEST_FAIL_OPT_IN (tests only): every shared-memory opt-in
    // fails as the runtime would refuse one (dynamic_smem.cuh), so that a
    // test sees what a call failing there leaves written.
    bool fail_opt_in = false;
};

// A launcher's runtime call `call` returned `err`: on failure, the error is
// cleared from the thread's last-error state (it is reported once, through
// the return value) and the call named in options.failed_call.
inline cudaError_t launch_step(cudaError_t err, const LaunchOptions &options, const char *call) {
    if (err != cudaSuccess) {
        cudaGetLastError();
        if (options.failed_call != nullptr) *options.failed_call = call;
    }
    return err;
}

}  // namespace flashcore
