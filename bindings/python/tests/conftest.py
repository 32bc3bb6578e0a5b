import ctypes
import os
import sys

import pytest

try:
    import flashcore
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import flashcore

from fc_testing import JAX_BACKWARD_WORKSPACE, JAX_FORWARD_WORKSPACE, FakeGpuHandle, RecordingHandle, skip_or_fail


def pytest_report_header(config):
    try:
        lib = flashcore.library()
        where = "%s %s (%s)" % (lib.version, lib.path, lib.how)
    except flashcore.LibraryError as e:
        where = "not loaded: %s" % str(e).splitlines()[0]
    return ["flashcore package %s from %s" % (flashcore.__version__, os.path.dirname(flashcore.__file__)),
            "libflashcore: %s" % where]


@pytest.fixture(scope="session")
def lib():
    """The library; skips when it cannot be found, unless the run named it
    (FLASHCORE_LIBRARY) or requires the GPU tests, where that is an error."""
    try:
        return flashcore.library()
    except flashcore.LibraryError:
        if os.environ.get(flashcore._library.ENV_VAR):
            raise
        skip_or_fail("libflashcore not found: set FLASHCORE_LIBRARY to test against it")


@pytest.fixture(scope="session")
def gpu_present(lib):
    """Whether the library sees a usable GPU (creating a handle succeeds)."""
    try:
        flashcore.Handle(lib=lib).close()
        return True
    except (flashcore.NoDeviceError, flashcore.UnsupportedError):
        return False


@pytest.fixture(scope="session")
def torch_cuda(lib):
    try:
        import torch
    except ImportError:
        skip_or_fail("torch is not installed")
    if not torch.cuda.is_available():
        skip_or_fail("torch sees no CUDA GPU")
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        skip_or_fail("flashcore needs sm_80 or newer")
    return torch


@pytest.fixture(scope="session")
def cupy_cuda(lib):
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or cupy without a usable CUDA
        skip_or_fail("cupy is not usable: %s: %s" % (type(e).__name__, e))
    if count < 1:
        skip_or_fail("cupy sees no CUDA GPU")
    return cupy


