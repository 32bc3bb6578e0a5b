"""The one planning path of a forward call. Describing and checking the
arrays, converting the options and building the params struct depend only
on the arrays' shapes, strides, dtypes and devices and on the options:
plan_of() keys a call on all of those, and a call whose key was seen before is
served from the plan the full path made of it (the params but for the
addresses, the shapes to allocate, the workspace size once asked), with
its own addresses put in. prepare() serves a call from its plan, or makes
and keeps the plan on the full path; launch_plain (_launch) and the
compiled path (_fastpath.remember) run the plans made here. Whatever
depends on the addresses is still checked on every call: by
flashcore_forward itself (alignment, overlaps, NULL), and for
__cuda_array_interface__ arrays by the driver (their device and that it
knows the memory)."""

import ctypes
import math
import sys

from ._arguments import _layout, _options
from ._arrays import (allocate, cai_signature, check_known_to_driver, contiguous_strides, cuda_driver, describe,
                      describe_first, pointer_device, stream_pointer)
from ._errors import InvalidArgumentError
from ._geometry import (_backward_is_empty, _build, _build_backward, _descales, _hint_bshd, _is_empty, _names,
                        _one_device, _out_shape, _sequences, _validate)
from ._launch import _BackwardParams, _Call, _new, _Params, torch_current_stream
from ._library import library

