"""A forward or backward call's plan, from its arguments to the queued
kernel: every route of a call consumes the one plan its arguments key.

Planning. Describing and checking the arrays, converting the options and
building the params struct depend only on the arrays' shapes, strides,
dtypes and devices and on the options: plan_of() keys a call on all of
those. The full path makes the call's _Plan (the params but for the
addresses, the shapes to allocate, the workspace size once asked) and
keeps it under the key; a call whose key was seen before is served from
it, with its own addresses put in (plan_call()). Whatever depends on the
addresses is still checked on every call: by flashcore_forward itself
(alignment, overlaps, NULL), and for __cuda_array_interface__ arrays by
the driver (their device and that it knows the memory).

Launching. launch() queues a planned call: the workspace, the handle
(Handle, flashcore.Handle: one device's flashcore_handle, which
get_handle() keeps per device and thread) and flashcore_forward
(flashcore_backward: launch_backward()), on the call's stream
(stream_pointer, current_stream); out, lse and the workspace are
allocated with the inputs' framework on that stream (empty, allocate).
launch_plain() is the quicker way of a plan of plain torch tensors queued
on torch's current stream (every step of it is host time on every call:
issue 18). Workspaces of calls on torch's current stream are kept per
stream from call to call (release_workspaces()). forward() is the whole
Python path: plan, then launch.

The compiled path. The plans launch_plain served, and the backward plans
gradients() served, are given to the compiled host path
(flashcore/_fastcall.c: load(), remember(), remember_backward()), which
serves the next such call without running Python. Optional: where the
module was not built, or FLASHCORE_FASTCALL=0 is set, load() gives False
and every call takes the Python path, which computes the same."""

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import math
import os
import sys
import threading
from typing import Optional

from . import _ffi
from ._arrays import check_known_to_driver, contiguous_strides, cuda_driver, describe, pointer_device
from ._errors import FlashcoreError, InvalidArgumentError
from ._fields import fits
from ._library import BACKWARD_PARAMS_FROM, FORWARD_PARAMS_FROM, MERGE_PARAMS_FROM, library, struct_ref
from ._params import (_backward_is_empty, _build, _build_backward, _descales, _hint_bshd, _is_empty, _layout, _names,
                      _one_device, _options, _out_shape, _sequences, _validate)

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


class _TorchApi:
    """The torch functions the quick paths call (launch_plain, and the
    compiled path, which load() configures with them), looked up
    once (each lookup is host time on every call)."""

    __slots__ = ("tensor", "parameter", "is_grad_enabled", "empty", "empty_like", "uint8", "current_stream",
                 "capturing", "deterministic_enabled")

    def __init__(self, torch):
        self.tensor = torch.Tensor
        # nn.Parameter: the one subclass of Tensor the quick paths read as
        # a tensor (it overrides nothing they use); learnable sinks are one.
        self.parameter = torch.nn.Parameter
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


# --------------------------------------------------------------------------
# Handles
# --------------------------------------------------------------------------


