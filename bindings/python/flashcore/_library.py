"""Finding and loading libflashcore, and the per-thread handle cache."""

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import threading
from typing import Optional

from . import _ffi
from ._checked import fits, struct_ref, whole_number
from ._errors import FlashcoreError, LibraryError, error_for_status
from ._fields import int_range

ENV_VAR = "FLASHCORE_LIBRARY"
MAJOR = _ffi.FLASHCORE_VERSION_MAJOR
# What flashcore_status_string gives any value that is no status (flashcore.h).
UNKNOWN_STATUS = "unknown status"
# (lowest, highest) int the C int of flashcore_status_string's argument holds.
_C_INT_RANGE = int_range(ctypes.c_int)
# Where the low-level calls' params come from, for messages.
FORWARD_PARAMS_FROM = "from flashcore.forward_params()"
MERGE_PARAMS_FROM = "from flashcore.merge_params()"


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


def bundled():
    """The library shipped inside this package (the flashcore-attention wheel
    puts it at flashcore/libflashcore.so.MAJOR), as (how, path) pairs; empty
    for a source checkout or the pure-Python package."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    return [("bundled with the package", os.path.join(d, n))
            for d in (package_dir, os.path.join(package_dir, "lib"))
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
        self._params_template = None
        self._merge_template = None
        self._head_dims = None

    def __getattr__(self, name):
        if name.startswith("flashcore_"):
            return getattr(self.cdll, name)
        raise AttributeError(name)

    def __repr__(self):
        return "<flashcore.Library %s %s>" % (self.version, self.path)

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

    def new_params(self):
        """A flashcore_forward_params set up by the library's own
        flashcore_forward_params_init, struct_size = this package's sizeof."""
        if self._params_template is None:
            template = _ffi.flashcore_forward_params()
            self.check(self.cdll.flashcore_forward_params_init(ctypes.byref(template), ctypes.sizeof(template)))
            self._params_template = bytes(template)
        return _ffi.flashcore_forward_params.from_buffer_copy(self._params_template)

    def new_merge_params(self):
        """A flashcore_merge_params set up by the library's own
        flashcore_merge_params_init, struct_size = this package's sizeof."""
        if self._merge_template is None:
            template = _ffi.flashcore_merge_params()
            self.check(self.cdll.flashcore_merge_params_init(ctypes.byref(template), ctypes.sizeof(template)))
            self._merge_template = bytes(template)
        return _ffi.flashcore_merge_params.from_buffer_copy(self._merge_template)


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


# --------------------------------------------------------------------------
# Handles
# --------------------------------------------------------------------------


class Handle:
    """A flashcore_handle: one CUDA device's dispatch state. Close it (or use
    it as a context manager); get_handle() keeps one per device per thread."""

    def __init__(self, device=None, lib=None):
        self._lib = lib or library()
        raw = _ffi.flashcore_handle()
        if device is None:
            self._lib.check(self._lib.cdll.flashcore_create(ctypes.byref(raw)))
        else:
            device = fits(device, ctypes.c_int32, "device")
            self._lib.check(self._lib.cdll.flashcore_create_for_device(ctypes.byref(raw), device))
        self._raw = raw
        ordinal = ctypes.c_int(-1)
        self._lib.check(self._lib.cdll.flashcore_handle_device(raw, ctypes.byref(ordinal)))
        self.device = ordinal.value

    @property
    def value(self):
        """The flashcore_handle as an int (0 once closed)."""
        if self._raw is None:
            return 0
        return self._raw.value or 0

    def _live(self):
        if self._raw is None:
            raise FlashcoreError("the handle is closed")
        return self._raw

    def workspace_size(self, params):
        """Bytes of workspace flashcore_forward needs for params on this device."""
        params = struct_ref(params, _ffi.flashcore_forward_params, "params", FORWARD_PARAMS_FROM)
        size = ctypes.c_size_t(0)
        self._lib.check(self._lib.cdll.flashcore_forward_workspace_size(self._live(), params, ctypes.byref(size)))
        return size.value

    def forward(self, params, workspace=0, workspace_bytes=0, stream=0):
        """Queues flashcore_forward. workspace and stream are raw addresses (ints)."""
        struct_ref(params, _ffi.flashcore_forward_params, "params", FORWARD_PARAMS_FROM)
        self.forward_unchecked(params, fits(workspace or None, ctypes.c_void_p, "workspace"),
                               fits(workspace_bytes, ctypes.c_size_t, "workspace_bytes"),
                               fits(stream or None, ctypes.c_void_p, "stream"))

    def forward_unchecked(self, params, workspace, workspace_bytes, stream):
        """forward() for arguments known to fit their C types: params a
        flashcore.ForwardParams, workspace and stream ints (0 or None for
        none), workspace_bytes an int >= 0. The cached calls' path, where
        each conversion is host time."""
        status = self._lib.cdll.flashcore_forward(self._live(), ctypes.byref(params), workspace or None,
                                                  workspace_bytes, stream or None)
        if status:
            self._lib.check(status)

    def merge_states(self, params, stream=0):
        """Queues flashcore_merge_states (a flashcore.MergeParams, e.g. from
        flashcore.merge_params). stream is a raw cudaStream_t (an int); the
        call needs no workspace."""
        params = struct_ref(params, _ffi.flashcore_merge_params, "params", MERGE_PARAMS_FROM)
        stream = fits(stream or None, ctypes.c_void_p, "stream")
        self._lib.check(self._lib.cdll.flashcore_merge_states(self._live(), params, stream))

    def close(self):
        raw, self._raw = getattr(self, "_raw", None), None
        if raw is not None and raw.value:
            self._lib.check(self._lib.cdll.flashcore_destroy(raw))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<flashcore.Handle device=%d %s>" % (self.device, "open" if self._raw is not None else "closed")


_thread_handles = threading.local()


def get_handle(device: Optional[int] = None) -> "Handle":
    """This thread's cached Handle for a CUDA device (None: the thread's
    current device)."""
    cache = getattr(_thread_handles, "cache", None)
    if cache is None:
        cache = _thread_handles.cache = {}
    if device is not None and device in cache:
        return cache[device]
    handle = Handle(device)
    return cache.setdefault(handle.device, handle)
