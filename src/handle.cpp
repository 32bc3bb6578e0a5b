#include "handle.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "error.h"

namespace flashcore {
namespace {

// FLASHCORE_FWD_VARIANT=large|keysplit pins the portable kernel's tile
// variant; unset or empty, the dispatcher chooses per call.
flashcore_status read_forced_variant(int *variant) {
    *variant = -1;
    const char *value = std::getenv("FLASHCORE_FWD_VARIANT");
    if (value == nullptr || *value == '\0') return FLASHCORE_STATUS_SUCCESS;
    for (int i = 0; i < int(sizeof(kFwdVariantNames) / sizeof(kFwdVariantNames[0])); ++i) {
        if (std::strcmp(value, kFwdVariantNames[i]) == 0) {
            *variant = i;
            return FLASHCORE_STATUS_SUCCESS;
        }
    }
    return fail(FLASHCORE_STATUS_INVALID_ARGUMENT,
                "FLASHCORE_FWD_VARIANT is '%.64s'; it must be unset, empty, 'large' or 'keysplit'", value);
}

}  // namespace

flashcore_status create_handle(int device, flashcore_handle *handle) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();  // the runtime keeps this error sticky otherwise
        const flashcore_status status = fail_cuda(err, "cudaGetDeviceCount");
        if (status == FLASHCORE_STATUS_NO_DEVICE) {
            return fail(FLASHCORE_STATUS_NO_DEVICE,
                        "no usable CUDA device: %s (%s); flashcore needs an NVIDIA GPU of compute capability "
                        "8.0 or newer and its driver",
                        cudaGetErrorString(err), cudaGetErrorName(err));
        }
        return status;
    }
    if (count == 0) return fail(FLASHCORE_STATUS_NO_DEVICE, "no CUDA device is visible");
    if (device < 0 || device >= count) {
        return fail(FLASHCORE_STATUS_INVALID_ARGUMENT, "device %d does not exist; %d CUDA device(s) are visible",
                    device, count);
    }
    flashcore_handle_s h{};
    h.device = device;
    int smem_optin = 0;
    const struct {
        int *value;
        cudaDeviceAttr attr;
    } attrs[] = {{&h.cc_major, cudaDevAttrComputeCapabilityMajor},
                 {&h.cc_minor, cudaDevAttrComputeCapabilityMinor},
                 {&h.num_sms, cudaDevAttrMultiProcessorCount},
                 {&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin}};
    for (const auto &a : attrs) {
        err = cudaDeviceGetAttribute(a.value, a.attr, device);
        if (err != cudaSuccess) return fail_cuda(err, "cudaDeviceGetAttribute");
    }
    h.max_smem_per_block = size_t(smem_optin);
    const flashcore_status status = read_forced_variant(&h.forced_fwd_variant);
    if (status != FLASHCORE_STATUS_SUCCESS) return status;
    if (h.cc_major < kMinComputeMajor) {
        return fail(FLASHCORE_STATUS_UNSUPPORTED,
                    "device %d has compute capability %d.%d; flashcore needs 8.0 or newer (Ampere, Ada, Hopper and "
                    "later)",
                    device, h.cc_major, h.cc_minor);
    }
    *handle = new (std::nothrow) flashcore_handle_s(h);
    if (*handle == nullptr) return fail(FLASHCORE_STATUS_OUT_OF_MEMORY, "could not allocate a handle");
    return FLASHCORE_STATUS_SUCCESS;
}

DeviceGuard::DeviceGuard(int device) {
    cudaError_t err = cudaGetDevice(&previous_);
    if (err == cudaSuccess && previous_ != device) {
        err = cudaSetDevice(device);
        switched_ = err == cudaSuccess;
    }
    if (err != cudaSuccess) status_ = fail_cuda(err, "selecting the handle's device");
}

DeviceGuard::~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
}

}  // namespace flashcore
