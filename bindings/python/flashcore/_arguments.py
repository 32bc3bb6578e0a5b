"""The scalar arguments of a forward call as the C API takes them: the
layout, and the options every call has (causal, softmax_scale,
num_splits, window, softcap), converted and checked for what the
conversion itself would lose (a value the C type cannot hold, a Python
spelling the C API reads as another); the rest is the library's check."""

import collections
import ctypes
import math
import numbers

from . import _ffi
from ._checked import fits, shown, whole_number
from ._errors import InvalidArgumentError, InvalidArgumentTypeError

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


# The converted keyword arguments every forward call takes: causal as 0/1,
# scale, num_splits as the C API reads them, window as (use_window,
# window_left, window_right) from _window, softcap.
_Options = collections.namedtuple("_Options", "causal scale num_splits window softcap")


def _options(causal, softmax_scale, num_splits, window, softcap):
    return _Options(1 if causal else 0, _softmax_scale(softmax_scale), _num_splits(num_splits), _window(window),
                    _softcap(softcap))
