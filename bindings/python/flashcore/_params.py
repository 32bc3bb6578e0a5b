"""A forward or backward call's arguments as the C API's params structs
take them. The scalars first: the layout and the options every call has
(causal, softmax_scale, num_splits, window, softcap, attention_chunk,
sm_margin), converted and checked for what the conversion itself would
lose (a value the C type cannot hold, a Python spelling the C API reads
as another).
Then the arrays: each seen through the layout (_View), the checks the C
API cannot make (it takes one dtype and one set of sizes for all of
them), the sequences of packed and paged calls, the descale factors of
quantized (fp8) inputs (K/V, or queries, K and V), the learnable sinks
(and their gradient), and the params struct built from all that (_build,
_build_backward). The rest is the library's check."""

import collections
import ctypes
import math
import numbers

from . import _ffi
from ._arrays import contiguous_strides, describe
from ._errors import InvalidArgumentError, InvalidArgumentTypeError, UnsupportedError
from ._fields import fits, set_fields, shown, whole_number

Layout = _ffi.Layout
# Axes of (batch, heads, seqlen) in each layout; head_dim is always the last.
LAYOUT_AXES = {Layout.BHSD: (0, 1, 2), Layout.BSHD: (0, 2, 1)}
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


def _attention_chunk(attention_chunk):
    """The C attention_chunk for the Python argument (Llama 4's chunked
    attention): 0 (off) or a chunk length, an int that an int32 holds; that
    it is >= 0 is the library's check."""
    return fits(attention_chunk, ctypes.c_int32, "attention_chunk")


def _sm_margin(sm_margin):
    """The C sm_margin for the Python argument (FlashAttention 3's: SMs the
    call leaves to kernels on other streams): an int that an int32 holds;
    that it is >= 0 and leaves the device an SM is the library's check (the
    SM count is the handle's)."""
    return fits(sm_margin, ctypes.c_int32, "sm_margin")


# The converted keyword arguments every forward call takes: causal as 0/1,
# scale, num_splits as the C API reads them, window as (use_window,
# window_left, window_right) from _window, softcap, attention_chunk,
# sm_margin.
_Options = collections.namedtuple("_Options", "causal scale num_splits window softcap attention_chunk sm_margin")


def _options(causal, softmax_scale, num_splits, window, softcap, attention_chunk=0, sm_margin=0):
    return _Options(1 if causal else 0, _softmax_scale(softmax_scale), _num_splits(num_splits), _window(window),
                    _softcap(softcap), _attention_chunk(attention_chunk), _sm_margin(sm_margin))


# --------------------------------------------------------------------------
# The arrays
# --------------------------------------------------------------------------

DTYPES = {"float16": _ffi.Dtype.FP16, "bfloat16": _ffi.Dtype.BF16}
# Quantized K/V a forward call takes beside float16/bfloat16 queries (its
# kv_dtype): an fp8 KV cache, each element times its descale factor.
KV_DTYPES = {"float8_e4m3fn": _ffi.Dtype.FP8_E4M3}
# Quantized queries (fp8 prefill, as FlashAttention 3's): q, k and v all of
# this dtype (the params' dtype), each element times its descale factor;
# out is of QUANTIZED_OUT_DTYPE, as FlashAttention 3's.
QUERY_DTYPES = {"float8_e4m3fn": _ffi.Dtype.FP8_E4M3}
QUANTIZED_OUT_DTYPE = "bfloat16"
# Every dtype a forward call's q may have (the params' dtype).
FORWARD_DTYPES = {**DTYPES, **QUERY_DTYPES}
# Why quantized K/V have no gradients, for the errors that say so.
QUANTIZED_BACKWARD = ("gradients through quantized K/V (float8_e4m3fn: an fp8 KV cache, for inference only) are not "
                      "computed: flashcore_backward takes float16/bfloat16 K/V. Run the call under torch.no_grad(), "
                      "or pass detach=True to compute from the values alone")
# Why quantized queries have no gradients, for the errors that say so.
QUANTIZED_QUERY_BACKWARD = ("gradients through fp8 queries (float8_e4m3fn q, k and v: fp8 prefill, for inference "
                            "only) are not computed: flashcore_backward takes float16/bfloat16 q, k and v. Run the "
                            "call under torch.no_grad(), or pass detach=True to compute from the values alone")
