"""Helpers shared by the flashcore Python tests."""

import ctypes
import os

import pytest

from flashcore import _arrays

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(TESTS_DIR)
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_ROOT))
REQUIRE_GPU = os.environ.get("FLASHCORE_REQUIRE_GPU") == "1"

# Fake device addresses: 16-byte aligned and far apart. Only ever given to
# calls that validate without touching memory.
FAKE_BASE = 0x7F0000000000
FAKE_SPAN = 1 << 34


def skip_or_fail(reason):
    """Skips the test, or fails it when FLASHCORE_REQUIRE_GPU=1 says the GPU
    tests must run."""
    if REQUIRE_GPU:
        pytest.fail("%s (FLASHCORE_REQUIRE_GPU=1 makes this an error)" % reason)
    pytest.skip(reason)


def fake_ptr(i, offset=0):
    return FAKE_BASE + i * FAKE_SPAN + offset


class FakeCudaArray:
    """An object with only __cuda_array_interface__ (version 3)."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=None, readonly=False, stream=None, index=0):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (fake_ptr(index) if ptr is None else ptr, readonly),
            "strides": None if strides is None else tuple(strides),
            "version": 3,
            "stream": stream,
        }


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


class FakeDLPackArray:
    """An object with only __dlpack__/__dlpack_device__, describing fake CUDA
    memory; it records the stream each export was asked for."""

    def __init__(self, shape, code=2, bits=16, strides=None, ptr=None, byte_offset=0, device=(2, 0), index=0):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self._managed = _arrays.DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = fake_ptr(index) if ptr is None else ptr
        t.device = _arrays.DLDevice(*device)
        t.ndim = len(shape)
        t.dtype = _arrays.DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = self._strides
        t.byte_offset = byte_offset
        self._device = device
        self.streams = []

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)


def fake_qkv(b=2, hq=8, hkv=2, sq=100, sk=120, d=64, cls=FakeCudaArray, **kwargs):
    """Fake contiguous [B, H, S, D] q, k, v, out (kwargs go to cls)."""
    return (cls((b, hq, sq, d), index=0, **kwargs), cls((b, hkv, sk, d), index=1, **kwargs),
            cls((b, hkv, sk, d), index=2, **kwargs), cls((b, hq, sq, d), index=3, **kwargs))