# Fields of flashcore_forward_params holding the arrays' addresses, in the
# order plan_of takes the arrays.
POINTER_FIELDS = ("q", "k", "v", "out", "lse", "seqused_k", "cu_seqlens_q", "cu_seqlens_k", "block_table",
                  "q_descale", "k_descale", "v_descale")
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
    is the driver's, asked each call), whether q, k or v requires grad, and
    the workspace size per device once asked; plain_torch: whether a call on
    torch's current stream may take _launch.launch_plain (torch tensors
    only, none requiring grad, no lse, cu_seqlens or block_table given, a
    result that is not empty; seqused_k and descales may be given);
    out_like_q: whether out is allocated with q's shape, dtype and
    contiguous strides, which torch.empty_like(q) gives for a contiguous q
    (in less host time; never for fp8 queries, whose out is bfloat16)."""

    __slots__ = ("template", "empty", "out_shape", "lse_shape", "dtype", "lse_dtype", "target", "torch_device",
                 "device", "names", "given", "cai_arrays", "requires_grad", "workspace_bytes", "plain_torch", "out_like_q")


class _Target:
    """Where a plan's arrays are allocated: ArrayInfo's framework and device."""

    __slots__ = ("framework", "device")

    def __init__(self, framework, device):
        self.framework, self.device = framework, device


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
    there is none yet: prepare()'s full path makes it). arrays: the call's,
    in POINTER_FIELDS order (None where not given); addresses: theirs.
    NOT_PLANNED unless every array given is a torch tensor (not a
    subclass) or has a cai_signature(), and every option is a plain value.
    The arrays' parts of the key are _array_key()'s."""
    if workspace is not None:
        return NOT_PLANNED
    causal, softmax_scale, num_splits, window, softcap = options
    if type(window) is list:
        window = tuple(window)
    if not (type(layout) is str and (softmax_scale is None or type(softmax_scale) in _PLAIN_REAL)
            and (num_splits is None or type(num_splits) is int) and type(softcap) in _PLAIN_REAL
            and (window is None or type(window) is tuple and len(window) == 2
                 and type(window[0]) is int and type(window[1]) is int)
            and (max_seqlen_q is None or type(max_seqlen_q) is int)
            and (max_seqlen_k is None or type(max_seqlen_k) is int)):
        return NOT_PLANNED
    keyed = _array_key([layout, 1 if causal else 0, softmax_scale, num_splits, window, softcap, bool(return_lse),
                        max_seqlen_q, max_seqlen_k], arrays)
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
    where an array is neither a torch tensor (not a subclass) nor has a
    cai_signature(). A torch tensor's part is its shape, strides, dtype,
    device index (-1 for the CPU: never planned, the full path refuses it)
    and requires_grad."""
    torch = sys.modules.get("torch")
    tensor_type = None if torch is None else torch.Tensor
    addresses = [None] * len(arrays)
    q_stream = None
    for i, a in enumerate(arrays):
        if a is None:
            continue
        if type(a) is tensor_type:  # read here rather than in a call: the common case, and a call's time counts
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


def _keep_plan(key, params, infos, out_shape, lse_shape, device, out_dtype_name=None):
    """Keeps the plan of a call that took the full path (infos: the
    ArrayInfos of the arrays, in POINTER_FIELDS order, None where not
    given; out_dtype_name: out's dtype where it is not q's, as
    _Geometry.out_dtype_name: bfloat16 for fp8 queries)."""
    q = infos[0]
    plan = _Plan()
    plan.template = bytes(params)
    plan.empty = _is_empty(params)
    plan.out_shape, plan.lse_shape = out_shape, lse_shape
    if q.framework != "torch":
        plan.dtype = None
    elif out_dtype_name is None:
        plan.dtype = q.obj.dtype
    else:
        plan.dtype = getattr(sys.modules["torch"], out_dtype_name)
    plan.lse_dtype = sys.modules["torch"].float32 if q.framework == "torch" else "float32"
    plan.target = _Target(q.framework, q.device)
    plan.torch_device = q.obj.device if q.framework == "torch" else None
    plan.device = device
    plan.names = _names(infos)
    plan.given = tuple(i for i, a in enumerate(infos) if a is not None)
    plan.cai_arrays = tuple((i, a.name) for i, a in enumerate(infos) if a is not None and a.framework is None)
    plan.requires_grad = any(a.framework == "torch" and a.obj.requires_grad for a in infos[:3])
    plan.workspace_bytes = {}
    plan.plain_torch = (q.framework == "torch" and not plan.cai_arrays and not plan.requires_grad and not plan.empty
                        and device is not None and (infos[4] is None or lse_shape is not None)
                        and infos[6] is None and infos[7] is None and infos[8] is None)
    plan.out_like_q = (plan.plain_torch and out_shape is not None and out_shape == tuple(q.obj.shape)
                       and out_dtype_name is None and q.obj.is_contiguous())
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def _prepare_cached(plan, addresses, q_stream, out, lse, return_lse, stream):
    """A planned call: plan's params with this call's addresses."""
    if stream is not None:
        s = stream_pointer(stream)
    elif plan.target.framework == "torch":
        s = torch_current_stream(plan.device)
    else:
        s = q_stream or 0
    on_current_stream = stream is None  # allocating on it needs no stream context
    if plan.out_shape is not None:
        out = _new(plan, plan.out_shape, plan.dtype, s, on_current_stream)
        addresses[3] = out.data_ptr()
    if plan.lse_shape is not None:
        lse = _new(plan, plan.lse_shape, plan.lse_dtype, s, on_current_stream)
        addresses[4] = lse.data_ptr()
    result = (out, lse) if return_lse else out
    if plan.empty:
        return _Call(result)
    params = _Params.from_buffer_copy(plan.template)
    for i in plan.given:
        setattr(params, POINTER_FIELDS[i], addresses[i])
    device = plan.device
    if plan.cai_arrays and cuda_driver() is not None:  # without a driver there is nothing to ask
        # In the full path's order: the library's verdict on the addresses, then the driver's.
        lib = library()
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
        pointers = [_Pointer(name, addresses[i]) for i, name in plan.cai_arrays]
        check_known_to_driver(pointers)
        device = _one_device([device] + [pointer_device(p.ptr) for p in pointers], plan.names)
    return _Call(result, params, device, s, plan.target, None, plan, on_current_stream)


def _prepare_in_full(q, k, v, layout, options, out, lse, return_lse, stream, workspace, sequences, descales, key):
    """The full path: describes and checks everything, and keeps the plan
    under `key` where it is not None. descales: (q_descale, k_descale,
    v_descale) as the caller gave them."""
    layout = _layout(layout)
    options = _options(*options)
    qi, s = describe_first(q, "q", stream)
    ki, vi = describe(k, "k", s), describe(v, "v", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    seqs = _sequences(s, **sequences)
    scales = _descales(s, *descales)
    lib = library()
    try:
        geometry = _validate(qi, ki, vi, oi, li, layout, seqs, descales=scales, options=options)
        out_shape = _out_shape(qi, geometry.views[2].shape[3]) if oi is None else None
        lse_shape = geometry.lse_shape if li is None and return_lse else None
        if out_shape is not None:
            # q's dtype, but bfloat16 for fp8 queries (out_dtype_name).
            out = allocate(qi, out_shape, geometry.out_dtype_name, s, "out")
            oi = describe(out, "out", s)
        if lse_shape is not None:
            lse = allocate(qi, lse_shape, "float32", s, "lse")
            li = describe(lse, "lse", s)
        params = _build(lib, qi, ki, vi, oi, li, layout, options, seqs, scales)
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    except InvalidArgumentError as e:
        raise _hint_bshd(e, qi, ki, vi, layout, seqs) from None
    infos = (qi, ki, vi, oi, li) + seqs.arrays() + scales.arrays()
    device = next((a.device for a in (qi, ki, vi, oi) if a.device is not None), None)
    if key is not None:
        _keep_plan(key, params, infos, out_shape, lse_shape, device, geometry.out_dtype_name)
    result = (out, lse) if return_lse else out
    if _is_empty(params):
        # As PyTorch: an empty result, nothing launched (no GPU needed).
        return _Call(result)
    check_known_to_driver(infos)
    given = None
    if workspace is not None:
        wi = describe(workspace, "workspace", s)
        if wi.strides != contiguous_strides(wi.shape):
            raise InvalidArgumentError("workspace must be contiguous")
        check_known_to_driver((wi,))
        given = (wi.ptr, math.prod(wi.shape) * wi.itemsize)
    return _Call(result, params, device, s, qi, given)


def prepare(q, k, v, layout, options, out, lse, return_lse, stream, workspace, seqused_k=None, cu_seqlens_q=None,
            max_seqlen_q=None, cu_seqlens_k=None, max_seqlen_k=None, block_table=None, seqused_k_name="seqused_k",
            q_descale=None, k_descale=None, v_descale=None, planned=None):
    """Everything a forward call does before it asks for a handle: a _Call
    for launch(), from the call's plan, or from the full path, which keeps
    the plan it makes under the call's key. The result has no gradient
    path: calls that need one are flashcore::forward's (_torch_ops), which
    comes here below autograd. options: (causal, softmax_scale,
    num_splits, window, softcap) as the caller gave them; the keywords up
    to seqused_k_name are _sequences', the descales _descales'. planned:
    plan_of's answer for this call, where the caller has it already."""
    if planned is None:
        planned = plan_of((q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, q_descale,
                           k_descale, v_descale), layout, options, return_lse, max_seqlen_q, max_seqlen_k, workspace)
    key, plan, addresses, q_stream = planned
    if plan is not None:
        return _prepare_cached(plan, addresses, q_stream, out, lse, return_lse, stream)
    sequences = dict(seqused_k=seqused_k, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                     cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, block_table=block_table,
                     seqused_k_name=seqused_k_name)
    return _prepare_in_full(q, k, v, layout, options, out, lse, return_lse, stream, workspace, sequences,
                            (q_descale, k_descale, v_descale), key)