class Handle:
    """A flashcore_handle: one CUDA device's dispatch state. Close it (or use
    it as a context manager); get_handle() keeps one per device per thread."""

    def __init__(self, device=None, lib=None):
        self._lib = lib or library()
        raw = _ffi.flashcore_handle()
        if device is None:
            self._lib.check(self._lib.cdll.flashcore_create(ctypes.byref(raw)))
        else:
            device = fits(device, ctypes.c_int32, "device")
            self._lib.check(self._lib.cdll.flashcore_create_for_device(ctypes.byref(raw), device))
        self._raw = raw
        ordinal = ctypes.c_int(-1)
        self._lib.check(self._lib.cdll.flashcore_handle_device(raw, ctypes.byref(ordinal)))
        self.device = ordinal.value

    @property
    def value(self):
        """The flashcore_handle as an int (0 once closed)."""
        if self._raw is None:
            return 0
        return self._raw.value or 0

    def _live(self):
        if self._raw is None:
            raise FlashcoreError("the handle is closed")
        return self._raw

    def workspace_size(self, params):
        """Bytes of workspace flashcore_forward needs for params on this device."""
        params = struct_ref(params, _ffi.flashcore_forward_params, "params", FORWARD_PARAMS_FROM)
        size = ctypes.c_size_t(0)
        self._lib.check(self._lib.cdll.flashcore_forward_workspace_size(self._live(), params, ctypes.byref(size)))
        return size.value

    def forward(self, params, workspace=0, workspace_bytes=0, stream=0):
        """Queues flashcore_forward. workspace and stream are raw addresses (ints)."""
        struct_ref(params, _ffi.flashcore_forward_params, "params", FORWARD_PARAMS_FROM)
        self.forward_unchecked(params, fits(workspace or None, ctypes.c_void_p, "workspace"),
                               fits(workspace_bytes, ctypes.c_size_t, "workspace_bytes"),
                               fits(stream or None, ctypes.c_void_p, "stream"))

    def forward_unchecked(self, params, workspace, workspace_bytes, stream):
        """forward() for arguments known to fit their C types: params a
        flashcore.ForwardParams, workspace and stream ints (0 or None for
        none), workspace_bytes an int >= 0. The cached calls' path, where
        each conversion is host time."""
        status = self._lib.cdll.flashcore_forward(self._live(), ctypes.byref(params), workspace or None,
                                                  workspace_bytes, stream or None)
        if status:
            self._lib.check(status)

    def backward_workspace_size(self, params):
        """Bytes of workspace flashcore_backward needs for params (a
        flashcore.BackwardParams): the fp32 dQ accumulator."""
        params = struct_ref(params, _ffi.flashcore_backward_params, "params", BACKWARD_PARAMS_FROM)
        size = ctypes.c_size_t(0)
        self._lib.check(self._lib.cdll.flashcore_backward_workspace_size(self._live(), params, ctypes.byref(size)))
        return size.value

    def backward(self, params, workspace=0, workspace_bytes=0, stream=0):
        """Queues flashcore_backward (a flashcore.BackwardParams, e.g. from
        flashcore.backward_params). workspace and stream are raw addresses
        (ints)."""
        struct_ref(params, _ffi.flashcore_backward_params, "params", BACKWARD_PARAMS_FROM)
        self.backward_unchecked(params, fits(workspace or None, ctypes.c_void_p, "workspace"),
                                fits(workspace_bytes, ctypes.c_size_t, "workspace_bytes"),
                                fits(stream or None, ctypes.c_void_p, "stream"))

    def backward_unchecked(self, params, workspace, workspace_bytes, stream):
        """backward() for arguments known to fit their C types, as
        forward_unchecked()."""
        status = self._lib.cdll.flashcore_backward(self._live(), ctypes.byref(params), workspace or None,
                                                   workspace_bytes, stream or None)
        if status:
            self._lib.check(status)

    def merge_states(self, params, stream=0):
        """Queues flashcore_merge_states (a flashcore.MergeParams, e.g. from
        flashcore.merge_params). stream is a raw cudaStream_t (an int); the
        call needs no workspace."""
        params = struct_ref(params, _ffi.flashcore_merge_params, "params", MERGE_PARAMS_FROM)
        stream = fits(stream or None, ctypes.c_void_p, "stream")
        self._lib.check(self._lib.cdll.flashcore_merge_states(self._live(), params, stream))

    def close(self):
        raw, self._raw = getattr(self, "_raw", None), None
        if raw is not None and raw.value:
            self._lib.check(self._lib.cdll.flashcore_destroy(raw))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<flashcore.Handle device=%d %s>" % (self.device, "open" if self._raw is not None else "closed")


_thread_handles = threading.local()


def get_handle(device: Optional[int] = None) -> "Handle":
    """This thread's cached Handle for a CUDA device (None: the thread's
    current device)."""
    cache = getattr(_thread_handles, "cache", None)
    if cache is None:
        cache = _thread_handles.cache = {}
    if device is not None and device in cache:
        return cache[device]
    handle = Handle(device)
    return cache.setdefault(handle.device, handle)


# --------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------


def stream_pointer(stream):
    """The cudaStream_t (an int) for a stream given as an int, a ctypes
    pointer, a torch.cuda.Stream, a cupy Stream or any object with
    __cuda_stream__."""
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream, not a bool")
    if isinstance(stream, int):
        return stream
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError("stream must be an int (cudaStream_t), a torch.cuda.Stream, a cupy Stream or an object "
                    "with __cuda_stream__; got %s" % type(stream).__name__)


def current_stream(info):
    """The stream work on info's data should go to by default: its framework's
    current stream, the producer's stream for __cuda_array_interface__ v3, else
    the legacy default stream (0)."""
    if info.framework == "torch":
        return sys.modules["torch"].cuda.current_stream(info.device).cuda_stream
    if info.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(info.device):
            return cupy.cuda.get_current_stream().ptr
    return int(info.stream) if info.stream else 0


def _torch_stream_context(torch, device, stream):
    if torch.cuda.current_stream(device).cuda_stream == stream:
        return contextlib.nullcontext()
    default = torch.cuda.default_stream(device)
    if stream in (0, 1) and default.cuda_stream == 0:
        return torch.cuda.stream(default)
    return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device))


def _cupy_stream_context(cupy, device, stream):
    with cupy.cuda.Device(device):
        if cupy.cuda.get_current_stream().ptr == stream:
            return contextlib.nullcontext()
    if stream in (0, 1):
        return cupy.cuda.Stream.null
    return cupy.cuda.ExternalStream(stream, device)


