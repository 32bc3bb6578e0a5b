"""Queuing a prepared call on the GPU: the workspace, the handle and
flashcore_forward (flashcore_backward: launch_backward()). launch() takes
any call _planning.prepare() made;
launch_plain() is the quicker way of a planned call on plain torch
tensors queued on torch's current stream (every step of it is host time
on every call: issue 18), and what it served is what the compiled path
(_fastpath) is given. Workspaces of calls on torch's current stream are
kept per stream from call to call (release_workspaces())."""

import ctypes
import sys

from . import _ffi
from ._arrays import allocate, describe, empty
from ._errors import FlashcoreError
from ._library import get_handle, library


class _Params(_ffi.flashcore_forward_params):
    """The params of a cached call: a plan's template with this call's
    addresses put in, which come from data_ptr() or cai_signature() and
    so are known to fit a pointer. Its fields are assigned unchecked
    (flashcore.ForwardParams checks each assignment, which is host time on
    every call); it is a ForwardParams for every other purpose."""

    __setattr__ = ctypes.Structure.__setattr__


class _BackwardParams(_ffi.flashcore_backward_params):
    """The params of a planned backward call, assigned unchecked as
    _Params are; a flashcore.BackwardParams for every other purpose."""

    __setattr__ = ctypes.Structure.__setattr__


class _Call:
    """A prepared call: its result, and unless that is empty (params None)
    the params to queue on `stream` for `device`, the workspace given as
    (address, bytes) or None to allocate like `target`, and its plan (None
    on the full path; with a plan of torch arrays and on_current_stream,
    the workspace is a plain torch.empty)."""

    __slots__ = ("result", "params", "device", "stream", "target", "workspace", "plan", "on_current_stream")

    def __init__(self, result, params=None, device=None, stream=0, target=None, workspace=None, plan=None,
                 on_current_stream=False):
        self.result, self.params, self.device, self.stream = result, params, device, stream
        self.target, self.workspace, self.plan, self.on_current_stream = target, workspace, plan, on_current_stream


class _TorchApi:
    """The torch functions the quick paths call (launch_plain, and the
    compiled path, which _fastpath.load configures with them), looked up
    once (each lookup is host time on every call)."""

    __slots__ = ("tensor", "is_grad_enabled", "empty", "empty_like", "uint8", "current_stream", "capturing",
                 "deterministic_enabled")

    def __init__(self, torch):
        self.tensor = torch.Tensor
        self.is_grad_enabled = torch.is_grad_enabled
        self.deterministic_enabled = torch.are_deterministic_algorithms_enabled
        self.empty, self.empty_like, self.uint8 = torch.empty, torch.empty_like, torch.uint8
        self.current_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
                               or (lambda device: torch.cuda.current_stream(device).cuda_stream))
        self.capturing = (getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
                          or torch.cuda.is_current_stream_capturing)


_torch_api = None


def _load_torch_api():
    """_TorchApi once torch is imported, else None (then no array is a
    torch tensor)."""
    global _torch_api
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "Tensor", None) is not None:
        _torch_api = _TorchApi(torch)
    return _torch_api


def torch_api():
    """The _TorchApi, None while torch is not imported."""
    return _torch_api or _load_torch_api()


def torch_current_stream(device):
    """torch's current stream on a device, as a cudaStream_t int (without
    making a torch.cuda.Stream object where torch has the faster call)."""
    return torch_api().current_stream(device)


def _new(plan, shape, dtype, stream, on_current_stream):
    """A torch tensor (dtype: a torch dtype) for a cached call: only torch
    calls allocate."""
    if on_current_stream:
        return sys.modules["torch"].empty(shape, dtype=dtype, device=plan.torch_device)
    return empty(plan.target, shape, dtype, stream)


# Workspaces up to this size are kept per (device, stream) for the next call
# on that stream (_new_workspace); larger ones are allocated per call.
MAX_KEPT_WORKSPACE_BYTES = 16 << 20
# (device, stream) -> (uint8 tensor, its bytes, its address)
_kept_workspaces = {}


def _new_workspace(api, torch_device, device, stream, nbytes):
    """A uint8 torch tensor of nbytes for a call queued on `stream`, torch's
    current stream, whose kept workspace (if any) is too small or may not
    be used. Split-KV decode needs one on every call, and torch.empty costs
    about as much host time as the rest of the call: a stream's calls share
    one buffer instead, kept from call to call (this one, where nbytes is
    at most MAX_KEPT_WORKSPACE_BYTES), since the stream runs them one after
    the other; flashcore.release_workspaces() frees them. While the stream
    is being captured into a CUDA graph, whose replays may run beside later
    calls, the workspace is a new tensor from torch's allocator, as are
    those past the limit; the caller drops it after the launch (the
    allocator orders its reuse after the call, on the same stream)."""
    workspace = api.empty((nbytes,), dtype=api.uint8, device=torch_device)
    if nbytes <= MAX_KEPT_WORKSPACE_BYTES and not api.capturing():
        _kept_workspaces[(device, stream)] = (workspace, nbytes, workspace.data_ptr())
    return workspace


