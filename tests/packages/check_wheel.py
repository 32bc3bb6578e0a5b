"""check_wheel.py: run by the Python of a fresh virtual environment into
which only the flashcore-attention wheel was installed (check_wheel.sh).

Checks that `import flashcore` loads a library bundled in the wheel (not a
system one, not $FLASHCORE_LIBRARY): the wheel carries one build per CUDA
major (flashcore/cudaMAJOR/; $FLASHCORE_WHEEL_EXPECT_CUDA_MAJORS, e.g.
"12 13", says which it must carry), without a driver the newest is loaded,
and each is loaded when FLASHCORE_CUDA_MAJOR asks for it (in a process of
its own) and reports its own CUDA runtime. For each: its version is the
package's, a call on a machine without a GPU raises NoDeviceError with the
library's message, and the compiled call path (flashcore._fastcall) is
inside, loads in this Python and fits the package's params struct. Exits
non-zero on any failure.
"""

import ctypes
import importlib.metadata
import os
import subprocess
import sys

import flashcore
from flashcore import _library

DIST = "flashcore-attention"
EXPECT_ENV = "FLASHCORE_WHEEL_EXPECT_CUDA_MAJORS"


def main():
    assert "FLASHCORE_LIBRARY" not in os.environ, "run without FLASHCORE_LIBRARY"
    package_dir = os.path.dirname(os.path.abspath(flashcore.__file__))
    builds = _library.flavoured_builds(package_dir)
    print("bundled builds: %s" % ", ".join("CUDA %d at %s" % (m, builds[m]) for m in sorted(builds)))
    assert builds, "the wheel carries no flashcore/cudaMAJOR/ library"
    expected = os.environ.get(EXPECT_ENV)
    if expected:
        assert sorted(builds) == sorted(int(m) for m in expected.split()), (sorted(builds), expected)
    requested = os.environ.get(_library.CUDA_MAJOR_ENV_VAR)
    if requested is None:
        # Without a driver the newest build is loaded (the loader's rule; with
        # one, which is loaded depends on its version).
        if _library.driver_cuda_version() is None:
            print("--- no NVIDIA driver: the newest build")
            check_loaded(package_dir, max(builds))
        for major in sorted(builds):
            print("--- %s=%d" % (_library.CUDA_MAJOR_ENV_VAR, major))
            subprocess.run([sys.executable, os.path.abspath(__file__)], check=True,
                           env=dict(os.environ, **{_library.CUDA_MAJOR_ENV_VAR: str(major)}))
    else:
        check_loaded(package_dir, int(requested))


def check_loaded(package_dir, major):
    """The loaded library is the bundled CUDA `major` build, and works as the
    package's library should without a GPU."""
    assert package_dir.startswith(sys.prefix), "flashcore imported from %s, not the venv %s" % (package_dir,
                                                                                            sys.prefix)
    lib = flashcore.library()
    print("flashcore %s from %s" % (flashcore.__version__, package_dir))
    print("library %s, %s: %s (%s)" % (lib.version, lib.cuda_runtime(), lib.path, lib.how))
    assert lib.how.startswith("bundled with the package: the CUDA %d build (" % major), lib.how
    assert os.path.dirname(lib.path) == os.path.join(package_dir, "cuda%d" % major), lib.path
    assert lib.cuda_runtime_version // 1000 == major, lib.cuda_runtime_version
    version = importlib.metadata.version(DIST)
    assert flashcore.library_version() == version == flashcore.__version__, (flashcore.library_version(), version)

    from flashcore import _plan
    compiled = _plan.find()
    assert compiled is not None, "the wheel has no flashcore._fastcall"
    assert os.path.dirname(os.path.abspath(compiled.__file__)) == package_dir, compiled.__file__
    assert _plan.fits_struct(compiled), "flashcore._fastcall was built against another flashcore.h"
    print("compiled call path: %s" % compiled.__file__)

    # flashcore.jax's XLA FFI handlers (pyproject.toml builds them with
    # FLASHCORE_JAX=ON): in the package, with their entry points.
    handlers = os.path.join(package_dir, "libflashcore_jax.so")
    assert os.path.exists(handlers), "the wheel has no %s" % handlers
    loaded = ctypes.CDLL(handlers)
    for symbol in ("flashcore_jax_bind", "flashcore_jax_forward", "flashcore_jax_backward"):
        assert hasattr(loaded, symbol), symbol
    print("jax handlers: %s" % handlers)

    # A call needs a handle; without a GPU the library says why.
    # As the library looks for the driver: whether libcuda.so.1 loads
    # (find_library("cuda") also finds the toolkit's stub libcuda.so).
    no_driver = not libcuda_loads()
    # q, k and v may share memory; out may overlap none of them.
    q = Array((1, 8, 128, 64), address=1 << 20)
    try:
        flashcore.attention(q, q, q, out=Array((1, 8, 128, 64), address=1 << 24))
    except flashcore.NoDeviceError as e:
        print("flashcore.attention without a GPU: NoDeviceError: %s" % e.message)
        assert e.status == flashcore.Status.NO_DEVICE
        if no_driver:
            assert e.message.startswith("no NVIDIA driver found (libcuda.so.1 could not be loaded"), e.message
    else:
        if no_driver:
            raise AssertionError("flashcore.attention succeeded on a machine without an NVIDIA driver")
    print("OK: %s %s loads its bundled library" % (DIST, version))


def libcuda_loads():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class Array:
    """A device array as flashcore reads it (__cuda_array_interface__), at an
    address nothing is ever launched on: the call fails before that."""

    def __init__(self, shape, address):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (address, False),
                                         "strides": None, "version": 3, "stream": None}


if __name__ == "__main__":
    main()
