"""flashcore.merge_states: merging attention results computed over parts of
the keys (flashcore_merge_states), and the parameter building under it."""

import ctypes
import sys
from typing import Any, Optional, Tuple, Union

from . import _ffi
from ._arrays import Array, check_known_to_driver, describe, is_torch
from ._errors import InvalidArgumentError, UnsupportedError
from ._fields import set_fields
from ._library import library
from ._params import _View, _check_int32_sizes, _check_lse, _check_one_device, _check_sinks, _layout
from ._plan import allocate, describe_first, get_handle

Dtype = _ffi.Dtype
Layout = _ffi.Layout
# The element types flashcore_merge_states reads and writes, by name.
MERGE_DTYPES = {"float16": Dtype.FP16, "bfloat16": Dtype.BF16, "float32": Dtype.FP32}
DTYPE_NAMES = {code: name for name, code in MERGE_DTYPES.items()}


def _dtype_name(dtype):
    """The name ("float16", "bfloat16" or "float32") of a dtype given as a
    string, a flashcore.Dtype, a torch dtype, or a NumPy/CuPy dtype or type."""
    if isinstance(dtype, Dtype):
        return DTYPE_NAMES[dtype]
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, type):
        name = dtype.__name__  # numpy.float16 and friends
    else:
        name = str(dtype)  # torch.float16 -> "torch.float16"; numpy dtype('float16') -> "float16"
    name = name.replace("torch.", "")
    if name not in MERGE_DTYPES:
        raise UnsupportedError("out_dtype must be one of %s, got %r" % (", ".join(MERGE_DTYPES), dtype))
    return name


def _validate(partial_out, partial_lse, out, lse, layout, out_dtype=None, sinks=None):
    """Checks what the C API cannot see (it takes one set of sizes for all
    arrays); strides, alignment and supported sizes are left to the library.
    Returns the views of partial_out and out (None when out is None) and the
    name of out's dtype."""
    pv = _View(partial_out, layout, states=True)
    ov = None if out is None else _View(out, layout)
    if partial_out.dtype not in MERGE_DTYPES:
        raise UnsupportedError("partial_out has dtype %s; flashcore merges %s"
                               % (partial_out.dtype, ", ".join(MERGE_DTYPES)))
    if out is not None:
        if out.dtype not in MERGE_DTYPES:
            raise UnsupportedError("out has dtype %s; flashcore merges into %s" % (out.dtype, ", ".join(MERGE_DTYPES)))
        if out_dtype is not None and out.dtype != out_dtype:
            raise InvalidArgumentError("out has dtype %s but out_dtype is %s" % (out.dtype, out_dtype))
        out_dtype = out.dtype
        if out.shape != partial_out.shape[1:]:
            raise InvalidArgumentError("out must have partial_out's shape without the leading state axis, %s, got %s"
                                       % (list(partial_out.shape[1:]), list(out.shape)))
        if out.readonly:
            raise InvalidArgumentError("out is read-only")
    states, batch, heads, seqlen, _ = pv.shape
    want = (states, batch, heads, seqlen)
    if len(partial_lse.shape) != 4 or partial_lse.shape != want or partial_lse.dtype != "float32":
        raise InvalidArgumentError("partial_lse must be float32 of shape [K, B, H, S] = %s, got %s %s"
                                   % (list(want), partial_lse.dtype, list(partial_lse.shape)))
    for view in (pv, ov):
        if view is not None:
            view.check_head_dim_contiguous()
    for info in (partial_out, partial_lse, out, lse):
        if info is not None:
            _check_int32_sizes(info)
    if lse is not None:
        _check_lse(lse, (batch, heads, seqlen), "[B, H, S]")
    if sinks is not None:
        _check_sinks(sinks, heads)
    _check_one_device((partial_out, partial_lse, out, lse, sinks), "partial_out, partial_lse, out, lse and sinks")
    return pv, ov, out_dtype or partial_out.dtype


def _build(lib, partial_out, partial_lse, out, lse, layout, sinks=None):
    pv, ov, out_dtype = _validate(partial_out, partial_lse, out, lse, layout, sinks=sinks)
    p = lib.new_merge_params()
    p.partial_dtype = MERGE_DTYPES[partial_out.dtype]
    p.out_dtype = MERGE_DTYPES[out_dtype]
    states, batch, heads, seqlen, head_dim = pv.shape
    set_fields(p, num_states=states, batch_size=batch, num_heads=heads, seqlen=seqlen, head_dim=head_dim,
               partial_out=partial_out.ptr, partial_lse=partial_lse.ptr, out=out.ptr,
               lse=lse.ptr if lse is not None else None, sinks=sinks.ptr if sinks is not None else None)
    state, batch, head, seq, _ = pv.aligned_strides()
    set_fields(p, partial_state_stride=state, partial_batch_stride=batch, partial_head_stride=head,
               partial_seq_stride=seq)
    # partial_lse is [K, B, H, S] whatever the layout; 4-byte elements need no stride rule.
    state, batch, head, seq = partial_lse.strides
    set_fields(p, lse_state_stride=state, lse_batch_stride=batch, lse_head_stride=head, lse_seq_stride=seq)
    batch, head, seq, _ = ov.aligned_strides()
    set_fields(p, out_batch_stride=batch, out_head_stride=head, out_seq_stride=seq)
    return p


