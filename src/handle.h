// What a handle caches about its device, and a guard that makes that device
// current for the length of an API call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "family_settings.h"
#include "flashcore.h"

namespace flashcore {

// What the environment asks of a handle's calls, read once by
// read_env_overrides when the handle is created (tests and benchmarks use
// these variables to pin a kernel; see README's Environment section).
struct EnvOverrides {
    // Each family's settings (family_settings.h), by Family.
    FamilySettings families[size_t(Family::kCount)];
    const FamilySettings &settings(Family family) const { return families[size_t(family)]; }
    // CTAs a persistent kernel may launch: the device's SM count, or fewer
    // where FLASHCORE_PERSISTENT_CTAS asks (tests: with a few CTAs, each walks
    // many query blocks).
    int persistent_ctas = 0;
    // FLASHCORE_TEST_KV_POSITION=N (tests only): where the sm_90a kernel's
    // count of K/V tiles per CTA starts, so that one call crosses 2^32.
    uint64_t first_kv_position = 0;
    // FLASHCORE_TEST_SMEM_PER_BLOCK=N (tests only): the shared memory per
    // block the handle plans with, at most the device's; create_handle makes
    // it the handle's max_smem_per_block, so that every choice and check is
    // made as on a GPU with that limit (an A100's 163 KiB, sm_86/sm_89's 99
    // KiB, tested on an H100). 0: the device's.
    size_t smem_per_block_choice = 0;
    // FLASHCORE_TEST_FAIL_OPT_IN=1 (tests only): every kernel's shared-memory
    // opt-in fails (LaunchOptions::fail_opt_in).
    bool fail_opt_in = false;
};

// A GPU a handle may be made for without one (FLASHCORE_TEST_EMULATE_GPU,
// tests only): the properties its plans read, as the vendor publishes them.
struct EmulatedGpu {
    const char *name;  // as the variable takes it
    int cc_major, cc_minor;
    int num_sms;
    size_t smem_per_block_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
    size_t smem_per_sm;           // cudaDevAttrMaxSharedMemoryPerMultiprocessor
};

}  // namespace flashcore

struct flashcore_handle_s {
    // kHandleLive from creation until flashcore_destroy, which overwrites it
    // before freeing: every call checks it, so a destroyed or made-up
    // handle is refused (as far as its memory still reads) rather than used.
    uint64_t magic;
    int device;
    int cc_major;
    int cc_minor;
    int num_sms;
    // The opt-in limit, for kernels above 48 KB (or FLASHCORE_TEST_SMEM_PER_BLOCK's,
    // where set): every kernel a plan chooses fits it.
    size_t max_smem_per_block;
    size_t smem_per_sm;         // shared by the CTAs resident on one SM
    flashcore::EnvOverrides env;
    // The GPU a FLASHCORE_TEST_EMULATE_GPU handle stands for (tests only),
    // else nullptr. Such a handle was made without the driver; its calls
    // are planned and checked as on that GPU, and return
    // FLASHCORE_STATUS_NO_DEVICE, naming the plan, where they would launch
    // (emulated_launch).
    const flashcore::EmulatedGpu *emulated = nullptr;
};

namespace flashcore {

// flashcore_handle_s::magic of a live handle ("flashcore" in ASCII, one
// letter short), and what flashcore_destroy leaves there.
constexpr uint64_t kHandleLive = 0x666c617368636f72ull;
constexpr uint64_t kHandleDestroyed = 0xdeadfc00deadfc00ull;

// SUCCESS for a live handle; INVALID_ARGUMENT for NULL or a pointer whose
// magic is not kHandleLive.
flashcore_status check_handle(const flashcore_handle_s *handle);

// The oldest architecture with the instructions the portable kernels use
// (cp.async, ldmatrix, bf16 mma.sync).
constexpr int kMinComputeMajor = 8;

flashcore_status create_handle(int device, flashcore_handle *handle);

// What a call on an emulated handle returns where it would launch:
// FLASHCORE_STATUS_NO_DEVICE, its message "emulated <gpu>: planned <plan>;
// nothing launched" (plan: printf-style, the kernel and its configuration).
flashcore_status emulated_launch(const flashcore_handle_s &handle, const char *plan_format, ...);

// The SMs a call may use: the device's less the call's sm_margin
// (flashcore_forward_params::sm_margin), which check_sm_margin has
// accepted. Its grid-size decisions count these.
int call_sms(const flashcore_handle_s &handle, int32_t sm_margin);

// INVALID_ARGUMENT where sm_margin (>= 0, as validation checked) leaves
// none of the device's SMs; SUCCESS otherwise.
flashcore_status check_sm_margin(const flashcore_handle_s &handle, int32_t sm_margin);

// CTAs a persistent kernel of the call launches at most: one for each SM
// it may use, or FLASHCORE_PERSISTENT_CTAS's cap where that is fewer.
int persistent_ctas(const flashcore_handle_s &handle, int32_t sm_margin);

// UNSUPPORTED where a kernel needs more shared memory per block than the
// handle's device allows; `kernel` names it in the message ("the <kernel>
// kernel for head dims ..."). SUCCESS otherwise.
flashcore_status check_kernel_smem(const flashcore_handle_s &handle, const char *kernel, int32_t head_dim,
                                   int32_t head_dim_v, size_t smem_bytes);

// UNSUPPORTED for a one-dimensional grid of `blocks` thread blocks, one per
// `block_rows` rows of seqlen_name for each batch and heads_name, past the
// grid's limit (INT_MAX): the message gives that product.
flashcore_status fail_grid_limit(const char *heads_name, const char *seqlen_name, int block_rows, long long blocks);

// Makes `device` current on the calling thread and restores on destruction
// what was current before: the driver's context, which may be one the
// caller created, not the primary one. status() reports a failure to
// switch.
class DeviceGuard {
   public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    flashcore_status status() const { return status_; }

   private:
    int previous_ = -1;
    void *previous_context_ = nullptr;  // the driver's current context before the switch (CUcontext)
    bool switched_ = false;
    flashcore_status status_ = FLASHCORE_STATUS_SUCCESS;
};

}  // namespace flashcore