# --------------------------------------------------------------------------
# Allocation with the input's framework (the call's out, lse and workspace)
# --------------------------------------------------------------------------


def empty(like, shape, dtype, stream):
    """A new array of like's framework and device (like: an ArrayInfo, or any
    object with its framework and device), shape and dtype (None: like's
    dtype; a name such as "float32" or "uint8", or the framework's own dtype),
    taken from the memory pool of the stream it will be written on."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        torch_dtype = like.obj.dtype if dtype is None else getattr(torch, dtype) if isinstance(dtype, str) else dtype
        with _torch_stream_context(torch, like.device, stream):
            return torch.empty(shape, dtype=torch_dtype, device=torch.device("cuda", like.device))
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            with _cupy_stream_context(cupy, like.device, stream):
                return cupy.empty(shape, dtype=like.obj.dtype if dtype is None else dtype)
    raise TypeError("cannot allocate memory for a %s: pass the output (out=) and, when the library "
                    "asks for one, the workspace (workspace=) yourself" % type(like.obj).__name__)


def full(like, shape, dtype, value, stream):
    """As empty(), every element set to value, written on `stream`."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        with _torch_stream_context(torch, like.device, stream):
            return torch.full(shape, value, dtype=getattr(torch, dtype), device=torch.device("cuda", like.device))
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            with _cupy_stream_context(cupy, like.device, stream):
                return cupy.full(shape, value, dtype=dtype)
    raise TypeError("cannot allocate memory for a %s" % type(like.obj).__name__)


def allocate(like, shape, dtype, stream, what):
    """empty(), where like's framework can allocate; else a TypeError that
    asks for `what` (out, lse, workspace) to be given."""
    if like.framework not in ("torch", "cupy"):
        kind = like.type_name if isinstance(like, _Target) else type(like.obj).__name__
        raise TypeError("flashcore cannot allocate %s for %s inputs: pass %s= (a CUDA array) yourself"
                        % (what, kind, what))
    return empty(like, shape, dtype, stream)


def describe_first(x, name, stream):
    """The ArrayInfo of a call's first array and the stream the call runs
    on: `stream` (any form stream_pointer takes) where given, else the
    current stream of that array's framework."""
    user_stream = None if stream is None else stream_pointer(stream)
    info = describe(x, name, user_stream or 0)
    return info, current_stream(info) if user_stream is None else user_stream


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


def launch(return_lse, plan, addresses, out, lse, stream, on_current_stream, device, workspace, params):
    """Queues a planned call (plan_call()'s answer after return_lse) and
    returns its result: params (where plan_call built them, else the
    plan's with `addresses`, in POINTER_FIELDS order, put in), out and lse
    allocated where the plan says and the caller gave none, on `stream` (a
    cudaStream_t; on_current_stream: torch's current one, where allocating
    needs no stream context) for `device`, with the caller's workspace
    ((address, bytes)) or one allocated like the plan's target."""
    if out is None and plan.out_shape is not None:
        out = _new(plan, plan.out_shape, plan.dtype, stream, on_current_stream)
        addresses[3] = out.data_ptr()
    if lse is None and plan.lse_shape is not None:
        lse = _new(plan, plan.lse_shape, plan.lse_dtype, stream, on_current_stream)
        addresses[4] = lse.data_ptr()
    result = (out, lse) if return_lse else out
    if plan.empty:
        return result  # as PyTorch: an empty result, nothing launched (no GPU needed)
    if params is None:
        params = _Params.from_buffer_copy(plan.template)
        for i in plan.given:
            setattr(params, POINTER_FIELDS[i], addresses[i])
    try:
        handle = get_handle(device)
    except FlashcoreError:
        # No handle (no GPU): first the library's verdict on this call's addresses, which flashcore_forward
        # would give with one.
        lib = library()
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
        raise
    keep = None
    if workspace is not None:
        address, nbytes = workspace
    else:
        address, nbytes = 0, _workspace_bytes(handle, params, plan, device)
        if nbytes and plan.target.framework == "torch":
            keep = _new(plan, (nbytes,), sys.modules["torch"].uint8, stream, on_current_stream)
            address = keep.data_ptr()
        elif nbytes:
            keep = allocate(plan.target, (nbytes,), "uint8", stream, "workspace")
            address = describe(keep, "workspace").ptr
    handle.forward(params, address, nbytes, stream)
    del keep  # back to the pool of the call's stream, which orders its reuse after this call
    return result


