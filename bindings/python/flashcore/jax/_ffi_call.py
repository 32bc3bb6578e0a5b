"""flashcore's forward and backward as XLA FFI custom calls
(docs/log/jax.md).

Each call is planned at trace time by the binding's own planning pieces
(_params._validate and _build: the same checks and messages as the torch
path) on the abstract arrays JAX traces: their shapes and dtypes, row-major
strides (XLA's default layout) and stand-in addresses, which the library's
flashcore_forward_check sees as distinct and aligned. The planned struct
travels to the handler (_handlers.cc) as a uint8 attribute with its address
fields cleared, beside the indices of the fields each operand and result
goes to; the handler puts XLA's buffers' addresses in. out, lse and the
workspace are results: XLA allocates them, the workspace sized here, at
trace time, for the first local GPU."""

import ctypes
import itertools
import os

import numpy as np

import jax

from .._arrays import ArrayInfo, contiguous_strides
from .._errors import InvalidArgumentError, UnsupportedError
from .._library import library
from .._params import (_build, _build_backward, _descales, _hint_bshd, _layout, _options, _out_shape, _sequences,
                        _validate)
from .._plan import BACKWARD_POINTER_FIELDS, POINTER_FIELDS, get_handle

FORWARD_TARGET = "flashcore_forward"
BACKWARD_TARGET = "flashcore_backward"
# The handlers' library, built beside libflashcore (cmake/FlashcoreJax.cmake)
# and installed into this package by the wheel.
HANDLERS_LIBRARY = "libflashcore_jax.so"
# Stand-in addresses for planning: array i at (i + 1) * this, far enough
# apart that no planned array can overlap the next, and aligned.
_STAND_IN_SPACING = 1 << 40

# The loaded handlers' library, once registered.
_handlers = None


def _handlers_path():
    """Where the handlers' library is: this package, else beside the
    libflashcore the binding loaded (a build tree)."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), HANDLERS_LIBRARY)
    if os.path.exists(here):
        return here
    beside = os.path.join(os.path.dirname(library().path), HANDLERS_LIBRARY)
    if os.path.exists(beside):
        return beside
    raise UnsupportedError("flashcore.jax's handlers (%s) are not installed: build flashcore with JAX's headers "
                           "present (cmake -DFLASHCORE_JAX=ON; pip install jax first), or install the wheel, which "
                           "carries them; looked in %s and beside %s" % (HANDLERS_LIBRARY, os.path.dirname(here),
                                                                         library().path))


def _register():
    """Loads the handlers, gives them the entry points of the library the
    binding loaded, and registers both targets for CUDA (once)."""
    global _handlers
    if _handlers is not None:
        return
    handlers = ctypes.CDLL(_handlers_path())
    lib = library().cdll
    entry = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p)
    handlers.flashcore_jax_bind.restype = ctypes.c_int
    handlers.flashcore_jax_bind.argtypes = [ctypes.c_void_p] * 5
    if handlers.flashcore_jax_bind(entry("flashcore_create_for_device"), entry("flashcore_forward"),
                                   entry("flashcore_backward"), entry("flashcore_last_error_message"),
                                   entry("flashcore_status_string")) != 0:
        raise UnsupportedError("flashcore.jax: the loaded libflashcore lacks an entry point the handlers need")
    jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(handlers.flashcore_jax_forward), platform="CUDA")
    jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(handlers.flashcore_jax_backward),
                                platform="CUDA")
    _handlers = handlers


def _info(x, name, index):
    """An ArrayInfo of an abstract array (anything with shape and dtype):
    row-major, at a stand-in address."""
    shape = tuple(int(n) for n in x.shape)
    dtype = np.dtype(x.dtype)
    return ArrayInfo(None, name, (index + 1) * _STAND_IN_SPACING, shape, contiguous_strides(shape), dtype.name,
                     dtype.itemsize, None, "jax")


def _result_info(shape, dtype_name, name, index):
    return _info(jax.ShapeDtypeStruct(shape, _jax_dtype(dtype_name)), name, index)


def _gpu_ordinal():
    """The CUDA ordinal of the first local GPU, which sizes the workspace;
    an UnsupportedError where JAX has none."""
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        raise UnsupportedError("flashcore.jax runs on NVIDIA GPUs; JAX has none here (its backend is %s): install "
                               "jax[cuda13] on a machine with one" % jax.default_backend())
    return gpus[0].local_hardware_id


def _template(params, fields):
    """The planned struct as the handler's attribute: its address fields
    cleared (the handler fills the ones it is given)."""
    for field in fields:
        setattr(params, field, None)
    return np.frombuffer(bytes(params), dtype=np.uint8)


# The optional arrays of a forward call, by their params field, in
# POINTER_FIELDS order (after q, k, v, out, lse).
OPTIONAL_FIELDS = POINTER_FIELDS[5:]
# Those the backward pass takes, in BACKWARD_POINTER_FIELDS order (dsinks,
# the last, is a result: the gradient of sinks, where the call has sinks).
BACKWARD_OPTIONAL_FIELDS = BACKWARD_POINTER_FIELDS[9:-1]


def _stand_ins(first_index):
    """describe_array for _sequences and _descales: ArrayInfos at stand-in
    addresses from first_index on."""
    indices = itertools.count(first_index)
    return lambda x, name: _info(x, name, next(indices))


def _abstract_sequences(arrays, max_seqlen_q, max_seqlen_k, seqused_k_name, describe_array):
    """_params._Sequences of a call's abstract optional arrays (by field
    name)."""
    return _sequences(0, seqused_k=arrays.get("seqused_k"), cu_seqlens_q=arrays.get("cu_seqlens_q"),
                      max_seqlen_q=max_seqlen_q, cu_seqlens_k=arrays.get("cu_seqlens_k"), max_seqlen_k=max_seqlen_k,
                      block_table=arrays.get("block_table"), seqused_k_name=seqused_k_name,
                      describe_array=describe_array)


def _field_indices(table, names):
    """The handler's attribute of where each operand and result goes: the
    index of each name's field in table (POINTER_FIELDS or
    BACKWARD_POINTER_FIELDS)."""
    return np.array([table.index(name) for name in names], dtype=np.uint8)


class ForwardPlan:
    """A planned forward call: the attribute blob, the field indices of
    the operands and results, which optional arrays it takes, the results'
    shapes and dtypes, and the workspace size."""

    __slots__ = ("plan", "fields", "optional", "out", "lse", "workspace_bytes")


def _abstract_sinks(arrays, describe_array):
    """The ArrayInfo of a call's abstract sinks, None where it has none."""
    return describe_array(arrays["sinks"], "sinks") if "sinks" in arrays else None


