// What a handle caches about its device, and a guard that makes that device
// current for the length of an API call.
#pragma once

#include <cstddef>

#include "flashcore.h"

struct flashcore_handle_s {
    int device;
    int cc_major;
    int cc_minor;
    int num_sms;
    size_t max_smem_per_block;  // opt-in limit, for kernels above 48 KB
    // From the FLASHCORE_FWD_VARIANT environment variable (tests and
    // benchmarks): a flashcore::FwdVariant of the portable kernel every call
    // uses, or -1: chosen per call.
    int forced_fwd_variant;
    // Whether calls may use the sm_90a kernels: the library has them, the
    // device is compute capability 9.0, and FLASHCORE_FWD_VARIANT does not
    // ask for the portable path.
    bool use_sm90;
    // FLASHCORE_FWD_VARIANT=sm90: every call the sm_90a kernel can serve uses
    // it, however small.
    bool sm90_forced;
    // CTAs a persistent kernel may launch: num_sms, or fewer where the
    // FLASHCORE_PERSISTENT_CTAS environment variable asks (tests: with a few
    // CTAs, each walks many query blocks).
    int persistent_ctas;
};

namespace flashcore {

// The oldest architecture with the instructions the portable kernels use
// (cp.async, ldmatrix, bf16 mma.sync).
constexpr int kMinComputeMajor = 8;

// Names accepted in FLASHCORE_FWD_VARIANT, indexed by flashcore::FwdVariant:
// each pins the portable kernel to that tile variant.
constexpr const char *kFwdVariantNames[] = {"large", "keysplit"};
// FLASHCORE_FWD_VARIANT values that choose a path rather than a variant:
// the portable kernel with variants chosen per call, or the sm_90a kernel
// (an error at handle creation where it cannot run).
constexpr const char *kFwdPortableName = "portable";
constexpr const char *kFwdSm90Name = "sm90";

flashcore_status create_handle(int device, flashcore_handle *handle);

// Makes `device` current on the calling thread and restores the previous one
// on destruction. status() reports a failure to switch.
class DeviceGuard {
   public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    flashcore_status status() const { return status_; }

   private:
    int previous_ = -1;
    bool switched_ = false;
    flashcore_status status_ = FLASHCORE_STATUS_SUCCESS;
};

}  // namespace flashcore
