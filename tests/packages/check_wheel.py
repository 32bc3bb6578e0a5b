"""check_wheel.py: run by the Python of a fresh virtual environment into
which only the flashcore-attention wheel was installed (check_wheel.sh).

Checks that `import flashcore` loads the library bundled in the wheel (not a
system one, not $FLASHCORE_LIBRARY), that its version is the package's, and
that a call on a machine without a GPU raises NoDeviceError with the
library's message, and that the compiled call path (flashcore._fastcall)
is inside, loads in this Python and fits the package's params struct.
Exits non-zero on any failure.
"""

import ctypes.util
import importlib.metadata
import os
import sys

import flashcore

DIST = "flashcore-attention"


def main():
    assert "FLASHCORE_LIBRARY" not in os.environ, "run without FLASHCORE_LIBRARY"
    package_dir = os.path.dirname(os.path.abspath(flashcore.__file__))
    assert package_dir.startswith(sys.prefix), "flashcore imported from %s, not the venv %s" % (package_dir,
                                                                                            sys.prefix)
    lib = flashcore.library()
    print("flashcore %s from %s" % (flashcore.__version__, package_dir))
    print("library %s: %s (%s)" % (lib.version, lib.path, lib.how))
    assert lib.how == "bundled with the package", lib.how
    assert os.path.dirname(lib.path) == package_dir, lib.path
    version = importlib.metadata.version(DIST)
    assert flashcore.library_version() == version == flashcore.__version__, (flashcore.library_version(), version)

    from flashcore import _fastpath
    compiled = _fastpath.find()
    assert compiled is not None, "the wheel has no flashcore._fastcall"
    assert os.path.dirname(os.path.abspath(compiled.__file__)) == package_dir, compiled.__file__
    assert _fastpath.fits_struct(compiled), "flashcore._fastcall was built against another flashcore.h"
    print("compiled call path: %s" % compiled.__file__)

    # A call needs a handle; without a GPU the library says why.
    no_driver = ctypes.util.find_library("cuda") is None
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


class Array:
    """A device array as flashcore reads it (__cuda_array_interface__), at an
    address nothing is ever launched on: the call fails before that."""

    def __init__(self, shape, address):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (address, False),
                                         "strides": None, "version": 3, "stream": None}


if __name__ == "__main__":
    main()
