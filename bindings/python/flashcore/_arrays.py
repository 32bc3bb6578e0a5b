"""Reading GPU arrays from any framework: PyTorch tensors and CuPy arrays
natively, anything else through __cuda_array_interface__ or DLPack.

Nothing here imports torch or cupy: an array of theirs can only exist once its
framework has been imported, so sys.modules is where to look.
"""

import ctypes
import re
import sys
from typing import Any

from ._fields import fits, whole_number
from ._errors import InvalidArgumentError, MisalignedError

# More dimensions than any array this package reads: a DLPack ndim past it
# is garbage, not an array.
MAX_NDIM = 64

# The type hint of a CUDA array argument: a PyTorch tensor, a CuPy array, or
# any object with __cuda_array_interface__ or __dlpack__.
Array = Any


class ArrayInfo:
    """What the binding needs of one array. strides are in elements; device is
    a CUDA ordinal or None when unknown; framework is "torch", "cupy" or None."""

    __slots__ = ("obj", "name", "ptr", "shape", "strides", "dtype", "itemsize", "device",
                 "framework", "readonly", "stream", "keepalive")

    def __init__(self, obj, name, ptr, shape, strides, dtype, itemsize, device, framework,
                 readonly=False, stream=None, keepalive=None):
        self.obj = obj
        self.name = name
        self.ptr = fits(ptr or 0, ctypes.c_void_p, "%s's data pointer" % name)
        self.shape = _whole_numbers(shape, "%s's shape" % name, minimum=0)
        self.strides = _whole_numbers(strides, "%s's strides" % name)
        if len(self.strides) != len(self.shape):
            raise InvalidArgumentError("%s has %d strides for its %d dimensions (shape %s)"
                                       % (name, len(self.strides), len(self.shape), list(self.shape)))
        self.dtype = dtype  # "float16", "bfloat16", "float32", ... or the source's own spelling
        self.itemsize = itemsize
        self.device = device
        self.framework = framework
        self.readonly = readonly
        self.stream = stream  # the producer's stream (__cuda_array_interface__ v3), if any
        self.keepalive = keepalive  # e.g. the DLPack capsule


# Frameworks' modules once seen imported. Code that torch.compile traces
# reads them from here: a sys.modules lookup that dynamo traces fails
# ("dictionary changed size during iteration") when an import elsewhere
# changes sys.modules meanwhile, as torch.compile's own lazy imports do.
_imported = {}


def imported(name):
    """Module `name` if it is imported, else None (looked up until it is)."""
    mod = _imported.get(name)
    if mod is None:
        mod = sys.modules.get(name)
        if mod is not None:
            _imported[name] = mod
    return mod


def _module_instance(x, module, cls):
    mod = imported(module)
    return mod is not None and isinstance(x, getattr(mod, cls))


def is_torch(x):
    return _module_instance(x, "torch", "Tensor")


def is_cupy(x):
    return _module_instance(x, "cupy", "ndarray")


def _whole_numbers(values, what, minimum=None):
    """values as a tuple of ints (each an int or has __index__; no bool, no
    float), each at least minimum where given, each within int64."""
    try:
        items = tuple(values)
    except TypeError:
        raise TypeError("%s must be a sequence of ints, got %s" % (what, type(values).__name__)) from None
    out = tuple(whole_number(v, "%s entry %d" % (what, i)) for i, v in enumerate(items))
    for i, v in enumerate(out):
        if minimum is not None and v < minimum:
            raise InvalidArgumentError("%s entry %d (%d) must be >= %d" % (what, i, v, minimum))
        fits(v, ctypes.c_int64, "%s entry %d" % (what, i))
    return out


def contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def _element_strides(name, byte_strides, itemsize):
    out = []
    for s in byte_strides:
        if s % itemsize:
            raise MisalignedError("%s has a byte stride (%d) that is not a whole number of %d-byte elements"
                                  % (name, s, itemsize))
        out.append(s // itemsize)
    return tuple(out)


# --------------------------------------------------------------------------
# PyTorch and CuPy
# --------------------------------------------------------------------------


NEEDS_DEVICE_MEMORY = "flashcore needs CUDA device memory"


def _from_torch(x, name):
    if x.device.type != "cuda":
        where = "the CPU" if x.device.type == "cpu" else "torch device '%s'" % x.device
        raise InvalidArgumentError("%s is on %s; %s (e.g. %s.cuda())" % (name, where, NEEDS_DEVICE_MEMORY, name))
    return ArrayInfo(x, name, x.data_ptr(), x.shape, x.stride(), str(x.dtype).replace("torch.", ""),
                     x.element_size(), x.device.index, "torch")


def _from_cupy(x, name):
    return ArrayInfo(x, name, x.data.ptr, x.shape, _element_strides(name, x.strides, x.itemsize),
                     x.dtype.name, x.itemsize, x.device.id, "cupy")


# --------------------------------------------------------------------------
# __cuda_array_interface__
# --------------------------------------------------------------------------

_TYPESTR = {"f2": "float16", "f4": "float32", "f8": "float64", "i4": "int32", "i8": "int64", "u4": "uint32"}


_TYPESTR_RE = re.compile(r"^[<>|=][a-zA-Z][0-9]+$")


def _cai_key(cai, name, key, required=True):
    if key not in cai:
        if required:
            raise InvalidArgumentError("%s: __cuda_array_interface__ has no '%s'" % (name, key))
        return None
    return cai[key]


def _bad_cai(name, key, want, value):
    return InvalidArgumentError("%s: __cuda_array_interface__['%s'] must be %s, got %r" % (name, key, want, value))


def _from_cai(x, name):
    """An ArrayInfo from __cuda_array_interface__ (versions 0 to 3), every
    key checked: a malformed one raises InvalidArgumentError naming it."""
    cai = x.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError("%s: __cuda_array_interface__ must be a dict, got %s" % (name, type(cai).__name__))
    shape = _cai_key(cai, name, "shape")
    if not isinstance(shape, (tuple, list)):
        raise _bad_cai(name, "shape", "a tuple of non-negative ints", shape)
    try:
        shape = _whole_numbers(shape, "%s: __cuda_array_interface__['shape']" % name, minimum=0)
    except TypeError as e:
        raise _bad_cai(name, "shape", "a tuple of non-negative ints", cai["shape"]) from e
    typestr = _cai_key(cai, name, "typestr")
    if not isinstance(typestr, str) or not _TYPESTR_RE.match(typestr) or int(typestr[2:]) == 0:
        raise _bad_cai(name, "typestr", "a NumPy type string such as '<f2'", typestr)
    itemsize = int(typestr[2:])
    dtype = _TYPESTR.get(typestr[1:], typestr) if typestr[0] in "<|=" else typestr
    data = _cai_key(cai, name, "data")
    if (not isinstance(data, (tuple, list)) or len(data) != 2 or isinstance(data[0], bool)
            or not (data[0] is None or isinstance(data[0], int)) or not isinstance(data[1], bool)):
        raise _bad_cai(name, "data", "a (pointer: int, read-only: bool) pair", data)
    ptr, readonly = data
    if ptr is not None and not 0 <= ptr < 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)):
        raise _bad_cai(name, "data", "a pointer within the address space", data)
    version = _cai_key(cai, name, "version", required=False)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise _bad_cai(name, "version", "a non-negative int", version)
    if _cai_key(cai, name, "mask", required=False) is not None:
        raise InvalidArgumentError("%s: masked arrays (__cuda_array_interface__ mask) are not supported" % name)
    strides = _cai_key(cai, name, "strides", required=False)
    if strides is None:
        strides = contiguous_strides(shape)
    else:
        if not isinstance(strides, (tuple, list)) or len(strides) != len(shape):
            raise _bad_cai(name, "strides", "None or a tuple of %d ints (one per dimension of shape %s)"
                           % (len(shape), list(shape)), strides)
        try:
            byte_strides = _whole_numbers(strides, "%s: __cuda_array_interface__['strides']" % name)
        except TypeError as e:
            raise _bad_cai(name, "strides", "None or a tuple of ints", strides) from e
        strides = _element_strides(name, byte_strides, itemsize)
    stream = _cai_key(cai, name, "stream", required=False) if (version or 0) >= 3 else None
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0):
        raise _bad_cai(name, "stream", "None or a cudaStream_t as a non-negative int", stream)
    return ArrayInfo(x, name, ptr, shape, strides, dtype, itemsize, pointer_device(ptr), None,
                     readonly=readonly, stream=stream)


_cuda_driver = []


def cuda_driver():
    """The CUDA driver (libcuda.so.1 through ctypes), initialized; None where
    it cannot be loaded or cuInit fails (no driver, no GPU). Loaded once."""
    if not _cuda_driver:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            ok = lib.cuInit(0) == 0
        except (OSError, AttributeError):
            lib, ok = None, False
        _cuda_driver.append(lib if ok else None)
    return _cuda_driver[0]


