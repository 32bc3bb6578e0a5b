"""flashcore.attention, attention_varlen and attention_with_kvcache, and
the parameter building under them."""

import collections
import ctypes
import math
import numbers
import sys
from typing import Any, List, Optional, Tuple, Union

from . import _fastpath, _ffi
from ._arrays import (Array, can_allocate, check_known_to_driver, contiguous_strides, current_stream, describe, empty,
                      cai_signature, cuda_driver, full, is_cupy, is_torch, pointer_device, shape_of,
                      stream_pointer)
from ._checked import fits, set_fields, shown, struct_ref, whole_number
from ._errors import FlashcoreError, InvalidArgumentError, InvalidArgumentTypeError, UnsupportedError
from ._library import get_handle, library
from ._torch_ops import refuse_grad, traced_forward, traced_full_int32, tracing

Layout = _ffi.Layout
# Axes of (batch, heads, seqlen) in each layout; head_dim is always the last.
LAYOUT_AXES = {Layout.BHSD: (0, 1, 2), Layout.BSHD: (0, 2, 1)}
DTYPES = {"float16": _ffi.Dtype.FP16, "bfloat16": _ffi.Dtype.BF16}
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
# The smallest positive float32 (a subnormal, 2**-149); half of it (2**-150)
# and less round to 0 as a float32.
FLOAT32_TINY = 2.0**-149


def _layout(layout):
    if isinstance(layout, str):
        if layout.upper() in Layout.__members__:
            return Layout[layout.upper()]
    else:
        # An int (or a flashcore.Layout); 1.0 and True are not layouts.
        layout = whole_number(layout, "layout")
    try:
        return Layout(layout)
    except ValueError:
        raise InvalidArgumentError("layout must be one of %s, got %r"
                                   % (", ".join(repr(n.lower()) for n in Layout.__members__), layout)) from None


def _softmax_scale(softmax_scale, name="softmax_scale"):
    """The C softmax_scale for the Python argument (called `name`): None
    (1 / sqrt(head_dim)) is the C API's 0; a real number is refused where
    its float32 would not be what was meant: 0 itself, of either sign (the C
    API reads +0 as the default, which is spelled None here), a value beyond
    a float32 (it would become infinite; an int beyond any float too), and a
    nonzero one that rounds to 0 as a float32 (1e-50 would become the
    default, -1e-50 -0.0). What is wrong with a value that survives the
    conversion (negative, NaN, infinite, too large once times log2(e)) is
    the library's check."""
    if softmax_scale is None:
        return _ffi.FLASHCORE_SOFTMAX_SCALE_DEFAULT
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise InvalidArgumentTypeError("%s must be None or a real number, got %s %s"
                                       % (name, type(softmax_scale).__name__, shown(softmax_scale)))
    try:
        scale = float(softmax_scale)
    except OverflowError:  # an int beyond any float
        scale = None
    if scale is None or math.isfinite(scale) and abs(scale) > FLOAT32_MAX:
        # ctypes would store it as an infinite float32.
        raise InvalidArgumentError("%s %s does not fit a float32 (at most %g)" % (name, shown(softmax_scale),
                                                                                FLOAT32_MAX))
    if scale == _ffi.FLASHCORE_SOFTMAX_SCALE_DEFAULT:
        # The C API reads 0 as "default"; from Python that is spelled None.
        raise InvalidArgumentError("%s must be > 0 (None means 1 / sqrt(head_dim)), got %r" % (name, softmax_scale))
    if abs(scale) <= FLOAT32_TINY / 2:  # what rounds to 0 as a float32 (ties to even: 2**-150 does)
        if scale > 0:
            rounded, why = "0.0", "which the C API reads as the default, 1 / sqrt(head_dim) (None asks for that)"
        else:
            rounded, why = "-0.0", "and a scale must be > 0"
        raise InvalidArgumentError("%s %r is %s as a float32 (the C API's type), %s; the smallest positive float32 "
                                   "is %.7g" % (name, softmax_scale, rounded, why, FLOAT32_TINY))
    return scale


def _num_splits(num_splits):
    """The C num_splits for the Python argument: None (the library chooses)
    is 0; otherwise a whole number from 1 (never split) up."""
    if num_splits is None:
        return 0
    n = whole_number(num_splits, "num_splits")
    if n == 0:
        # The C API reads 0 as "choose"; from Python that is spelled None.
        raise InvalidArgumentError("num_splits must be >= 1 (None lets the library choose), got 0")
    n = fits(n, ctypes.c_int32, "num_splits")
    return n  # negative or above FLASHCORE_MAX_NUM_SPLITS: the library says why not


def _window(window):
    """The C (use_window, window_left, window_right) for the Python argument:
    None (no window) is use_window 0, the bounds left at their default 0;
    a pair (left, right), FlashAttention's window_size, is use_window 1 with
    those bounds, each -1 (unbounded on that side) or >= 0. That a causal
    call's right bound is -1 or 0 is the library's check."""
    if window is None:
        return 0, 0, 0
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise InvalidArgumentTypeError("window must be None or a pair (left, right) of ints, got %s %s"
                                       % (type(window).__name__, shown(window)))
    bounds = []
    for side, bound in zip(("left", "right"), window):
        what = "window's %s bound" % side
        bound = fits(bound, ctypes.c_int32, what)
        if bound < -1:
            raise InvalidArgumentError("%s (%d) must be -1 (unbounded) or >= 0 (keys seen on that side of the "
                                       "diagonal)" % (what, bound))
        bounds.append(bound)
    return (1, *bounds)


