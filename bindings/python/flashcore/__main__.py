"""python -m flashcore: which library this package loads, its version and
kernels, and the GPUs of this machine with what flashcore runs on each.
Works without a GPU (and says so). Exits 1 when no library loads."""

import ctypes
import os
import sys

import flashcore
from flashcore import _arrays, _library

# CUdevice_attribute values (cuda.h).
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
# The sm_90a kernels run on compute capability 9.0 only (src/handle.cpp).
SM90_CAPABILITY = (9, 0)


def driver_gpus():
    """(driver version, [(ordinal, name, (major, minor), SMs, bytes)]) from
    the CUDA driver; (None, []) without one."""
    lib = _arrays.cuda_driver()
    if lib is None:
        return None, []
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return version.value, []
    gpus = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, len(name), device)
        values = []
        for attribute in (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                          CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT):
            value = ctypes.c_int(0)
            lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
            values.append(value.value)
        memory = ctypes.c_size_t(0)
        lib.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
        gpus.append((ordinal, name.value.decode(errors="replace"), (values[0], values[1]), values[2], memory.value))
    return version.value, gpus


def driver_too_old(lib, driver_version):
    """A line saying the driver is too old for lib and what would run on it;
    None where it runs lib or there is no driver."""
    if driver_version is None or _library.driver_runs(driver_version, lib.cuda_major):
        return None
    line = ("the NVIDIA driver supports CUDA %s, too old for this library, which needs %s: "
            % (_library.cuda_version_string(driver_version), lib.driver_requirement()))
    bundled = [m for m in _library.flavoured_builds(_library.package_dir()) if _library.driver_runs(driver_version, m)]
    if bundled:
        newest = max(bundled)
        return line + "the bundled CUDA %d build runs on it (%s=%d)" % (newest, _library.CUDA_MAJOR_ENV_VAR, newest)
    known = [m for m in _library.MINIMUM_DRIVER_FOR_CUDA_MAJOR if _library.driver_runs(driver_version, m)]
    if known:
        return line + "a CUDA %d build would run on it, or upgrade the driver" % max(known)
    return line + "upgrade the driver"


def kernel_path(ordinal, capability):
    """What flashcore runs on a GPU: a handle is created for it, and on a 9.0
    GPU once more with FLASHCORE_FWD_VARIANT=hopper, which succeeds only where
    the library has the sm_90a kernels (README: FLASHCORE_FWD_VARIANT)."""
    try:
        flashcore.Handle(ordinal).close()
    except flashcore.FlashcoreError as e:
        return "cannot run: %s" % e
    if tuple(capability) != SM90_CAPABILITY:
        return "the portable kernels (sm_80 and newer)"
    saved = os.environ.get("FLASHCORE_FWD_VARIANT")
    os.environ["FLASHCORE_FWD_VARIANT"] = "hopper"
    try:
        flashcore.Handle(ordinal).close()
        return ("the sm_90a (wgmma/TMA) kernels for calls that fill the GPU, the portable ones for the others "
                "(decoding, short query sequences)")
    except flashcore.FlashcoreError:
        return "the portable kernels only: this library was built without the sm_90a kernels"
    finally:
        if saved is None:
            del os.environ["FLASHCORE_FWD_VARIANT"]
        else:
            os.environ["FLASHCORE_FWD_VARIANT"] = saved


def compiled_path():
    """Where flashcore._fastcall was found, or why it is not used."""
    from . import _plan
    if os.environ.get(_plan.DISABLE_ENV) == "0":
        return "off (%s=0)" % _plan.DISABLE_ENV
    module = _plan.find()
    if module is None:
        return "not built (every call runs in Python)"
    if not _plan.fits_struct(module):
        return "%s, not used: built against another flashcore.h" % module.__file__
    return module.__file__


def main():
    print("flashcore (Python package) %s at %s" % (flashcore.__version__, os.path.dirname(flashcore.__file__)))
    try:
        lib = flashcore.library()
    except flashcore.LibraryError as e:
        print("libflashcore: not loaded\n  %s" % str(e).replace("\n", "\n  "))
        return 1
    print("libflashcore %s at %s: %s, needs %s" % (lib.version, lib.path, lib.cuda_runtime(),
                                                  lib.driver_requirement()))
    print("  found: %s" % (lib.how or "given"))
    too_old = driver_too_old(lib, _library.driver_cuda_version())
    if too_old:
        print("  WARNING: %s" % too_old)
    dims = ", ".join("(%d, %d)" % pair for pair in lib.supported_head_dims())
    print("kernels for (head_dim, head_dim_v): %s; other multiples of 8 run on the first pair that covers them" % dims)
    print("compiled call path (repeated calls on torch tensors): %s" % compiled_path())
    version, gpus = driver_gpus()
    if version is None:
        try:
            flashcore.Handle().close()
        except flashcore.FlashcoreError as e:
            print("GPUs: none (%s)" % e)
        return 0
    print("CUDA driver %d.%d" % (version // 1000, version % 1000 // 10))
    if not gpus:
        print("GPUs: none (the driver sees no device)")
    for ordinal, name, capability, sms, memory in gpus:
        print("GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GiB: %s"
              % (ordinal, name, capability[0], capability[1], sms, memory / 2**30, kernel_path(ordinal, capability)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