def plan_forward(q, k, v, layout, causal, softmax_scale, window, softcap, num_splits, arrays=None,
                 max_seqlen_q=None, max_seqlen_k=None, seqused_k_name="seqused_k", attention_chunk=0, sm_margin=0):
    """The ForwardPlan of a call on abstract arrays, with the binding's
    checks and messages; an UnsupportedError without a GPU (after the checks
    that need none). arrays: the call's optional arrays by field name
    (OPTIONAL_FIELDS), None or absent where not given."""
    arrays = {name: x for name, x in (arrays or {}).items() if x is not None}
    layout = _layout(layout)
    options = _options(causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin)
    qi, ki, vi = _info(q, "q", 0), _info(k, "k", 1), _info(v, "v", 2)
    describe_array = _stand_ins(len(POINTER_FIELDS))
    seqs = _abstract_sequences(arrays, max_seqlen_q, max_seqlen_k, seqused_k_name, describe_array)
    scales = _descales(0, arrays.get("q_descale"), arrays.get("k_descale"), arrays.get("v_descale"),
                       describe_array=describe_array)
    sinks = _abstract_sinks(arrays, describe_array)
    lib = library()
    try:
        geometry = _validate(qi, ki, vi, None, None, layout, seqs, descales=scales, options=options, sinks=sinks)
        out_dtype = geometry.out_dtype_name or qi.dtype
        out_shape = _out_shape(qi, geometry.views[2].shape[3])
        oi = _result_info(out_shape, out_dtype, "out", 3)
        li = _result_info(geometry.lse_shape, "float32", "lse", 4)
        params = _build(lib, qi, ki, vi, oi, li, layout, options, seqs, scales, sinks)
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    except InvalidArgumentError as e:
        raise _hint_bshd(e, qi, ki, vi, layout, seqs) from None
    workspace_bytes = get_handle(_gpu_ordinal()).workspace_size(params)
    optional = tuple(name for name in OPTIONAL_FIELDS if name in arrays)
    plan = ForwardPlan()
    plan.plan = _template(params, POINTER_FIELDS)
    plan.fields = _field_indices(POINTER_FIELDS, ("q", "k", "v") + optional + ("out", "lse"))
    plan.optional = optional
    plan.out = jax.ShapeDtypeStruct(out_shape, _jax_dtype(out_dtype))
    plan.lse = jax.ShapeDtypeStruct(tuple(geometry.lse_shape), np.float32)
    plan.workspace_bytes = workspace_bytes
    return plan


