"""Helpers shared by the flashcore Python tests."""

import ctypes
import os

import pytest

import flashcore
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


def raises_from_library(lib, cls, call):
    """The error `call` raises, of class `cls`, checked to carry the
    library's status and its own message, still current on this thread."""
    with pytest.raises(cls) as info:
        call()
    assert info.value.status == cls.status_code
    assert info.value.message and info.value.message == lib.cdll.flashcore_last_error_message().decode()
    return info.value


def assert_one_graph(torch, fn, *args):
    """Asserts that torch.compile would trace fn(*args) as one graph with no
    breaks (torch._dynamo.explain), leaving dynamo's caches reset for the
    compile that follows."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    torch._dynamo.reset()


def recording_backend(graphs):
    """A torch.compile backend (AOT autograd, the graphs run as they are)
    that appends to `graphs` the set of flashcore operators each graph it
    is given calls, the forward's then the backward's."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def record(gm, inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if "flashcore" in str(n.target)})
        return make_boxed_func(gm.forward)

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=record, bw_compiler=record)

    return backend


def cuda_randn(torch, shape, dtype, seed):
    """Seeded standard-normal values on the GPU, drawn in float32 and cast
    to `dtype` (a torch dtype's name)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(getattr(torch, dtype))


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


def fake_qkv(b=2, hq=8, hkv=2, sq=100, sk=120, d=64, dv=None, cls=FakeCudaArray, **kwargs):
    """Fake contiguous [B, H, S, D] q, k and [B, H, S, Dv] v, out (Dv = D
    unless given; kwargs go to cls)."""
    dv = d if dv is None else dv
    return (cls((b, hq, sq, d), index=0, **kwargs), cls((b, hkv, sk, d), index=1, **kwargs),
            cls((b, hkv, sk, dv), index=2, **kwargs), cls((b, hq, sq, dv), index=3, **kwargs))


def fake_varlen(b=3, hq=8, hkv=2, total_q=100, total_k=120, d=64, dv=None):
    """Fake packed q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k,
    Hkv, Dv], out [total_q, Hq, Dv] and int32 cu_seqlens_q/_k of B + 1
    entries (indices 0-3, 5 and 6)."""
    dv = d if dv is None else dv
    return (FakeCudaArray((total_q, hq, d), index=0), FakeCudaArray((total_k, hkv, d), index=1),
            FakeCudaArray((total_k, hkv, dv), index=2), FakeCudaArray((total_q, hq, dv), index=3),
            FakeCudaArray((b + 1,), typestr="<i4", index=5), FakeCudaArray((b + 1,), typestr="<i4", index=6))


def fake_paged(b=3, hq=8, hkv=2, sq=4, num_pages=40, page_size=16, max_pages=10, d=128):
    """Fake q [B, Sq, Hq, D], page pools k, v [num_pages, page_size, Hkv,
    D], out, and an int32 block_table [B, max_pages] (indices 0-3 and 7)."""
    return (FakeCudaArray((b, sq, hq, d), index=0), FakeCudaArray((num_pages, page_size, hkv, d), index=1),
            FakeCudaArray((num_pages, page_size, hkv, d), index=2), FakeCudaArray((b, sq, hq, d), index=3),
            FakeCudaArray((b, max_pages), typestr="<i4", index=7))


# The default build's pairs: what the GPU tests are parametrized over when
# the library cannot be loaded (they skip then anyway).
DEFAULT_HEAD_DIMS = [(32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256), (512, 512), (576, 512)]
# DeepSeek MLA's latent-cache kernel: it takes v only as k's view (v = k[..., :512]), so the tests that pass
# a v of its own leave it out (test_gpu_torch.py's test_mla_latent_cache runs it).
LATENT_HEAD_DIMS = [(576, 512)]
# The backward's kernels stop at head dim 512 (MLA's 576 has the forward only).
MAX_BACKWARD_HEAD_DIM = 512
# Past head dim 256 the backward's tiles need this much shared memory per
# block (kernels/bwd/sm80/config.cuh): not on sm_86 and sm_89 (99 KiB), where
# the call is refused.
MAX_SM86_BACKWARD_HEAD_DIM = 256  # the largest whose backward fits 99 KiB per block
WIDE_BACKWARD_SMEM_PER_BLOCK = 135424


def need_backward_smem(torch, d):
    """Skips a backward test at head dim d where this GPU's blocks cannot
    have the shared memory its kernel needs (head dims past 256 on sm_86 and
    sm_89)."""
    if d <= MAX_SM86_BACKWARD_HEAD_DIM:
        return
    optin = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin
    if optin < WIDE_BACKWARD_SMEM_PER_BLOCK:
        pytest.skip("the backward at head dim %d needs %d bytes of shared memory per block; this GPU allows %d"
                    % (d, WIDE_BACKWARD_SMEM_PER_BLOCK, optin))
# Dims with no kernel of their own in the default build, run on the next
# larger one, and the DeepSeek-style pair.
EXTRA_HEAD_DIMS = [(80, 80), (112, 112), (160, 160), (192, 128)]


def gpu_head_dims():
    """(head_dim, head_dim_v) pairs for the GPU tests: every pair this build
    lists but the latent cache's (LATENT_HEAD_DIMS), the rounding-up dims and
    (192, 128)."""
    try:
        listed = flashcore.supported_head_dims()
    except flashcore.FlashcoreError:  # LibraryError included
        listed = DEFAULT_HEAD_DIMS
    return sorted((set(listed) - set(LATENT_HEAD_DIMS)) | set(EXTRA_HEAD_DIMS))


def head_dim_id(pair):
    d, dv = pair
    return "d%d" % d if d == dv else "d%d-%d" % (d, dv)


def covering_pair(supported, head_dim, head_dim_v):
    """The (head_dim, head_dim_v) kernel pair a call runs on, by the rule of
    flashcore_supported_head_dims: the first listed pair with both dims at
    least the call's; None when none covers it."""
    return next(((d, dv) for d, dv in supported if d >= head_dim and dv >= head_dim_v), None)