def release_workspaces() -> None:
    """Frees the workspaces flashcore.attention keeps for its calls on each
    CUDA stream (back to torch's allocator, which orders their reuse after
    the calls queued on them)."""
    _kept_workspaces.clear()


def _workspace_bytes(handle, params, plan, device):
    """Bytes of workspace params need on handle's device: asked of the
    library once per plan and device (None: no plan, or no known device)."""
    if plan is None or device is None:
        return handle.workspace_size(params)
    needed = plan.workspace_bytes.get(device)
    if needed is None:
        needed = plan.workspace_bytes[device] = handle.workspace_size(params)
    return needed


def launch(call):
    """Queues a prepared call (prepare()) and returns its result."""
    if call.params is None:
        return call.result
    plan = call.plan
    try:
        handle = get_handle(call.device)
    except FlashcoreError:
        if plan is not None:
            # No handle (no GPU): first what the full path would have said before asking for one, the library's
            # verdict on this call's addresses (with a handle, flashcore_forward gives the same).
            lib = library()
            lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(call.params)))
        raise
    ws_keep = None
    if call.workspace is not None:
        ws_ptr, ws_bytes = call.workspace
    else:
        needed = _workspace_bytes(handle, call.params, plan, call.device)
        ws_ptr, ws_bytes = 0, needed
        if needed and plan is not None and plan.target.framework == "torch":
            ws_keep = _new(plan, (needed,), sys.modules["torch"].uint8, call.stream, call.on_current_stream)
            ws_ptr = ws_keep.data_ptr()
        elif needed:
            ws_keep = allocate(call.target, (needed,), "uint8", call.stream, "workspace")
            ws_ptr = describe(ws_keep, "workspace").ptr
    handle.forward(call.params, ws_ptr, ws_bytes, call.stream)
    del ws_keep  # back to the pool of the call's stream, which orders its reuse after this call
    return call.result


def launch_plain(plan, addresses, q, out, return_lse):
    """Queues a call of a plain_torch plan (_planning._Plan: torch tensors
    only, none requiring grad, a result that is not empty) on torch's
    current stream, and returns its result: what prepare() and launch() do
    for it, without their other cases. addresses: those plan_of read, in
    POINTER_FIELDS order; out: as the caller gave it."""
    api = _torch_api or _load_torch_api()
    device = plan.device
    params = _Params.from_buffer_copy(plan.template)
    params.q = addresses[0]
    params.k = addresses[1]
    params.v = addresses[2]
    if out is None:
        out = api.empty_like(q) if plan.out_like_q else api.empty(plan.out_shape, dtype=plan.dtype,
                                                                  device=plan.torch_device)
        params.out = out.data_ptr()
    else:
        params.out = addresses[3]
    lse = None
    if plan.lse_shape is not None:
        lse = api.empty(plan.lse_shape, dtype=plan.lse_dtype, device=plan.torch_device)
        params.lse = lse.data_ptr()
    if addresses[5] is not None:
        params.seqused_k = addresses[5]
    # The descale factors of quantized inputs (POINTER_FIELDS 9 to 11).
    if addresses[9] is not None:
        params.q_descale = addresses[9]
    if addresses[10] is not None:
        params.k_descale = addresses[10]
    if addresses[11] is not None:
        params.v_descale = addresses[11]
    handle = get_handle(device)
    workspace_bytes = _workspace_bytes(handle, params, plan, device)
    stream = api.current_stream(device)
    if not workspace_bytes:
        handle.forward_unchecked(params, 0, 0, stream)
    else:
        kept = _kept_workspaces.get((device, stream))
        if kept is not None and kept[1] >= workspace_bytes and not api.capturing():
            handle.forward_unchecked(params, kept[2], workspace_bytes, stream)
        else:
            workspace = _new_workspace(api, plan.torch_device, device, stream, workspace_bytes)
            handle.forward_unchecked(params, workspace.data_ptr(), workspace_bytes, stream)
            del workspace
    return (out, lse) if return_lse else out


def launch_backward(params, plan):
    """Queues a backward call (_planning.prepare_backward's params and plan)
    on torch's current stream of its device, its workspace (the fp32 dQ
    accumulator, as large as dq in float32) a new tensor from torch's
    caching allocator, which orders its reuse after the call."""
    if plan.empty:
        return
    api = _torch_api or _load_torch_api()
    handle = get_handle(plan.device)
    workspace_bytes = plan.workspace_bytes
    if workspace_bytes is None:
        workspace_bytes = plan.workspace_bytes = handle.backward_workspace_size(params)
    stream = api.current_stream(plan.device)
    if not workspace_bytes:
        handle.backward_unchecked(params, 0, 0, stream)
        return
    workspace = api.empty((workspace_bytes,), dtype=api.uint8, device=plan.torch_device)
    handle.backward_unchecked(params, workspace.data_ptr(), workspace_bytes, stream)
    del workspace
