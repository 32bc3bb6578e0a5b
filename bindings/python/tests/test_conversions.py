"""Values on their way into the C API's types, without a GPU: what the
conversion would change (a softmax_scale of 1e-50 is 0 as a float32, which
means the default; 2**32 + 128 in an int32_t field reads back 128; 2**40 as
a C int is 0, "success") or refuse with an error of Python's or of ctypes'
that names no argument (OverflowError, ctypes.ArgumentError) is refused with
flashcore's own error, naming the argument or the field and why."""

import ctypes
import math

import pytest

import flashcore
from flashcore import Status, _ffi
from fc_testing import fake_paged, fake_qkv, fake_varlen

FLOAT32_MAX = float.fromhex("0x1.fffffep+127")
FLOAT32_TINY = 2.0**-149  # the smallest positive float32; 2**-150 rounds to 0


class Index:
    """An integer that is no int (a NumPy integer, say): it has __index__."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


# --------------------------------------------------------------------------
# softmax_scale: a float32 in the C struct
# --------------------------------------------------------------------------


def _call(entry, scale):
    """Calls an entry point that takes a softmax scale, with `scale` under
    the name it has there; returns that name."""
    if entry == "attention":
        q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
        flashcore.attention(q, k, v, out=out, softmax_scale=scale)
    elif entry == "attention(scale=)":
        q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
        flashcore.attention(q, k, v, out=out, scale=scale)
        return "scale"
    elif entry == "forward_params":
        flashcore.forward_params(*fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20), softmax_scale=scale)
    elif entry == "flash_attn_func":
        q, k, v, _ = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
        flashcore.flash_attn_func(q, k, v, softmax_scale=scale)
    elif entry == "attention_varlen":
        q, k, v, out, cu_q, cu_k = fake_varlen()
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 40, 50, out=out, softmax_scale=scale)
    elif entry == "attention_with_kvcache":
        q, k, v, out, table = fake_paged(d=64)
        flashcore.attention_with_kvcache(q, k, v, block_table=table, out=out, softmax_scale=scale)
    elif entry == "sdpa":
        q, k, v, _ = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
        flashcore.sdpa(q, k, v, scale=scale)
        return "scale"
    return "softmax_scale"


ENTRIES = ["attention", "attention(scale=)", "forward_params", "flash_attn_func", "attention_varlen",
           "attention_with_kvcache", "sdpa"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("scale,why", [
    (1e-50, r"1e-50 is 0\.0 as a float32 \(the C API's type\), which the C API reads as the default"),
    (2.0**-150, r"7\.006492321624085e-46 is 0\.0 as a float32 \(the C API's type\), which the C API reads as the "
                r"default"),
    (-1e-50, r"-1e-50 is -0\.0 as a float32 \(the C API's type\), and a scale must be > 0"),
    (10**400, r"1000.* \(401 characters\) does not fit a float32"),
    (-10**400, r"-1000.* \(402 characters\) does not fit a float32"),
])
def test_softmax_scale_a_float32_does_not_hold_is_refused(queued, entry, scale, why):
    # Before: 1e-50 was queued as 0.0, the default 1/sqrt(d); -1e-50 as -0.0;
    # 10**400 raised OverflowError from float().
    if entry == "sdpa" and not scale > 0:
        pytest.skip("sdpa takes PyTorch's scales: those <= 0 raise NotImplementedError (tested with it)")
    name = "softmax_scale" if entry not in ("sdpa", "attention(scale=)") else "scale"
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^invalid argument: %s %s" % (name, why)):
        _call(entry, scale)
    assert not queued


@pytest.mark.parametrize("entry", ENTRIES)
def test_softmax_scale_a_float32_holds_is_passed_on(queued, entry):
    # The smallest positive float32 passes as it is, and so do large ones
    # (the library's limit is 2.36e38: times log2(e) a float); half the
    # smallest (2**-150, which rounds to 0) is refused.
    for scale in (FLOAT32_TINY, 2e38, 0.125):
        if entry == "forward_params":
            q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
            params = flashcore.forward_params(q, k, v, out, softmax_scale=scale)
            assert params.softmax_scale == ctypes.c_float(scale).value
        elif entry in ("sdpa", "flash_attn_func"):
            # No out= to give: past the scale, the call stops at allocating out for arrays of no framework.
            with pytest.raises(TypeError, match="cannot allocate out"):
                _call(entry, scale)
        else:
            _call(entry, scale)
            assert queued.pop().softmax_scale == ctypes.c_float(scale).value
    with pytest.raises(flashcore.InvalidArgumentError, match="as a float32"):
        _call(entry, 2.0**-150)


def test_sdpa_scale_of_another_type_is_refused_naming_it(queued):
    # Before: TypeError: '>' not supported between instances of 'str' and 'int'.
    q, k, v, _ = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
    for bad in ("0.5", None.__class__, [0.5], True):
        with pytest.raises(flashcore.InvalidArgumentError, match="flashcore.sdpa: scale must be None or a real"):
            flashcore.sdpa(q, k, v, scale=bad)
        with pytest.raises(TypeError):
            flashcore.sdpa(q, k, v, scale=bad)
    assert not queued


# --------------------------------------------------------------------------
# Arguments of a wrong type: flashcore's errors (TypeErrors too)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case,match", [
    (dict(num_splits=1.5), "num_splits must be an int, got float 1.5"),
    (dict(window=(1.5, 0)), "window's left bound must be an int, got float 1.5"),
    (dict(window="ab"), "window must be None or a pair"),
    (dict(softmax_scale="0.5"), "softmax_scale must be None or a real number, got str '0.5'"),
    (dict(softcap="30"), "softcap must be a real number"),
    (dict(layout=1.5), "layout must be an int, got float 1.5"),
    (dict(num_splits=True), "num_splits must be an int, not a bool"),
])
def test_arguments_of_a_wrong_type_raise_flashcore_errors(queued, case, match):
    # Before: plain TypeErrors, which `except flashcore.FlashcoreError` missed.
    q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
    with pytest.raises(flashcore.InvalidArgumentError, match=match) as info:
        flashcore.attention(q, k, v, out=out, **case)
    assert isinstance(info.value, TypeError) and info.value.status == Status.INVALID_ARGUMENT
    assert not queued


def test_sizes_of_a_wrong_type_raise_flashcore_errors(lib, queued):
    q, k, v, out, cu_q, cu_k = fake_varlen()
    with pytest.raises(flashcore.InvalidArgumentError, match="max_seqlen_q must be an int, got float 40.5"):
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 40.5, 50, out=out)
    q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
    with pytest.raises(flashcore.InvalidArgumentError, match="cache_seqlens must be None, an int or an int32"):
        flashcore.attention_with_kvcache(q, k, v, 12.5, out=out)
    with pytest.raises(flashcore.InvalidArgumentError, match="device must be an int, got float 0.5"):
        flashcore.Handle(device=0.5, lib=lib)
    assert not queued


# --------------------------------------------------------------------------
# status_string: a C int
# --------------------------------------------------------------------------


def test_status_string_of_an_int_beyond_a_c_int_is_unknown(lib):
    # The C function names every int that is no status "unknown status";
    # before, ctypes passed the low 32 bits: 2**40 was 0, "success".
    for status in (2**40, 2**32, 2**32 + 1, -2**31 - 1, 2**64 + 2, -2**63):
        assert flashcore.status_string(status) == "unknown status", status
        assert lib.status_string(status) == "unknown status", status
    for status in (2**31 - 1, -2**31, -1):
        assert flashcore.status_string(status) == "unknown status"
    assert flashcore.status_string(Status.MISALIGNED) == "misaligned"
    assert flashcore.status_string(Index(1)) == "invalid argument"


@pytest.mark.parametrize("bad", [1.5, 1.0, None, "1", True])
def test_status_string_of_a_non_int_is_refused_naming_it(lib, bad):
    # Before: 1.5 and 1.0 were int()ed to "invalid argument", "1" too, True
    # was 1; None raised int()'s TypeError.
    with pytest.raises(flashcore.InvalidArgumentError, match="^invalid argument: status must be an int") as info:
        flashcore.status_string(bad)
    assert isinstance(info.value, TypeError)
    with pytest.raises(flashcore.InvalidArgumentError, match="status must be an int"):
        lib.status_string(bad)


# --------------------------------------------------------------------------
# The params structs the low-level calls take
# --------------------------------------------------------------------------


class _Bare(flashcore.Handle):
    """A Handle that was never opened (there is no GPU): the calls' checks
    of their arguments come before they need it."""

    def __init__(self, lib):
        self._lib, self._raw, self.device = lib, None, 0


OTHERS = [(None, "None"), (flashcore.MergeParams(), "flashcore.MergeParams"), (b"\0" * 400, "bytes"),
          (flashcore.ForwardParams, "PyCStructType"), (0, "int"), (ctypes.c_int(0), "c_int")]


@pytest.mark.parametrize("bad,got", OTHERS, ids=[g for _, g in OTHERS])
def test_calls_taking_forward_params_refuse_anything_else(lib, bad, got):
    # Before: ctypes' ArgumentError ("argument 1: TypeError: expected
    # LP_flashcore_forward_params instance ...") or byref()'s TypeError.
    want = (r"^invalid argument: params must be a flashcore\.ForwardParams \(from flashcore\.forward_params\(\)\), "
            r"got %s$")
    calls = [flashcore.check_params, _Bare(lib).workspace_size, _Bare(lib).forward]
    for call in calls:
        with pytest.raises(flashcore.InvalidArgumentError, match=want % got) as info:
            call(bad)
        assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("bad,got", [(None, "None"), (flashcore.ForwardParams(), "flashcore.ForwardParams"),
                                     (0, "int")])
def test_merge_states_refuses_anything_but_merge_params(lib, bad, got):
    with pytest.raises(flashcore.InvalidArgumentError,
                       match=r"params must be a flashcore\.MergeParams \(from flashcore\.merge_params\(\)\), got %s$"
                       % got) as info:
        _Bare(lib).merge_states(bad)
    assert isinstance(info.value, TypeError)


# --------------------------------------------------------------------------
# Fields of the structs: each checked against its C type on assignment
# --------------------------------------------------------------------------

_BITS = 8 * ctypes.sizeof(ctypes.c_size_t)
# The integer C types of the structs' fields: their ctypes, and their ranges.
_INTEGERS = {ctypes.c_int32: ("int32_t", -2**31, 2**31 - 1), ctypes.c_int64: ("int64_t", -2**63, 2**63 - 1),
             ctypes.c_size_t: ("size_t", 0, 2**_BITS - 1)}


def _fields(kind):
    """(struct, field) of every field of the two params structs of one
    kind: "int" (an integer), "pointer" or "float"."""
    want = {"int": tuple(_INTEGERS), "pointer": (ctypes.c_void_p,), "float": (ctypes.c_float,)}[kind]
    return [pytest.param(struct, name, id="%s.%s" % (struct.__name__, name))
            for struct in (flashcore.ForwardParams, flashcore.MergeParams)
            for name, ctype in struct._fields_ if ctype in want]


def _refused(struct, name, value, match, wrong_type=False):
    p = struct()
    setattr(p, name, 0 if name not in ("softmax_scale", "softcap") else 0.5)
    before = getattr(p, name)
    with pytest.raises(flashcore.InvalidArgumentError, match=match) as info:
        setattr(p, name, value)
    assert isinstance(info.value, TypeError) == wrong_type
    assert getattr(p, name) == before, "a refused value is not stored"


def test_every_field_has_its_c_type_as_the_header_spells_it():
    for struct in (flashcore.ForwardParams, flashcore.MergeParams):
        assert [f for f, _ in struct._fields_] == list(struct._c_types_)
        for name, ctype in struct._fields_:
            spelled = struct._c_types_[name]
            assert spelled == _INTEGERS[ctype][0] if ctype in _INTEGERS else spelled.endswith(" *") if (
                ctype is ctypes.c_void_p) else spelled == "float", (name, spelled)
    assert len(_fields("int")) + len(_fields("pointer")) + len(_fields("float")) == (
        len(flashcore.ForwardParams._fields_) + len(flashcore.MergeParams._fields_))
    assert flashcore.ForwardParams._c_types_["struct_size"] == "size_t"
    assert flashcore.ForwardParams._c_types_["seqused_k"] == "const int32_t *"
    assert flashcore.MergeParams._c_types_["partial_lse"] == "const float *"


@pytest.mark.parametrize("struct,name", _fields("int"))
def test_integer_fields_refuse_what_their_c_type_does_not_hold(struct, name):
    # Before: ctypes kept the low bits (seqlen_q = 2**32 + 128 read back
    # 128, struct_size = -1 read back 2**64 - 1) and refused a float with a
    # TypeError naming no field.
    c_type, low, high = _INTEGERS[dict(struct._fields_)[name]]
    for value in (low - 1, high + 1, high + 2**64 + 128, -10**30):
        _refused(struct, name, value, r"^invalid argument: %s\.%s \(%d\) does not fit its C type %s \(%d to %d\)$"
                 % (struct.__name__, name, value, c_type, low, high))
    for value in (1.5, 2.0, "3", None, b"x"):
        _refused(struct, name, value, r"%s\.%s \(%s\) must be an int, got %s" % (struct.__name__, name, c_type,
                                                                               type(value).__name__), True)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"%s\.%s \(%d\) does not fit" % (struct.__name__, name,
                                                                                           high + 1)):
        struct(**{name: high + 1})  # the constructor assigns its keywords alike
    p = struct()
    for value in (low, high, 0, 7, Index(high), Status.MISALIGNED, True):
        setattr(p, name, value)
        assert getattr(p, name) == int(value.__index__() if isinstance(value, Index) else value)


@pytest.mark.parametrize("struct,name", _fields("pointer"))
def test_pointer_fields_refuse_what_is_no_address(struct, name):
    # Before: q = 2**64 + 16 read back 16, q = -16 read back 2**64 - 16.
    high = 2**(8 * ctypes.sizeof(ctypes.c_void_p)) - 1
    for value in (-1, -16, high + 1, high + 17):
        _refused(struct, name, value, r"^invalid argument: %s\.%s \(%d\) does not fit its C type [\w ]+ \* \(0 to "
                 r"%d, or None for NULL\)$" % (struct.__name__, name, value, high))
    for value in (1.5, "0x10", b"x"):
        _refused(struct, name, value, r"%s\.%s \([\w ]+ \*\) must be an address \(an int\) or None, got %s"
                 % (struct.__name__, name, type(value).__name__), True)
    p = struct()
    for value in (high, 16, Index(4096)):
        setattr(p, name, value)
        assert getattr(p, name) == int(value.__index__() if isinstance(value, Index) else value)
    for value in (None, 0):
        setattr(p, name, value)
        assert getattr(p, name) is None


@pytest.mark.parametrize("struct,name", _fields("float"))
def test_float_fields_refuse_what_a_float32_changes_in_kind(struct, name):
    # Before: 1e-50 was stored as 0 (softmax_scale's default, softcap's
    # "none"), -1e-50 as -0.0, 1e39 as inf, and 10**400 raised OverflowError.
    what = r"^invalid argument: %s\.%s \(" % (struct.__name__, name)
    for value in (1e-50, -1e-50, 2.0**-150, -2.0**-150):
        _refused(struct, name, value, what + r"%r\) is too small for its C type float, which would hold it as -?0\.0"
                 % value)
    for value in (1e39, -1e39, FLOAT32_MAX * (1 + 2**-20), 10**400, -10**400):
        _refused(struct, name, value, what + r".*\) does not fit its C type float \(finite values up to "
                 r"3\.4028234663852886e\+38 in magnitude\)$")
    for value in ("0.5", None, b"x", [0.5]):
        _refused(struct, name, value, r"%s\.%s \(float\) must be a real number, got %s"
                 % (struct.__name__, name, type(value).__name__), True)
    p = struct()
    # What a float32 holds, rounded as ctypes rounds it: infinity and NaN
    # too (the library says where they are wrong), and -0.0.
    for value in (FLOAT32_TINY, -FLOAT32_TINY, FLOAT32_MAX, 0.1, 2**100, math.inf, -math.inf, 0.0, -0.0, Index(3)):
        setattr(p, name, value)
        number = float(value.__index__() if isinstance(value, Index) else value)
        assert getattr(p, name) == ctypes.c_float(number).value
        assert math.copysign(1, getattr(p, name)) == math.copysign(1, number)
    setattr(p, name, math.nan)
    assert math.isnan(getattr(p, name))


def test_params_of_the_binding_are_checked_structs(lib):
    # forward_params() and merge_params() give the structs users then edit.
    p = flashcore.forward_params(*fake_qkv())
    with pytest.raises(flashcore.InvalidArgumentError, match=r"seqlen_q \(4294967424\) does not fit"):
        p.seqlen_q = 2**32 + 128
    assert p.seqlen_q == 100
    m = lib.new_merge_params()
    with pytest.raises(flashcore.InvalidArgumentError, match=r"num_states \(2147483648\) does not fit"):
        m.num_states = 2**31
    assert m.num_states == 0
