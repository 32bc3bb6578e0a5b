#include "handle.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <string>

#include "common/driver_function.h"
#include "error.h"

namespace flashcore {
namespace {

// The environment variable `name` as a whole number from min to max:
// SUCCESS with *found false where it is unset or empty; INVALID_ARGUMENT,
// quoting it and saying what is allowed (range: "from ..."), where it is
// anything else.
flashcore_status read_env_number(const char *name, long long min, long long max, const char *range, bool *found,
                                 long long *number) {
    *found = false;
    const char *value = std::getenv(name);
    if (value == nullptr || *value == '\0') return FLASHCORE_STATUS_SUCCESS;
    char *end = nullptr;
    errno = 0;
    const long long n = std::strtoll(value, &end, 10);
    if (*end != '\0' || errno == ERANGE || n < min || n > max) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "%s is '%.64s'; it must be unset, empty, or a whole number %s",
                    name, value, range);
    }
    *found = true;
    *number = n;
    return FLASHCORE_STATUS_SUCCESS;
}

// FLASHCORE_PERSISTENT_CTAS=N (1 <= N <= SMs): a persistent kernel launches
// at most N CTAs instead of one per SM.
flashcore_status read_persistent_ctas(const flashcore_handle_s &h, EnvOverrides *env) {
    char range[80];
    std::snprintf(range, sizeof range, "from 1 to %d (the SMs of device %d)", h.num_sms, h.device);
    bool found = false;
    long long n = 0;
    const flashcore_status status = read_env_number("FLASHCORE_PERSISTENT_CTAS", 1, h.num_sms, range, &found, &n);
    env->persistent_ctas = found ? int(n) : h.num_sms;
    return status;
}

// FLASHCORE_TEST_KV_POSITION=N (0 <= N < 2^63), for tests: the sm_90a
// kernel's CTAs count their K/V tiles from N instead of 0. Results do not
// depend on it; a test starts just below 2^32 to cross where a 32-bit count
// would wrap (sm90/pipeline.cuh).
flashcore_status read_first_kv_position(EnvOverrides *env) {
    bool found = false;
    long long n = 0;
    const flashcore_status status =
        read_env_number("FLASHCORE_TEST_KV_POSITION", 0, LLONG_MAX, "from 0 to 2^63 - 1", &found, &n);
    if (found) env->first_kv_position = uint64_t(n);
    return status;
}

// FLASHCORE_TEST_SMEM_PER_BLOCK=N (1 <= N <= the device's opt-in limit), for
// tests: the handle plans every call as if the device allowed N bytes per
// block (create_handle).
flashcore_status read_smem_per_block_choice(const flashcore_handle_s &h, EnvOverrides *env) {
    char range[96];
    std::snprintf(range, sizeof range, "from 1 to %zu (the shared memory per block device %d allows)",
                  h.max_smem_per_block, h.device);
    bool found = false;
    long long n = 0;
    const flashcore_status status = read_env_number("FLASHCORE_TEST_SMEM_PER_BLOCK", 1,
                                                    static_cast<long long>(h.max_smem_per_block), range, &found, &n);
    if (found) env->smem_per_block_choice = size_t(n);
    return status;
}

}  // namespace

bool runs_hopper_kernels(const flashcore_handle_s &h, bool has_kernels) {
    return has_kernels && h.cc_major == 9 && h.cc_minor == 0;
}

flashcore_status hopper_setting_usable(const flashcore_handle_s &h, const char *setting, bool has_kernels) {
    if (!has_kernels) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "%s, but this library was built without the sm_90a kernels (configure with an sm_90 target or "
                    "-DFLASHCORE_ENABLE_SM90=ON)",
                    setting);
    }
    if (!runs_hopper_kernels(h, has_kernels)) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "%s, but device %d has compute capability %d.%d; the sm_90a kernels run on 9.0 (H100, H200) only",
                    setting, h.device, h.cc_major, h.cc_minor);
    }
    return FLASHCORE_STATUS_SUCCESS;
}

flashcore_status check_kernel_smem(const flashcore_handle_s &handle, const char *kernel, int32_t head_dim,
                                   int32_t head_dim_v, size_t smem_bytes) {
    if (smem_bytes <= handle.max_smem_per_block) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "the %s kernel for head dims (%d, %d) needs %zu bytes of shared memory per block; device %d "
                "(sm_%d%d) allows %zu",
                kernel, int(head_dim), int(head_dim_v), smem_bytes, handle.device, handle.cc_major, handle.cc_minor,
                handle.max_smem_per_block);
}

int call_sms(const flashcore_handle_s &handle, int32_t sm_margin) { return handle.num_sms - sm_margin; }