def launch_plain(plan, addresses, q, out, return_lse):
    """Queues a call of a plain_torch plan (_Plan: torch tensors
    only, none requiring grad, a result that is not empty) on torch's
    current stream, and returns its result: what plan_call() and launch() do
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
    if addresses[SINKS] is not None:
        params.sinks = addresses[SINKS]
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
    """Queues a backward call (prepare_backward's params and plan)
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


# --------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------

# One past the highest address a pointer holds (cai_signature takes none beyond).
_ADDRESS_END = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p))


def cai_signature(x):
    """(key, pointer, stream) of a __cuda_array_interface__ array whose
    description the call cache can reuse: key holds every entry describe()
    reads but the pointer and the stream, so that equal keys describe equal
    arrays but for where they are (and on which stream). None for arrays
    that take the full path every time: tensor subclasses, CuPy arrays,
    DLPack-only objects, and interfaces whose per-call entries are malformed
    (the full path says how). A shape or strides of anything but ints (a
    shape of 64.0, which compares equal to a cached 64) takes the full
    path too, which refuses it: the cache serves only what the full path
    accepts. The device is the driver's, asked per pointer each call.
    (torch tensors are read by the cache itself.)"""
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if torch is not None and isinstance(x, torch.Tensor) or cupy is not None and isinstance(x, cupy.ndarray):
        return None
    cai = getattr(x, "__cuda_array_interface__", None)
    if type(cai) is not dict:
        return None
    data, version = cai.get("data"), cai.get("version")
    if type(data) is not tuple or len(data) != 2 or (version is not None and type(version) is not int):
        return None
    ptr, readonly = data
    if type(ptr) is not int or not 0 <= ptr < _ADDRESS_END or type(readonly) is not bool:
        return None
    stream = cai.get("stream") if version is not None and version >= 3 else None
    if stream is not None and (type(stream) is not int or stream < 0):
        return None
    shape, strides = cai.get("shape"), cai.get("strides")
    if not _int_tuple(shape) or strides is not None and not _int_tuple(strides):
        return None
    key = (shape, strides, cai.get("typestr"), readonly, version, cai.get("mask"))
    return key, ptr, stream


def _int_tuple(entries):
    """Whether entries is a tuple of ints (no bools, floats or other numbers
    that compare equal to one)."""
    if type(entries) is not tuple:
        return False
    for n in entries:
        if type(n) is not int:
            return False
    return True


# Fields of flashcore_forward_params holding the arrays' addresses, in the
# order plan_of takes the arrays.
POINTER_FIELDS = ("q", "k", "v", "out", "lse", "seqused_k", "cu_seqlens_q", "cu_seqlens_k", "block_table",
                  "q_descale", "k_descale", "v_descale", "sinks")
# The index of the learnable sinks among them (an nn.Parameter of its model).
SINKS = POINTER_FIELDS.index("sinks")
# Plans kept; past that many the cache starts again empty, so that a model
# with ever new shapes does not grow it without end.
MAX_PLANS = 1024
_plans = {}
# Option values a key may hold: their exact types, since values of other
# types can compare equal and mean something else to the full path (True
# == 1, yet True is no softmax_scale).
_PLAIN_REAL = (float, int)


class _Plan:
    """What the full path made of one key (plan_of): the params struct but
    for its addresses (template), whether the result is empty, the shapes
    of out and lse to allocate (None where given or not asked for), their
    dtypes (dtype: out's, q's but bfloat16 for fp8 queries, None unless q
    is a torch tensor; lse_dtype), where to allocate (target,
    torch_device), the device of the framework arrays, the arrays' names
    for messages, the indices of the arrays given or allocated, the arrays
    read through __cuda_array_interface__ as (index, name) (their device
    is the driver's, asked each call), whether q, k or v requires grad
    (sinks, a model's parameter, require grad in inference too: whether
    the call is differentiated was decided before it was planned), and
    the workspace size per device once asked; plain_torch: whether a call on
    torch's current stream may take launch_plain (torch tensors
    only, none requiring grad, no lse, cu_seqlens or block_table given, a
    result that is not empty; seqused_k, descales and sinks may be given);
    out_like_q: whether out is allocated with q's shape, dtype and
    contiguous strides, which torch.empty_like(q) gives for a contiguous q
    (in less host time; never for fp8 queries, whose out is bfloat16)."""

    __slots__ = ("template", "empty", "out_shape", "lse_shape", "dtype", "lse_dtype", "target", "torch_device",
                 "device", "names", "given", "cai_arrays", "requires_grad", "workspace_bytes", "plain_torch", "out_like_q")


class _Target:
    """Where a plan's arrays are allocated: q's framework and device (an
    ArrayInfo's), and the name of q's type for messages (a plan keeps no
    array alive)."""

    __slots__ = ("framework", "device", "type_name")

    def __init__(self, framework, device, type_name):
        self.framework, self.device, self.type_name = framework, device, type_name


