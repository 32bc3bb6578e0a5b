"""flashcore.attention and the parameter building under it."""

import ctypes
import math
import numbers
import operator

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


class _View:
    """An array seen as [batch, heads, seqlen, head_dim] through a layout,
    after a leading state axis where `states` (merge_states' partials)."""

    def __init__(self, info, layout, states=False):
        self.info = info
        ndim = 5 if states else 4
        if len(info.shape) != ndim:
            raise InvalidArgumentError("%s must be %d-D, %s, got shape %s"
                                       % (info.name, ndim, _shape_words(layout, states), list(info.shape)))
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


def _check_seqused_k(seqused_k, batch):
    """seqused_k: int32 of shape [batch], contiguous."""
    if seqused_k.dtype != "int32" or tuple(seqused_k.shape) != (batch,):
        raise InvalidArgumentError("seqused_k must be int32 of shape [B] = [%d] (one key count per sequence), "
                                   "got %s %s" % (batch, seqused_k.dtype, list(seqused_k.shape)))
    if batch > 1 and seqused_k.strides[0] != 1:
        raise InvalidArgumentError("seqused_k must be contiguous, got stride %d" % seqused_k.strides[0])


def _check_one_device(arrays, names):
    devices = sorted({a.device for a in arrays if a is not None and a.device is not None})
    if len(devices) > 1:
        raise InvalidArgumentError("%s must be on one device, got devices %s" % (names, devices))


def _out_shape(q, head_dim_v):
    """out's shape, in q's own layout: q's, with head_dim_v last."""
    return tuple(q.shape[:3]) + (head_dim_v,)


def _validate(q, k, v, out, lse, layout, seqused_k=None):
    """Checks what the C API cannot see (it takes one dtype and one set of
    sizes for all tensors); strides, alignment, head counts and supported
    sizes are left to the library's own validation."""
    views = [_View(a, layout) for a in (q, k, v, out) if a is not None]
    qv, kv, vv = views[:3]
    if q.dtype not in DTYPES:
        raise UnsupportedError("q has dtype %s; flashcore computes on %s" % (q.dtype, " or ".join(DTYPES)))
    for a in (k, v, out):
        if a is not None and a.dtype != q.dtype:
            raise InvalidArgumentError("%s has dtype %s but q has %s: all must match" % (a.name, a.dtype, q.dtype))
    if kv.shape[:3] != vv.shape[:3]:
        raise InvalidArgumentError("k and v must have the same shape but for the last dimension (v's is head_dim_v), "
                                   "got %s and %s" % (list(k.shape), list(v.shape)))
    if kv.shape[0] != qv.shape[0] or kv.shape[3] != qv.shape[3]:
        raise InvalidArgumentError("q %s and k %s must agree on batch size and head_dim (%s)"
                                   % (list(q.shape), list(k.shape), _shape_words(layout)))
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
    if lse is not None:
        _check_lse(lse, (qv.shape[0], qv.shape[1], qv.shape[2]), "[B, H, Sq]")
    if seqused_k is not None:
        _check_seqused_k(seqused_k, qv.shape[0])
    _check_one_device((q, k, v, out, lse, seqused_k), "q, k, v, out, lse and seqused_k")
    return qv, kv, vv


def _build(lib, q, k, v, out, lse, layout, causal, scale, num_splits=0, window=(0, 0, 0), softcap=0.0,
           seqused_k=None):
    """window: (use_window, window_left, window_right) from _window."""
    qv, kv, vv = _validate(q, k, v, out, lse, layout, seqused_k)
    p = lib.new_params()
    batch, heads_q, seqlen_q, head_dim = qv.shape
    p.dtype = DTYPES[q.dtype]
    p.causal = 1 if causal else 0
    p.softmax_scale = scale
    p.softcap = softcap
    use_window, window_left, window_right = window
    set_fields(p, batch_size=batch, num_heads_q=heads_q, seqlen_q=seqlen_q, head_dim=head_dim,
               head_dim_v=vv.shape[3], num_heads_kv=kv.shape[1], seqlen_k=kv.shape[2], num_splits=num_splits,
               use_window=use_window, window_left=window_left, window_right=window_right,
               lse=lse.ptr if lse is not None else None,
               seqused_k=seqused_k.ptr if seqused_k is not None else None)
    for prefix, info in (("q", q), ("k", k), ("v", v), ("out", out)):
        if info is None:
            continue
        fields = {prefix: info.ptr}
        for stride, what in zip(_View(info, layout).aligned_strides(), ("batch", "head", "seq")):
            fields["%s_%s_stride" % (prefix, what)] = stride
        set_fields(p, **fields)
    return p


