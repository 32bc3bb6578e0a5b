"""Reading GPU arrays from any framework: PyTorch tensors and CuPy arrays
natively, anything else through __cuda_array_interface__ or DLPack.

Nothing here imports torch or cupy: an array of theirs can only exist once its
framework has been imported, so sys.modules is where to look.
"""

import contextlib
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


# --------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------


def stream_pointer(stream):
    """The cudaStream_t (an int) for a stream given as an int, a ctypes
    pointer, a torch.cuda.Stream, a cupy Stream or any object with
    __cuda_stream__."""
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream, not a bool")
    if isinstance(stream, int):
        return stream
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError("stream must be an int (cudaStream_t), a torch.cuda.Stream, a cupy Stream or an object "
                    "with __cuda_stream__; got %s" % type(stream).__name__)


def current_stream(info):
    """The stream work on info's data should go to by default: its framework's
    current stream, the producer's stream for __cuda_array_interface__ v3, else
    the legacy default stream (0)."""
    if info.framework == "torch":
        return sys.modules["torch"].cuda.current_stream(info.device).cuda_stream
    if info.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(info.device):
            return cupy.cuda.get_current_stream().ptr
    return int(info.stream) if info.stream else 0


def _torch_stream_context(torch, device, stream):
    if torch.cuda.current_stream(device).cuda_stream == stream:
        return contextlib.nullcontext()
    default = torch.cuda.default_stream(device)
    if stream in (0, 1) and default.cuda_stream == 0:
        return torch.cuda.stream(default)
    return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device))


def _cupy_stream_context(cupy, device, stream):
    with cupy.cuda.Device(device):
        if cupy.cuda.get_current_stream().ptr == stream:
            return contextlib.nullcontext()
    if stream in (0, 1):
        return cupy.cuda.Stream.null
    return cupy.cuda.ExternalStream(stream, device)


# --------------------------------------------------------------------------
# Allocation with the input's framework
# --------------------------------------------------------------------------


def shape_of(x, name):
    """x's shape as a tuple, read from x.shape where it has one (cheaper
    than describe(), which reads everything), else from describe()."""
    shape = getattr(x, "shape", None)
    return tuple(describe(x, name).shape if shape is None else shape)


def can_allocate(like):
    return like.framework in ("torch", "cupy")


def empty(like, shape, dtype, stream):
    """A new array of like's framework and device (like: an ArrayInfo, or any
    object with its framework and device), shape and dtype (None: like's
    dtype; a name such as "float32" or "uint8", or the framework's own dtype),
    taken from the memory pool of the stream it will be written on."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        torch_dtype = like.obj.dtype if dtype is None else getattr(torch, dtype) if isinstance(dtype, str) else dtype
        with _torch_stream_context(torch, like.device, stream):
            return torch.empty(shape, dtype=torch_dtype, device=torch.device("cuda", like.device))
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            with _cupy_stream_context(cupy, like.device, stream):
                return cupy.empty(shape, dtype=like.obj.dtype if dtype is None else dtype)
    raise TypeError("cannot allocate memory for a %s: pass the output (out=) and, when the library "
                    "asks for one, the workspace (workspace=) yourself" % type(like.obj).__name__)


def full(like, shape, dtype, value, stream):
    """As empty(), every element set to value, written on `stream`."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        with _torch_stream_context(torch, like.device, stream):
            return torch.full(shape, value, dtype=getattr(torch, dtype), device=torch.device("cuda", like.device))
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            with _cupy_stream_context(cupy, like.device, stream):
                return cupy.full(shape, value, dtype=dtype)
    raise TypeError("cannot allocate memory for a %s" % type(like.obj).__name__)


def allocate(like, shape, dtype, stream, what):
    """empty(), where like's framework can allocate; else a TypeError that
    asks for `what` (out, lse, workspace) to be given."""
    if not can_allocate(like):
        raise TypeError("flashcore cannot allocate %s for %s inputs: pass %s= (a CUDA array) yourself"
                        % (what, type(like.obj).__name__, what))
    return empty(like, shape, dtype, stream)


def describe_first(x, name, stream):
    """The ArrayInfo of a call's first array and the stream the call runs
    on: `stream` (any form stream_pointer takes) where given, else the
    current stream of that array's framework."""
    user_stream = None if stream is None else stream_pointer(stream)
    info = describe(x, name, user_stream or 0)
    return info, current_stream(info) if user_stream is None else user_stream


# --------------------------------------------------------------------------
# Signatures: what the call cache (flashcore._plan) keys on
# --------------------------------------------------------------------------

_ADDRESS_END = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p))


def cai_signature(x):
    """(key, pointer, stream) of a __cuda_array_interface__ array whose
    description the call cache can reuse: key holds every entry describe()
    reads but the pointer and the stream, so that equal keys describe equal
    arrays but for where they are (and on which stream). None for arrays
    that take the full path every time: tensor subclasses, CuPy arrays,
    DLPack-only objects, and interfaces whose per-call entries are malformed
    (the full path says how). A shape or strides of anything but ints (a
    shape of 64.0, which compares equal to a cached 64) takes the full
    path too, which refuses it: the cache serves only what the full path
    accepts. The device is the driver's, asked per pointer each call.
    (torch tensors are read by the cache itself.)"""
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if torch is not None and isinstance(x, torch.Tensor) or cupy is not None and isinstance(x, cupy.ndarray):
        return None
    cai = getattr(x, "__cuda_array_interface__", None)
    if type(cai) is not dict:
        return None
    data, version = cai.get("data"), cai.get("version")
    if type(data) is not tuple or len(data) != 2 or (version is not None and type(version) is not int):
        return None
    ptr, readonly = data
    if type(ptr) is not int or not 0 <= ptr < _ADDRESS_END or type(readonly) is not bool:
        return None
    stream = cai.get("stream") if version is not None and version >= 3 else None
    if stream is not None and (type(stream) is not int or stream < 0):
        return None
    shape, strides = cai.get("shape"), cai.get("strides")
    if not _int_tuple(shape) or strides is not None and not _int_tuple(strides):
        return None
    key = (shape, strides, cai.get("typestr"), readonly, version, cai.get("mask"))
    return key, ptr, stream


def _int_tuple(entries):
    """Whether entries is a tuple of ints (no bools, floats or other numbers
    that compare equal to one)."""
    if type(entries) is not tuple:
        return False
    for n in entries:
        if type(n) is not int:
            return False
    return True
