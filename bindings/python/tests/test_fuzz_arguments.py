"""The Python binding's argument layer, fuzzed (issue 59): random calls of
flashcore.attention on fake __cuda_array_interface__ arrays (shapes near the edges, odd strides,
dtypes the library does not take) with options of the right and the wrong
types and values, queued to a stand-in handle (no GPU). Every call either
queues parameters that flashcore_forward_check accepts, or raises one of
the documented errors (a flashcore.FlashcoreError subclass, or TypeError
for an argument of the wrong type); never another exception (an
IndexError, an OverflowError, a ZeroDivisionError ...). Each call is made
twice: the second is served by the call cache, which must give the same
verdict.

FLASHCORE_FUZZ_SEED=<n> replays a run; the seed is printed on failure."""

import ctypes
import math
import os
import random

import pytest

import flashcore
from fc_testing import FakeCudaArray

CALLS = int(os.environ.get("FLASHCORE_FUZZ_CALLS", "1500"))
# Each option: a value the binding takes most of the time, else one from
# the edge or of the wrong type, so that calls break one rule at a time.
GOOD, BAD = 0, 1
TYPESTRS = (["<f2"], ["<f4", "|u1", "<i4", "<f8", "<V2"])
LAYOUTS = (["bhsd", "bshd"], ["BSHD", "sbhd", 0, 1, 2, None, 1.5])
SCALES = ([None, None, 0.125, 1.0, 3], [1e-30, 0.0, -1.0, float("nan"), float("inf"), 1e300, True, "0.1"])
SOFTCAPS = ([0.0, 0.0, 30.0, 0], [-1.0, float("nan"), 1e40, "x"])
WINDOWS = ([None, (128, 0), (-1, -1), (0, 0), [64, 64]], [(5,), (1.5, 0), (True, 0), "w", (-2, 0), (2**40, 0)])
SPLITS = ([None, None, 1, 2, 300], [0, -1, 2.0, True])
CAUSAL = ([False, True, 1, 0], ["yes", None])
DIMS = ([8, 32, 64, 64, 96, 128, 128, 192, 256], [4, 12, 264, 0])
BAD_CHANCE = 0.08


def pick(r, choices):
    return r.choice(choices[BAD] if r.random() < BAD_CHANCE else choices[GOOD])


def seeds():
    fixed = 59
    given = os.environ.get("FLASHCORE_FUZZ_SEED")
    return [fixed, int(given) if given else random.randrange(2**32)]


def shape_of(r, layout, batch, heads, seqlen, dim):
    rows = (batch, heads, seqlen) if layout != "bshd" else (batch, seqlen, heads)
    shape = rows + (dim,)
    if r.random() < 0.01:
        shape = shape[:3]  # not 4-D
    if r.random() < 0.01:
        shape = shape[:2] + (float(shape[2]),) + shape[3:]  # a float entry
    return shape


def strides_of(r, shape, itemsize):
    if r.random() < 0.85 or len(shape) != 4:
        return None
    dense = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        dense[i] = dense[i + 1] * max(int(shape[i + 1]), 1)
    strides = [s * itemsize for s in dense]
    if r.random() < 0.5:
        strides[r.randrange(3)] += itemsize * r.choice([1, 8, -8])
    else:
        strides[-1] = itemsize * r.choice([2, 0])
    return strides


def array(r, shape, typestr, index):
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 2
    ptr = None
    if r.random() < 0.01:
        ptr = (index + 1) << 36 | r.choice([2, 8])  # misaligned
    return FakeCudaArray(shape, typestr=typestr, strides=strides_of(r, shape, itemsize), ptr=ptr, index=index)