class _Pointer:
    """An address to ask the driver about (check_known_to_driver)."""

    __slots__ = ("name", "ptr", "framework")

    def __init__(self, name, ptr):
        self.name, self.ptr, self.framework = name, ptr, None


# plan_of's answer for a call that is not planned: a workspace given, or
# arrays or options that the key does not read (the full path serves it).
NOT_PLANNED = (None, None, None, None)


def plan_of(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, workspace):
    """(key, plan, addresses, q's __cuda_array_interface__ stream) of a
    call: the one key of a call, under which every plan is kept (the
    compiled path matches the same arrays and options in C, _fastcall.c,
    for the plans given to it), and the plan kept under it (None where
    there is none yet: plan_call()'s full path makes it). arrays: the call's,
    in POINTER_FIELDS order (None where not given); addresses: theirs.
    NOT_PLANNED unless every array given is a torch tensor (not a
    subclass) or has a cai_signature(), and every option is a plain value.
    The arrays' parts of the key are _array_key()'s."""
    if workspace is not None:
        return NOT_PLANNED
    causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin = options
    if type(window) is list:
        window = tuple(window)
    if not (type(layout) is str and (softmax_scale is None or type(softmax_scale) in _PLAIN_REAL)
            and (num_splits is None or type(num_splits) is int) and type(softcap) in _PLAIN_REAL
            and type(attention_chunk) is int and type(sm_margin) is int
            and (window is None or type(window) is tuple and len(window) == 2
                 and type(window[0]) is int and type(window[1]) is int)
            and (max_seqlen_q is None or type(max_seqlen_q) is int)
            and (max_seqlen_k is None or type(max_seqlen_k) is int)):
        return NOT_PLANNED
    keyed = _array_key([layout, 1 if causal else 0, softmax_scale, num_splits, window, softcap, attention_chunk,
                        sm_margin, bool(return_lse), max_seqlen_q, max_seqlen_k], arrays)
    if keyed is None:
        return NOT_PLANNED
    key, addresses, q_stream = keyed
    try:
        return key, _plans.get(key), addresses, q_stream
    except TypeError:  # an unhashable entry (a list for a shape): the full path reads it
        return NOT_PLANNED


def _array_key(key, arrays):
    """(key, addresses, q's __cuda_array_interface__ stream): key (a list of
    the call's options) with each array's part appended after its index,
    as a tuple, and the arrays' addresses (None where not given); None
    where an array is neither a torch tensor (not a subclass, but for an
    nn.Parameter) nor has a cai_signature(). A torch tensor's part is its
    shape, strides, dtype, device index (-1 for the CPU: never planned, the
    full path refuses it) and requires_grad."""
    api = _torch_api or _load_torch_api()
    tensor_type, parameter_type = (None, None) if api is None else (api.tensor, api.parameter)
    addresses = [None] * len(arrays)
    q_stream = None
    for i, a in enumerate(arrays):
        if a is None:
            continue
        # Read here rather than in a call: the common case, and a call's time counts.
        if type(a) is tensor_type or type(a) is parameter_type:
            key += (i, a.shape, a.stride(), a.dtype, a.get_device(), a.requires_grad)
            addresses[i] = a.data_ptr()
            continue
        found = cai_signature(a)
        if found is None:
            return None
        key += (i, found[0])
        addresses[i] = found[1]
        if not i:
            q_stream = found[2]
    return tuple(key), addresses, q_stream


def _make_plan(params, infos, out_shape, lse_shape, device, out_dtype_name):
    """The _Plan of a call the full path built params for (infos: the
    ArrayInfos of the arrays, in POINTER_FIELDS order, None where not
    given; out_dtype_name: out's dtype where it is not q's, as
    _Geometry.out_dtype_name: bfloat16 for fp8 queries)."""
    q = infos[0]
    torch = sys.modules.get("torch") if q.framework == "torch" else None
    plan = _Plan()
    plan.template = bytes(params)
    plan.empty = _is_empty(params)
    plan.out_shape, plan.lse_shape = out_shape, lse_shape
    if torch is None:
        plan.dtype, plan.lse_dtype, plan.torch_device = None, "float32", None
    else:
        plan.dtype = q.obj.dtype if out_dtype_name is None else getattr(torch, out_dtype_name)
        plan.lse_dtype, plan.torch_device = torch.float32, q.obj.device
    plan.target = _Target(q.framework, q.device, type(q.obj).__name__)
    plan.device = device
    plan.names = _names(infos)
    plan.given = tuple(i for i, a in enumerate(infos) if a is not None)
    plan.cai_arrays = tuple((i, a.name) for i, a in enumerate(infos) if a is not None and a.framework is None)
    plan.requires_grad = any(a.framework == "torch" and a.obj.requires_grad for a in infos[:3])
    plan.workspace_bytes = {}
    plan.plain_torch = (torch is not None and not plan.cai_arrays and not plan.requires_grad and not plan.empty
                        and device is not None and (infos[4] is None or lse_shape is not None)
                        and infos[6] is None and infos[7] is None and infos[8] is None)
    plan.out_like_q = (plan.plain_torch and out_shape is not None and out_shape == tuple(q.obj.shape)
                       and out_dtype_name is None and q.obj.is_contiguous())
    return plan