@pytest.fixture
def queued(lib, monkeypatch):
    """The params the calls of the test queue, caught by a RecordingHandle
    (the fake pointers reach no GPU and no driver)."""
    handle = RecordingHandle()
    monkeypatch.setattr(flashcore._plan, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(flashcore._plan, "check_known_to_driver", lambda infos: None)
    return handle.queued


@pytest.fixture
def fake_gpu(lib, monkeypatch):
    """A FakeGpuHandle that every call on torch CPU tensors is queued to, the
    tensors described as device 0's and planned as a GPU's would be (the
    plans start empty), on stream 0, outside any CUDA graph capture, by the
    Python paths (the compiled one off). Skips without torch."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from flashcore import _arrays, _attention, _plan

    def as_on_device_0(x, name):
        return _arrays.ArrayInfo(x, name, x.data_ptr(), x.shape, x.stride(), str(x.dtype)[6:], x.element_size(), 0,
                                 "torch")

    handle = FakeGpuHandle(torch)
    monkeypatch.setattr(_arrays, "_from_torch", as_on_device_0)
    monkeypatch.setattr(_plan, "current_stream", lambda info: 0)
    monkeypatch.setattr(_plan, "check_known_to_driver", lambda infos: None)
    monkeypatch.setattr(_plan, "allocate", lambda like, shape, dtype, stream, what: torch.empty(
        shape, dtype=like.obj.dtype if dtype is None else getattr(torch, dtype)))
    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_plan, "_backward_plans", {})
    monkeypatch.setattr(_plan, "get_handle", lambda device=None: handle)
    # The compiled path would call the library with the stand-in's handle:
    # the Python paths only (queued_as_on_a_gpu configures it with stubs).
    monkeypatch.setattr(_attention, "_fast", False)
    api = _plan.torch_api()
    monkeypatch.setattr(api, "current_stream", lambda device: 0)
    monkeypatch.setattr(api, "capturing", lambda: False)
    yield handle
    # Code torch.compile traced through the stand-ins must not be reused by
    # later tests on a real GPU.
    torch._dynamo.reset()
    # The stand-ins undone now, and the compiled module, where one was
    # loaded before this test (the undo gives _attention._fast back), given
    # the library's functions and torch's again: compiled_on_fake_gpu
    # configured it with fakes whose trampolines are gone, and nothing else
    # configures a loaded module. (Left so, the next compiled call jumped to
    # freed code: a crash on 2 H200s in test_gpu_distributed.py after
    # test_sm_margin.py.)
    monkeypatch.undo()
    if _attention._fast:
        _attention._load_fast()


@pytest.fixture
def fp8_queries_checked(lib, monkeypatch):
    """Sets aside the library's UNSUPPORTED verdict on fp8 queries (params
    of dtype FP8_E4M3) in flashcore_forward_check, for the tests of what
    the binding makes of such calls: whether a library takes them before
    looking at the GPU depends on it (fp8 prefill runs on the sm_90a
    kernels only, which a build may lack, and libraries older than fp8
    prefill refuse it outright); test_gpu_fp8_prefill.py checks what it
    computes. Every other verdict, on these calls and on the others,
    stands."""
    real = lib.cdll.flashcore_forward_check

    def check(params_ref):  # the binding passes ctypes.byref(params)
        status = real(params_ref)
        if status == flashcore.Status.UNSUPPORTED and params_ref._obj.dtype == flashcore.Dtype.FP8_E4M3:
            return 0
        return status

    monkeypatch.setattr(lib.cdll, "flashcore_forward_check", check)


@pytest.fixture
def jax_planned(lib, monkeypatch):
    """(jax, flashcore.jax._ffi_call) with the plans made as for a first GPU
    whose workspaces are JAX_FORWARD_WORKSPACE bytes (forward) and
    JAX_BACKWARD_WORKSPACE (backward), without one: flashcore.jax's plans,
    lowered for CUDA on the CPU. Skips without jax."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
    from flashcore.jax import _ffi_call

    class Sizes:
        def workspace_size(self, params):
            return JAX_FORWARD_WORKSPACE

        def backward_workspace_size(self, params):
            return JAX_BACKWARD_WORKSPACE

    monkeypatch.setattr(_ffi_call, "_gpu_ordinal", lambda: 0)
    monkeypatch.setattr(_ffi_call, "get_handle", lambda device: Sizes())
    return jax, _ffi_call


@pytest.fixture
def compiled_on_fake_gpu(fake_gpu, monkeypatch):
    """The compiled path configured with ctypes callbacks that queue to
    fake_gpu as "compiled" and "compiled backward"; skips where it is not
    built."""
    from flashcore import _attention, _ffi, _plan
    found = _plan.find()
    if not found:
        pytest.skip("flashcore._fastcall is not built")
    monkeypatch.setitem(_plan._handles, 0, fake_gpu)
    forward_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_ffi.flashcore_forward_params),
                                    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    backward_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_ffi.flashcore_backward_params),
                                     ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)

    @forward_type
    def compiled_forward(raw_handle, params, *unused):
        fake_gpu._forward("compiled", params.contents)
        return 0

    @backward_type
    def compiled_backward(raw_handle, params, workspace, workspace_bytes, stream):
        fake_gpu.backward_unchecked(params.contents, workspace, workspace_bytes, stream)
        fake_gpu.queued[-1] = ("compiled backward", fake_gpu.queued[-1][1])
        return 0

    module = _plan.load(_plan.torch_api(), _plan._kept_workspaces,
                            ctypes.cast(compiled_forward, ctypes.c_void_p).value,
                            ctypes.cast(compiled_backward, ctypes.c_void_p).value)
    # Set, not monkeypatched: monkeypatch's undo, after this teardown, would
    # give back a module loaded before, which is this one (there is one), still
    # configured with the fakes, whose trampolines are gone by then.
    _attention._fast = module
    yield fake_gpu
    module.clear()
    _attention._fast = None  # configured again, with the library's functions, by the next call