# Why fp8 queries take no softcap, for the errors that say so (the library
# refuses it too, UNSUPPORTED).
QUANTIZED_QUERY_SOFTCAP = ("softcap is not supported with fp8 (float8_e4m3fn) queries: the fp8 prefill kernels "
                           "have no logit softcapping (pass softcap=0.0, or float16/bfloat16 q with fp8 K/V)")
INT32_MAX = 2**31 - 1


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


def _check_lse(lse, want, words, written=True):
    """lse: float32 of shape `want` (named `words`), contiguous, and
    writable where the call writes it."""
    if lse.shape != want or lse.dtype != "float32":
        raise InvalidArgumentError("lse must be float32 of shape %s = %s, got %s %s"
                                   % (words, list(want), lse.dtype, list(lse.shape)))
    if any(st != c for size, st, c in zip(lse.shape, lse.strides, contiguous_strides(lse.shape)) if size > 1):
        raise InvalidArgumentError("lse must be contiguous, got strides %s" % (list(lse.strides),))
    if written and lse.readonly:
        raise InvalidArgumentError("lse is read-only")


def _check_contiguous_vector(info):
    if info.shape[0] > 1 and info.strides[0] != 1:
        raise InvalidArgumentError("%s must be contiguous, got stride %d" % (info.name, info.strides[0]))


def _check_vector(info, length, words, dtype="int32"):
    """info: a contiguous vector of `length` entries of `dtype`; `words` is
    its shape as messages give it."""
    if info.dtype != dtype or tuple(info.shape) != (length,):
        raise InvalidArgumentError("%s must be %s of shape %s, got %s %s"
                                   % (info.name, dtype, words, info.dtype, list(info.shape)))
    _check_contiguous_vector(info)


def _check_sinks(info, heads, written=False):
    """sinks (or dsinks, its gradient, written): a contiguous float32 vector
    of one logit per query head. Their values, and that dsinks comes with
    sinks, are the library's."""
    _check_vector(info, heads, "[Hq] = [%d] (one logit per query head)" % heads, "float32")
    if written and info.readonly:
        raise InvalidArgumentError("%s is read-only" % info.name)


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
               block_table=None, seqused_k_name="seqused_k", describe_array=None):
    """_Sequences from the Python arguments, arrays described on `stream`
    (seqused_k under the name the caller knows it by), or by
    describe_array(x, name) where given (flashcore.jax: abstract arrays)."""
    if cu_seqlens_k is not None and block_table is not None:
        raise InvalidArgumentError("cu_seqlens_k and block_table cannot be combined: a paged cache's key counts come "
                                   "from seqused_k (cu_seqlens_q with a block_table is supported)")
    max_q, max_k = _max_seqlen(max_seqlen_q, cu_seqlens_q, "q"), _max_seqlen(max_seqlen_k, cu_seqlens_k, "k")

    def info(x, name):
        if x is None:
            return None
        return describe(x, name, stream) if describe_array is None else describe_array(x, name)

    return _Sequences(info(seqused_k, seqused_k_name), info(cu_seqlens_q, "cu_seqlens_q"),
                      info(cu_seqlens_k, "cu_seqlens_k"), info(block_table, "block_table"), max_q, max_k)


# The descale arguments, in the order of their fields in flashcore_forward_params.
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


class _Descales:
    """The descale factors of a call's quantized inputs (FlashAttention 3's
    q_descale, k_descale and v_descale): described arrays, None where not
    given."""

    __slots__ = DESCALE_NAMES

    def __init__(self, q_descale=None, k_descale=None, v_descale=None):
        self.q_descale, self.k_descale, self.v_descale = q_descale, k_descale, v_descale

    def arrays(self):
        return (self.q_descale, self.k_descale, self.v_descale)


NO_DESCALES = _Descales()


def _descale_forms(name, batch=None, heads_kv=None):
    """The forms a descale argument takes, for messages."""
    per_head = "[B, Hkv]" if batch is None else "[B, Hkv] = [%d, %d]" % (batch, heads_kv)
    return ("%s must be None or a float32 CUDA tensor: of one element (shape [] or [1]: one factor for the whole "
            "tensor) or of shape %s (one per sequence and K/V head; any strides, an expand()ed view included)"
            % (name, per_head))