def _jax_dtype(name):
    return jax.numpy.dtype(name)


def forward(plan, q, k, v, arrays=None):
    """(out, lse) of a planned call (arrays: its optional arrays by field
    name, as planned)."""
    _register()
    arrays = arrays or {}
    operands = (q, k, v) + tuple(arrays[name] for name in plan.optional)
    call = jax.ffi.ffi_call(FORWARD_TARGET,
                            (plan.out, plan.lse, jax.ShapeDtypeStruct((plan.workspace_bytes,), np.uint8)),
                            vmap_method="sequential")
    out, lse, _ = call(*operands, plan=plan.plan, fields=plan.fields)
    return out, lse


class BackwardPlan:
    """A planned backward call, as ForwardPlan; sinks: whether it has sinks,
    and so gives their gradient too."""

    __slots__ = ("plan", "fields", "optional", "workspace_bytes", "sinks")


def plan_backward(q, k, v, out, lse, layout, causal, softmax_scale, window, softcap, deterministic, arrays=None,
                  max_seqlen_q=None, max_seqlen_k=None, seqused_k_name="seqused_k", attention_chunk=0, sm_margin=0):
    """The BackwardPlan of the gradients of a planned forward call (dout
    has out's shape and dtype; dq, dk, dv those of q, k, v; dsinks, with
    sinks, theirs). arrays: the forward's optional arrays by field name;
    those the backward pass does not take (a block table, descales) are
    refused as the torch path refuses them."""
    arrays = {name: x for name, x in (arrays or {}).items() if x is not None}
    layout = _layout(layout)
    options = _options(causal, softmax_scale, None, window, softcap, attention_chunk, sm_margin)
    main = (q, k, v, out, out, lse, q, k, v)
    infos = [_info(a, name, i) for i, (a, name) in enumerate(zip(main, BACKWARD_POINTER_FIELDS))]
    describe_array = _stand_ins(len(BACKWARD_POINTER_FIELDS))
    seqs = _abstract_sequences(arrays, max_seqlen_q, max_seqlen_k, seqused_k_name, describe_array)
    sinks = _abstract_sinks(arrays, describe_array)
    dsinks = None if sinks is None else describe_array(arrays["sinks"], "dsinks")
    if any(name in arrays for name in ("q_descale", "k_descale", "v_descale")):
        raise UnsupportedError("gradients of float8_e4m3fn calls are not supported (the backward pass takes float16 "
                               "and bfloat16); differentiate a 16-bit call, or stop the gradient")
    lib = library()
    try:
        params = _build_backward(lib, *infos, layout, options, bool(deterministic), seqs, sinks, dsinks)
        lib.check(lib.cdll.flashcore_backward_check(ctypes.byref(params)))
    except InvalidArgumentError as e:
        raise _hint_bshd(e, infos[0], infos[1], infos[2], layout, seqs) from None
    workspace_bytes = get_handle(_gpu_ordinal()).backward_workspace_size(params)
    optional = tuple(name for name in BACKWARD_OPTIONAL_FIELDS if name in arrays)
    plan = BackwardPlan()
    plan.plan = _template(params, BACKWARD_POINTER_FIELDS)
    plan.sinks = sinks is not None
    plan.fields = _field_indices(BACKWARD_POINTER_FIELDS, ("q", "k", "v", "out", "dout", "lse") + optional
                                 + ("dq", "dk", "dv") + (("dsinks",) if plan.sinks else ()))
    plan.optional = optional
    plan.workspace_bytes = workspace_bytes
    return plan


def backward(plan, q, k, v, out, dout, lse, arrays=None):
    """(dq, dk, dv, dsinks) of a planned call; dsinks None where it has no
    sinks."""
    _register()
    arrays = arrays or {}
    operands = (q, k, v, out, dout, lse) + tuple(arrays[name] for name in plan.optional)
    gradients = (q, k, v) + ((arrays["sinks"],) if plan.sinks else ())
    results = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in gradients)
    call = jax.ffi.ffi_call(BACKWARD_TARGET, results + (jax.ShapeDtypeStruct((plan.workspace_bytes,), np.uint8),),
                            vmap_method="sequential")
    grads = call(*operands, plan=plan.plan, fields=plan.fields)
    return tuple(grads[:3]) + ((grads[3] if plan.sinks else None),)
