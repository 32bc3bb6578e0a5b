"""Assignments to the fields of the ctypes structs of _ffi, checked against
each field's C type.

ctypes alone stores an int modulo 2**bits (2**32 + 128 in an int32_t reads
back 128, -1 in a size_t 2**64 - 1), a finite float beyond a float's range
as infinity and a nonzero one too small for it as 0, and refuses a value of
another type without naming the field. A value the field would not hold as
given is refused instead, the error naming the field, its C type as the
header spells it (the struct's _c_types_, generated with its _fields_) and
its range. Ints, objects with __index__ and bools are taken for integer
fields; ints, or None for NULL, for pointers (addresses); real numbers for
floats, infinity and NaN included (the library says where those are wrong).

The same holds for the binding's own ints before they reach ctypes
(whole_number, fits, set_fields): a pointer of 2**64 + a would become a, a
bool or a float of 64.5 passed through int() would be taken.

The generated structs take checked_setattr as their __setattr__: it raises
flashcore.InvalidArgumentError, for a value of the wrong type
InvalidArgumentTypeError (a TypeError too), as do the other checks here.
The generated module loaded on its own, outside the package (as the
generator's tests load its output), takes plain_checked_setattr instead,
which raises ValueError and TypeError.

_ffi imports this module while it is being loaded, before anything else of
the package can be, and _errors imports _ffi (for Status): so this module
imports nothing of the package, and _errors hands it the exceptions to
raise (use_errors) once they exist.
"""

import ctypes
import math
import operator

# The largest finite value and the smallest nonzero one of float and double.
_FLOAT_RANGE = {"f": (float.fromhex("0x1.fffffep+127"), float.fromhex("0x1p-149")),
                "d": (float.fromhex("0x1.fffffffffffffp+1023"), float.fromhex("0x1p-1074"))}
_setattr = ctypes.Structure.__setattr__
# struct -> {field: (low, high)}: the ints an integer or pointer field holds
# (those in range take no other check), an empty range (1, 0) for a float.
_BOUNDS = {}


def int_range(ctype):
    """(lowest, highest) int the integer or pointer ctype holds; None for
    any other ctype."""
    code = getattr(ctype, "_type_", None)
    bits = 8 * ctypes.sizeof(ctype)
    if code == "P" or code in ("B", "H", "I", "L", "Q"):
        return 0, (1 << bits) - 1
    if code in ("b", "h", "i", "l", "q"):
        return -(1 << bits - 1), (1 << bits - 1) - 1
    return None


def shown(value):
    """repr(value) for a message, shortened where it is long (an int of
    hundreds of digits)."""
    text = repr(value)
    return text if len(text) <= 40 else "%s... (%d characters)" % (text[:24], len(text))


def _bounds(struct):
    bounds = _BOUNDS[struct] = {}
    for name, ctype in struct._fields_:
        if getattr(ctype, "_type_", None) in _FLOAT_RANGE:
            bounds[name] = (1, 0)
        elif int_range(ctype) is not None:
            bounds[name] = int_range(ctype)
    return bounds


def _field_value(struct, name, value, refusal):
    """value as the field `name` of `struct` is to be assigned it; raises
    refusal(message, wrong type?) where the field would not hold it as
    given."""
    low, high = _BOUNDS[struct][name]
    ctype = dict(struct._fields_)[name]
    c_type = struct._c_types_[name]
    what = "%s.%s" % (struct.__name__, name)
    if ctype._type_ in _FLOAT_RANGE:
        if not (hasattr(type(value), "__float__") or hasattr(type(value), "__index__")):
            raise refusal("%s (%s) must be a real number, got %s %s" % (what, c_type, type(value).__name__,
                                                                        shown(value)), True)
        largest, smallest = _FLOAT_RANGE[ctype._type_]
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = None
        if number is None or math.isfinite(number) and not math.isfinite(ctype(number).value):
            raise refusal("%s (%s) does not fit its C type %s (finite values up to %r in magnitude)"
                          % (what, shown(value), c_type, largest), False)
        if number != 0 and ctype(number).value == 0:
            raise refusal("%s (%s) is too small for its C type %s, which would hold it as %r (the smallest nonzero "
                          "one is %r in magnitude)" % (what, shown(value), c_type, ctype(number).value, smallest),
                          False)
        return number
    pointer = ctype._type_ == "P"
    if value is None and pointer:
        return None
    try:
        number = operator.index(value)
    except TypeError:
        raise refusal("%s (%s) must be %s, got %s %s" % (what, c_type, "an address (an int) or None" if pointer
                                                         else "an int", type(value).__name__, shown(value)),
                      True) from None
    if not low <= number <= high:
        raise refusal("%s (%s) does not fit its C type %s (%d to %d%s)"
                      % (what, shown(number), c_type, low, high, ", or None for NULL" if pointer else ""), False)
    return number


def _checked_setattr(refusal):
    """A __setattr__ for ctypes structs with _c_types_ that checks a field's
    value first (_field_value), refusing with refusal(message, wrong type?)."""

    def __setattr__(self, name, value):
        """Assigns to an attribute, checking a field's value first (flashcore._fields)."""
        struct = type(self)
        bounds = (_BOUNDS.get(struct) or _bounds(struct)).get(name)
        if bounds is not None and not (type(value) is int and bounds[0] <= value <= bounds[1]):
            value = _field_value(struct, name, value, refusal)
        _setattr(self, name, value)

    return __setattr__


def _python_error(message, wrong_type):
    return (TypeError if wrong_type else ValueError)(message)


# (InvalidArgumentError, InvalidArgumentTypeError) once _errors has handed
# them in (use_errors); Python's ValueError and TypeError until then.
_errors = [ValueError, TypeError]


def use_errors(invalid, invalid_type):
    """The exceptions the checks here raise: flashcore's, from _errors (see
    the module's docstring for why they are handed in)."""
    _errors[:] = [invalid, invalid_type]


def _refusal(message, wrong_type):
    return _errors[1 if wrong_type else 0](message)


checked_setattr = _checked_setattr(_refusal)
plain_checked_setattr = _checked_setattr(_python_error)


_C_NAMES = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_size_t: "size_t",
            ctypes.c_void_p: "pointer"}
# (lowest, highest) int of each C type above.
_RANGES = {ctype: int_range(ctype) for ctype in _C_NAMES}


def whole_number(value, what):
    """value as a Python int: ints and objects with __index__ (NumPy
    integers), never a bool or a float (64.5 and 64.0 alike)."""
    if isinstance(value, bool):
        raise _refusal("%s must be an int, not a bool" % what, True)
    try:
        return operator.index(value)
    except TypeError:
        raise _refusal("%s must be an int, got %s %s" % (what, type(value).__name__, shown(value)), True) from None


def fits(value, ctype, what):
    """value (an int, or None for a pointer) after checking that the C type
    holds it."""
    if value is None and ctype is ctypes.c_void_p:
        return None
    if type(value) is not int:  # the common case skips the call (a call's host time matters)
        value = whole_number(value, what)
    low, high = _RANGES[ctype]
    if not low <= value <= high:
        raise _refusal("%s (%s) does not fit the C API's %s (%d to %d)"
                       % (what, shown(value), _C_NAMES[ctype], low, high), False)
    return value


def set_fields(struct, **values):
    """Assigns each keyword to the ctypes struct's field of that name, range
    checked against the field's C type (by fits(), which names the argument
    rather than the field: the struct's own check is not repeated)."""
    types = dict(type(struct)._fields_)
    for name, value in values.items():
        _setattr(struct, name, fits(value, types[name], name))
