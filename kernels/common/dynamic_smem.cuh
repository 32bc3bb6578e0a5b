// Launching a kernel whose dynamic shared memory is past the 48 KB default,
// which it must first be opted in to (cudaFuncSetAttribute). That opt-in
// costs a runtime call per launch if made every time, and it lasts as long
// as the context, so it is made once per kernel and device and remembered.
// A context that never saw it (the device was reset, or the caller made
// another context current) fails the launch; launch_opted_in then opts in
// again and retries once.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/launch_options.h"

namespace flashcore {

// Above this, a kernel must opt in to more dynamic shared memory.
constexpr size_t kDefaultDynamicSmemLimit = 48 * 1024;

// The devices a kernel has been opted in on: bit d for device d. Devices
// past the word's bits are never remembered (opted in on every launch).
class DynamicSmemOptIn {
   public:
    static constexpr int kRememberedDevices = 64;

    bool remembered(int device) const {
        return known(device) && (devices_.load(std::memory_order_relaxed) >> device & 1u) != 0;
    }
    void remember(int device) {
        if (known(device)) devices_.fetch_or(uint64_t(1) << device, std::memory_order_relaxed);
    }

   private:
    static bool known(int device) { return device >= 0 && device < kRememberedDevices; }
    std::atomic<uint64_t> devices_{0};
};

// The opt-in itself: cudaFuncSetAttribute of `kernel`'s dynamic shared
// memory on the current device, with launch_step's reporting.
template <typename... KernelArgs>
cudaError_t set_dynamic_smem(void (*kernel)(KernelArgs...), size_t smem_bytes, const LaunchOptions &options) {
    return launch_step(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)),
                       options, "cudaFuncSetAttribute (the kernel's dynamic shared memory)");
}

// Opts `kernel` in to `smem_bytes` of dynamic shared memory on
// options.device, the current device, where that is past the default and
// not remembered (`opt_in`: that kernel's own record). A launcher that
// queues other work first calls it before that work, so that the opt-in
// cannot fail after something was queued.
template <typename... KernelArgs>
cudaError_t ensure_opted_in(DynamicSmemOptIn &opt_in, void (*kernel)(KernelArgs...), size_t smem_bytes,
                            const LaunchOptions &options) {
    if (smem_bytes <= kDefaultDynamicSmemLimit) return cudaSuccess;
    if (options.fail_opt_in) {
        return launch_step(cudaErrorInvalidValue, options,
                           "cudaFuncSetAttribute (the kernel's dynamic shared memory; FLASHCORE_TEST_FAIL_OPT_IN)");
    }
    if (opt_in.remembered(options.device)) return cudaSuccess;
    const cudaError_t err = set_dynamic_smem(kernel, smem_bytes, options);
    if (err == cudaSuccess) opt_in.remember(options.device);
    return err;
}

// Queues `kernel` (one launcher's: `opt_in` is that kernel's own record)
// with `config` on options.device, the current device, opting it in to
// config.dynamicSmemBytes first where that is past the default and not
// remembered. Returns the launch's result, with launch_step's reporting.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_opted_in(DynamicSmemOptIn &opt_in, void (*kernel)(KernelArgs...), const cudaLaunchConfig_t &config,
                            const LaunchOptions &options, Args &&...args) {
    // Whether an earlier launch opted in: a failed launch may then be a
    // context that never saw it, opted in again below.
    const bool remembered =
        config.dynamicSmemBytes > kDefaultDynamicSmemLimit && opt_in.remembered(options.device);
    cudaError_t err = ensure_opted_in(opt_in, kernel, config.dynamicSmemBytes, options);
    if (err != cudaSuccess) return err;
    err = cudaLaunchKernelEx(&config, kernel, args...);
    if (err != cudaSuccess && remembered) {
        // Launch errors of this kind are not sticky: nothing was queued.
        cudaGetLastError();
        const cudaError_t set = set_dynamic_smem(kernel, config.dynamicSmemBytes, options);
        if (set != cudaSuccess) return set;
        err = cudaLaunchKernelEx(&config, kernel, args...);
    }
    return launch_step(err, options, "cudaLaunchKernelEx");
}

}  // namespace flashcore
