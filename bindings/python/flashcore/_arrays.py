"""Reading GPU arrays from any framework: PyTorch tensors and CuPy arrays
natively, anything else through __cuda_array_interface__ or DLPack.

Nothing here imports torch or cupy: an array of theirs can only exist once its
framework has been imported, so sys.modules is where to look.
"""

import contextlib
import ctypes
import sys

from ._errors import InvalidArgumentError, MisalignedError


class ArrayInfo:
    """What the binding needs of one array. strides are in elements; device is
    a CUDA ordinal or None when unknown; framework is "torch", "cupy" or None."""

    __slots__ = ("obj", "name", "ptr", "shape", "strides", "dtype", "itemsize", "device",
                 "framework", "readonly", "stream", "keepalive")

    def __init__(self, obj, name, ptr, shape, strides, dtype, itemsize, device, framework,
                 readonly=False, stream=None, keepalive=None):
        self.obj = obj
        self.name = name
        self.ptr = int(ptr or 0)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.dtype = dtype  # "float16", "bfloat16", "float32", ... or the source's own spelling
        self.itemsize = itemsize
        self.device = device
        self.framework = framework
        self.readonly = readonly
        self.stream = stream  # the producer's stream (__cuda_array_interface__ v3), if any
        self.keepalive = keepalive  # e.g. the DLPack capsule


def _module_instance(x, module, cls):
    mod = sys.modules.get(module)
    return mod is not None and isinstance(x, getattr(mod, cls))


def is_torch(x):
    return _module_instance(x, "torch", "Tensor")


def is_cupy(x):
    return _module_instance(x, "cupy", "ndarray")


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


def _from_torch(x, name):
    if x.device.type != "cuda":
        raise InvalidArgumentError("%s is a tensor on %s; flashcore needs CUDA tensors" % (name, x.device))
    return ArrayInfo(x, name, x.data_ptr(), x.shape, x.stride(), str(x.dtype).replace("torch.", ""),
                     x.element_size(), x.device.index, "torch")


def _from_cupy(x, name):
    return ArrayInfo(x, name, x.data.ptr, x.shape, _element_strides(name, x.strides, x.itemsize),
                     x.dtype.name, x.itemsize, x.device.id, "cupy")


# --------------------------------------------------------------------------
# __cuda_array_interface__
# --------------------------------------------------------------------------

_TYPESTR = {"f2": "float16", "f4": "float32", "f8": "float64"}


def _from_cai(x, name):
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    dtype = _TYPESTR.get(typestr[1:], typestr) if typestr[0] in "<|=" else typestr
    if cai.get("mask") is not None:
        raise InvalidArgumentError("%s: masked arrays (__cuda_array_interface__ mask) are not supported" % name)
    strides = cai.get("strides")
    strides = contiguous_strides(shape) if strides is None else _element_strides(name, strides, itemsize)
    ptr, readonly = cai["data"]
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return ArrayInfo(x, name, ptr, shape, strides, dtype, itemsize, pointer_device(ptr), None,
                     readonly=bool(readonly), stream=stream)


_cuda_driver = []


def pointer_device(ptr):
    """CUDA ordinal of the device holding ptr, asked of the driver; None if
    there is no driver or it does not know the pointer."""
    if not ptr:
        return None
    if not _cuda_driver:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            ok = lib.cuInit(0) == 0
        except (OSError, AttributeError):
            lib, ok = None, False
        _cuda_driver.append(lib if ok else None)
    lib = _cuda_driver[0]
    if lib is None:
        return None
    ordinal = ctypes.c_int(-1)
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    if lib.cuPointerGetAttribute(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != 0:
        return None
    return ordinal.value


# --------------------------------------------------------------------------
# DLPack (the unversioned capsule every producer still offers)
# --------------------------------------------------------------------------

kDLCUDA = 2
kDLCUDAManaged = 13
_DL_DTYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64"}


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
        raise InvalidArgumentError("%s is not in CUDA memory (DLPack device type %d)" % (name, int(device_type)))
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
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    if t.dtype.lanes != 1:
        raise InvalidArgumentError("%s: vector DLPack dtypes (lanes=%d) are not supported" % (name, t.dtype.lanes))
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits), "DLPack code %d bits %d" % (t.dtype.code, t.dtype.bits))
    return ArrayInfo(x, name, (t.data or 0) + t.byte_offset, shape, strides, dtype, max(t.dtype.bits // 8, 1),
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


def can_allocate(like):
    return like.framework in ("torch", "cupy")


def empty(like, shape, dtype, stream):
    """A new array of like's framework and device, shape and dtype (None: like's
    dtype; else "float32" or "uint8"), taken from the memory pool of the stream
    it will be written on."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        torch_dtype = like.obj.dtype if dtype is None else getattr(torch, dtype)
        with _torch_stream_context(torch, like.device, stream):
            return torch.empty(shape, dtype=torch_dtype, device=torch.device("cuda", like.device))
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            with _cupy_stream_context(cupy, like.device, stream):
                return cupy.empty(shape, dtype=like.obj.dtype if dtype is None else dtype)
    raise TypeError("cannot allocate memory for a %s: pass the output (out=) and, when the library "
                    "asks for one, the workspace (workspace=) yourself" % type(like.obj).__name__)
