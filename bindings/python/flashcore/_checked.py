"""Integers checked before they reach ctypes, which silently wraps what does
not fit (a pointer of 2**64 + a becomes a, an int32 of 2**31 becomes -2**31),
and refuses nothing that has __index__ or __int__ of the wrong kind (a bool,
a float of 64.5 passed through int())."""

import ctypes
import operator

from ._errors import InvalidArgumentError

_BITS = {
    ctypes.c_int32: (True, 32),
    ctypes.c_int64: (True, 64),
    ctypes.c_size_t: (False, 8 * ctypes.sizeof(ctypes.c_size_t)),
    ctypes.c_void_p: (False, 8 * ctypes.sizeof(ctypes.c_void_p)),
}
_C_NAMES = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_size_t: "size_t",
            ctypes.c_void_p: "pointer"}


def whole_number(value, what):
    """value as a Python int: ints and objects with __index__ (NumPy
    integers), never a bool or a float (64.5 and 64.0 alike)."""
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not a bool" % what)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, got %s %r" % (what, type(value).__name__, value)) from None


def fits(value, ctype, what):
    """value (an int, or None for a pointer) after checking that the C type
    holds it."""
    if value is None and ctype is ctypes.c_void_p:
        return None
    if type(value) is not int:  # the common case skips the call (a call's host time matters)
        value = whole_number(value, what)
    signed, bits = _BITS[ctype]
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise InvalidArgumentError("%s (%d) does not fit the C API's %s (%d to %d)"
                                   % (what, value, _C_NAMES[ctype], low, high))
    return value


def set_fields(struct, **values):
    """Assigns each keyword to the ctypes struct's field of that name, range
    checked against the field's C type."""
    types = dict(type(struct)._fields_)
    for name, value in values.items():
        setattr(struct, name, fits(value, types[name], name))