def pointer_device(ptr):
    """CUDA ordinal of the device holding ptr, asked of the driver; None if
    there is no driver or it does not know the pointer."""
    if not ptr:
        return None
    lib = cuda_driver()
    if lib is None:
        return None
    ordinal = ctypes.c_int(-1)
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    if lib.cuPointerGetAttribute(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != 0:
        return None
    return ordinal.value


def check_known_to_driver(infos):
    """Where a CUDA driver is loaded, refuses the arrays that came without a
    framework (__cuda_array_interface__, DLPack) whose pointer the driver
    does not know as device memory: such an address would fault on the GPU
    instead. Without a driver (or for torch/cupy arrays) nothing is asked."""
    for info in infos:
        if info is None or info.framework is not None or not info.ptr:
            continue
        device = pointer_device(info.ptr)  # loads the driver on first use
        if device is None and _cuda_driver[0] is not None:
            raise InvalidArgumentError("%s (0x%x) is not device memory the CUDA driver knows "
                                       "(cuPointerGetAttribute refused it)" % (info.name, info.ptr))


# --------------------------------------------------------------------------
# DLPack (the unversioned capsule every producer still offers)
# --------------------------------------------------------------------------

kDLCPU = 1
kDLCUDA = 2
kDLCUDAManaged = 13
# Where DLPack says memory is, for messages: the device types a CUDA array
# is mistaken for most often.
_DL_PLACES = {kDLCPU: "the CPU", 3: "pinned host memory (kDLCUDAHost)", 8: "a Metal device", 10: "a ROCm device",
              11: "pinned ROCm host memory", 14: "a oneAPI device"}
# (DLDataTypeCode, bits) -> dtype name; code 10 is kDLFloat8_e4m3fn (DLPack 1.1).
_DL_DTYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64", (0, 32): "int32",
              (0, 64): "int64", (1, 32): "uint32", (10, 8): "float8_e4m3fn"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _from_dlpack(x, name, stream):
    device_type, device_id = x.__dlpack_device__()
    if int(device_type) not in (kDLCUDA, kDLCUDAManaged):
        place = _DL_PLACES.get(int(device_type), "a device that is not CUDA")
        raise InvalidArgumentError("%s is on %s (DLPack device type %d); %s"
                                   % (name, place, int(device_type), NEEDS_DEVICE_MEMORY))
    # The stream we will run on, so the producer can order its work before it
    # (DLPack: 1 is the legacy default stream; 0 is not allowed).
    try:
        capsule = x.__dlpack__(stream=stream if stream else 1)
    except TypeError:
        capsule = x.__dlpack__()
    try:
        address = _capsule_pointer(capsule, b"dltensor")
    except ValueError:
        raise TypeError("%s: __dlpack__ did not return a 'dltensor' capsule" % name) from None
    t = DLManagedTensor.from_address(address).dl_tensor
    if not 0 <= t.ndim <= MAX_NDIM:
        raise InvalidArgumentError("%s: DLPack ndim (%d) must be from 0 to %d" % (name, t.ndim, MAX_NDIM))
    if t.ndim and not t.shape:
        raise InvalidArgumentError("%s: DLPack shape is NULL for %d dimensions" % (name, t.ndim))
    shape = _whole_numbers((t.shape[i] for i in range(t.ndim)), "%s: DLPack shape" % name, minimum=0)
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    if t.dtype.bits % 8 or t.dtype.bits == 0:
        raise InvalidArgumentError("%s: DLPack dtype bits (%d) must be a whole number of bytes"
                                   % (name, t.dtype.bits))
    if t.dtype.lanes != 1:
        raise InvalidArgumentError("%s: vector DLPack dtypes (lanes=%d) are not supported" % (name, t.dtype.lanes))
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits), "DLPack code %d bits %d" % (t.dtype.code, t.dtype.bits))
    return ArrayInfo(x, name, (t.data or 0) + t.byte_offset, shape, strides, dtype, t.dtype.bits // 8,
                     t.device.device_id, None, keepalive=capsule)


def describe(x, name, stream=0):
    """ArrayInfo of x. stream is the one the caller will run on (only used to
    export DLPack arrays)."""
    if is_torch(x):
        return _from_torch(x, name)
    if is_cupy(x):
        return _from_cupy(x, name)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(x, name)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _from_dlpack(x, name, stream)
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        raise InvalidArgumentError("%s is a host array (%s, on the CPU); %s"
                                   % (name, type(x).__name__, NEEDS_DEVICE_MEMORY))
    raise TypeError("%s must be a CUDA array: a PyTorch tensor, a CuPy array, or an object with "
                    "__cuda_array_interface__ or __dlpack__; got %s" % (name, type(x).__name__))


def shape_of(x, name):
    """x's shape as a tuple, read from x.shape where it has one (cheaper
    than describe(), which reads everything), else from describe()."""
    shape = getattr(x, "shape", None)
    return tuple(describe(x, name).shape if shape is None else shape)