def refuse_descale_number(value, name):
    """Raises the error of a descale factor given as a Python number: the
    factors are read on the GPU, and a tensor made of the number would be
    an allocation and a copy on every call, hidden in the call."""
    raise InvalidArgumentTypeError("%s: got %s %s; pass a tensor instead (e.g. torch.tensor([%s], "
                                   "dtype=torch.float32, device=q.device), made once and reused)"
                                   % (_descale_forms(name), type(value).__name__, shown(value), shown(value)))


def _describe_descale(x, name, stream, describe_array=None):
    """The ArrayInfo of a descale argument; what is no CUDA array is refused
    with the forms it takes."""
    if isinstance(x, numbers.Number):
        refuse_descale_number(x, name)
    try:
        return describe(x, name, stream) if describe_array is None else describe_array(x, name)
    except InvalidArgumentError as e:  # host memory, say
        raise type(e)("%s; %s" % (e.message, _descale_forms(name))) from None
    except TypeError:  # no array at all
        raise InvalidArgumentTypeError("%s; got %s" % (_descale_forms(name), type(x).__name__)) from None


def _descales(stream, q_descale=None, k_descale=None, v_descale=None, describe_array=None):
    """_Descales from the Python arguments, arrays described on `stream`
    (or by describe_array, as for _sequences)."""
    return _Descales(*(None if x is None else _describe_descale(x, name, stream, describe_array)
                       for x, name in zip((q_descale, k_descale, v_descale), DESCALE_NAMES)))


def _descale_strides(info, batch, heads_kv):
    """(batch stride, head stride) of a described descale array: (0, 0) for
    one element (a factor for the whole tensor), its own strides for
    [B, Hkv] (0 along a dimension of size 1, never stepped along; a
    framework may give it any stride)."""
    if info.dtype == "float32":
        if all(size == 1 for size in info.shape):
            return 0, 0
        if tuple(info.shape) == (batch, heads_kv):
            return tuple(0 if size == 1 else stride for size, stride in zip(info.shape, info.strides))
    raise InvalidArgumentError("%s; got %s %s" % (_descale_forms(info.name, batch, heads_kv), info.dtype,
                                                  list(info.shape)))


class _Geometry:
    """The sizes of one call as the C API takes them, with the views of q,
    k, v and out (out's None when not given), K/V's flashcore_dtype when
    quantized under 16-bit queries (0: q's), out's flashcore_dtype and its
    name where it is not q's (fp8 queries: 0 and None otherwise) and the
    fields of the descale arrays."""

    __slots__ = ("views", "batch", "seqlen_q", "seqlen_k", "total_q", "total_k", "page_size", "num_pages",
                 "table_stride", "lse_shape", "lse_words", "kv_dtype", "out_dtype", "out_dtype_name",
                 "descale_fields")

    def __init__(self, views, batch, seqlen_q, seqlen_k):
        self.views = views
        self.batch, self.seqlen_q, self.seqlen_k = batch, seqlen_q, seqlen_k
        self.total_q = self.total_k = self.page_size = self.num_pages = self.table_stride = self.kv_dtype = 0
        self.out_dtype, self.out_dtype_name = 0, None
        self.lse_shape, self.lse_words = (batch, views[0].shape[1], seqlen_q), "[B, H, Sq]"
        self.descale_fields = {}


def out_dtype_name(q_dtype):
    """The dtype (name) of out for queries of q_dtype (a name): q's own,
    but QUANTIZED_OUT_DTYPE for fp8 queries."""
    return QUANTIZED_OUT_DTYPE if q_dtype in QUERY_DTYPES else q_dtype