def random_call(r):
    """(function name, args, kwargs) of one random call."""
    layout = pick(r, LAYOUTS)
    batch = r.choice([1, 2, 3, 1, 2, 0])
    heads_kv = r.choice([1, 2, 4])
    heads_q = heads_kv * r.choice([1, 2, 4]) if r.random() > BAD_CHANCE else r.choice([3, 5, 0])
    seqlen_q, seqlen_k = r.choice([1, 7, 64, 130, 1, 0]), r.choice([1, 33, 256, 1000, 0])
    dim = pick(r, DIMS)
    dim_v = dim if r.random() < 0.8 else pick(r, DIMS)
    typestr = pick(r, TYPESTRS)
    kv_typestr = typestr if r.random() > BAD_CHANCE else pick(r, TYPESTRS)
    layout_name = layout if isinstance(layout, str) else "bhsd"
    q = array(r, shape_of(r, layout_name, batch, heads_q, seqlen_q, dim), typestr, 0)
    k = array(r, shape_of(r, layout_name, batch, heads_kv, seqlen_k, dim), kv_typestr, 1)
    v = array(r, shape_of(r, layout_name, batch, heads_kv, seqlen_k, dim_v), kv_typestr, 2)
    kwargs = dict(causal=pick(r, CAUSAL), softmax_scale=pick(r, SCALES), softcap=pick(r, SOFTCAPS),
                  window=pick(r, WINDOWS), num_splits=pick(r, SPLITS), layout=layout,
                  out=array(r, shape_of(r, layout_name, batch, heads_q, seqlen_q, dim_v), typestr, 3))
    if r.random() < 0.15:
        kwargs["seqused_k"] = FakeCudaArray((batch,), typestr="<i4" if r.random() > BAD_CHANCE else "<i8", index=4)
    for key in list(kwargs):
        if r.random() < 0.3 and key not in ("layout", "out"):
            del kwargs[key]
    return "attention", (q, k, v), kwargs


# What a call may raise: the library's and the binding's errors, and
# TypeError for an argument of the wrong type (Python's own convention).
ALLOWED = (flashcore.FlashcoreError, TypeError)


def outcome(fn, args, kwargs, queued):
    before = len(queued)
    try:
        fn(*args, **kwargs)
    except ALLOWED as e:
        return "raised %s: %s" % (type(e).__name__, str(e).split(" (")[0][:60])
    return "queued %d" % (len(queued) - before)


@pytest.mark.parametrize("seed", seeds())
def test_random_calls_raise_only_documented_errors(queued, lib, seed):
    r = random.Random(seed)
    counts = {"queued": 0, "raised": 0}
    for i in range(CALLS):
        name, args, kwargs = random_call(r)
        fn = getattr(flashcore, name)
        try:
            first = outcome(fn, args, kwargs, queued)
            again = outcome(fn, args, kwargs, queued)  # the call cache's turn
        except Exception as e:  # noqa: BLE001 - what the test is for
            pytest.fail("seed %d, call %d: %s(%s, %s) raised %s: %s (FLASHCORE_FUZZ_SEED=%d replays it)"
                        % (seed, i, name, [a.__cuda_array_interface__ for a in args], kwargs, type(e).__name__, e,
                           seed))
        assert first == again, "seed %d, call %d: %r then %r for %s" % (seed, i, first, again, kwargs)
        counts["queued" if first.startswith("queued") else "raised"] += 1
        if first.startswith("queued") and first != "queued 0":
            params = queued[-1]
            status = lib.cdll.flashcore_forward_check(ctypes.byref(params))
            assert status == 0, "seed %d, call %d: queued params the library refuses: %s (%s)" % (
                seed, i, lib.status_string(status), kwargs)
    # Both outcomes are reached (the generator is not all refusals).
    assert counts["queued"] > CALLS // 20 and counts["raised"] > CALLS // 20, counts


def test_scales_nan_and_inf_are_refused(queued):
    # (A property the fuzzer leans on, stated plainly.)
    q, k, v = (FakeCudaArray((1, 2, 16, 64), index=i) for i in range(3))
    for scale in (float("nan"), float("inf"), -math.inf, 0.0, -1.0):
        with pytest.raises(flashcore.InvalidArgumentError):
            flashcore.attention(q, k, v, softmax_scale=scale, out=FakeCudaArray((1, 2, 16, 64), index=3))