flashcore_status check_sm_margin(const flashcore_handle_s &handle, int32_t sm_margin) {
    if (sm_margin < handle.num_sms) return FLASHCORE_STATUS_SUCCESS;
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "sm_margin (%d) leaves none of device %d's %d SMs to the call; it must be at most %d (0: every SM)",
                int(sm_margin), handle.device, handle.num_sms, handle.num_sms - 1);
}

int persistent_ctas(const flashcore_handle_s &handle, int32_t sm_margin) {
    return std::min(handle.env.persistent_ctas, call_sms(handle, sm_margin));
}

flashcore_status fail_grid_limit(const char *heads_name, const char *seqlen_name, int block_rows, long long blocks) {
    return fail(FLASHCORE_STATUS_UNSUPPORTED,
                "batch_size * %s * ceil(%s / %d) = %lld thread blocks exceeds the grid limit (%d)", heads_name,
                seqlen_name, block_rows, blocks, INT_MAX);
}

namespace {

// Every environment variable a handle reads, for the device in h.
flashcore_status read_env_overrides(const flashcore_handle_s &h, EnvOverrides *env) {
    *env = EnvOverrides{};
    using SettingsReader = flashcore_status (*)(const flashcore_handle_s &, FamilySettings *);
    constexpr SettingsReader kSettingsReaders[] = {
#define FLASHCORE_FAMILY(name) &read_##name##_settings,
#include "families.inc"
#undef FLASHCORE_FAMILY
    };
    static_assert(std::size(kSettingsReaders) == size_t(Family::kCount), "a reader per family of the list");
    flashcore_status status = FLASHCORE_STATUS_SUCCESS;
    for (size_t family = 0; family < std::size(kSettingsReaders); ++family) {
        status = kSettingsReaders[family](h, &env->families[family]);
        if (status != FLASHCORE_STATUS_SUCCESS) return status;
    }
    status = read_persistent_ctas(h, env);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = read_smem_per_block_choice(h, env);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    status = read_first_kv_position(env);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    bool found = false;
    long long fail_opt_in = 0;
    status = read_env_number("FLASHCORE_TEST_FAIL_OPT_IN", 0, 1, "0 or 1", &found, &fail_opt_in);
    env->fail_opt_in = found && fail_opt_in == 1;
    return status;
}

// The driver CUDA version the oldest flavour of flashcore (the CUDA 12
// build) runs on: a driver at least this new but too old for this build is
// pointed at that build.
constexpr int kOldestFlavourCudaVersion = 12000;

// Why cudaGetDeviceCount found no usable device (err maps to NO_DEVICE):
// no NVIDIA driver installed at all, a driver older than the CUDA runtime
// linked into the library, or a driver that sees no device. The runtime
// reports the first two alike (cudaErrorInsufficientDriver), so the driver's
// presence is checked here the way the runtime loads it: libcuda.so.1.
flashcore_status fail_no_device(cudaError_t err) {
    constexpr const char *kNeeds = "flashcore needs an NVIDIA GPU of compute capability 8.0 or newer and its driver";
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) {
        const char *why = dlerror();
        return fail(FLASHCORE_STATUS_NO_DEVICE, "no NVIDIA driver found (libcuda.so.1 could not be loaded: %s); %s",
                    why != nullptr ? why : "no reason given", kNeeds);
    }
    dlclose(driver);
    int driver_version = 0;  // as CUDA versions: 1000 * major + 10 * minor; 0 without a driver
    cleared(cudaDriverGetVersion(&driver_version));
    if (err == cudaErrorInsufficientDriver && driver_version > 0) {
        // A CUDA N runtime runs on any driver for CUDA N.0 or newer (minor-version compatibility).
        return fail(FLASHCORE_STATUS_NO_DEVICE,
                    "the NVIDIA driver (version for CUDA %d.%d) is older than this library's CUDA runtime (%d.%d) "
                    "needs: a driver for CUDA %d.0 or newer (%s or newer); update the driver%s (%s)",
                    driver_version / 1000, driver_version % 1000 / 10, CUDART_VERSION / 1000,
                    CUDART_VERSION % 1000 / 10, CUDART_VERSION / 1000, FLASHCORE_MIN_DRIVER,
                    driver_version >= kOldestFlavourCudaVersion
                        ? ", or use flashcore's CUDA 12 build (Debian: libflashcore0-cuda12; the Python wheel "
                          "carries both and loads the one the driver runs)"
                        : "",
                    cudaGetErrorName(err));
    }
    if (driver_version == 0) {
        return fail(FLASHCORE_STATUS_NO_DEVICE,
                    "no NVIDIA driver found (libcuda.so.1 loads but reports no driver version: %s); %s",
                    cudaGetErrorString(err), kNeeds);
    }
    return fail(FLASHCORE_STATUS_NO_DEVICE, "no usable CUDA device: %s (%s; NVIDIA driver for CUDA %d.%d); %s",
                cudaGetErrorString(err), cudaGetErrorName(err), driver_version / 1000, driver_version % 1000 / 10,
                kNeeds);
}

}  // namespace