def _query_dtypes(q, k, v, out, quantized):
    """(kv_dtype, out_dtype) of fp8 queries (q of a QUERY_DTYPES dtype):
    k and v must be of q's dtype too (kv_dtype is then 0, "q's"; 16-bit K/V
    under fp8 queries are UNSUPPORTED), out bfloat16 (out_dtype BF16, as
    FlashAttention 3's fp8 forward gives). quantized: whether the call
    takes quantized inputs at all (the forward; the backward has no fp8
    kernels)."""
    if not quantized:
        raise UnsupportedError("q has dtype %s: %s" % (q.dtype, QUANTIZED_QUERY_BACKWARD))
    if k.dtype != v.dtype and (k.dtype in KV_DTYPES or v.dtype in KV_DTYPES):
        raise InvalidArgumentError("k has dtype %s but v has %s: with %s queries both must be %s"
                                   % (k.dtype, v.dtype, q.dtype, q.dtype))
    for a in (k, v):
        if a.dtype != q.dtype:
            raise UnsupportedError("%s has dtype %s but q has %s: fp8 queries take %s k and v only (fp8 prefill: q, "
                                   "k and v all %s, each with its descale); for 16-bit K/V, pass float16 or bfloat16 "
                                   "q" % (a.name, a.dtype, q.dtype, q.dtype, q.dtype))
    if out is not None and out.dtype != QUANTIZED_OUT_DTYPE:
        raise UnsupportedError("out has dtype %s: %s queries give a %s result (as FlashAttention 3's fp8 forward); "
                               "pass a %s out" % (out.dtype, q.dtype, QUANTIZED_OUT_DTYPE, QUANTIZED_OUT_DTYPE))
    return 0, DTYPES[QUANTIZED_OUT_DTYPE]


def _kv_dtype(q, k, v, out, quantized_kv):
    """(kv_dtype, out_dtype) of a call, as flashcore_forward_params takes
    them. 16-bit queries: K/V's flashcore_dtype where they are quantized (k
    and v both of a KV_DTYPES dtype; taken where quantized_kv), else 0,
    every dtype then checked to be q's; out_dtype 0 (q's). fp8 queries:
    _query_dtypes(). Whether the library has kernels for the combination
    (fp8 queries: sm_90 only) is its own check."""
    if q.dtype in QUERY_DTYPES:
        return _query_dtypes(q, k, v, out, quantized_kv)
    if q.dtype not in DTYPES:
        raise UnsupportedError("q has dtype %s; flashcore computes on %s (or, forward only, %s q, k and v: fp8 "
                               "prefill)" % (q.dtype, " or ".join(DTYPES), " or ".join(QUERY_DTYPES)))
    quantized = [a for a in (k, v) if a.dtype in KV_DTYPES]
    if quantized and not quantized_kv:
        raise UnsupportedError("%s has dtype %s: %s" % (quantized[0].name, quantized[0].dtype, QUANTIZED_BACKWARD))
    if quantized and k.dtype != v.dtype:
        raise InvalidArgumentError("k has dtype %s but v has %s: quantized K/V (a KV cache of %s) must both be"
                                   % (k.dtype, v.dtype, " or ".join(KV_DTYPES)))
    for a in (out,) if quantized else (k, v, out):
        if a is not None and a.dtype != q.dtype:
            also = "" if a is out or not quantized_kv else " (or k and v both %s: a quantized KV cache)" % (
                " or ".join(KV_DTYPES))
            raise InvalidArgumentError("%s has dtype %s but q has %s: all must match%s"
                                       % (a.name, a.dtype, q.dtype, also))
    return (KV_DTYPES[k.dtype] if quantized else 0), 0


def check_quantized_options(q, options):
    """Refuses the options fp8 queries (q: an ArrayInfo) do not take:
    softcap, which the library refuses too (UNSUPPORTED), before anything
    is allocated or queued."""
    if options is not None and q.dtype in QUERY_DTYPES and options.softcap:
        raise UnsupportedError(QUANTIZED_QUERY_SOFTCAP)