def merge_params(partial_out: Array, partial_lse: Array, out: Array, *, lse: Optional[Array] = None,
                 layout: Union[str, int] = "bhsd", sinks: Optional[Array] = None) -> "_ffi.flashcore_merge_params":
    """A flashcore.MergeParams for these arrays (pointers, sizes, dtypes,
    strides), for the low-level Handle.merge_states. Arguments as for
    merge_states; out's dtype is the output dtype. The arrays must outlive
    every use of the result."""
    layout = _layout(layout)
    if out is None:
        raise TypeError("merge_params needs out (a CUDA array): the C struct has no default for it")
    infos = [None if a is None else describe(a, name) for a, name in
             ((partial_out, "partial_out"), (partial_lse, "partial_lse"), (out, "out"), (lse, "lse"),
              (sinks, "sinks"))]
    return _build(library(), *infos[:4], layout, infos[4])


def merge_states(partial_out: Array, partial_lse: Array, *, out: Optional[Array] = None, lse: Optional[Array] = None,
                 return_lse: bool = True, out_dtype: Any = None, layout: Union[str, int] = "bhsd",
                 stream: Any = None, sinks: Optional[Array] = None) -> Union[Array, Tuple[Array, Array]]:
    """Merges K attention results computed over disjoint parts of the keys
    into the result over all of them (flashcore_merge_states):

        lse = log(sum_s exp(partial_lse[s])),
        out = sum_s exp(partial_lse[s] - lse) * partial_out[s]

    Each part's out and lse are what attention(..., return_lse=True) gives
    for that part of the keys (a KV cache spread over devices, a shared
    prefix cached apart from each request's own keys, ...). A part in which a
    row sees no key has lse -inf and contributes nothing; rows that no part
    sees give out = 0 and lse = -inf, as attention does.

    partial_out: [K, B, H, S, D] (layout="bshd": [K, B, S, H, D]), float16,
        bfloat16 or float32; K >= 1 and D a multiple of 8. Any strides the C
        API accepts (head_dim contiguous, 16-byte aligned, other strides
        multiples of 16 bytes), e.g. torch.stack([out_a, out_b]).
    partial_lse: float32 [K, B, H, S] (whatever the layout, as attention's
        lse), any strides.
    out: where to write the result, [B, H, S, D] (or [B, S, H, D]), any
        strides the C API accepts; allocated with partial_out's framework
        when None.
    lse: where to write the merged log-sum-exp, contiguous float32
        [B, H, S]; allocated when return_lse is set and lse is None.
    return_lse: return (out, lse) (the default); False returns out alone,
        and lse is then written only when given.
    out_dtype: dtype of out when it is allocated: "float16", "bfloat16",
        "float32", a flashcore.Dtype or a framework dtype (e.g.
        torch.float32). None: out's dtype when out is given, else
        partial_out's. The merge computes in float32 either way.
    layout: "bhsd" or "bshd", as for attention().
    stream: where to queue the work, as for attention(); None: the current
        stream of partial_out's framework.
    sinks: learnable sinks (attention()'s sinks): None, or a float32 CUDA
        array [H], one logit per head. Head h's sink joins each of its rows
        as one more part, of lse sinks[h] and output 0:
            lse = log(exp(sinks[h]) + sum_s exp(partial_lse[s])),
            out = sum_s exp(partial_lse[s] - lse) * partial_out[s];
        a row that no part sees gets out = 0 and lse = sinks[h]. Give it
        only to the merge of all of a row's parts, each computed without
        sinks: a result merged again would count the sink twice.

    Returns without waiting for the GPU. Raises flashcore.FlashcoreError
    subclasses carrying the library's status and message.

    Not differentiable: a partial_out that requires grad while grad mode is
    on raises UnsupportedError rather than giving a result without a
    gradient path (attention's lse has no gradient either, so train on the
    attention over all the keys, or merge under torch.no_grad()).
    """
    if is_torch(partial_out) and partial_out.requires_grad and sys.modules["torch"].is_grad_enabled():
        raise UnsupportedError("merge_states has no backward pass, and partial_out requires grad: the result would "
                               "have no gradient path. Merge under torch.no_grad() (or pass partial_out.detach()), "
                               "or train on attention over all the keys")
    layout = _layout(layout)
    wanted = None if out_dtype is None else _dtype_name(out_dtype)
    pi, s = describe_first(partial_out, "partial_out", stream)
    pli = describe(partial_lse, "partial_lse", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    si = None if sinks is None else describe(sinks, "sinks", s)
    pv, _, out_name = _validate(pi, pli, oi, li, layout, wanted, si)
    lib = library()
    if oi is None:
        out = allocate(pi, pi.shape[1:], None if out_name == pi.dtype else out_name, s, "out")
        oi = describe(out, "out", s)
    if li is None and return_lse:
        lse = allocate(pi, pv.shape[1:4], "float32", s, "lse")
        li = describe(lse, "lse", s)
    params = _build(lib, pi, pli, oi, li, layout, si)
    # The library's verdict first, as flashcore_merge_states gives it: an
    # empty merge is still checked, and an argument error is reported as
    # such before a handle (a GPU) is asked for.
    lib.check(lib.cdll.flashcore_merge_check(ctypes.byref(params)))
    if 0 in (params.batch_size, params.num_heads, params.seqlen):
        # An empty result (flashcore.h): nothing to merge, nothing launched.
        return (out, lse) if return_lse else out
    check_known_to_driver((pi, pli, oi, li, si))
    device = next((a.device for a in (pi, pli, oi) if a.device is not None), None)
    get_handle(device).merge_states(params, s)
    return (out, lse) if return_lse else out