# --------------------------------------------------------------------------
# The backward pass (flashcore::backward, on torch tensors): planned as the
# forward is, under a key of the arrays and options.
# --------------------------------------------------------------------------

# Fields of flashcore_backward_params holding the arrays' addresses, in the
# order prepare_backward takes the arrays.
BACKWARD_POINTER_FIELDS = ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", "seqused_k", "cu_seqlens_q",
                           "cu_seqlens_k")
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
    (causal, softmax_scale, window, softcap) as the caller gave them."""
    causal, softmax_scale, window, softcap = options
    layout = _layout(layout)
    options = _options(causal, softmax_scale, None, window, softcap)
    infos = [None if a is None else describe(a, name, stream) for a, name in zip(arrays[:9], BACKWARD_POINTER_FIELDS)]
    seqs = _sequences(stream, seqused_k=arrays[9], cu_seqlens_q=arrays[10], max_seqlen_q=max_seqlen_q,
                      cu_seqlens_k=arrays[11], max_seqlen_k=max_seqlen_k)
    try:
        return _build_backward(library(), *infos, layout, options, deterministic, seqs), infos[0].device
    except InvalidArgumentError as e:
        raise _hint_bshd(e, infos[0], infos[1], infos[2], layout, seqs) from None


def backward_key(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k):
    """(key, addresses) of a backward call (prepare_backward's arguments),
    the key its plan is kept under; (None, None) where _array_key reads
    none."""
    causal, softmax_scale, window, softcap = options
    keyed = _array_key([layout, bool(causal), softmax_scale, None if window is None else tuple(window), softcap,
                        bool(deterministic), max_seqlen_q, max_seqlen_k], arrays)
    return (None, None) if keyed is None else keyed[:2]


def prepare_backward(arrays, layout, options, deterministic, max_seqlen_q, max_seqlen_k):
    """(params, plan) of a backward call on torch tensors: arrays in
    BACKWARD_POINTER_FIELDS order (None where not given), options (causal,
    softmax_scale, window, softcap) as flashcore::backward has them. A
    call whose key was seen before gets its plan's params with its own
    addresses (flashcore_backward checks them, alignment and overlaps, on
    every call); else the full path builds and checks them
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