def _plan_in_full(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream, workspace,
                  seqused_k_name, key):
    """plan_call()'s full path: describes and checks everything, allocates
    out and lse where they are to be returned and not given, and keeps the
    plan under `key` where it is not None."""
    q, k, v, out, lse = arrays[:5]
    layout = _layout(layout)
    options = _options(*options)
    qi, s = describe_first(q, "q", stream)
    ki, vi = describe(k, "k", s), describe(v, "v", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    seqs = _sequences(s, arrays[5], arrays[6], max_seqlen_q, arrays[7], max_seqlen_k, arrays[8], seqused_k_name)
    scales = _descales(s, *arrays[9:SINKS])
    sinks = None if arrays[SINKS] is None else describe(arrays[SINKS], "sinks", s)
    lib = library()
    try:
        geometry = _validate(qi, ki, vi, oi, li, layout, seqs, descales=scales, options=options, sinks=sinks)
        out_shape = _out_shape(qi, geometry.views[2].shape[3]) if oi is None else None
        lse_shape = geometry.lse_shape if li is None and return_lse else None
        if out_shape is not None:
            # q's dtype, but bfloat16 for fp8 queries (out_dtype_name).
            out = allocate(qi, out_shape, geometry.out_dtype_name, s, "out")
            oi = describe(out, "out", s)
        if lse_shape is not None:
            lse = allocate(qi, lse_shape, "float32", s, "lse")
            li = describe(lse, "lse", s)
        params = _build(lib, qi, ki, vi, oi, li, layout, options, seqs, scales, sinks)
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    except InvalidArgumentError as e:
        raise _hint_bshd(e, qi, ki, vi, layout, seqs) from None
    infos = (qi, ki, vi, oi, li) + seqs.arrays() + scales.arrays() + (sinks,)
    device = next((a.device for a in (qi, ki, vi, oi) if a.device is not None), None)
    plan = _make_plan(params, infos, out_shape, lse_shape, device, geometry.out_dtype_name)
    if key is not None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    given = None
    if not plan.empty:
        check_known_to_driver(infos)
        if workspace is not None:
            wi = describe(workspace, "workspace", s)
            if wi.strides != contiguous_strides(wi.shape):
                raise InvalidArgumentError("workspace must be contiguous")
            check_known_to_driver((wi,))
            given = (wi.ptr, math.prod(wi.shape) * wi.itemsize)
    return plan, None, out, lse, s, False, device, given, params


def plan_call(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream, workspace,
              seqused_k_name="seqused_k", planned=None):
    """Everything a forward call does before it asks for a handle: the
    arguments of launch() after return_lse, (plan, addresses, out, lse,
    stream, on_current_stream, device, workspace), from the call's kept
    plan, or from the full path, which keeps the plan it makes under the
    call's key. arrays: the call's, in POINTER_FIELDS order (None where not
    given); options: (causal, softmax_scale, num_splits, window, softcap,
    attention_chunk, sm_margin) as the caller gave them; planned: plan_of's
    answer, where the caller has it. The result has no gradient path: calls
    that need one are flashcore::forward's (_torch_ops), which comes here
    below autograd."""
    if planned is None:
        planned = plan_of(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, workspace)
    key, plan, addresses, q_stream = planned
    if plan is None:
        return _plan_in_full(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream, workspace,
                             seqused_k_name, key)
    torch_target = plan.target.framework == "torch"
    if stream is not None:
        s = stream_pointer(stream)
    elif torch_target:
        s = torch_api().current_stream(plan.device)  # (without making a torch.cuda.Stream)
    else:
        s = q_stream or 0
    device, params = plan.device, None
    if plan.cai_arrays and not plan.empty and cuda_driver() is not None:  # without a driver there is nothing to ask
        # In the full path's order: the library's verdict on the addresses, then the driver's.
        params = _Params.from_buffer_copy(plan.template)
        for i in plan.given:
            setattr(params, POINTER_FIELDS[i], addresses[i])
        lib = library()
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
        pointers = [_Pointer(name, addresses[i]) for i, name in plan.cai_arrays]
        check_known_to_driver(pointers)
        device = _one_device([device] + [pointer_device(p.ptr) for p in pointers], plan.names)
    return plan, addresses, arrays[3], arrays[4], s, stream is None and torch_target, device, None, params


def forward(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream, workspace, seqused_k_name,
            fast):
    """The Python path of a forward call (arrays and options as
    plan_call() takes them): its plan, then launch_plain() where the plan
    is of plain torch tensors and the call on torch's current stream (the
    compiled path `fast`, where there is one, is then given the plan for
    the next such call), else launch()."""
    planned = plan_of(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, workspace)
    plan = planned[1]
    if plan is not None and plan.plain_torch and stream is None:
        result = launch_plain(plan, planned[2], arrays[0], arrays[3], return_lse)
        if fast:
            remember(fast, plan, arrays, layout, options, return_lse)
        return result
    return launch(return_lse, *plan_call(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream,
                                         workspace, seqused_k_name, planned))


# --------------------------------------------------------------------------
# The backward pass (flashcore::backward, on torch tensors): planned as the
# forward is, under a key of the arrays and options.
# --------------------------------------------------------------------------

# Fields of flashcore_backward_params holding the arrays' addresses, in the
# order prepare_backward takes the arrays.
BACKWARD_POINTER_FIELDS = ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", "seqused_k", "cu_seqlens_q",
                           "cu_seqlens_k", "sinks", "dsinks")