# The workspace sizes conftest's jax_planned plans flashcore.jax's calls with
# (forward, backward), as a first GPU without one would give them.
JAX_FORWARD_WORKSPACE, JAX_BACKWARD_WORKSPACE = 1024, 4096


class RecordingHandle:
    """Stands in for get_handle()'s Handle: needs no workspace, keeps a copy
    of each params struct it is asked to queue."""

    def __init__(self):
        self.queued = []

    def workspace_size(self, params):
        return 0

    def forward(self, params, workspace, workspace_bytes, stream):
        self.queued.append(type(params).from_buffer_copy(params))


def need_head_dim(d):
    """Skips unless this build runs head_dim d (most tests assume the
    default build, which runs every head dim; these also run on a build for
    fewer, -DFLASHCORE_HEAD_DIMS)."""
    if covering_pair(flashcore.supported_head_dims(), d, d) is None:
        pytest.skip("this build has no kernel covering head_dim %d: %s" % (d, flashcore.supported_head_dims()))



class FakeGpuHandle:
    """Stands in for a GPU's Handle for torch CPU tensors described as device
    0's (the fake_gpu fixture): queued holds (path, params copy) for each
    call, path "launch" (Handle.forward), "launch_plain"
    (forward_unchecked) or "backward". The forward writes zeros to out and
    lse, the backward FILL_DQ, FILL_DK and FILL_DV to every element of dq,
    dk and dv (all dense, as the binding allocates them), and FILL_DSINKS
    to dsinks where it is asked for, so that a test sees which gradient
    went where."""

    value = 1
    FILL_DQ, FILL_DK, FILL_DV, FILL_DSINKS = 1.0, 2.0, 3.0, 4.0

    def __init__(self, torch):
        self.torch = torch
        self.queued = []
        self.workspaces = []  # (address, bytes) each backward call was given

    def workspace_size(self, params):
        return 0

    def backward_workspace_size(self, params):
        return 4 * params.num_heads_q * params.head_dim * self._rows_q(params)

    @staticmethod
    def _rows_q(params):
        return params.total_seqlen_q if params.cu_seqlens_q else params.batch_size * params.seqlen_q

    @staticmethod
    def _rows_k(params):
        return params.total_seqlen_k if params.cu_seqlens_k else params.batch_size * params.seqlen_k

    def _fill(self, address, count, dtype_code, value):
        torch = self.torch
        dtype = torch.float16 if dtype_code == flashcore.Dtype.FP16 else torch.bfloat16
        bits = torch.tensor(value, dtype=dtype).view(torch.int16).item() & 0xFFFF
        (ctypes.c_uint16 * count).from_address(address)[:] = [bits] * count

    def _forward(self, path, params):
        self.queued.append((path, type(params).from_buffer_copy(params)))
        rows = self._rows_q(params)
        ctypes.memset(params.out, 0, 2 * rows * params.num_heads_q * (params.head_dim_v or params.head_dim))
        if params.lse:
            ctypes.memset(params.lse, 0, 4 * rows * params.num_heads_q)

    def forward(self, params, *unused):
        self._forward("launch", params)

    def forward_unchecked(self, params, *unused):
        self._forward("launch_plain", params)

    def backward_unchecked(self, params, workspace, workspace_bytes, stream):
        self.queued.append(("backward", flashcore.BackwardParams.from_buffer_copy(params)))
        self.workspaces.append((workspace, workspace_bytes))
        rows_q, rows_k = self._rows_q(params), self._rows_k(params)
        dv = params.head_dim_v or params.head_dim
        self._fill(params.dq, rows_q * params.num_heads_q * params.head_dim, params.dtype, self.FILL_DQ)
        self._fill(params.dk, rows_k * params.num_heads_kv * params.head_dim, params.dtype, self.FILL_DK)
        self._fill(params.dv, rows_k * params.num_heads_kv * dv, params.dtype, self.FILL_DV)
        if params.dsinks:
            heads = params.num_heads_q
            (ctypes.c_float * heads).from_address(params.dsinks)[:] = [self.FILL_DSINKS] * heads

    def backward_params(self):
        return [params for path, params in self.queued if path == "backward"]
