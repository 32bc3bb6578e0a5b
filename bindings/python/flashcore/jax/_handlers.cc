// flashcore.jax's XLA FFI handlers (docs/log/jax.md): flashcore_forward and
// flashcore_backward as XLA custom calls on XLA's stream, into buffers XLA
// allocates.
//
// The Python side plans each call at trace time with the binding's one
// planning path and hands the handler the planned params struct (its
// addresses left out) as a uint8 attribute, with the index of the struct's
// address field each operand and result goes to. A handler copies the
// struct, puts the buffers' addresses in and calls the library, so every
// check and option lives in one place; what can only be known at run time
// (alignment, overlaps) the library checks on every call.
//
// The library's entry points come from flashcore_jax_bind, with the
// addresses of the library the binding loaded (flashcore._library): one
// libflashcore in the process, whichever the binding found, and no link
// to it here. The handler needs only flashcore.h and jaxlib's FFI headers
// (header-only; jax.ffi.include_dir()); no CUDA headers: the stream is a
// void *, as flashcore.h takes it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "flashcore.h"
#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = xla::ffi;

// The library's entry points, as flashcore_jax_bind receives them.
struct Api {
    decltype(&flashcore_create_for_device) create_for_device = nullptr;
    decltype(&flashcore_forward) forward = nullptr;
    decltype(&flashcore_backward) backward = nullptr;
    decltype(&flashcore_last_error_message) last_error_message = nullptr;
    decltype(&flashcore_status_string) status_string = nullptr;
};

Api g_api;

// Handles, one per device ordinal, made on first use and kept for the
// process (XLA may call from any thread).
constexpr int kMaxDevices = 64;
std::mutex g_handles_mutex;
std::array<flashcore_handle, kMaxDevices> g_handles{};

// Where each address goes: the struct's pointer fields, in the order of
// flashcore/_plan.py's POINTER_FIELDS and BACKWARD_POINTER_FIELDS (the
// Python side sends indices into these lists).
constexpr std::array<size_t, 13> kForwardPointerOffsets = {
    offsetof(flashcore_forward_params, q),
    offsetof(flashcore_forward_params, k),
    offsetof(flashcore_forward_params, v),
    offsetof(flashcore_forward_params, out),
    offsetof(flashcore_forward_params, lse),
    offsetof(flashcore_forward_params, seqused_k),
    offsetof(flashcore_forward_params, cu_seqlens_q),
    offsetof(flashcore_forward_params, cu_seqlens_k),
    offsetof(flashcore_forward_params, block_table),
    offsetof(flashcore_forward_params, q_descale),
    offsetof(flashcore_forward_params, k_descale),
    offsetof(flashcore_forward_params, v_descale),
    offsetof(flashcore_forward_params, sinks),
};
constexpr std::array<size_t, 14> kBackwardPointerOffsets = {
    offsetof(flashcore_backward_params, q),
    offsetof(flashcore_backward_params, k),
    offsetof(flashcore_backward_params, v),
    offsetof(flashcore_backward_params, out),
    offsetof(flashcore_backward_params, dout),
    offsetof(flashcore_backward_params, lse),
    offsetof(flashcore_backward_params, dq),
    offsetof(flashcore_backward_params, dk),
    offsetof(flashcore_backward_params, dv),
    offsetof(flashcore_backward_params, seqused_k),
    offsetof(flashcore_backward_params, cu_seqlens_q),
    offsetof(flashcore_backward_params, cu_seqlens_k),
    offsetof(flashcore_backward_params, sinks),
    offsetof(flashcore_backward_params, dsinks),
};

ffi::Error invalid(const std::string &message) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "flashcore.jax: " + message);
}

ffi::Error library_error(flashcore_status status, const char *call) {
    const char *detail = g_api.last_error_message != nullptr ? g_api.last_error_message() : nullptr;
    std::string message = std::string("flashcore.jax: ") + call + ": " +
                          (g_api.status_string != nullptr ? g_api.status_string(status) : "error");
    if (detail != nullptr && detail[0] != '\0') message += std::string(": ") + detail;
    return ffi::Error(ffi::ErrorCode::kInternal, message);
}

// An ErrorOr holding an error.
ffi::Unexpected<ffi::Error> failed(ffi::Error error) { return ffi::Unexpected<ffi::Error>(std::move(error)); }

ffi::ErrorOr<flashcore_handle> handle_for(int32_t device) {
    if (g_api.create_for_device == nullptr) {
        return failed(ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                                 "flashcore.jax: the handlers were registered without the library's entry points "
                                 "(flashcore_jax_bind was not called)"));
    }
    if (device < 0 || device >= kMaxDevices) {
        return failed(invalid("device ordinal " + std::to_string(device) + " is past the " +
                              std::to_string(kMaxDevices) + " devices the handlers keep handles for"));
    }
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    if (g_handles[device] == nullptr) {
        flashcore_handle handle = nullptr;
        const flashcore_status status = g_api.create_for_device(&handle, device);
        if (status != FLASHCORE_STATUS_SUCCESS) return failed(library_error(status, "flashcore_create_for_device"));
        g_handles[device] = handle;
    }
    return g_handles[device];
}