_backward_plans = {}


class _BackwardPlan:
    """What the full path made of one backward key: the params struct but
    for its addresses (template), whether the call has nothing to compute
    (empty), q's device (index and torch.device) and the workspace size
    once asked (it depends on the shapes alone)."""

    __slots__ = ("template", "empty", "device", "torch_device", "workspace_bytes")


def backward_in_full(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k, stream=0):
    """The full path of a backward call: the arrays (BACKWARD_POINTER_FIELDS
    order, None where not given) described on `stream` and checked, and
    (the flashcore_backward_params built of them, q's device). options:
    (causal, softmax_scale, window, softcap, attention_chunk, sm_margin) as
    the caller gave them."""
    causal, softmax_scale, window, softcap, attention_chunk, sm_margin = options
    layout = _layout(layout)
    options = _options(causal, softmax_scale, None, window, softcap, attention_chunk, sm_margin)
    # The tensors and the sinks (and their gradient); the sequence arrays are _sequences'.
    infos = [None if a is None else describe(a, name, stream)
             for a, name in zip(arrays[:9] + arrays[12:], BACKWARD_POINTER_FIELDS[:9] + BACKWARD_POINTER_FIELDS[12:])]
    seqs = _sequences(stream, seqused_k=arrays[9], cu_seqlens_q=arrays[10], max_seqlen_q=max_seqlen_q,
                      cu_seqlens_k=arrays[11], max_seqlen_k=max_seqlen_k)
    try:
        return _build_backward(library(), *infos[:9], layout, options, deterministic, seqs, *infos[9:]), infos[0].device
    except InvalidArgumentError as e:
        raise _hint_bshd(e, infos[0], infos[1], infos[2], layout, seqs) from None


def backward_key(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k):
    """(key, addresses) of a backward call (prepare_backward's arguments),
    the key its plan is kept under; (None, None) where _array_key reads
    none."""
    causal, softmax_scale, window, softcap, attention_chunk, sm_margin = options
    keyed = _array_key([layout, bool(causal), softmax_scale, None if window is None else tuple(window), softcap,
                        attention_chunk, sm_margin, bool(deterministic), max_seqlen_q, max_seqlen_k], arrays)
    return (None, None) if keyed is None else keyed[:2]


def prepare_backward(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k):
    """(params, plan) of a backward call on torch tensors: arrays in
    BACKWARD_POINTER_FIELDS order (None where not given), options (causal,
    softmax_scale, window, softcap, attention_chunk, sm_margin) as
    flashcore::backward has them. A call whose key was seen before gets its plan's params with
    its own addresses (flashcore_backward checks them, alignment and
    overlaps, on every call); else the full path builds and checks them
    (flashcore_backward_check) and keeps the plan."""
    key, addresses = backward_key(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k)
    try:
        plan = None if key is None else _backward_plans.get(key)
    except TypeError:  # an unhashable entry: the full path reads it
        key = plan = None
    if plan is not None:
        params = _BackwardParams.from_buffer_copy(plan.template)
        for field, address in zip(BACKWARD_POINTER_FIELDS, addresses):
            if address is not None:
                setattr(params, field, address)
        return params, plan
    params, device = backward_in_full(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k)
    lib = library()
    lib.check(lib.cdll.flashcore_backward_check(ctypes.byref(params)))
    plan = _BackwardPlan()
    plan.template = bytes(params)
    plan.empty = _backward_is_empty(params)
    plan.device = device
    plan.torch_device = arrays[0].device
    plan.workspace_bytes = None
    if key is not None:
        if len(_backward_plans) >= MAX_PLANS:
            _backward_plans.clear()
        _backward_plans[key] = plan
    return params, plan


