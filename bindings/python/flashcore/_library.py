"""Finding and loading libflashcore (library(), open_library), and
struct_ref, which checks the params structs the low-level calls take."""

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import threading
from typing import Optional

from . import _ffi
from ._errors import InvalidArgumentTypeError, LibraryError, error_for_status
from ._fields import int_range, whole_number

ENV_VAR = "FLASHCORE_LIBRARY"
# Picks the bundled build by CUDA major, overriding the driver-based choice.
CUDA_MAJOR_ENV_VAR = "FLASHCORE_CUDA_MAJOR"
MAJOR = _ffi.FLASHCORE_VERSION_MAJOR
# What flashcore_status_string gives any value that is no status (flashcore.h).
UNKNOWN_STATUS = "unknown status"
# (lowest, highest) int the C int of flashcore_status_string's argument holds.
_C_INT_RANGE = int_range(ctypes.c_int)
# Where the low-level calls' params come from, for messages.
FORWARD_PARAMS_FROM = "from flashcore.forward_params()"
BACKWARD_PARAMS_FROM = "from flashcore.backward_params()"
MERGE_PARAMS_FROM = "from flashcore.merge_params()"
# The params structs by the names the package exports them under.
STRUCT_NAMES = {_ffi.flashcore_forward_params: "flashcore.ForwardParams",
                _ffi.flashcore_backward_params: "flashcore.BackwardParams",
                _ffi.flashcore_merge_params: "flashcore.MergeParams"}


def struct_ref(value, struct, what, made_by):
    """ctypes.byref(value), value a `struct` (a params struct of _ffi; made_by
    says where one comes from). Anything else is refused naming `what`:
    ctypes would raise its own TypeError or ArgumentError, naming neither
    the argument nor the type it takes."""
    if not isinstance(value, struct):
        got = next((name for s, name in STRUCT_NAMES.items() if isinstance(value, s)), None)
        raise InvalidArgumentTypeError("%s must be a %s (%s), got %s"
                                       % (what, STRUCT_NAMES[struct], made_by,
                                          got or ("None" if value is None else type(value).__name__)))
    return ctypes.byref(value)


def library_names():
    if sys.platform == "win32":
        return ["flashcore.dll"]
    if sys.platform == "darwin":
        return ["libflashcore.%d.dylib" % MAJOR, "libflashcore.dylib"]
    return ["libflashcore.so.%d" % MAJOR, "libflashcore.so"]


def _pkgconfig_libdir():
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--variable=libdir", "flashcore"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


# --------------------------------------------------------------------------
# CUDA flavours: the wheel bundles one build per CUDA major
# --------------------------------------------------------------------------

# CUDA writes versions as 1000 * major + 10 * minor (12040 is 12.4).
CUDA_VERSION_PER_MAJOR = 1000
CUDA_VERSION_PER_MINOR = 10
# The oldest NVIDIA driver of each CUDA major: a build linked against CUDA
# major.x runs on it and on any newer driver (CUDA's minor-version
# compatibility), i.e. wherever cuDriverGetVersion() >= 1000 * major.
MINIMUM_DRIVER_FOR_CUDA_MAJOR = {12: "525.60.13", 13: "580.65.06"}
# Where the wheel puts each build: flashcore/cuda12/, flashcore/cuda13/.
FLAVOUR_DIR = re.compile(r"cuda([0-9]+)$")
# The CUDA driver library's name, per platform (none on macOS).
CUDA_DRIVER_NAMES = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


