"""The compiled host path of repeated flashcore.attention calls on torch
tensors (flashcore/_fastcall.c), and of their backward pass
(flashcore::backward): found, checked against this package's ctypes
structs and configured once torch is imported. Optional: where the
module was not built, or FLASHCORE_FASTCALL=0 is set, load() gives False
and every call takes the Python path, which computes the same."""

import ctypes
import importlib.machinery
import importlib.util
import os
import sys

from . import _ffi
from ._errors import FlashcoreError
from ._library import Handle, library

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
    binding's _TorchApi (_launch); kept_workspaces: its dict of workspaces
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
                     torch_api.empty_like, torch_api.current_stream, torch_api.capturing, kept_workspaces)
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


def remember(module, plan, q, k, v, out, seqused_k, descales, layout, options, return_lse):
    """Gives the module a plan that _launch.launch_plain served, with the
    arguments of that call (out: as the caller gave it, None to allocate;
    descales: (q_descale, k_descale, v_descale)): the module keys the plan
    on its own reading of them."""
    device = plan.device
    handle = _handle(device)
    module.remember(q, k, v, out, seqused_k, *descales, layout, options, return_lse, plan.template, plan.out_like_q,
                    plan.out_shape, plan.dtype, plan.torch_device, plan.lse_shape, plan.lse_dtype,
                    plan.workspace_bytes[device], handle, handle.value, device)


def remember_backward(module, arguments, plan):
    """Gives the module a backward plan (_planning._BackwardPlan) that the
    Python path served for flashcore::backward's arguments (a tuple, in its
    order; dout queued as given, not a copy): the module keys the plan on
    its own reading of them. Its backward() serves dense calls only (no
    cu_seqlens): it returns None for the others, which are not kept."""
    handle = _handle(plan.device)
    module.remember_backward(*arguments, plan.template, plan.workspace_bytes or 0, plan.torch_device, handle,
                             handle.value, plan.device)
