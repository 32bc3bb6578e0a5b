"""flashcore.attention, attention_varlen and attention_with_kvcache, and
the parameter building under them."""

import collections
import ctypes
import math
import numbers

from . import _ffi
from ._arrays import (can_allocate, check_known_to_driver, contiguous_strides, current_stream, describe, empty, full,
                      is_cupy, is_torch, stream_pointer)
from ._checked import fits, set_fields, whole_number
from ._errors import InvalidArgumentError, UnsupportedError
from ._library import get_handle, library

Layout = _ffi.Layout
# Axes of (batch, heads, seqlen) in each layout; head_dim is always the last.
LAYOUT_AXES = {Layout.BHSD: (0, 1, 2), Layout.BSHD: (0, 2, 1)}
DTYPES = {"float16": _ffi.Dtype.FP16, "bfloat16": _ffi.Dtype.BF16}
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38


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


def _softmax_scale(softmax_scale):
    if softmax_scale is None:
        return _ffi.FLASHCORE_SOFTMAX_SCALE_DEFAULT
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError("softmax_scale must be None or a real number, got %s %r"
                        % (type(softmax_scale).__name__, softmax_scale))
    scale = float(softmax_scale)
    if math.isfinite(scale) and abs(scale) > FLOAT32_MAX:
        # ctypes would store it as an infinite float32.
        raise InvalidArgumentError("softmax_scale %r does not fit a float32 (at most %g)" % (softmax_scale, FLOAT32_MAX))
    if scale == _ffi.FLASHCORE_SOFTMAX_SCALE_DEFAULT:
        # The C API reads 0 as "default"; from Python that is spelled None.
        raise InvalidArgumentError("softmax_scale must be > 0 (None means 1 / sqrt(head_dim)), got %r" % softmax_scale)
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
        raise TypeError("window must be None or a pair (left, right) of ints, got %s %r"
                        % (type(window).__name__, window))
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
        raise TypeError("softcap must be a real number (0 for none), got %s %r" % (type(softcap).__name__, softcap))
    try:
        cap = float(softcap)
    except OverflowError:  # an int beyond any float
        cap = math.inf
    if not (math.isfinite(cap) and cap >= 0):
        raise InvalidArgumentError("softcap must be finite and >= 0 (0 for none), got %r" % softcap)
    if cap > FLOAT32_MAX:
        raise InvalidArgumentError("softcap %r does not fit a float32 (at most %g)" % (softcap, FLOAT32_MAX))
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
    devices = sorted({a.device for a in arrays if a is not None and a.device is not None})
    if len(devices) > 1:
        raise InvalidArgumentError("%s must be on one device, got devices %s" % (names, devices))


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
               block_table=None):
    """_Sequences from the Python arguments, arrays described on `stream`."""
    if cu_seqlens_k is not None and block_table is not None:
        raise InvalidArgumentError("cu_seqlens_k and block_table cannot be combined: a paged cache's key counts come "
                                   "from seqused_k (cu_seqlens_q with a block_table is supported)")
    max_q, max_k = _max_seqlen(max_seqlen_q, cu_seqlens_q, "q"), _max_seqlen(max_seqlen_k, cu_seqlens_k, "k")

    def info(x, name):
        return None if x is None else describe(x, name, stream)

    return _Sequences(info(seqused_k, "seqused_k"), info(cu_seqlens_q, "cu_seqlens_q"),
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


def forward_params(q, k, v, out=None, *, lse=None, causal=False, softmax_scale=None, layout="bhsd", num_splits=None,
                   window=None, softcap=0.0, seqused_k=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                   max_seqlen_k=None, block_table=None):
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


def supported_head_dims():
    """The (head_dim, head_dim_v) pairs this build of the library has kernels
    of its own for (flashcore_supported_head_dims), in increasing order, e.g.
    [(32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256)].

    Other head dims run too: q/k's head_dim and v's head_dim_v, both
    multiples of 8, run on the first listed pair whose two dims are both at
    least theirs (80 runs on (96, 96), (64, 128) on (128, 128)). A call no
    listed pair covers raises UnsupportedError."""
    return library().supported_head_dims()


def check_params(params):
    """flashcore_forward_check: raises what flashcore_forward would for these
    parameters before looking at the GPU."""
    lib = library()
    lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))


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