# --------------------------------------------------------------------------
# The compiled path
# --------------------------------------------------------------------------

# FLASHCORE_FASTCALL=0 in the environment: the Python path only (to compare
# the two, or to rule the compiled one out).
DISABLE_ENV = "FLASHCORE_FASTCALL"
MODULE_NAME = "_fastcall"

# device -> the Handle the compiled path queues on. Its plans hold the raw
# handle, so these live as long as the process (get_handle()'s per-thread
# handles close with their thread, or when a caller closes them).
_handles = {}


def find():
    """The compiled module, or None: flashcore._fastcall where it was
    installed in the package (the wheel), else the one a CMake build put
    beside the library this package loaded."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    try:
        from . import _fastcall
        return _fastcall
    except ImportError:
        pass
    directory = os.path.dirname(library().path)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES if directory else ():
        path = os.path.join(directory, MODULE_NAME + suffix)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location(__package__ + "." + MODULE_NAME, path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except ImportError:
                return None
            sys.modules[spec.name] = module
            return module
    return None


def _same_layout(layout, struct):
    """Whether (sizeof, {field: offset}) as the module was compiled agrees
    with the ctypes struct."""
    size, offsets = layout
    return size == ctypes.sizeof(struct) and all(getattr(struct, f).offset == o for f, o in offsets.items())


def fits_struct(module):
    """Whether the module was compiled against this package's
    flashcore_forward_params (its size and the fields it writes)."""
    return _same_layout(module.params_layout(), _ffi.flashcore_forward_params)


def fits_backward_struct(module):
    """Whether the module was compiled against this package's
    flashcore_backward_params (its size and the fields backward() writes);
    False for a module from before the backward was served."""
    layout = getattr(module, "backward_params_layout", None)
    return layout is not None and _same_layout(layout(), _ffi.flashcore_backward_params)


def load(torch_api, kept_workspaces, forward_address=None, backward_address=None):
    """The configured module; False where there is none or it does not fit;
    None while torch is not imported (ask again later). torch_api: the
    binding's _TorchApi; kept_workspaces: its dict of workspaces
    per (device, stream). forward_address and backward_address:
    flashcore_forward's and flashcore_backward's unless given (stubs', to
    time the binding alone). A module compiled against another header
    (either struct differs, or it predates the backward's functions) is
    not used: the Python path serves both directions."""
    if torch_api is None:
        return None
    try:
        lib = library()
        module = find()
    except (FlashcoreError, OSError):
        return False  # no library: the Python path says why, as before
    if module is None or not fits_struct(module) or not fits_backward_struct(module):
        return False
    if forward_address is None:
        forward_address = ctypes.cast(lib.cdll.flashcore_forward, ctypes.c_void_p).value
    module.configure(forward_address, lib.check, torch_api.tensor, torch_api.is_grad_enabled, torch_api.empty,
                     torch_api.empty_like, torch_api.current_stream, torch_api.capturing, kept_workspaces,
                     torch_api.parameter)
    if backward_address is None:
        backward_address = ctypes.cast(lib.cdll.flashcore_backward, ctypes.c_void_p).value
    module.configure_backward(backward_address, torch_api.deterministic_enabled, torch_api.uint8)
    return module


def _handle(device):
    """The Handle the compiled path queues on for `device`."""
    handle = _handles.get(device)
    if handle is None:
        handle = _handles[device] = Handle(device)
    return handle


def remember(module, plan, arrays, layout, options, return_lse):
    """Gives the module a plan that launch_plain served, with the
    arguments of that call (arrays in POINTER_FIELDS order, out as the
    caller gave it, None to allocate): the module keys the plan on its own
    reading of them."""
    device = plan.device
    handle = _handle(device)
    q, k, v, out, _, seqused_k = arrays[:6]
    module.remember(q, k, v, out, seqused_k, *arrays[9:], layout, options, return_lse, plan.template, plan.out_like_q,
                    plan.out_shape, plan.dtype, plan.torch_device, plan.lse_shape, plan.lse_dtype,
                    plan.workspace_bytes[device], handle, handle.value, device)


def remember_backward(module, arguments, plan):
    """Gives the module a backward plan (_BackwardPlan) that the
    Python path served for flashcore::backward's arguments (a tuple, in its
    order; dout queued as given, not a copy): the module keys the plan on
    its own reading of them. Its backward() serves dense calls only (no
    cu_seqlens): it returns None for the others, which are not kept."""
    handle = _handle(plan.device)
    module.remember_backward(*arguments, plan.template, plan.workspace_bytes or 0, plan.torch_device, handle,
                             handle.value, plan.device)