def _softcap(softcap):
    """The C softcap for the Python argument: 0 (off) or a finite real > 0,
    refused where its float32 would differ in kind (infinite, or 0 for a
    value that is not). The limits that depend on softmax_scale too are the
    library's check."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise InvalidArgumentTypeError("softcap must be a real number (0 for none), got %s %s"
                                       % (type(softcap).__name__, shown(softcap)))
    try:
        cap = float(softcap)
    except OverflowError:  # an int beyond any float
        cap = math.inf
    if not (math.isfinite(cap) and cap >= 0):
        raise InvalidArgumentError("softcap must be finite and >= 0 (0 for none), got %s" % shown(softcap))
    if cap > FLOAT32_MAX:
        raise InvalidArgumentError("softcap %s does not fit a float32 (at most %g)" % (shown(softcap), FLOAT32_MAX))
    if cap > 0 and ctypes.c_float(cap).value == 0:
        # The C API would read the rounded 0 as "no softcap".
        raise InvalidArgumentError("softcap %r is 0 as a float32, which means no softcap" % softcap)
    return cap


# The converted keyword arguments every forward call takes: causal as 0/1,
# scale, num_splits as the C API reads them, window as (use_window,
# window_left, window_right) from _window, softcap.
_Options = collections.namedtuple("_Options", "causal scale num_splits window softcap")


def _options(causal, softmax_scale, num_splits, window, softcap):
    return _Options(1 if causal else 0, _softmax_scale(softmax_scale), _num_splits(num_splits), _window(window),
                    _softcap(softcap))


# How packed (variable-length) tensors are described in messages.
PACKED_WORDS = "[total, H, D] (the rows of every sequence, one after another)"


def _paged_words(layout):
    if layout == Layout.BSHD:
        return "[num_pages, page_size, H, D] (a page pool)"
    return "[num_pages, H, page_size, D] (a page pool)"


class _View:
    """An array seen as [batch, heads, seqlen, head_dim] through a layout,
    after a leading state axis where `states` (merge_states' partials).
    A packed array, [total, heads, head_dim], is seen as one batch of all
    its rows with batch stride 0: the C API takes each sequence's rows from
    cu_seqlens and ignores the batch strides of packed tensors. `words`
    describes the expected shape in messages, where the layout's default
    does not."""

    def __init__(self, info, layout, states=False, packed=False, words=None):
        self.info = info
        if packed:
            if len(info.shape) != 3:
                raise InvalidArgumentError("%s must be 3-D, %s, got shape %s"
                                           % (info.name, words or PACKED_WORDS, list(info.shape)))
            rows, heads, dim = info.shape
            row_stride, head_stride, dim_stride = info.strides
            self.shape = (1, heads, rows, dim)
            self.strides = (0, head_stride, row_stride, dim_stride)
            return
        ndim = 5 if states else 4
        if len(info.shape) != ndim:
            raise InvalidArgumentError("%s must be %d-D, %s, got shape %s"
                                       % (info.name, ndim, words or _shape_words(layout, states), list(info.shape)))
        first = 1 if states else 0
        axes = ((0,) if states else ()) + tuple(first + a for a in LAYOUT_AXES[layout]) + (first + 3,)
        self.shape = tuple(info.shape[a] for a in axes)
        self.strides = tuple(info.strides[a] for a in axes)

    def check_head_dim_contiguous(self):
        if self.strides[-1] != 1 and self.shape[-1] > 1:
            raise InvalidArgumentError(
                "%s's last dimension (head_dim) must be contiguous (stride 1), got stride %d: pass a copy "
                "(e.g. .contiguous()) instead" % (self.info.name, self.strides[-1]))

    def aligned_strides(self):
        """The strides, with those of size-1 dimensions (never stepped along;
        frameworks give them arbitrary values) zeroed where they would break
        the alignment rule."""
        step = max(_ffi.FLASHCORE_ALIGNMENT // self.info.itemsize, 1)
        return tuple(0 if size == 1 and stride % step else stride for size, stride in zip(self.shape, self.strides))


def _shape_words(layout, states=False):
    prefix = "K, " if states else ""
    if layout == Layout.BSHD:
        return "[%sB, S, H, D] (layout='bshd')" % prefix
    return "[%sB, H, S, D]" % prefix


def _check_int32_sizes(info):
    for size in info.shape:
        if size > INT32_MAX:
            raise InvalidArgumentError("%s has a dimension of %d, more than the C API's int32" % (info.name, size))


def _check_lse(lse, want, words):
    """lse: float32 of shape `want` (named `words`), contiguous, writable."""
    if lse.shape != want or lse.dtype != "float32":
        raise InvalidArgumentError("lse must be float32 of shape %s = %s, got %s %s"
                                   % (words, list(want), lse.dtype, list(lse.shape)))
    if any(st != c for size, st, c in zip(lse.shape, lse.strides, contiguous_strides(lse.shape)) if size > 1):
        raise InvalidArgumentError("lse must be contiguous, got strides %s" % (list(lse.strides),))
    if lse.readonly:
        raise InvalidArgumentError("lse is read-only")


def _check_contiguous_vector(info):
    if info.shape[0] > 1 and info.strides[0] != 1:
        raise InvalidArgumentError("%s must be contiguous, got stride %d" % (info.name, info.strides[0]))


def _check_int32_vector(info, length, words):
    """info: a contiguous int32 vector of `length` entries; `words` is its
    shape as messages give it."""
    if info.dtype != "int32" or tuple(info.shape) != (length,):
        raise InvalidArgumentError("%s must be int32 of shape %s, got %s %s"
                                   % (info.name, words, info.dtype, list(info.shape)))
    _check_contiguous_vector(info)


def _batch_from_cu_seqlens(cu_seqlens):
    """B of packed sequences: cu_seqlens holds B + 1 int32 offsets."""
    if cu_seqlens.dtype != "int32" or len(cu_seqlens.shape) != 1 or cu_seqlens.shape[0] < 1:
        raise InvalidArgumentError("%s must be int32 of shape [B + 1] (the row where each of the B sequences "
                                   "starts, then the end), got %s %s"
                                   % (cu_seqlens.name, cu_seqlens.dtype, list(cu_seqlens.shape)))
    _check_contiguous_vector(cu_seqlens)
    return cu_seqlens.shape[0] - 1


def _check_block_table(table, batch, batch_words):
    """table: int32 [B, max_pages]; only its rows need be contiguous (a
    view of a wider table works: the C API takes the row stride)."""
    if table.dtype != "int32" or len(table.shape) != 2 or table.shape[0] != batch:
        raise InvalidArgumentError("block_table must be int32 of shape [B, max_pages] with B = %d (%s), got %s %s"
                                   % (batch, batch_words, table.dtype, list(table.shape)))
    if table.shape[1] > 1 and table.strides[1] != 1:
        raise InvalidArgumentError("block_table's rows must be contiguous (stride 1 along max_pages), got stride %d"
                                   % table.strides[1])


def _check_one_device(arrays, names):
    """The one CUDA device of the arrays (None where none is known)."""
    return _one_device([a.device for a in arrays if a is not None], names)


def _one_device(devices, names):
    distinct = sorted({d for d in devices if d is not None})
    if len(distinct) > 1:
        raise InvalidArgumentError("%s must be on one device, got devices %s" % (names, distinct))
    return distinct[0] if distinct else None


def _names(infos):
    """'a, b and c' of the arrays given."""
    names = [a.name for a in infos if a is not None]
    return names[0] if len(names) == 1 else "%s and %s" % (", ".join(names[:-1]), names[-1])


def _out_shape(q, head_dim_v):
    """out's shape, in q's own layout: q's, with head_dim_v last."""
    return tuple(q.shape[:-1]) + (head_dim_v,)


class _Sequences:
    """Where a call's sequences lie when the arrays are not all dense
    [B, ...] tensors of full length: the described int32 arrays (None where
    not used) and the longest packed sequences (None without cu_seqlens)."""

    __slots__ = ("seqused_k", "cu_seqlens_q", "cu_seqlens_k", "block_table", "max_seqlen_q", "max_seqlen_k")

    def __init__(self, seqused_k=None, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None, max_seqlen_q=None,
                 max_seqlen_k=None):
        self.seqused_k = seqused_k
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.block_table = block_table
        self.max_seqlen_q = max_seqlen_q
        self.max_seqlen_k = max_seqlen_k

    def arrays(self):
        return (self.seqused_k, self.cu_seqlens_q, self.cu_seqlens_k, self.block_table)


DENSE = _Sequences()


def _max_seqlen(value, cu_seqlens, side):
    """The C seqlen_q/_k of packed sequences: max_seqlen_<side>, which
    comes with cu_seqlens_<side> and only with it."""
    name = "max_seqlen_" + side
    if cu_seqlens is None:
        if value is not None:
            raise InvalidArgumentError("%s is given without cu_seqlens_%s; it is the longest of the packed sequences "
                                       "that cu_seqlens_%s describes" % (name, side, side))
        return None
    if value is None:
        raise TypeError("cu_seqlens_%s needs %s, the longest of its sequences (it sizes the grid)" % (side, name))
    value = fits(value, ctypes.c_int32, name)
    if value < 0:
        raise InvalidArgumentError("%s (%d) must be >= 0" % (name, value))
    return value


def _sequences(stream, seqused_k=None, cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k=None, max_seqlen_k=None,
               block_table=None, seqused_k_name="seqused_k"):
    """_Sequences from the Python arguments, arrays described on `stream`
    (seqused_k under the name the caller knows it by)."""
    if cu_seqlens_k is not None and block_table is not None:
        raise InvalidArgumentError("cu_seqlens_k and block_table cannot be combined: a paged cache's key counts come "
                                   "from seqused_k (cu_seqlens_q with a block_table is supported)")
    max_q, max_k = _max_seqlen(max_seqlen_q, cu_seqlens_q, "q"), _max_seqlen(max_seqlen_k, cu_seqlens_k, "k")

    def info(x, name):
        return None if x is None else describe(x, name, stream)

    return _Sequences(info(seqused_k, seqused_k_name), info(cu_seqlens_q, "cu_seqlens_q"),
                      info(cu_seqlens_k, "cu_seqlens_k"), info(block_table, "block_table"), max_q, max_k)


class _Geometry:
    """The sizes of one call as the C API takes them, with the views of q,
    k, v and out (out's None when not given)."""

    __slots__ = ("views", "batch", "seqlen_q", "seqlen_k", "total_q", "total_k", "page_size", "num_pages",
                 "table_stride", "lse_shape", "lse_words")

    def __init__(self, views, batch, seqlen_q, seqlen_k):
        self.views = views
        self.batch, self.seqlen_q, self.seqlen_k = batch, seqlen_q, seqlen_k
        self.total_q = self.total_k = self.page_size = self.num_pages = self.table_stride = 0
        self.lse_shape, self.lse_words = (batch, views[0].shape[1], seqlen_q), "[B, H, Sq]"


def _validate(q, k, v, out, lse, layout, seqs=DENSE):
    """Checks what the C API cannot see (it takes one dtype and one set of
    sizes for all tensors) and returns the call's _Geometry; strides,
    alignment, head counts and supported sizes are left to the library's
    own validation."""
    packed_q, packed_kv = seqs.cu_seqlens_q is not None, seqs.cu_seqlens_k is not None
    paged = seqs.block_table is not None
    kv_words = _paged_words(layout) if paged else None
    qv = _View(q, layout, packed=packed_q)
    kv, vv = (_View(a, layout, packed=packed_kv, words=kv_words) for a in (k, v))
    ov = None if out is None else _View(out, layout, packed=packed_q)
    views = [a for a in (qv, kv, vv, ov) if a is not None]
    if q.dtype not in DTYPES:
        raise UnsupportedError("q has dtype %s; flashcore computes on %s" % (q.dtype, " or ".join(DTYPES)))
    for a in (k, v, out):
        if a is not None and a.dtype != q.dtype:
            raise InvalidArgumentError("%s has dtype %s but q has %s: all must match" % (a.name, a.dtype, q.dtype))
    if kv.shape[:3] != vv.shape[:3]:
        raise InvalidArgumentError("k and v must have the same shape but for the last dimension (v's is head_dim_v), "
                                   "got %s and %s" % (list(k.shape), list(v.shape)))
    if kv.shape[3] != qv.shape[3]:
        raise InvalidArgumentError("q %s and k %s must have the same head_dim (their last dimension)"
                                   % (list(q.shape), list(k.shape)))
    if packed_q:
        batch, batch_words = _batch_from_cu_seqlens(seqs.cu_seqlens_q), "from cu_seqlens_q"
    else:
        batch, batch_words = qv.shape[0], "q's batch size"
    if not (packed_kv or paged) and kv.shape[0] != batch:
        raise InvalidArgumentError("k %s must have batch size B = %d (%s, %s)"
                                   % (list(k.shape), batch, batch_words, _shape_words(layout)))
    if out is not None:
        want = _out_shape(q, vv.shape[3])
        if out.shape != want:
            raise InvalidArgumentError("out must have q's shape with v's last dimension (head_dim_v), %s, got %s"
                                       % (list(want), list(out.shape)))
        if out.readonly:
            raise InvalidArgumentError("out is read-only")
    for view in views:
        view.check_head_dim_contiguous()
        _check_int32_sizes(view.info)

    geometry = _Geometry(views, batch, seqs.max_seqlen_q if packed_q else qv.shape[2], kv.shape[2])
    if packed_q:
        geometry.total_q = qv.shape[2]
        geometry.lse_shape, geometry.lse_words = (qv.shape[1], qv.shape[2]), "[Hq, total_q]"
    if packed_kv:
        _check_int32_vector(seqs.cu_seqlens_k, batch + 1, "[B + 1] = [%d] (B = %d, %s: the row where each sequence "
                            "starts in k and v, then the end)" % (batch + 1, batch, batch_words))
        geometry.seqlen_k, geometry.total_k = seqs.max_seqlen_k, kv.shape[2]
    if paged:
        table = seqs.block_table
        _check_block_table(table, batch, batch_words)
        geometry.num_pages, geometry.page_size = kv.shape[0], kv.shape[2]
        # Each sequence holds up to max_pages pages: that is the capacity.
        geometry.seqlen_k = table.shape[1] * geometry.page_size
        # A one-row table's stride is never stepped along (frameworks give
        # such strides arbitrary values); the C API only asks it be >= 0.
        geometry.table_stride = table.strides[0] if batch > 1 else table.shape[1]
    if seqs.seqused_k is not None:
        _check_int32_vector(seqs.seqused_k, batch, "[B] = [%d] (one key count per sequence)" % batch)
    if lse is not None:
        _check_lse(lse, geometry.lse_shape, geometry.lse_words)
    arrays = (q, k, v, out, lse) + seqs.arrays()
    _check_one_device(arrays, _names(arrays))
    return geometry


def _address(info):
    return None if info is None else info.ptr


def _build(lib, q, k, v, out, lse, layout, options, seqs=DENSE):
    """A flashcore_forward_params for described arrays and _Options."""
    geometry = _validate(q, k, v, out, lse, layout, seqs)
    qv, kv, vv = geometry.views[:3]
    p = lib.new_params()
    p.dtype = DTYPES[q.dtype]
    p.causal = options.causal
    p.softmax_scale = options.scale
    p.softcap = options.softcap
    use_window, window_left, window_right = options.window
    set_fields(p, batch_size=geometry.batch, num_heads_q=qv.shape[1], seqlen_q=geometry.seqlen_q,
               head_dim=qv.shape[3], head_dim_v=vv.shape[3], num_heads_kv=kv.shape[1], seqlen_k=geometry.seqlen_k,
               num_splits=options.num_splits, use_window=use_window, window_left=window_left,
               window_right=window_right, lse=_address(lse), seqused_k=_address(seqs.seqused_k),
               cu_seqlens_q=_address(seqs.cu_seqlens_q), cu_seqlens_k=_address(seqs.cu_seqlens_k),
               total_seqlen_q=geometry.total_q, total_seqlen_k=geometry.total_k,
               block_table=_address(seqs.block_table), block_table_batch_stride=geometry.table_stride,
               page_size=geometry.page_size, num_pages=geometry.num_pages)
    for prefix, view in zip(("q", "k", "v", "out"), geometry.views):
        fields = {prefix: view.info.ptr}
        for stride, what in zip(view.aligned_strides(), ("batch", "head", "seq")):
            fields["%s_%s_stride" % (prefix, what)] = stride
        set_fields(p, **fields)
    return p


def _is_empty(params):
    """Whether the call's output is empty (flashcore.h: batch_size, seqlen_q
    or num_heads_q 0, or packed queries of no rows): the library then does
    nothing, and neither do we."""
    return (0 in (params.batch_size, params.seqlen_q, params.num_heads_q)
            or (params.cu_seqlens_q is not None and params.total_seqlen_q == 0))


def forward_params(q: Array, k: Array, v: Array, out: Optional[Array] = None, *, lse: Optional[Array] = None,
                   causal: bool = False, softmax_scale: Optional[float] = None, layout: Union[str, int] = "bhsd",
                   num_splits: Optional[int] = None, window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                   seqused_k: Optional[Array] = None, cu_seqlens_q: Optional[Array] = None,
                   cu_seqlens_k: Optional[Array] = None, max_seqlen_q: Optional[int] = None,
                   max_seqlen_k: Optional[int] = None,
                   block_table: Optional[Array] = None) -> "_ffi.flashcore_forward_params":
    """A flashcore.ForwardParams for these arrays (pointers, sizes, strides),
    for the low-level calls: Handle.workspace_size, Handle.forward,
    check_params. The arrays must outlive every use of the result.
    num_splits, window, softcap and seqused_k as for attention();
    cu_seqlens_q/max_seqlen_q and cu_seqlens_k/max_seqlen_k as for
    attention_varlen() (each side packed on its own: q and out, or k and v,
    are then [total, H, D] whatever the layout); block_table as for
    attention_with_kvcache(), k and v then page pools [num_pages,
    page_size, Hkv, D] (layout="bshd") or [num_pages, Hkv, page_size, D]."""
    layout = _layout(layout)
    options = _options(causal, softmax_scale, num_splits, window, softcap)
    infos = [None if a is None else describe(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    seqs = _sequences(0, seqused_k=seqused_k, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                      cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, block_table=block_table)
    return _build(library(), *infos, layout, options, seqs)


def supported_head_dims() -> List[Tuple[int, int]]:
    """The (head_dim, head_dim_v) pairs this build of the library has kernels
    of its own for (flashcore_supported_head_dims), in increasing order, e.g.
    [(32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256)].

    Other head dims run too: q/k's head_dim and v's head_dim_v, both
    multiples of 8, run on the first listed pair whose two dims are both at
    least theirs (80 runs on (96, 96), (64, 128) on (128, 128)). A call no
    listed pair covers raises UnsupportedError."""
    return library().supported_head_dims()


def check_params(params: "_ffi.flashcore_forward_params") -> None:
    """flashcore_forward_check: raises what flashcore_forward would for these
    parameters (a flashcore.ForwardParams) before looking at the GPU."""
    lib = library()
    lib.check(lib.cdll.flashcore_forward_check(struct_ref(params, _ffi.flashcore_forward_params, "params",
                                                          "from flashcore.forward_params()")))


def _allocate(like, shape, dtype, stream, what):
    if not can_allocate(like):
        raise TypeError("flashcore cannot allocate %s for %s inputs: pass %s= (a CUDA array) yourself"
                        % (what, type(like.obj).__name__, what))
    return empty(like, shape, dtype, stream)


def _describe_first(x, name, stream):
    """The ArrayInfo of a call's first array and the stream the call runs
    on: `stream` (any form stream_pointer takes) where given, else the
    current stream of that array's framework."""
    user_stream = None if stream is None else stream_pointer(stream)
    info = describe(x, name, user_stream or 0)
    return info, current_stream(info) if user_stream is None else user_stream


# --------------------------------------------------------------------------
# One call: the full path, and the cache that lets a repeated call skip it
#
# Describing and checking the arrays, converting the options and building
# the params struct depend only on the arrays' shapes, strides, dtypes and
# devices and on the options; a call whose key (all of those, see
# _cache_key) was seen before reuses what the full path made of it and
# only puts in the new addresses. Whatever depends on the addresses is
# still checked on every call: by flashcore_forward itself (alignment,
# overlaps, NULL), and for __cuda_array_interface__ arrays by the driver
# (their device and that it knows the memory).
# --------------------------------------------------------------------------

class _Params(_ffi.flashcore_forward_params):
    """The params of a cached call: a plan's template with this call's
    addresses put in, which come from data_ptr() or cai_signature() and
    so are known to fit a pointer. Its fields are assigned unchecked
    (flashcore.ForwardParams checks each assignment, which is host time on
    every call); it is a ForwardParams for every other purpose."""

    __setattr__ = ctypes.Structure.__setattr__


# Fields of flashcore_forward_params holding the arrays' addresses, in the
# order _forward passes the arrays.
POINTER_FIELDS = ("q", "k", "v", "out", "lse", "seqused_k", "cu_seqlens_q", "cu_seqlens_k", "block_table")
# Plans kept; past that many the cache starts again empty, so that a model
# with ever new shapes does not grow it without end.
MAX_PLANS = 1024
_plans = {}
# Option values a key may hold: their exact types, since values of other
# types can compare equal and mean something else to the full path (True
# == 1, yet True is no softmax_scale).
_PLAIN_REAL = (float, int)


class _Plan:
    """What the full path made of one cache key: the params struct but for
    its addresses (template), whether the result is empty, the shapes of
    out and lse to allocate (None where given or not asked for), q's dtype
    and where to allocate (target, torch_device), the device of the
    framework arrays, the arrays' names for messages, the indices of the
    arrays given or allocated, the arrays read through
    __cuda_array_interface__ as (index, name) (their device is the
    driver's, asked each call), whether q, k or v requires grad, and the
    workspace size per device once asked; plain_torch: whether a call
    on torch's current stream may take _call_plain_torch (torch arrays
    only, none requiring grad, a result that is not empty); out_like_q:
    whether out is allocated with q's shape and contiguous strides, which
    torch.empty_like(q) gives for a contiguous q (in less host time)."""

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


class _Call:
    """A prepared call: its result, and unless that is empty (params None)
    the params to queue on `stream` for `device`, the workspace given as
    (address, bytes) or None to allocate like `target`, and its plan (None
    on the full path of an uncached call; with a plan of torch arrays and
    on_current_stream, the workspace is a plain torch.empty)."""

    __slots__ = ("result", "params", "device", "stream", "target", "workspace", "plan", "on_current_stream")

    def __init__(self, result, params=None, device=None, stream=0, target=None, workspace=None, plan=None,
                 on_current_stream=False):
        self.result, self.params, self.device, self.stream = result, params, device, stream
        self.target, self.workspace, self.plan, self.on_current_stream = target, workspace, plan, on_current_stream


def _cache_key(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k):
    """(key, addresses, q's __cuda_array_interface__ stream) of a call the
    cache can serve: every array given is a torch tensor (not a subclass)
    or has a cai_signature(), and every option is a plain value; else None.
    A torch tensor's part of the key is its shape, strides, dtype, device
    index (-1 for the CPU: never cached, the full path refuses it) and
    requires_grad; each part comes after the array's index."""
    causal, softmax_scale, num_splits, window, softcap = options
    if type(window) is list:
        window = tuple(window)
    if not (type(layout) is str and (softmax_scale is None or type(softmax_scale) in _PLAIN_REAL)
            and (num_splits is None or type(num_splits) is int) and type(softcap) in _PLAIN_REAL
            and (window is None or type(window) is tuple and len(window) == 2
                 and type(window[0]) is int and type(window[1]) is int)
            and (max_seqlen_q is None or type(max_seqlen_q) is int)
            and (max_seqlen_k is None or type(max_seqlen_k) is int)):
        return None
    torch = sys.modules.get("torch")
    tensor_type = None if torch is None else torch.Tensor
    key = [layout, 1 if causal else 0, softmax_scale, num_splits, window, softcap, bool(return_lse), max_seqlen_q,
           max_seqlen_k]
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


def _remember(key, params, infos, out_shape, lse_shape, device):
    """Keeps the plan of a call that took the full path (infos: the
    ArrayInfos of the arrays, in POINTER_FIELDS order, None where not
    given)."""
    q = infos[0]
    plan = _Plan()
    plan.template = bytes(params)
    plan.empty = _is_empty(params)
    plan.out_shape, plan.lse_shape = out_shape, lse_shape
    plan.dtype = q.obj.dtype if q.framework == "torch" else None
    plan.lse_dtype = sys.modules["torch"].float32 if q.framework == "torch" else "float32"
    plan.target = _Target(q.framework, q.device)
    plan.torch_device = q.obj.device if q.framework == "torch" else None
    plan.device = device
    plan.names = _names(infos)
    plan.given = tuple(i for i, a in enumerate(infos) if a is not None)
    plan.cai_arrays = tuple((i, a.name) for i, a in enumerate(infos) if a is not None and a.framework is None)
    plan.requires_grad = any(a.framework == "torch" and a.obj.requires_grad for a in infos[:3])
    plan.workspace_bytes = {}
    plan.plain_torch = (key[0] is _PLAIN_TORCH and not plan.requires_grad and not plan.empty and device is not None)
    plan.out_like_q = (plan.plain_torch and out_shape is not None and out_shape == tuple(q.obj.shape)
                       and q.obj.is_contiguous())
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def _torch_current_stream(device):
    """torch's current stream on a device, as a cudaStream_t int (without
    making a torch.cuda.Stream object where torch has the faster call)."""
    return (_torch_api or _load_torch_api()).current_stream(device)


def _prepare_cached(plan, addresses, q_stream, q, k, v, out, lse, return_lse, stream, detach):
    """The cache's path: plan's params with this call's addresses."""
    if plan.requires_grad:
        refuse_grad(q, k, v, detach)
    if stream is not None:
        s = stream_pointer(stream)
    elif plan.target.framework == "torch":
        s = _torch_current_stream(plan.device)
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


def _new(plan, shape, dtype, stream, on_current_stream):
    """A torch tensor (dtype: a torch dtype) for a cached call: only torch
    calls allocate."""
    if on_current_stream:
        return sys.modules["torch"].empty(shape, dtype=dtype, device=plan.torch_device)
    return empty(plan.target, shape, dtype, stream)


def _hint_bshd(error, q, k, v, layout, seqs):
    """error, with a hint to pass layout="bshd" where the head counts of
    dense q and k read as [B, H, S, D] do not fit (Hq not a multiple of
    Hkv) but read as [B, S, H, D] they, and the rest of the shapes, do:
    FlashAttention-ordered tensors given with the default layout. (Where
    both readings fit, as for self-attention with as many query as key
    heads, the shapes cannot tell.)"""
    if layout != Layout.BHSD or any(a is not None for a in seqs.arrays()):
        return error
    try:
        as_given = [_View(a, Layout.BHSD) for a in (q, k)]
        qv, kv, vv = (_View(a, Layout.BSHD) for a in (q, k, v))
    except InvalidArgumentError:
        return error

    def heads_fit(q_view, k_view):
        return k_view.shape[1] > 0 and q_view.shape[1] % k_view.shape[1] == 0

    if heads_fit(*as_given) or not (heads_fit(qv, kv) and kv.shape[:3] == vv.shape[:3]
                                    and qv.shape[0] == kv.shape[0] and qv.shape[3] == kv.shape[3]):
        return error
    hint = (" (these are valid [B, S, H, D] shapes: pass layout='bshd' if that is their order, or "
            "x.transpose(1, 2) for [B, H, S, D] views)")
    return type(error)(error.message + hint, error.status)


def _prepare_in_full(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, sequences, key):
    """The full path: describes and checks everything, and keeps the plan
    under `key` where it is not None."""
    refuse_grad(q, k, v, detach)
    layout = _layout(layout)
    options = _options(*options)
    qi, s = _describe_first(q, "q", stream)
    ki, vi = describe(k, "k", s), describe(v, "v", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    seqs = _sequences(s, **sequences)
    lib = library()
    try:
        geometry = _validate(qi, ki, vi, oi, li, layout, seqs)
        out_shape = _out_shape(qi, geometry.views[2].shape[3]) if oi is None else None
        lse_shape = geometry.lse_shape if li is None and return_lse else None
        if out_shape is not None:
            out = _allocate(qi, out_shape, None, s, "out")
            oi = describe(out, "out", s)
        if lse_shape is not None:
            lse = _allocate(qi, lse_shape, "float32", s, "lse")
            li = describe(lse, "lse", s)
        params = _build(lib, qi, ki, vi, oi, li, layout, options, seqs)
        lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    except InvalidArgumentError as e:
        raise _hint_bshd(e, qi, ki, vi, layout, seqs) from None
    infos = (qi, ki, vi, oi, li) + seqs.arrays()
    device = next((a.device for a in (qi, ki, vi, oi) if a.device is not None), None)
    if key is not None:
        _remember(key, params, infos, out_shape, lse_shape, device)
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


def prepare(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, seqused_k=None,
            cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k=None, max_seqlen_k=None, block_table=None,
            seqused_k_name="seqused_k", plain_key=None):
    """Everything a forward call does before it asks for a handle: a _Call.
    options: (causal, softmax_scale, num_splits, window, softcap) as the
    caller gave them; the keywords up to seqused_k_name are _sequences'.
    plain_key: the call's _plain_torch_key, which a call taking the full
    path keeps its plan under (else under _cache_key's)."""
    arrays = (q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table)
    found = None
    if workspace is None:
        found = _cache_key(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k)
    if found is not None:
        try:
            plan = _plans.get(found[0])
        except TypeError:  # an unhashable entry (a list for a shape): the full path reads it
            found = plan = None
        if plan is not None:
            return _prepare_cached(plan, found[1], found[2], q, k, v, out, lse, return_lse, stream, detach)
    sequences = dict(seqused_k=seqused_k, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                     cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, block_table=block_table,
                     seqused_k_name=seqused_k_name)
    key = plain_key if plain_key is not None else None if found is None else found[0]
    return _prepare_in_full(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, sequences,
                            key)


# First element of _plain_torch_key's keys, which _cache_key's never start with.
_PLAIN_TORCH = object()


def _plain_torch_key(q, k, v, out, seqused_k, layout, options, return_lse):
    """The cache key of a call that _call_plain_torch can serve once the
    full path has seen it (q, k, v and where given out and seqused_k plain
    torch tensors, options of plain types, queued on torch's current
    stream: the caller checks the rest), else None. _cache_key's key
    restated for this one case, without its loop: on torch tensors each
    attribute read is host time. Whether grad mode is on and an input
    requires grad is one entry: a plan kept under False runs without
    refusing, and one under True is never plain (refuse_grad decides)."""
    api = _torch_api or _load_torch_api()
    if api is None:
        return None
    tensor = api.tensor
    if not (type(q) is tensor and type(k) is tensor and type(v) is tensor):
        return None
    causal, softmax_scale, num_splits, window, softcap = options
    if not (type(layout) is str and (softmax_scale is None or type(softmax_scale) is float)
            and (num_splits is None or type(num_splits) is int) and type(softcap) is float
            and (window is None or type(window) is tuple and len(window) == 2
                 and type(window[0]) is int and type(window[1]) is int)):
        return None
    grad = api.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    key = (_PLAIN_TORCH, layout, 1 if causal else 0, softmax_scale, num_splits, window, softcap,
           True if return_lse else False, grad,
           q.shape, q.stride(), q.dtype, q.get_device(),
           k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device())
    if out is not None:
        if type(out) is not tensor:
            return None
        key += (3, out.shape, out.stride(), out.dtype, out.get_device())
    if seqused_k is not None:
        if type(seqused_k) is not tensor:
            return None
        key += (5, seqused_k.shape, seqused_k.stride(), seqused_k.dtype, seqused_k.get_device())
    return key


class _TorchApi:
    """The torch functions the quick path calls, looked up once (each
    lookup is host time on every call)."""

    __slots__ = ("tensor", "is_grad_enabled", "empty", "empty_like", "uint8", "current_stream", "capturing")

    def __init__(self, torch):
        self.tensor = torch.Tensor
        self.is_grad_enabled = torch.is_grad_enabled
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


def _call_plain_torch(plan, q, k, v, out, seqused_k, layout, options, return_lse):
    """A call whose _plain_torch_key found a plain_torch plan: what
    _prepare_cached and launch do, without their other cases, since every
    step here is host time on every call (issue 18: a call's overhead
    within 10 us). The compiled path, where there is one, is given the plan
    for the next such call."""
    api = _torch_api
    device = plan.device
    out_given = out
    if out is None:
        out = api.empty_like(q) if plan.out_like_q else api.empty(plan.out_shape, dtype=plan.dtype,
                                                                  device=plan.torch_device)
    lse = None
    params = _Params.from_buffer_copy(plan.template)
    params.q = q.data_ptr()
    params.k = k.data_ptr()
    params.v = v.data_ptr()
    params.out = out.data_ptr()
    if plan.lse_shape is not None:
        lse = api.empty(plan.lse_shape, dtype=plan.lse_dtype, device=plan.torch_device)
        params.lse = lse.data_ptr()
    if seqused_k is not None:
        params.seqused_k = seqused_k.data_ptr()
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
    if _fast:
        _fastpath.remember(_fast, plan, q, k, v, out_given, seqused_k, layout, options, return_lse, workspace_bytes)
    return (out, lse) if return_lse else out


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


# The compiled path (_fastpath): None until torch is imported and it was
# looked for, then the configured module, or False where there is none.
_fast = None
# tracing(), which attention() asks on every call: torch.compiler.is_compiling
# itself once _fast is loaded (without tracing()'s lookups).
_is_compiling = tracing


def _load_fast():
    """_fast, looked for once torch is imported."""
    global _fast, _is_compiling
    fast = _fastpath.load(_torch_api or _load_torch_api(), _kept_workspaces)
    if fast:
        _is_compiling = sys.modules["torch"].compiler.is_compiling
    _fast = fast
    return fast


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
            ws_keep = _allocate(call.target, (needed,), "uint8", call.stream, "workspace")
            ws_ptr = describe(ws_keep, "workspace").ptr
    handle.forward(call.params, ws_ptr, ws_bytes, call.stream)
    del ws_keep  # back to the pool of the call's stream, which orders its reuse after this call
    return call.result


def _forward(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, seqused_k=None,
             cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k=None, max_seqlen_k=None, block_table=None,
             seqused_k_name="seqused_k", fast_asked=False):
    """What attention, attention_varlen and attention_with_kvcache share:
    under torch.compile (or torch.export) the torch operator
    flashcore::forward, else prepare() and launch(), with prepare()'s
    arguments; fast_asked: the caller already asked the compiled path,
    which handed the call back. (Positional: keywords cost host time on
    every call.)"""
    if tracing():
        return traced_forward(q, k, v, layout=layout, options=options, out=out, lse=lse, return_lse=return_lse,
                              stream=stream, workspace=workspace, detach=detach, seqused_k=seqused_k,
                              cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_k=max_seqlen_k, block_table=block_table)
    key = None
    if (stream is None and workspace is None and lse is None and cu_seqlens_q is None and cu_seqlens_k is None
            and block_table is None):
        fast = _fast if _fast is not None else _load_fast()
        if fast and not fast_asked:
            result = fast.call(q, k, v, out, seqused_k, layout, options, return_lse)
            if result is not None:
                return result
        key = _plain_torch_key(q, k, v, out, seqused_k, layout, options, return_lse)
    if key is not None:
        plan = _plans.get(key)
        if plan is not None:
            if plan.plain_torch:
                return _call_plain_torch(plan, q, k, v, out, seqused_k, layout, options, return_lse)
            key = None  # a call the general cache (_cache_key's) serves
    return launch(prepare(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, seqused_k,
                          cu_seqlens_q, max_seqlen_q, cu_seqlens_k, max_seqlen_k, block_table, seqused_k_name, key))


def _pytorch_names(q, k, layout, causal, softmax_scale, is_causal, scale):
    """causal and softmax_scale with PyTorch's spellings taken in: scale is
    softmax_scale; is_causal is causal where the two agree (Sq == Sk: top-left
    and bottom-right alignment are one mask), refused where they do not."""
    if scale is not None:
        if softmax_scale is not None:
            raise TypeError("pass softmax_scale or scale (PyTorch's name for it), not both")
        if not tracing():  # (traced, it may be symbolic: flashcore::forward checks it as softmax_scale)
            _softmax_scale(scale, "scale")  # refused under the name it was given
        softmax_scale = scale
    if is_causal is not None:
        if causal:
            raise TypeError("pass causal or is_causal, not both (causal is bottom-right aligned, PyTorch's "
                            "is_causal top-left)")
        if is_causal:
            axis = LAYOUT_AXES[_layout(layout)][2]
            sq, sk = _shape_of(q, "q")[axis], _shape_of(k, "k")[axis]
            if sq != sk:
                raise InvalidArgumentError(
                    "is_causal (PyTorch's name) masks top-left aligned, flashcore's causal bottom-right, and with "
                    "Sq = %d != Sk = %d the two differ: call flashcore.sdpa(q, k, v, is_causal=True) for PyTorch's "
                    "mask, or pass causal=True for FlashAttention's" % (sq, sk))
        causal = bool(is_causal)
    return causal, softmax_scale


def _shape_of(x, name):
    """x's shape, which must be 4-D."""
    shape = shape_of(x, name)
    if len(shape) != 4:
        raise InvalidArgumentError("%s must be 4-D, got shape %s" % (name, list(shape)))
    return shape


def attention(q: Array, k: Array, v: Array, *, causal: bool = False, softmax_scale: Optional[float] = None,
              out: Optional[Array] = None, return_lse: bool = False, stream: Any = None, layout: Union[str, int] = "bhsd",
              lse: Optional[Array] = None, workspace: Optional[Array] = None, num_splits: Optional[int] = None,
              window: Optional[Tuple[int, int]] = None, softcap: float = 0.0, seqused_k: Optional[Array] = None,
              detach: bool = False, is_causal: Optional[bool] = None,
              scale: Optional[float] = None) -> Union[Array, Tuple[Array, Array]]:
    """Fused scaled-dot-product attention, like
    torch.nn.functional.scaled_dot_product_attention(q, k, v):

        out = softmax(cap(softmax_scale * q @ k^T) [+ causal/window mask]) @ v

    (cap is the identity unless softcap is set).

    q: [B, Hq, Sq, D]; k: [B, Hkv, Sk, D]; v: [B, Hkv, Sk, Dv] with Hq a
    multiple of Hkv (grouped-query attention); float16 or bfloat16, on one
    CUDA device. out is [B, Hq, Sq, Dv]. D (head_dim) and Dv (head_dim_v)
    may differ, e.g. 192 and 128; see supported_head_dims() for the pairs
    this build has kernels for and which others run. Any storage order works
    as long as the last dimension is contiguous: strides are read from the
    arrays. layout="bshd" takes FlashAttention's [B, S, H, D] shapes instead
    (out is then [B, Sq, Hq, Dv]). Shapes alone cannot always tell [B, S,
    H, D] tensors given with the default layout from [B, H, S, D] ones;
    where the head counts then do not fit, the error says to pass
    layout="bshd".

    causal: bottom-right aligned mask: query i sees key j iff
        j <= i + Sk - Sq; rows that see no key give 0 (and lse -inf).
    softmax_scale: None for 1 / sqrt(D).
    scale, is_causal: PyTorch's names, taken in as softmax_scale and
        causal: scale is softmax_scale; is_causal=True is causal=True where
        Sq == Sk, and refused otherwise (PyTorch's mask is then top-left
        aligned: flashcore.sdpa implements it).
    window: sliding window (local attention), FlashAttention's window_size:
        None (the default) for none, or a pair (left, right) of ints, each
        -1 (unbounded on that side) or >= 0: query i sees key j only where
        i + Sk - Sq - left <= j <= i + Sk - Sq + right (bottom-right
        aligned, as causal). (0, 0) sees the diagonal key only; (left, 0)
        is causal with a window of left keys back. causal=True is right = 0,
        so with it right must be -1 or 0. Rows that see no key give 0 (and
        lse -inf).
    softcap: logit softcapping (Gemma 2): with softcap > 0 each score
        s = softmax_scale * q.k becomes softcap * tanh(s / softcap) before
        the mask and the softmax (lse is of the capped scores); 0 (the
        default) for none. A finite real >= 0.
    seqused_k: per-sequence key counts (FlashAttention's seqused_k, its
        kv-cache call's cache_seqlens): None for none, or an int32 CUDA array
        of shape [B]. Sequence b then attends to its first seqused_k[b] keys
        of k and v (whose Sk is the cache's capacity); causal and the window
        align to that count, a count of 0 gives 0 (and lse -inf), and keys
        past it may hold anything, NaN included. Read on the GPU: each value
        should be in [0, Sk] and is clamped into it.
    out: where to write the result (q's shape with v's last dimension, q's
        dtype; any strides the C API accepts). Allocated with q's framework
        when None.
    return_lse: also return the float32 [B, Hq, Sq] log-sum-exp of each
        row's scaled (capped), masked scores: the result is then (out, lse).
    lse: where to write that log-sum-exp (contiguous float32 [B, Hq, Sq]);
        allocated when return_lse is set and lse is None.
    stream: where to queue the work: a torch.cuda.Stream, a cupy Stream, an
        object with __cuda_stream__ or a cudaStream_t as an int. None: the
        current stream of q's framework (for other arrays, the producer's
        __cuda_array_interface__ stream, else the legacy default stream).
    workspace: device memory for the library's scratch space (a CUDA array);
        allocated with q's framework when needed and None. Only calls that
        split their keys (num_splits) need one.
    num_splits: split-KV. None (the default) lets the library choose from
        the grid, the GPU's SM count and Sk (it splits calls too small to
        fill the GPU, such as decoding); 1 never splits; N (2 up to
        flashcore.MAX_NUM_SPLITS) splits the keys each query block sees into
        exactly N parts, computed in parallel and merged (the same math as
        merge_states). Results are deterministic for a given num_splits;
        different num_splits round differently.

    detach: forward only: no autograd. A torch input that requires grad
        while grad mode is on raises NoBackwardError, unless detach=True (or
        FLASHCORE_DETACH=1 in the environment) says to compute from its
        values, the result then without a gradient path. Under
        torch.no_grad() or torch.inference_mode() nothing is refused.

    PyTorch tensors, CuPy arrays and any object with __cuda_array_interface__
    or __dlpack__ are accepted; for the last two, out (and lse, workspace when
    needed) must be given. Host (CPU) arrays are refused. Returns without
    waiting for the GPU. Raises flashcore.FlashcoreError subclasses
    (InvalidArgumentError, UnsupportedError, MisalignedError, ...) carrying
    the library's status and message.

    A call whose arrays have the shapes, strides, dtypes and devices of an
    earlier one, with the same options, reuses its checked parameters (only
    the addresses change; the library checks them on every call): a few
    microseconds of host time on torch tensors. Under torch.compile (and
    torch.export) the call is the torch operator flashcore::forward
    (flashcore.register_torch_ops()), traced without a graph break; stream=
    and workspace= are refused there (it runs on torch's current stream and
    allocates from torch's allocator), out= and lse= are copied into.
    """
    if is_causal is not None or scale is not None:
        causal, softmax_scale = _pytorch_names(q, k, layout, causal, softmax_scale, is_causal, scale)
    options = (causal, softmax_scale, num_splits, window, softcap)
    # A repeated call on torch tensors: the compiled path, first thing (each
    # Python call on the way is host time). Under torch.compile it is never
    # reached: _is_compiling() comes first, and there _forward traces.
    fast_asked = False
    if _fast and stream is None and lse is None and workspace is None and not _is_compiling():
        result = _fast.call(q, k, v, out, seqused_k, layout, options, return_lse)
        if result is not None:
            return result
        fast_asked = True
    return _forward(q, k, v, layout, options, out, lse, return_lse, stream, workspace, detach, seqused_k, None,
                    None, None, None, None, "seqused_k", fast_asked)


def attention_varlen(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool = False, softmax_scale: Optional[float] = None,
                     out: Optional[Array] = None, return_lse: bool = False, stream: Any = None,
                     lse: Optional[Array] = None, workspace: Optional[Array] = None, num_splits: Optional[int] = None,
                     window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                     seqused_k: Optional[Array] = None, detach: bool = False) -> Union[Array, Tuple[Array, Array]]:
    """Attention over a batch of sequences of different lengths packed
    without padding, as FlashAttention's flash_attn_varlen_func (forward
    only):

    q: [total_q, Hq, D]; k: [total_k, Hkv, D]; v: [total_k, Hkv, Dv]; out:
    [total_q, Hq, Dv]: the rows of every sequence, one after another.
    cu_seqlens_q, cu_seqlens_k: int32 CUDA arrays of shape [B + 1], the
        row where each of the B sequences starts in q (in k and v), then
        the end: sequence b's queries are rows cu_seqlens_q[b] to
        cu_seqlens_q[b + 1] - 1. Read on the GPU (clamped into the arrays,
        so wrong offsets give wrong results, never a fault); rows outside
        every sequence are not written.
    max_seqlen_q, max_seqlen_k: ints, the longest query and key sequence;
        they size the grid and the workspace. A sequence longer than its
        max is cut to it.
    causal and window align to each sequence's own lengths: query i of
        sequence b sees key j <= i + Sk_b - Sq_b. A sequence with no keys
        gives 0 (and lse -inf).
    seqused_k: None, or an int32 CUDA array [B]: sequence b then uses only
        the first min(seqused_k[b], its length) of its keys.
    lse: float32 [Hq, total_q] (FlashAttention's varlen layout), returned
        with return_lse as (out, lse).

    The other arguments are attention()'s, detach included.
    """
    return _forward(q, k, v, "bshd", (causal, softmax_scale, num_splits, window, softcap), out, lse, return_lse,
                    stream, workspace, detach, seqused_k, cu_seqlens_q, max_seqlen_q, cu_seqlens_k, max_seqlen_k)


def _cache_seqlens_array(count, q, cu_seqlens_q, stream):
    """cache_seqlens given as an int: an int32 [B] CUDA array of it, made
    with q's framework on the call's stream."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise InvalidArgumentTypeError("cache_seqlens must be None, an int or an int32 CUDA array of shape [B], "
                                       "got %s" % type(count).__name__)
    count = fits(int(count), ctypes.c_int32, "cache_seqlens")
    if tracing():
        return traced_full_int32(q, cu_seqlens_q, count)
    qi, s = _describe_first(q, "q", stream)
    if not (is_torch(q) or is_cupy(q)):
        raise TypeError("an int cache_seqlens needs torch or cupy inputs; pass an int32 CUDA array instead")
    if cu_seqlens_q is None:
        batch = qi.shape[0]
    else:
        batch = _batch_from_cu_seqlens(describe(cu_seqlens_q, "cu_seqlens_q", s))
    return full(qi, (batch,), "int32", count, s)


def attention_with_kvcache(q: Array, k_cache: Array, v_cache: Array, cache_seqlens: Union[Array, int, None] = None, *,
                           block_table: Optional[Array] = None, cu_seqlens_q: Optional[Array] = None,
                           max_seqlen_q: Optional[int] = None, causal: bool = False,
                           softmax_scale: Optional[float] = None, out: Optional[Array] = None,
                           return_lse: bool = False, stream: Any = None, lse: Optional[Array] = None,
                           workspace: Optional[Array] = None, num_splits: Optional[int] = None,
                           window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                           detach: bool = False) -> Union[Array, Tuple[Array, Array]]:
    """Attention of new queries against a KV cache, as FlashAttention's
    flash_attn_with_kvcache (forward only, without appending to the cache or
    rotary embedding), in its [B, S, H, D] storage:

    q: [B, Sq, Hq, D]; k_cache: [B, S_cache, Hkv, D]; v_cache:
    [B, S_cache, Hkv, Dv]; out: [B, Sq, Hq, Dv].
    cache_seqlens: how many keys of each sequence's cache are in use: an
        int32 CUDA array of shape [B], or an int for every sequence (then
        allocated with q's framework), or None for the whole cache. The rows
        past a sequence's count may hold anything, NaN included. causal and
        the window align the queries to the end of each sequence's keys:
        query i of sequence b sees key j <= i + cache_seqlens[b] - Sq.
    block_table: a paged cache (FlashAttention's block_table, vLLM's paged
        attention): None for the contiguous cache above, or an int32 CUDA
        array [B, max_pages] of page indices. k_cache and v_cache are then
        page pools, [num_pages, page_size, Hkv, D] and [num_pages,
        page_size, Hkv, Dv], page_size a multiple of 16: key j of sequence
        b is row j % page_size of page block_table[b, j // page_size]. Each
        sequence holds up to max_pages * page_size keys, of which it uses
        cache_seqlens[b] (all of them without cache_seqlens); only the
        entries of its used pages are read, the others may hold anything.
        Entries are clamped into [0, num_pages) on the GPU. The table's
        rows may be padded (a [:, :max_pages] view of a wider table): only
        its last dimension must be contiguous.
    cu_seqlens_q, max_seqlen_q: queries of different lengths packed without
        padding (chunked prefill), as for attention_varlen: q is then
        [total_q, Hq, D], out [total_q, Hq, Dv], lse [Hq, total_q], and B
        is len(cu_seqlens_q) - 1; query i of sequence b, of Sq_b queries,
        sees key j <= i + cache_seqlens[b] - Sq_b with causal.
    The other arguments are attention()'s (layout is "bshd"), detach
    included.
    """
    seqused_k = cache_seqlens
    if cache_seqlens is not None and not (is_torch(cache_seqlens) or hasattr(cache_seqlens, "__cuda_array_interface__")
                                          or hasattr(cache_seqlens, "__dlpack__")):
        seqused_k = _cache_seqlens_array(cache_seqlens, q, cu_seqlens_q, stream)
    return _forward(q, k_cache, v_cache, "bshd", (causal, softmax_scale, num_splits, window, softcap), out, lse,
                    return_lse, stream, workspace, detach, seqused_k, cu_seqlens_q, max_seqlen_q,
                    block_table=block_table, seqused_k_name="cache_seqlens")