def cuda_version_string(version):
    """12080 -> "12.8"."""
    return "%d.%d" % (version // CUDA_VERSION_PER_MAJOR, version % CUDA_VERSION_PER_MAJOR // CUDA_VERSION_PER_MINOR)


def driver_requirement(cuda_major):
    """The driver a build of that CUDA major needs, in words."""
    text = "an NVIDIA driver for CUDA %d.0 or newer" % cuda_major
    if cuda_major in MINIMUM_DRIVER_FOR_CUDA_MAJOR:
        text += " (%s+)" % MINIMUM_DRIVER_FOR_CUDA_MAJOR[cuda_major]
    return text


def driver_runs(driver_version, cuda_major):
    """Whether a driver supporting CUDA driver_version (cuDriverGetVersion)
    runs a build of that CUDA major."""
    return driver_version >= cuda_major * CUDA_VERSION_PER_MAJOR


def driver_cuda_version():
    """The CUDA version the installed NVIDIA driver supports
    (cuDriverGetVersion, e.g. 12080), or None without a driver. Asked of
    libcuda directly, before any libflashcore is loaded; it needs no cuInit
    and no GPU."""
    name = CUDA_DRIVER_NAMES.get(sys.platform)
    if name is None:
        return None
    try:
        cuda = ctypes.CDLL(name)
        version = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value


def _needs(cuda_major):
    """What a build of that CUDA major needs, for reasons: e.g. "needs 13.0,
    driver 580.65.06 or newer" (the driver part where known)."""
    text = "needs %d.0" % cuda_major
    if cuda_major in MINIMUM_DRIVER_FOR_CUDA_MAJOR:
        text += ", driver %s or newer" % MINIMUM_DRIVER_FOR_CUDA_MAJOR[cuda_major]
    return text


def _bundled_list(majors):
    """[13, 12] -> "CUDA 13 and CUDA 12 builds", for messages."""
    return " and ".join("CUDA %d" % m for m in majors) + (" builds" if len(majors) > 1 else " build")


def choose_flavour(available, driver_version, requested):
    """The bundled builds to try, in order, as (CUDA major, reason) pairs.
    available: the CUDA majors bundled; driver_version: cuDriverGetVersion's
    value or None without a driver; requested: $FLASHCORE_CUDA_MAJOR or None.
    The first pair is the choice; the others are builds the driver runs too,
    newest first, tried only when the choice does not load. Raises
    LibraryError for a request that no bundled build meets."""
    available = sorted(set(available), reverse=True)
    if requested is not None:
        setting = "%s=%s" % (CUDA_MAJOR_ENV_VAR, requested)
        major = int(requested) if requested.strip().isdecimal() else None
        if major not in available:
            bundles = "the %s" % _bundled_list(available) if available else "no CUDA-specific build"
            raise LibraryError("%s: no such build is bundled with this package, which has %s" % (setting, bundles))
        return [(major, setting)]
    if not available:
        return []
    if driver_version is None:
        newest, older = available[0], available[1:]
        return ([(newest, "no NVIDIA driver was found, so the newest; creating a handle reports the missing driver")]
                + [(m, "no NVIDIA driver was found; an older build, tried as the newer one did not load")
                   for m in older])
    driver = "the NVIDIA driver supports CUDA %s" % cuda_version_string(driver_version)
    runnable = [m for m in available if driver_runs(driver_version, m)]
    if not runnable:
        oldest = available[-1]
        return [(oldest, "%s, too old for every bundled build (the oldest, CUDA %d, %s): creating a handle fails "
                         "with NO_DEVICE and the library's message" % (driver, oldest, _needs(oldest)))]
    chosen = runnable[0]
    too_new = [m for m in available if m > chosen]
    if too_new:
        reason = "%s, which runs the CUDA %d build and not the CUDA %d one (%s)" % (driver, chosen, too_new[-1],
                                                                                    _needs(too_new[-1]))
    else:
        reason = "%s: the newest build it runs" % driver
    return [(chosen, reason)] + [(m, "%s, which runs this build too: tried as a newer one did not load" % driver)
                                 for m in runnable[1:]]


def package_dir():
    """This package's folder, where the wheel puts the library."""
    return os.path.dirname(os.path.abspath(__file__))


def flavoured_builds(folder):
    """{CUDA major: library path} of the builds in folder/cudaMAJOR/."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return {}
    builds = {}
    for entry in entries:
        match = FLAVOUR_DIR.match(entry)
        if not match:
            continue
        for name in library_names():
            path = os.path.join(folder, entry, name)
            if os.path.isfile(path):
                builds[int(match.group(1))] = path
                break
    return builds


def bundled():
    """The libraries shipped inside this package, as (how, path) pairs in the
    order to try; empty for a source checkout or the pure-Python package.
    The wheel puts one build per CUDA major at flashcore/cudaMAJOR/ and the
    one to load is picked by choose_flavour from the driver's CUDA version
    or $FLASHCORE_CUDA_MAJOR; an older wheel put its one library, of unknown
    flavour, at flashcore/libflashcore.so.MAJOR (or flashcore/lib/)."""
    here = package_dir()
    builds = flavoured_builds(here)
    requested = os.environ.get(CUDA_MAJOR_ENV_VAR) or None
    found = []
    if builds or requested is not None:
        # The driver is asked only where there is a choice to make.
        driver_version = driver_cuda_version() if builds and requested is None else None
        found = [("bundled with the package: the CUDA %d build (%s)" % (major, reason), builds[major])
                 for major, reason in choose_flavour(sorted(builds), driver_version, requested)]
    if requested is not None:
        return found  # a flat-layout library's flavour is unknown: it cannot meet the request
    return found + [("bundled with the package", os.path.join(d, n))
                    for d in (here, os.path.join(here, "lib"))
                    for n in library_names() if os.path.isfile(os.path.join(d, n))]


def candidates():
    """Where an installed library is looked for when there is no bundled one
    and FLASHCORE_LIBRARY is not set, in order: (how, path or name for the
    dynamic loader)."""
    found = []
    libdir = _pkgconfig_libdir()
    if libdir:
        found += [("pkg-config libdir", os.path.join(libdir, n)) for n in library_names()
                  if os.path.isfile(os.path.join(libdir, n))]
    name = ctypes.util.find_library("flashcore")
    if name:
        found.append(("ctypes.util.find_library", name))
    found += [("the dynamic loader's search path", n) for n in library_names()]
    return found


def bind(cdll):
    """Sets restype and argtypes of every function in _ffi.FUNCTIONS on a
    ctypes.CDLL; returns the names it does not export."""
    missing = []
    for name, restype, params in _ffi.FUNCTIONS:
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = [ctype for _, ctype in params]
    return missing


class Library:
    """A loaded libflashcore. Its attributes flashcore_* are the C functions,
    with the argument and result types of the header; check(status) turns a
    status into an exception."""

    def __init__(self, path, how=""):
        self.path = path
        self.how = how
        try:
            self.cdll = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryError("cannot load %s (%s): %s" % (path, how or "given", e)) from None
        missing = bind(self.cdll)
        if "flashcore_version_number" in missing:
            raise LibraryError("%s is not libflashcore: it has no flashcore_version_number" % path)
        self.version_number = self.cdll.flashcore_version_number()
        if self.version_number // 10000 != MAJOR:
            raise LibraryError("%s is libflashcore %d.x (version number %d); this package needs %d.x"
                               % (path, self.version_number // 10000, self.version_number, MAJOR))
        if missing:
            raise LibraryError("%s (version number %d) lacks %s, which this package's header (version number %d) "
                               "declares: install a newer library" % (path, self.version_number, ", ".join(missing),
                                                                      _ffi.FLASHCORE_VERSION_NUMBER))
        self.version = self.cdll.flashcore_version_string().decode()
        self.cuda_runtime_version = self.cdll.flashcore_cuda_runtime_version()
        self.cuda_major = self.cuda_runtime_version // CUDA_VERSION_PER_MAJOR
        self._templates = {}  # params struct type -> its bytes as the library's init left them
        self._head_dims = None

    def __getattr__(self, name):
        if name.startswith("flashcore_"):
            return getattr(self.cdll, name)
        raise AttributeError(name)

    def __repr__(self):
        return "<flashcore.Library %s %s>" % (self.version, self.path)

    def cuda_runtime(self):
        """The runtime linked into the library, e.g. "CUDA 12.4 runtime"."""
        return "CUDA %s runtime" % cuda_version_string(self.cuda_runtime_version)

    def driver_requirement(self):
        """The driver this library needs, in words: "an NVIDIA driver for
        CUDA 12.0 or newer (525.60.13+)"."""
        return driver_requirement(self.cuda_major)

    def status_string(self, status):
        """The library's name for a status (an int): flashcore_status_string,
        which names any int that is no status "unknown status". An int the C
        int cannot hold is none either, and has that name too (ctypes would
        pass it on cut to its low 32 bits: 2**40 read as 0, "success")."""
        status = whole_number(status, "status")
        if not _C_INT_RANGE[0] <= status <= _C_INT_RANGE[1]:
            return UNKNOWN_STATUS
        return self.cdll.flashcore_status_string(status).decode()

    def check(self, status):
        """Raises the FlashcoreError subclass for status, with the calling
        thread's last error message; returns None on success."""
        if status == 0:
            return
        message = self.cdll.flashcore_last_error_message().decode("utf-8", "replace")
        raise error_for_status(status, message or self.status_string(status))

    def supported_head_dims(self):
        """flashcore_supported_head_dims as a list of (head_dim, head_dim_v)
        tuples (read once: it is fixed for a build)."""
        if self._head_dims is None:
            count = ctypes.c_size_t(0)
            self.check(self.cdll.flashcore_supported_head_dims(None, None, 0, ctypes.byref(count)))
            capacity = count.value
            dims, dims_v = (ctypes.c_int32 * capacity)(), (ctypes.c_int32 * capacity)()
            self.check(self.cdll.flashcore_supported_head_dims(dims, dims_v, capacity, ctypes.byref(count)))
            self._head_dims = [(dims[i], dims_v[i]) for i in range(min(count.value, capacity))]
        return list(self._head_dims)

    def _new_struct(self, struct_type, init):
        """A params struct set up by the library's own init function (init,
        e.g. flashcore_forward_params_init), struct_size = this package's
        sizeof; the library is asked once per struct type."""
        template = self._templates.get(struct_type)
        if template is None:
            fresh = struct_type()
            self.check(init(ctypes.byref(fresh), ctypes.sizeof(fresh)))
            template = self._templates[struct_type] = bytes(fresh)
        return struct_type.from_buffer_copy(template)

    def new_params(self):
        """A flashcore_forward_params set up by flashcore_forward_params_init."""
        return self._new_struct(_ffi.flashcore_forward_params, self.cdll.flashcore_forward_params_init)

    def new_backward_params(self):
        """A flashcore_backward_params set up by flashcore_backward_params_init."""
        return self._new_struct(_ffi.flashcore_backward_params, self.cdll.flashcore_backward_params_init)

    def new_merge_params(self):
        """A flashcore_merge_params set up by flashcore_merge_params_init."""
        return self._new_struct(_ffi.flashcore_merge_params, self.cdll.flashcore_merge_params_init)


def open_library(path: Optional[str] = None) -> "Library":
    """Loads the library without caching it: from path if given, else the
    first that loads of: the library bundled with the package (bundled()),
    $FLASHCORE_LIBRARY (an error if it does not load), the installed ones
    (candidates())."""
    if path is not None:
        return Library(path)
    tried = []
    for how, where in bundled():
        try:
            return Library(where, how)
        except LibraryError as e:
            tried.append(str(e))
    path = os.environ.get(ENV_VAR) or None
    if path is not None:
        return Library(path, "$" + ENV_VAR)
    for how, where in candidates():
        try:
            return Library(where, how)
        except LibraryError as e:
            tried.append(str(e))
    raise LibraryError("libflashcore not found. Set %s to its path, or install it where pkg-config or the dynamic "
                       "loader finds it. Tried:\n  %s" % (ENV_VAR, "\n  ".join(tried)))


_lock = threading.Lock()
_library = None


def library() -> "Library":
    """The process's libflashcore, loaded on first use (see open_library)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = open_library()
    return _library
