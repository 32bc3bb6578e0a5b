"""Integers checked before they reach ctypes, which silently wraps what does
not fit (a pointer of 2**64 + a becomes a, an int32 of 2**31 becomes -2**31),
and refuses nothing that has __index__ or __int__ of the wrong kind (a bool,
a float of 64.5 passed through int()); and the params structs the low-level
calls take, checked before ctypes refuses another object with an error that
names no argument."""

import ctypes
import operator

from . import _ffi
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._fields import int_range, shown

_C_NAMES = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_size_t: "size_t",
            ctypes.c_void_p: "pointer"}
# (lowest, highest) int of each C type above.
_RANGES = {ctype: int_range(ctype) for ctype in _C_NAMES}
_setattr = ctypes.Structure.__setattr__
# The params structs by the names the package exports them under.
STRUCT_NAMES = {_ffi.flashcore_forward_params: "flashcore.ForwardParams",
                _ffi.flashcore_backward_params: "flashcore.BackwardParams",
                _ffi.flashcore_merge_params: "flashcore.MergeParams"}


def whole_number(value, what):
    """value as a Python int: ints and objects with __index__ (NumPy
    integers), never a bool or a float (64.5 and 64.0 alike)."""
    if isinstance(value, bool):
        raise InvalidArgumentTypeError("%s must be an int, not a bool" % what)
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentTypeError("%s must be an int, got %s %s"
                                       % (what, type(value).__name__, shown(value))) from None


def fits(value, ctype, what):
    """value (an int, or None for a pointer) after checking that the C type
    holds it."""
    if value is None and ctype is ctypes.c_void_p:
        return None
    if type(value) is not int:  # the common case skips the call (a call's host time matters)
        value = whole_number(value, what)
    low, high = _RANGES[ctype]
    if not low <= value <= high:
        raise InvalidArgumentError("%s (%s) does not fit the C API's %s (%d to %d)"
                                   % (what, shown(value), _C_NAMES[ctype], low, high))
    return value


def set_fields(struct, **values):
    """Assigns each keyword to the ctypes struct's field of that name, range
    checked against the field's C type (by fits(), which names the argument
    rather than the field: the struct's own check is not repeated)."""
    types = dict(type(struct)._fields_)
    for name, value in values.items():
        _setattr(struct, name, fits(value, types[name], name))


def struct_ref(value, struct, what, made_by):
    """ctypes.byref(value), value a `struct` (a params struct of _ffi; made_by
    says where one comes from). Anything else is refused naming `what`:
    ctypes would raise its own TypeError or ArgumentError, naming neither
    the argument nor the type it takes."""
    if not isinstance(value, struct):
        got = next((name for s, name in STRUCT_NAMES.items() if isinstance(value, s)), None)
        raise InvalidArgumentTypeError("%s must be a %s (%s), got %s"
                                       % (what, STRUCT_NAMES[struct], made_by,
                                          got or ("None" if value is None else type(value).__name__)))
    return ctypes.byref(value)