flashcore_status check_handle(const flashcore_handle_s *handle) {
    if (handle == nullptr) return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    if (handle->magic != kHandleLive) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                    "handle (%p) is not a live flashcore handle: it was destroyed, or did not come from "
                    "flashcore_create",
                    static_cast<const void *>(handle));
    }
    return FLASHCORE_STATUS_SUCCESS;
}

namespace {

// FLASHCORE_TEST_EMULATE_GPU's GPUs: compute capability, SMs, and the
// shared memory per block (opt-in) and per SM of NVIDIA's published specs
// (CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability"; the SM counts of each product's data sheet).
constexpr EmulatedGpu kEmulatedGpus[] = {
    {"a100", 8, 0, 108, 166912, 167936},  // A100 SXM: 163 KiB per block, 164 KiB per SM
    {"a10", 8, 6, 72, 101376, 102400},    // A10 (sm_86): 99 KiB per block, 100 KiB per SM
    {"l4", 8, 9, 58, 101376, 102400},     // L4 (sm_89): as sm_86
    {"h100", 9, 0, 132, 232448, 233472},  // H100 SXM: 227 KiB per block, 228 KiB per SM
    {"h200", 9, 0, 132, 232448, 233472},  // H200: as the H100 SXM
};

// FLASHCORE_TEST_EMULATE_GPU=<name> (tests only): the handle stands for that
// GPU, made without the driver. *gpu is nullptr where the variable is unset
// or empty.
flashcore_status read_emulated_gpu(const EmulatedGpu **gpu) {
    *gpu = nullptr;
    const char *value = std::getenv("FLASHCORE_TEST_EMULATE_GPU");
    if (value == nullptr || value[0] == '\0') return FLASHCORE_STATUS_SUCCESS;
    std::string names;
    for (const EmulatedGpu &g : kEmulatedGpus) {
        if (std::strcmp(value, g.name) == 0) {
            *gpu = &g;
            return FLASHCORE_STATUS_SUCCESS;
        }
        names += names.empty() ? g.name : std::string(", ") + g.name;
    }
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "FLASHCORE_TEST_EMULATE_GPU=%.32s is not a GPU flashcore emulates; it takes %s (tests only)", value,
                names.c_str());
}

// The last steps of making a handle whose device properties h holds: the
// environment's overrides read for it, its shared-memory limit lowered
// where FLASHCORE_TEST_SMEM_PER_BLOCK asks, and the handle allocated.
flashcore_status finish_handle(flashcore_handle_s h, flashcore_handle *handle) {
    const flashcore_status status = read_env_overrides(h, &h.env);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (h.env.smem_per_block_choice != 0) h.max_smem_per_block = h.env.smem_per_block_choice;
    *handle = new (std::nothrow) flashcore_handle_s(h);
    if (*handle == nullptr) return fail(FLASHCORE_STATUS_OUT_OF_MEMORY, "could not allocate a handle");
    return FLASHCORE_STATUS_SUCCESS;
}

// A handle for an emulated GPU: what create_handle reads of a device, from
// the table instead of the driver.
flashcore_status create_emulated_handle(const EmulatedGpu &gpu, int device, flashcore_handle *handle) {
    if (device < 0) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "device %d does not exist (FLASHCORE_TEST_EMULATE_GPU=%s)",
                    device, gpu.name);
    }
    flashcore_handle_s h{};
    h.magic = kHandleLive;
    h.device = device;
    h.cc_major = gpu.cc_major;
    h.cc_minor = gpu.cc_minor;
    h.num_sms = gpu.num_sms;
    h.max_smem_per_block = gpu.smem_per_block_optin;
    h.smem_per_sm = gpu.smem_per_sm;
    h.emulated = &gpu;
    return finish_handle(h, handle);
}

}  // namespace

flashcore_status emulated_launch(const flashcore_handle_s &handle, const char *plan_format, ...) {
    char plan[256];
    va_list args;
    va_start(args, plan_format);
    std::vsnprintf(plan, sizeof plan, plan_format, args);
    va_end(args);
    return fail(FLASHCORE_STATUS_NO_DEVICE,
                "emulated %s (FLASHCORE_TEST_EMULATE_GPU): planned %s with %zu bytes of shared memory per block "
                "allowed; nothing launched",
                handle.emulated->name, plan, handle.max_smem_per_block);
}