def _forward(q, k, v, *, layout, options, out, lse, return_lse, stream, workspace, **sequences):
    """What attention, attention_varlen and attention_with_kvcache share:
    describes the arrays, allocates what was not given, builds and checks
    the params and queues the call. `sequences` are _sequences' keywords."""
    qi, s = _describe_first(q, "q", stream)
    ki, vi = describe(k, "k", s), describe(v, "v", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    seqs = _sequences(s, **sequences)
    geometry = _validate(qi, ki, vi, oi, li, layout, seqs)
    lib = library()
    if oi is None:
        out = _allocate(qi, _out_shape(qi, geometry.views[2].shape[3]), None, s, "out")
        oi = describe(out, "out", s)
    if li is None and return_lse:
        lse = _allocate(qi, geometry.lse_shape, "float32", s, "lse")
        li = describe(lse, "lse", s)
    params = _build(lib, qi, ki, vi, oi, li, layout, options, seqs)
    lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    if _is_empty(params):
        # As PyTorch: an empty result, nothing launched (no GPU needed).
        return (out, lse) if return_lse else out
    check_known_to_driver((qi, ki, vi, oi, li) + seqs.arrays())

    device = next((a.device for a in (qi, ki, vi, oi) if a.device is not None), None)
    handle = get_handle(device)
    needed = handle.workspace_size(params)
    ws_ptr, ws_bytes, ws_keep = 0, 0, None
    if workspace is not None:
        wi = describe(workspace, "workspace", s)
        if wi.strides != contiguous_strides(wi.shape):
            raise InvalidArgumentError("workspace must be contiguous")
        check_known_to_driver((wi,))
        ws_ptr, ws_bytes = wi.ptr, math.prod(wi.shape) * wi.itemsize
    elif needed:
        ws_keep = _allocate(qi, (needed,), "uint8", s, "workspace")
        ws_ptr, ws_bytes = describe(ws_keep, "workspace").ptr, needed
    handle.forward(params, ws_ptr, ws_bytes, s)
    del ws_keep  # back to the pool of stream s, which orders its reuse after this call
    return (out, lse) if return_lse else out


def attention(q, k, v, *, causal=False, softmax_scale=None, out=None, return_lse=False, stream=None,
              layout="bhsd", lse=None, workspace=None, num_splits=None, window=None, softcap=0.0, seqused_k=None):
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
    (out is then [B, Sq, Hq, Dv]).

    causal: bottom-right aligned mask: query i sees key j iff
        j <= i + Sk - Sq; rows that see no key give 0 (and lse -inf).
    softmax_scale: None for 1 / sqrt(D).
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

    PyTorch tensors, CuPy arrays and any object with __cuda_array_interface__
    or __dlpack__ are accepted; for the last two, out (and lse, workspace when
    needed) must be given. Returns without waiting for the GPU. Raises
    flashcore.FlashcoreError subclasses (InvalidArgumentError,
    UnsupportedError, MisalignedError, ...) carrying the library's status and
    message. Forward only: no autograd.
    """
    layout = _layout(layout)
    return _forward(q, k, v, layout=layout, options=_options(causal, softmax_scale, num_splits, window, softcap),
                    out=out, lse=lse, return_lse=return_lse, stream=stream, workspace=workspace, seqused_k=seqused_k)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     softmax_scale=None, out=None, return_lse=False, stream=None, lse=None, workspace=None,
                     num_splits=None, window=None, softcap=0.0, seqused_k=None):
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

    The other arguments are attention()'s.
    """
    return _forward(q, k, v, layout=Layout.BSHD, options=_options(causal, softmax_scale, num_splits, window, softcap),
                    out=out, lse=lse, return_lse=return_lse, stream=stream, workspace=workspace, seqused_k=seqused_k,
                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, cu_seqlens_k=cu_seqlens_k,
                    max_seqlen_k=max_seqlen_k)


def _cache_seqlens_array(count, q, cu_seqlens_q, stream):
    """cache_seqlens given as an int: an int32 [B] CUDA array of it, made
    with q's framework on the call's stream."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise TypeError("cache_seqlens must be None, an int or an int32 CUDA array of shape [B], got %s"
                        % type(count).__name__)
    count = fits(int(count), ctypes.c_int32, "cache_seqlens")
    qi, s = _describe_first(q, "q", stream)
    if not (is_torch(q) or is_cupy(q)):
        raise TypeError("an int cache_seqlens needs torch or cupy inputs; pass an int32 CUDA array instead")
    if cu_seqlens_q is None:
        batch = qi.shape[0]
    else:
        batch = _batch_from_cu_seqlens(describe(cu_seqlens_q, "cu_seqlens_q", s))
    return full(qi, (batch,), "int32", count, s)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, *, block_table=None, cu_seqlens_q=None,
                           max_seqlen_q=None, causal=False, softmax_scale=None, out=None, return_lse=False,
                           stream=None, lse=None, workspace=None, num_splits=None, window=None, softcap=0.0):
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
    The other arguments are attention()'s (layout is "bshd").
    """
    seqused_k = cache_seqlens
    if cache_seqlens is not None and not hasattr(cache_seqlens, "__cuda_array_interface__") \
            and not hasattr(cache_seqlens, "__dlpack__"):
        seqused_k = _cache_seqlens_array(cache_seqlens, q, cu_seqlens_q, stream)
    return _forward(q, k_cache, v_cache, layout=Layout.BSHD,
                    options=_options(causal, softmax_scale, num_splits, window, softcap), out=out, lse=lse,
                    return_lse=return_lse, stream=stream, workspace=workspace, seqused_k=seqused_k,
                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, block_table=block_table)