def _is_empty(params):
    """Whether the call's output is empty (flashcore.h: batch_size, seqlen_q
    or num_heads_q 0): the library then does nothing, and neither do we."""
    return 0 in (params.batch_size, params.seqlen_q, params.num_heads_q)


def forward_params(q, k, v, out=None, *, lse=None, causal=False, softmax_scale=None, layout="bhsd", num_splits=None,
                   window=None, softcap=0.0, seqused_k=None):
    """A flashcore.ForwardParams for these arrays (pointers, sizes, strides),
    for the low-level calls: Handle.workspace_size, Handle.forward,
    check_params. The arrays must outlive every use of the result.
    num_splits, window, softcap and seqused_k as for attention()."""
    layout = _layout(layout)
    scale, splits = _softmax_scale(softmax_scale), _num_splits(num_splits)
    window, softcap = _window(window), _softcap(softcap)
    infos = [None if a is None else describe(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    used = None if seqused_k is None else describe(seqused_k, "seqused_k")
    return _build(library(), *infos, layout, causal, scale, splits, window, softcap, used)


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
    scale = _softmax_scale(softmax_scale)
    splits = _num_splits(num_splits)
    window, softcap = _window(window), _softcap(softcap)
    user_stream = None if stream is None else stream_pointer(stream)
    qi = describe(q, "q", user_stream or 0)
    s = current_stream(qi) if user_stream is None else user_stream
    ki, vi = describe(k, "k", s), describe(v, "v", s)
    oi = None if out is None else describe(out, "out", s)
    li = None if lse is None else describe(lse, "lse", s)
    ui = None if seqused_k is None else describe(seqused_k, "seqused_k", s)
    qv, _, vv = _validate(qi, ki, vi, oi, li, layout, ui)
    lib = library()
    if oi is None:
        out = _allocate(qi, _out_shape(qi, vv.shape[3]), None, s, "out")
        oi = describe(out, "out", s)
    if li is None and return_lse:
        lse = _allocate(qi, qv.shape[:3], "float32", s, "lse")
        li = describe(lse, "lse", s)
    params = _build(lib, qi, ki, vi, oi, li, layout, causal, scale, splits, window, softcap, ui)
    lib.check(lib.cdll.flashcore_forward_check(ctypes.byref(params)))
    if _is_empty(params):
        # As PyTorch: an empty result, nothing launched (no GPU needed).
        return (out, lse) if return_lse else out
    check_known_to_driver((qi, ki, vi, oi, li, ui))

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


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, *, causal=False, softmax_scale=None, out=None,
                           return_lse=False, stream=None, lse=None, workspace=None, num_splits=None, window=None,
                           softcap=0.0):
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
    The other arguments are attention()'s (layout is "bshd"). Paged caches
    (block_table) are not supported yet.
    """
    seqused_k = cache_seqlens
    if cache_seqlens is not None and not hasattr(cache_seqlens, "__cuda_array_interface__") \
            and not hasattr(cache_seqlens, "__dlpack__"):
        if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, numbers.Integral):
            raise TypeError("cache_seqlens must be None, an int or an int32 CUDA array of shape [B], got %s"
                            % type(cache_seqlens).__name__)
        count = fits(int(cache_seqlens), ctypes.c_int32, "cache_seqlens")
        user_stream = None if stream is None else stream_pointer(stream)
        qi = describe(q, "q", user_stream or 0)
        if not (is_torch(q) or is_cupy(q)):
            raise TypeError("an int cache_seqlens needs torch or cupy inputs; pass an int32 CUDA array instead")
        s = current_stream(qi) if user_stream is None else user_stream
        seqused_k = full(qi, (qi.shape[0],), "int32", count, s)
    return attention(q, k_cache, v_cache, causal=causal, softmax_scale=softmax_scale, out=out, return_lse=return_lse,
                     stream=stream, layout="bshd", lse=lse, workspace=workspace, num_splits=num_splits, window=window,
                     softcap=softcap, seqused_k=seqused_k)