flashcore_status create_handle(int device, flashcore_handle *handle) {
    const EmulatedGpu *emulated = nullptr;
    flashcore_status emulated_status = read_emulated_gpu(&emulated);
    if (emulated_status != FLASHCORE_STATUS_SUCCESS) return emulated_status;
    if (emulated != nullptr) return create_emulated_handle(*emulated, device, handle);
    int count = 0;
    // Cleared: the runtime would report this error again on the next call.
    cudaError_t err = cleared(cudaGetDeviceCount(&count));
    if (err != cudaSuccess) {
        const flashcore_status status = fail_cuda(err, "cudaGetDeviceCount");
        return status == FLASHCORE_STATUS_NO_DEVICE ? fail_no_device(err) : status;
    }
    if (count == 0) return fail(FLASHCORE_STATUS_NO_DEVICE, "no CUDA device is visible");
    if (device < 0 || device >= count) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "device %d does not exist; %d CUDA device(s) are visible",
                    device, count);
    }
    flashcore_handle_s h{};
    h.magic = kHandleLive;
    h.device = device;
    int smem_optin = 0, smem_per_sm = 0;
    const struct {
        int *value;
        cudaDeviceAttr attr;
    } attrs[] = {{&h.cc_major, cudaDevAttrComputeCapabilityMajor},
                 {&h.cc_minor, cudaDevAttrComputeCapabilityMinor},
                 {&h.num_sms, cudaDevAttrMultiProcessorCount},
                 {&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
                 {&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor}};
    for (const auto &a : attrs) {
        err = cudaDeviceGetAttribute(a.value, a.attr, device);
        if (err != cudaSuccess) return fail_cuda(cleared(err), "reading the device's attributes (cudaDeviceGetAttribute)");
    }
    h.max_smem_per_block = size_t(smem_optin);
    h.smem_per_sm = size_t(smem_per_sm);
    if (h.cc_major < kMinComputeMajor) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "device %d has compute capability %d.%d; flashcore needs 8.0 or newer (Ampere, Ada, Hopper and "
                    "later)",
                    device, h.cc_major, h.cc_minor);
    }
    return finish_handle(h, handle);
}

namespace {

// cuCtxGetCurrent and cuCtxSetCurrent from the driver, found once through
// the runtime (the library has no link-time dependency on libcuda).
using CtxGetCurrent = int (*)(void **);
using CtxSetCurrent = int (*)(void *);
struct ContextFunctions {
    CtxGetCurrent get = nullptr;
    CtxSetCurrent set = nullptr;
};

const ContextFunctions &context_functions() {
    static const ContextFunctions functions = [] {
        ContextFunctions f;
        void *get = driver_function("cuCtxGetCurrent");
        void *set = driver_function("cuCtxSetCurrent");
        if (get != nullptr && set != nullptr) {
            f.get = reinterpret_cast<CtxGetCurrent>(get);
            f.set = reinterpret_cast<CtxSetCurrent>(set);
        }
        return f;
    }();
    return functions;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
    cudaError_t err = cudaGetDevice(&previous_);
    if (err == cudaSuccess && previous_ == device) {
        // The right device, but perhaps no context current on this thread:
        // one the caller's framework made (PyTorch runs the backward on an
        // autograd thread of its own), where cudaGetDevice answers 0
        // without binding anything. The runtime binds the primary context
        // at its first call, but the driver calls before it find none
        // (cuTensorMapEncodeTiled: CUDA_ERROR_INVALID_CONTEXT, and every
        // sm_90a call failed). Bound here as the runtime would; the device
        // stays the same, so nothing is restored.
        const ContextFunctions &ctx = context_functions();
        void *current = nullptr;
        if (ctx.get != nullptr && ctx.get(&current) == 0 && current == nullptr) err = cudaSetDevice(device);
    } else if (err == cudaSuccess) {
        // The context current on the thread, which may be one the caller
        // created (cuCtxCreate), not the device's primary one: restored as
        // it was, where cudaSetDevice(previous_) would put the primary
        // context in its place.
        const ContextFunctions &ctx = context_functions();
        if (ctx.get != nullptr && ctx.get(&previous_context_) != 0) previous_context_ = nullptr;
        err = cudaSetDevice(device);
        switched_ = err == cudaSuccess;
    }
    if (err != cudaSuccess) status_ = fail_cuda(cleared(err), "making the handle's device current");
}

DeviceGuard::~DeviceGuard() {
    if (!switched_) return;
    const ContextFunctions &ctx = context_functions();
    if (previous_context_ != nullptr && ctx.set != nullptr && ctx.set(previous_context_) == 0) return;
    cleared(cudaSetDevice(previous_));
}

}  // namespace flashcore