// A planned struct with the operands' and results' addresses put in.
// fields[i] is the struct field of operand i, then of result i - #operands;
// the last result, the workspace, has none. The blob must be this header's
// struct (struct_size first, as every flashcore params struct begins).
template <typename Params, size_t kFields>
ffi::ErrorOr<Params> planned(ffi::Span<const uint8_t> plan, ffi::Span<const uint8_t> fields,
                             const std::array<size_t, kFields> &offsets, ffi::RemainingArgs args,
                             ffi::RemainingRets rets, void **workspace, size_t *workspace_bytes) {
    Params params;
    if (plan.size() != sizeof(Params)) {
        return failed(invalid("the call was planned for a params struct of " + std::to_string(plan.size()) +
                       " bytes, this library's is " + std::to_string(sizeof(Params)) +
                       " (flashcore.jax and its handlers are from different versions)"));
    }
    std::memcpy(&params, plan.begin(), sizeof(Params));
    if (params.struct_size != sizeof(Params)) return failed(invalid("the planned params struct has a wrong struct_size"));
    if (rets.size() == 0 || fields.size() != args.size() + rets.size() - 1) {
        return failed(invalid("the call's operands and results do not match its plan"));
    }
    auto *bytes = reinterpret_cast<unsigned char *>(&params);
    for (size_t i = 0; i < fields.size(); ++i) {
        void *address = nullptr;
        if (i < args.size()) {
            auto buffer = args.get<ffi::AnyBuffer>(i);
            if (buffer.has_error()) return failed(buffer.error());
            address = buffer->untyped_data();
        } else {
            auto buffer = rets.get<ffi::AnyBuffer>(i - args.size());
            if (buffer.has_error()) return failed(buffer.error());
            address = (*buffer)->untyped_data();
        }
        if (fields[i] >= offsets.size()) return failed(invalid("a planned field index is out of range"));
        std::memcpy(bytes + offsets[fields[i]], &address, sizeof(address));
    }
    auto workspace_buffer = rets.get<ffi::AnyBuffer>(rets.size() - 1);
    if (workspace_buffer.has_error()) return failed(workspace_buffer.error());
    *workspace_bytes = (*workspace_buffer)->size_bytes();
    *workspace = *workspace_bytes == 0 ? nullptr : (*workspace_buffer)->untyped_data();
    return params;
}

// One call of the library: the planned struct with this call's buffers, on
// the handle of XLA's device, on XLA's stream.
template <typename Params, size_t kFields>
ffi::Error call(flashcore_status (*entry)(flashcore_handle, const Params *, void *, size_t, void *), const char *name,
                const std::array<size_t, kFields> &offsets, void *stream, int32_t device,
                ffi::Span<const uint8_t> plan, ffi::Span<const uint8_t> fields, ffi::RemainingArgs args,
                ffi::RemainingRets rets) {
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    auto params = planned<Params>(plan, fields, offsets, args, rets, &workspace, &workspace_bytes);
    if (params.has_error()) return params.error();
    auto handle = handle_for(device);
    if (handle.has_error()) return handle.error();
    const flashcore_status status = entry(*handle, &*params, workspace, workspace_bytes, stream);
    return status == FLASHCORE_STATUS_SUCCESS ? ffi::Error::Success() : library_error(status, name);
}

ffi::Error forward(void *stream, int32_t device, ffi::Span<const uint8_t> plan, ffi::Span<const uint8_t> fields,
                   ffi::RemainingArgs args, ffi::RemainingRets rets) {
    return call(g_api.forward, "flashcore_forward", kForwardPointerOffsets, stream, device, plan, fields, args, rets);
}

ffi::Error backward(void *stream, int32_t device, ffi::Span<const uint8_t> plan, ffi::Span<const uint8_t> fields,
                    ffi::RemainingArgs args, ffi::RemainingRets rets) {
    return call(g_api.backward, "flashcore_backward", kBackwardPointerOffsets, stream, device, plan, fields, args,
                rets);
}

// Both handlers' signature: XLA's stream and device, the plan and its field
// indices, the operands and the results (the workspace last).
auto binding() {
    return ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<void *>>()
        .Ctx<ffi::DeviceOrdinal>()
        .Attr<ffi::Span<const uint8_t>>("plan")
        .Attr<ffi::Span<const uint8_t>>("fields")
        .RemainingArgs()
        .RemainingRets();
}

}  // namespace

// The library's entry points, from the binding (flashcore/jax/_ffi_call.py),
// before the handlers are registered. Returns 0, or -1 if one is missing.
extern "C" __attribute__((visibility("default"))) int flashcore_jax_bind(
    decltype(&flashcore_create_for_device) create_for_device, decltype(&flashcore_forward) forward_entry,
    decltype(&flashcore_backward) backward_entry, decltype(&flashcore_last_error_message) last_error_message,
    decltype(&flashcore_status_string) status_string) {
    if (create_for_device == nullptr || forward_entry == nullptr || backward_entry == nullptr ||
        last_error_message == nullptr || status_string == nullptr) {
        return -1;
    }
    g_api = Api{create_for_device, forward_entry, backward_entry, last_error_message, status_string};
    return 0;
}

// Command-buffer compatible: XLA may record the calls into a CUDA graph
// (tracing the handler under stream capture) and replay it, as the torch
// binding's users replay theirs. Each call enqueues work on XLA's stream
// alone, decided by the plan and the buffers' addresses, and the library
// neither allocates nor synchronizes; without the trait every call is
// launched from the host, which decode's short calls feel (bench/jax_compare.py).
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcore_jax_forward, forward, binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(flashcore_jax_backward, backward, binding(), {ffi::Traits::kCmdBufferCompatible});
