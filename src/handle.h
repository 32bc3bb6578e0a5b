// What a handle caches about its device, and a guard that makes that device
// current for the length of an API call.
#pragma once

#include <cstddef>
#include <optional>

#include "common/fwd_params.h"
#include "flashcore.h"

namespace flashcore {

// What the environment asks of a handle's calls, read once by
// read_env_overrides when the handle is created (tests and benchmarks use
// these variables to pin a kernel; see README's Environment table).
struct EnvOverrides {
    // FLASHCORE_FWD_VARIANT=large|keysplit|decode: every call uses the portable
    // kernel with that tile variant. Empty: chosen per call.
    std::optional<FwdVariant> forced_variant;
    // Whether calls may use the sm_90a kernels: the library has them, the
    // device is compute capability 9.0, and FLASHCORE_FWD_VARIANT does not
    // ask for the portable path.
    bool use_sm90 = false;
    // FLASHCORE_FWD_VARIANT=sm90: every call the sm_90a kernel can serve uses
    // it, however small.
    bool sm90_forced = false;
    // CTAs a persistent kernel may launch: the device's SM count, or fewer
    // where FLASHCORE_PERSISTENT_CTAS asks (tests: with a few CTAs, each walks
    // many query blocks).
    int persistent_ctas = 0;
};

}  // namespace flashcore

struct flashcore_handle_s {
    int device;
    int cc_major;
    int cc_minor;
    int num_sms;
    size_t max_smem_per_block;  // opt-in limit, for kernels above 48 KB
    size_t smem_per_sm;         // shared by the CTAs resident on one SM
    flashcore::EnvOverrides env;
};

namespace flashcore {

// The oldest architecture with the instructions the portable kernels use
// (cp.async, ldmatrix, bf16 mma.sync).
constexpr int kMinComputeMajor = 8;

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