def _validate(q, k, v, out, lse, layout, seqs=DENSE, written=True, descales=None, options=None, sinks=None):
    """Checks what the C API cannot see (it takes one dtype and one set of
    sizes for all tensors) and returns the call's _Geometry; strides,
    alignment, head counts and supported sizes are left to the library's
    own validation. written: whether the call writes out and lse (the
    forward does; the backward reads them). descales: the forward's
    _Descales; quantized K/V and queries are taken with it only (the
    backward has none). options: the forward's _Options, where given
    checked against fp8 queries (check_quantized_options). sinks: the
    described learnable sinks, one float32 logit per query head, or None."""
    packed_q, packed_kv = seqs.cu_seqlens_q is not None, seqs.cu_seqlens_k is not None
    paged = seqs.block_table is not None
    kv_words = _paged_words(layout) if paged else None
    qv = _View(q, layout, packed=packed_q)
    kv, vv = (_View(a, layout, packed=packed_kv, words=kv_words) for a in (k, v))
    ov = None if out is None else _View(out, layout, packed=packed_q)
    views = [a for a in (qv, kv, vv, ov) if a is not None]
    kv_dtype, out_dtype = _kv_dtype(q, k, v, out, descales is not None)
    check_quantized_options(q, options)
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
        if written and out.readonly:
            raise InvalidArgumentError("out is read-only")
    for view in views:
        view.check_head_dim_contiguous()
        _check_int32_sizes(view.info)

    geometry = _Geometry(views, batch, seqs.max_seqlen_q if packed_q else qv.shape[2], kv.shape[2])
    if packed_q:
        geometry.total_q = qv.shape[2]
        geometry.lse_shape, geometry.lse_words = (qv.shape[1], qv.shape[2]), "[Hq, total_q]"
    if packed_kv:
        _check_vector(seqs.cu_seqlens_k, batch + 1, "[B + 1] = [%d] (B = %d, %s: the row where each sequence "
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
        _check_vector(seqs.seqused_k, batch, "[B] = [%d] (one key count per sequence)" % batch)
    if lse is not None:
        _check_lse(lse, geometry.lse_shape, geometry.lse_words, written)
    if sinks is not None:
        _check_sinks(sinks, qv.shape[1])
    geometry.kv_dtype, geometry.out_dtype = kv_dtype, out_dtype
    if out_dtype:
        geometry.out_dtype_name = out_dtype_name(q.dtype)
    arrays = (q, k, v, out, lse) + seqs.arrays() + (sinks,)
    if descales is not None:
        for info, name in zip(descales.arrays(), DESCALE_NAMES):
            if info is not None:
                strides = _descale_strides(info, batch, kv.shape[1])
                geometry.descale_fields.update({name: info.ptr, name + "_batch_stride": strides[0],
                                                name + "_head_stride": strides[1]})
        arrays += descales.arrays()
    _check_one_device(arrays, _names(arrays))
    return geometry


def _address(info):
    return None if info is None else info.ptr


def _set_call_fields(p, q, geometry, options, seqs, sinks, tensors, **fields):
    """Sets what flashcore_forward_params and flashcore_backward_params
    share (the dtype, the options, the shapes, the sequence arrays, the
    sinks), then `fields` and the arrays' `tensors` (_tensor_fields), in
    one set_fields."""
    qv, kv, vv = geometry.views[:3]
    p.dtype = FORWARD_DTYPES[q.dtype]
    p.causal = options.causal
    p.softmax_scale = options.scale
    p.softcap = options.softcap
    use_window, window_left, window_right = options.window
    set_fields(p, batch_size=geometry.batch, num_heads_q=qv.shape[1], seqlen_q=geometry.seqlen_q,
               head_dim=qv.shape[3], head_dim_v=vv.shape[3], num_heads_kv=kv.shape[1], seqlen_k=geometry.seqlen_k,
               use_window=use_window, window_left=window_left, window_right=window_right,
               seqused_k=_address(seqs.seqused_k), cu_seqlens_q=_address(seqs.cu_seqlens_q),
               cu_seqlens_k=_address(seqs.cu_seqlens_k), total_seqlen_q=geometry.total_q,
               total_seqlen_k=geometry.total_k, attention_chunk=options.attention_chunk, sinks=_address(sinks),
               sm_margin=options.sm_margin, **fields, **tensors)


def _tensor_fields(prefixes, views):
    """Each view's pointer and strides, keyed by the fields named by its
    prefix ("q": q, q_batch_stride, ...)."""
    fields = {}
    for prefix, view in zip(prefixes, views):
        fields[prefix] = view.info.ptr
        for stride, what in zip(view.aligned_strides(), ("batch", "head", "seq")):
            fields["%s_%s_stride" % (prefix, what)] = stride
    return fields


def _build(lib, q, k, v, out, lse, layout, options, seqs=DENSE, descales=NO_DESCALES, sinks=None):
    """A flashcore_forward_params for described arrays (sinks: the learnable
    sinks, or None) and _Options."""
    geometry = _validate(q, k, v, out, lse, layout, seqs, descales=descales, options=options, sinks=sinks)
    p = lib.new_params()
    _set_call_fields(p, q, geometry, options, seqs, sinks, _tensor_fields(("q", "k", "v", "out"), geometry.views),
                     num_splits=options.num_splits, lse=_address(lse), block_table=_address(seqs.block_table),
                     block_table_batch_stride=geometry.table_stride, page_size=geometry.page_size,
                     num_pages=geometry.num_pages, kv_dtype=geometry.kv_dtype, out_dtype=geometry.out_dtype,
                     **geometry.descale_fields)
    return p


# Why a paged call has no gradients, for the errors that say so.
PAGED_BACKWARD = ("gradients through a paged KV cache (block_table) are not computed: flashcore_backward takes no "
                  "paged caches. Run the call under torch.no_grad(), or pass detach=True to compute from the values "
                  "alone")


def _build_backward(lib, q, k, v, out, dout, lse, dq, dk, dv, layout, options, deterministic, seqs=DENSE, sinks=None,
                    dsinks=None):
    """A flashcore_backward_params for described arrays (dout, dq, dk and dv
    are out's, q's, k's and v's gradients: their shapes and dtype; sinks the
    forward's, dsinks their gradient, written, or None), _Options
    (num_splits unused) and deterministic."""
    if seqs.block_table is not None:
        raise UnsupportedError(PAGED_BACKWARD)
    why = {"out": " (the forward's output: the backward pass reads it)",
           "lse": " (the forward's log-sum-exp: the backward pass recomputes the attention weights from it)"}
    for info, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout"), (lse, "lse"), (dq, "dq"),
                       (dk, "dk"), (dv, "dv")):
        if info is None:
            raise InvalidArgumentError("%s%s is required" % (name, why.get(name, "")))
    geometry = _validate(q, k, v, out, lse, layout, seqs, written=False, sinks=sinks)
    if dsinks is not None:
        _check_sinks(dsinks, geometry.views[0].shape[1], written=True)
    packed_q, packed_kv = seqs.cu_seqlens_q is not None, seqs.cu_seqlens_k is not None
    grads = ((dout, out, packed_q), (dq, q, packed_q), (dk, k, packed_kv), (dv, v, packed_kv))
    for grad, like, _ in grads:
        if grad.shape != like.shape:
            raise InvalidArgumentError("%s must have %s's shape %s, got %s"
                                       % (grad.name, like.name, list(like.shape), list(grad.shape)))
        if grad.dtype != q.dtype:
            raise InvalidArgumentError("%s has dtype %s but q has %s: all must match"
                                       % (grad.name, grad.dtype, q.dtype))
    for grad in (dq, dk, dv):
        if grad.readonly:
            raise InvalidArgumentError("%s is read-only" % grad.name)
    views = list(geometry.views)
    for grad, _, packed in grads:
        view = _View(grad, layout, packed=packed)
        view.check_head_dim_contiguous()
        views.append(view)
    arrays = (q, k, v, out, dout, lse, dq, dk, dv) + seqs.arrays() + (sinks, dsinks)
    _check_one_device(arrays, _names(arrays))
    p = lib.new_backward_params()
    tensors = _tensor_fields(("q", "k", "v", "out", "dout", "dq", "dk", "dv"), views)
    _set_call_fields(p, q, geometry, options, seqs, sinks, tensors, deterministic=1 if deterministic else 0,
                     lse=lse.ptr, dsinks=_address(dsinks))
    return p


def _is_empty(params):
    """Whether the call's output is empty (flashcore.h: batch_size, seqlen_q
    or num_heads_q 0, or packed queries of no rows): the library then does
    nothing, and neither do we."""
    return (0 in (params.batch_size, params.seqlen_q, params.num_heads_q)
            or (params.cu_seqlens_q is not None and params.total_seqlen_q == 0))


def _backward_is_empty(params):
    """Whether a backward call has nothing to compute (flashcore.h: batch_size
    or num_heads_q 0; unlike the forward, no query rows with keys still
    gives dk = dv = 0)."""
    return 0 in (params.batch_size, params.num_heads_q)


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
