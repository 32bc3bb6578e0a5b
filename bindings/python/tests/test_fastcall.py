"""The compiled call path (flashcore/_fastcall.c) on a machine without a GPU
or torch: configured with a stand-in tensor class and a recording
flashcore_forward (a ctypes callback), it must serve exactly the calls a
remembered plan describes, with the plan's params and this call's
addresses, and hand every other call back (None). Its results on a GPU are
tested beside the Python path's in test_gpu_torch.py."""

import ctypes

import pytest

import flashcore
from flashcore import _attention, _ffi, _plan


@pytest.fixture(scope="module")
def module(lib):
    found = _plan.find()
    if found is None:
        pytest.skip("flashcore._fastcall is not built (CMake found no Python headers, or FLASHCORE_FASTCALL=0); "
                    "the binding then runs every call in Python")
    return found


class Dtype:
    def __init__(self, name):
        self.name = name


FLOAT16, BFLOAT16, FLOAT32, FP8 = Dtype("float16"), Dtype("bfloat16"), Dtype("float32"), Dtype("float8_e4m3fn")
UINT8, INT32 = Dtype("uint8"), Dtype("int32")


class Tensor:
    """What the compiled path reads of a torch tensor."""

    next_address = 0x10000

    def __init__(self, shape, dtype=FLOAT16, strides=None, device=0, requires_grad=False):
        self.shape = tuple(shape)
        self.dtype = dtype
        self._strides = tuple(strides) if strides else _contiguous(shape)
        self._device = device
        self.requires_grad = requires_grad
        self.address = Tensor.next_address
        Tensor.next_address += 0x10000

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def data_ptr(self):
        return self.address


class SubTensor(Tensor):
    pass


class Parameter(Tensor):
    """Stands in for torch.nn.Parameter."""


def _contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


FORWARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_ffi.flashcore_forward_params),
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
BACKWARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_ffi.flashcore_backward_params),
                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class Backend:
    """configure()'s arguments, recording what call() does with them."""

    def __init__(self):
        self.grad = False
        self.capturing = False
        self.stream = 0x5000
        self.status = 0
        self.queued = []  # (params copy, workspace, workspace_bytes, stream, handle)
        self.allocated = []
        self.kept = {}
        self.forward = FORWARD(self._forward)  # kept alive as long as the backend
        self.backward = BACKWARD(self._backward)
        self.queued_backward = []  # (params copy, workspace, workspace_bytes, stream, handle)
        self.deterministic = False  # torch.are_deterministic_algorithms_enabled()

    def _forward(self, handle, params, workspace, workspace_bytes, stream):
        self.queued.append((_ffi.flashcore_forward_params.from_buffer_copy(params.contents), workspace or 0,
                            workspace_bytes, stream or 0, handle))
        return self.status

    def _backward(self, handle, params, workspace, workspace_bytes, stream):
        self.queued_backward.append((_ffi.flashcore_backward_params.from_buffer_copy(params.contents),
                                     workspace or 0, workspace_bytes, stream or 0, handle))
        return self.status

    def check(self, status):
        if status:
            raise flashcore.InvalidArgumentError("status %d" % status)

    def empty(self, shape, dtype, device):
        t = Tensor(shape, dtype=dtype, device=device)
        self.allocated.append(("empty", t))
        return t

    def empty_like(self, like):
        t = Tensor(like.shape, dtype=like.dtype, device=like.get_device())
        self.allocated.append(("empty_like", t))
        return t

    def configure(self, module, *parameter_type):
        module.configure(ctypes.cast(self.forward, ctypes.c_void_p).value, self.check, Tensor, lambda: self.grad,
                         self.empty, self.empty_like, lambda device: self.stream, lambda: self.capturing, self.kept,
                         *parameter_type)
        module.configure_backward(ctypes.cast(self.backward, ctypes.c_void_p).value, lambda: self.deterministic,
                                  UINT8)


@pytest.fixture
def backend(module):
    b = Backend()
    b.configure(module)
    yield b
    module.clear()
    if _attention._fast:  # the binding's own configuration, for the tests after this one
        _attention._fast = None


OPTIONS = (False, None, None, None, 0.0, 0, 0)  # causal, scale, num_splits, window, softcap, attention_chunk, sm_margin
HANDLE = 0xABC0


def template(**fields):
    params = _ffi.flashcore_forward_params()
    params.struct_size = ctypes.sizeof(params)
    params.seqlen_q = 7  # a field the plan sets and call() must keep
    for name, value in fields.items():
        setattr(params, name, value)
    return bytes(params)


def qkv(**kwargs):
    return Tensor((1, 8, 16, 64), **kwargs), Tensor((1, 2, 32, 64), **kwargs), Tensor((1, 2, 32, 64), **kwargs)


def remember(module, q, k, v, out=None, seqused_k=None, layout="bhsd", options=OPTIONS, return_lse=False,
             out_like_q=True, out_shape=None, lse_shape=None, workspace_bytes=0, device=0, params=None,
             descales=(None, None, None), sinks=None):
    return module.remember(q, k, v, out, seqused_k, *descales, sinks, layout, options, return_lse,
                           params if params is not None else template(), out_like_q, out_shape, FLOAT16, "cuda:0",
                           lse_shape, FLOAT32, workspace_bytes, object(), HANDLE, device)


def plain_call(module, q, k, v, options=OPTIONS, return_lse=False):
    """module.call of q, k and v alone (no out, seqused_k, descales or sinks), layout "bhsd"."""
    return module.call(q, k, v, None, None, None, None, None, None, "bhsd", options, return_lse)


def test_module_fits_the_ctypes_struct(module):
    size, offsets = module.params_layout()
    assert size == ctypes.sizeof(_ffi.flashcore_forward_params)
    assert set(offsets) >= {"q", "k", "v", "out", "lse", "seqused_k", "q_descale", "k_descale", "v_descale", "sinks"}
    assert _plan.fits_struct(module)


def test_a_remembered_call_is_queued_with_new_addresses(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v) is True
    q2, k2, v2 = qkv()
    out = plain_call(module, q2, k2, v2)
    assert [how for how, _ in backend.allocated] == ["empty_like"] and out is backend.allocated[0][1]
    (params, workspace, workspace_bytes, stream, handle), = backend.queued
    assert (params.q, params.k, params.v, params.out) == (q2.address, k2.address, v2.address, out.address)
    assert params.seqlen_q == 7 and params.struct_size == ctypes.sizeof(params)
    assert not params.lse and not params.seqused_k
    assert (workspace, workspace_bytes, stream, handle) == (0, 0, backend.stream, HANDLE)


def test_out_given_lse_and_seqused_k(module, backend):
    q, k, v = qkv()
    out, used = Tensor(q.shape), Tensor((1,), dtype=Dtype("int32"))
    assert remember(module, q, k, v, out=out, seqused_k=used, return_lse=True, lse_shape=(1, 8, 16))
    result = module.call(q, k, v, out, used, None, None, None, None, "bhsd", OPTIONS, True)
    assert type(result) is tuple and result[0] is out
    lse = result[1]
    assert [(how, t.shape, t.dtype) for how, t in backend.allocated] == [("empty", (1, 8, 16), FLOAT32)]
    (params, *_), = backend.queued
    assert (params.out, params.lse, params.seqused_k) == (out.address, lse.address, used.address)


def test_descales_of_quantized_kv_are_queued_with_their_addresses(module, backend):
    # fp8 K/V (kv_dtype in the plan's template) with per-tensor k_descale
    # and per-(batch, head) v_descale: each call's own descale tensors.
    q = Tensor((2, 8, 16, 64))
    k, v = Tensor((2, 2, 32, 64), dtype=FP8), Tensor((2, 2, 32, 64), dtype=FP8)
    k_scale, v_scale = Tensor((), dtype=FLOAT32), Tensor((2, 2), dtype=FLOAT32, strides=(0, 1))
    fp8 = template(kv_dtype=int(_ffi.Dtype.FP8_E4M3), k_descale=0x40, v_descale=0x80, v_descale_head_stride=1)
    assert remember(module, q, k, v, params=fp8, descales=(None, k_scale, v_scale))
    for _ in range(2):
        k_scale, v_scale = Tensor((), dtype=FLOAT32), Tensor((2, 2), dtype=FLOAT32, strides=(0, 1))
        assert module.call(q, k, v, None, None, None, k_scale, v_scale, None, "bhsd", OPTIONS, False) is not None
        params = backend.queued[-1][0]
        assert (params.k_descale, params.v_descale, params.q_descale) == (k_scale.address, v_scale.address, None)
        assert (params.kv_dtype, params.v_descale_batch_stride, params.v_descale_head_stride) == (4, 0, 1)
    # Descales of other strides, or none, are another plan's.
    contiguous = Tensor((2, 2), dtype=FLOAT32)
    assert module.call(q, k, v, None, None, None, k_scale, contiguous, None, "bhsd", OPTIONS, False) is None
    assert module.call(q, k, v, None, None, None, k_scale, None, None, "bhsd", OPTIONS, False) is None
    assert len(backend.queued) == 2


def test_sinks_and_attention_chunk_are_queued_with_the_plan(module, backend):
    # The sinks (float32 [Hq]) are an array of the plan, queued at each
    # call's own address; attention_chunk an option the plan matches (its
    # value is the template's).
    q, k, v = qkv()
    options = (True, None, None, None, 0.0, 128, 0)
    params = template(attention_chunk=128, sinks=0x40)
    assert remember(module, q, k, v, options=options, params=params, sinks=Tensor((8,), dtype=FLOAT32))
    for _ in range(2):
        sinks = Tensor((8,), dtype=FLOAT32)
        assert module.call(q, k, v, None, None, None, None, None, sinks, "bhsd", options, False) is not None
        queued = backend.queued[-1][0]
        assert (queued.sinks, queued.attention_chunk) == (sinks.address, 128)
    # Without sinks, or with sinks of another shape, or another chunk: other plans'.
    assert module.call(q, k, v, None, None, None, None, None, None, "bhsd", options, False) is None
    assert module.call(q, k, v, None, None, None, None, None, Tensor((4,), dtype=FLOAT32), "bhsd", options,
                       False) is None
    assert module.call(q, k, v, None, None, None, None, None, Tensor((8,), dtype=FLOAT32), "bhsd",
                       options[:5] + (256, 0), False) is None
    assert len(backend.queued) == 2


def test_sm_margin_is_an_option_the_plan_matches(module, backend):
    # Its value is the template's (it changes the plan: the split count and
    # the persistent grid); another sm_margin is another plan's.
    q, k, v = qkv()
    options = OPTIONS[:6] + (16,)
    assert remember(module, q, k, v, options=options, params=template(sm_margin=16))
    for _ in range(2):
        assert plain_call(module, q, k, v, options) is not None
        assert backend.queued[-1][0].sm_margin == 16
    assert plain_call(module, q, k, v) is None
    assert plain_call(module, q, k, v, OPTIONS[:6] + (8,)) is None
    assert len(backend.queued) == 2


def test_parameters_are_read_as_tensors_and_other_subclasses_are_not(module, backend):
    # nn.Parameter (learnable sinks are one) where configure() names it.
    q, k, v = qkv()
    sinks = Parameter((8,), dtype=FLOAT32)
    assert remember(module, q, k, v, sinks=sinks) is False, "no Parameter type configured"
    backend.configure(module, Parameter)
    assert remember(module, q, k, v, sinks=sinks) is True
    assert module.call(q, k, v, None, None, None, None, None, Parameter((8,), dtype=FLOAT32), "bhsd", OPTIONS,
                       False) is not None
    assert module.call(q, k, v, None, None, None, None, None, SubTensor((8,), dtype=FLOAT32), "bhsd", OPTIONS,
                       False) is None
    assert len(backend.queued) == 1
    arrays = backward_arrays()
    assert remember_backward(module, arrays, sinks=(0, sinks, True))
    assert backward_call(module, arrays, sinks=(0, Parameter((8,), dtype=FLOAT32), True)) is not None
    assert backward_call(module, arrays, sinks=(0, SubTensor((8,), dtype=FLOAT32), True)) is None


def test_sinks_that_require_grad_are_left_to_the_python_path(module, backend):
    q, k, v = qkv()
    sinks = Tensor((8,), dtype=FLOAT32, requires_grad=True)
    assert remember(module, q, k, v, sinks=sinks)
    call = lambda: module.call(q, k, v, None, None, None, None, None, sinks, "bhsd", OPTIONS, False)
    assert call() is not None, "grad mode is off"
    backend.grad = True
    assert call() is None, "the Python path differentiates (an nn.Parameter's gradient)"
    sinks.requires_grad = False
    assert call() is not None
    assert len(backend.queued) == 2


def test_return_lse_without_an_lse_plan_gives_none(module, backend):
    # As the Python path's (out, lse): a plan that returns no lse array.
    q, k, v = qkv()
    assert remember(module, q, k, v, return_lse=True)
    result = plain_call(module, q, k, v, return_lse=True)
    assert type(result) is tuple and result[1] is None and result[0] is backend.allocated[0][1]


def test_out_of_another_shape_is_allocated_with_empty(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v, out_like_q=False, out_shape=(1, 8, 16, 32))
    out = plain_call(module, q, k, v)
    assert [(how, t.shape, t.dtype) for how, t in backend.allocated] == [("empty", (1, 8, 16, 32), FLOAT16)]
    assert backend.queued[0][0].out == out.address


def test_workspace_is_the_kept_one_or_the_python_paths(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v, workspace_bytes=4096)
    assert plain_call(module, q, k, v) is None, "no kept workspace yet"
    backend.kept[(0, backend.stream)] = (object(), 2048, 0x9000)
    assert plain_call(module, q, k, v) is None, "the kept one is too small"
    backend.kept[(0, backend.stream)] = (object(), 8192, 0x9000)
    backend.capturing = True
    assert plain_call(module, q, k, v) is None, "captured calls allocate their own"
    backend.capturing = False
    assert plain_call(module, q, k, v) is not None
    assert [(w, n) for _, w, n, _, _ in backend.queued] == [(0x9000, 4096)]
    assert len(backend.allocated) == 1, "out was allocated before a miss"


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "device", "subclass", "layout", "causal", "scale",
                                    "scale_type", "num_splits", "window", "window_type", "softcap", "softcap_type",
                                    "attention_chunk", "attention_chunk_type", "sm_margin", "sm_margin_type",
                                    "return_lse", "out_given", "seqused_k", "an_extra_option", "six_options", "fp8_kv",
                                    "k_descale", "q_descale", "sinks"])
def test_anything_else_is_handed_back(module, backend, change):
    q, k, v = qkv()
    assert remember(module, q, k, v)
    args = [q, k, v, None, None, None, None, None, None, "bhsd", OPTIONS, False]
    options = list(OPTIONS)
    if change == "shape":
        args[1] = Tensor((1, 2, 33, 64))
    elif change == "stride":
        args[0] = Tensor(q.shape, strides=(8 * 16 * 64, 64, 8 * 64, 1))
    elif change == "dtype":
        args[2] = Tensor(v.shape, dtype=BFLOAT16)
    elif change == "device":
        args[1] = Tensor(k.shape, device=1)
    elif change == "subclass":
        args[0] = SubTensor(q.shape)
    elif change == "layout":
        args[9] = "bshd"
    elif change == "causal":
        options[0] = True
    elif change == "scale":
        options[1] = 0.5
    elif change == "scale_type":
        remember(module, q, k, v, options=(False, 1.0, None, None, 0.0, 0, 0))
        options[1] = 1  # equal to 1.0, but only exact floats are served
    elif change == "num_splits":
        options[2] = 2
    elif change == "window":
        options[3] = (4, 0)
    elif change == "window_type":
        remember(module, q, k, v, options=(False, None, None, (4, 0), 0.0, 0, 0))
        options[3] = [4, 0]
    elif change == "softcap":
        options[4] = 30.0
    elif change == "softcap_type":
        options[4] = 0
    elif change == "attention_chunk":
        options[5] = 64
    elif change == "attention_chunk_type":
        remember(module, q, k, v, options=(False, None, None, None, 0.0, 1, 0))
        options[5] = True  # equal to 1, but only exact ints are served
    elif change == "sm_margin":
        options[6] = 16
    elif change == "sm_margin_type":
        remember(module, q, k, v, options=(False, None, None, None, 0.0, 0, 1))
        options[6] = True  # equal to 1, but only exact ints are served
    elif change == "return_lse":
        args[11] = True
    elif change == "out_given":
        args[3] = Tensor(q.shape)
    elif change == "seqused_k":
        args[4] = Tensor((1,))
    elif change == "an_extra_option":
        options.append(None)
    elif change == "six_options":  # as before sm_margin
        options.pop()
    elif change == "fp8_kv":
        args[1], args[2] = Tensor(k.shape, dtype=FP8), Tensor(v.shape, dtype=FP8)
    elif change == "k_descale":
        args[6] = Tensor((), dtype=FLOAT32)
    elif change == "q_descale":
        args[5] = Tensor((), dtype=FLOAT32)
    elif change == "sinks":
        args[8] = Tensor((8,), dtype=FLOAT32)
    args[10] = tuple(options)
    assert module.call(*args) is None
    assert not backend.queued and not backend.allocated


@pytest.mark.parametrize("scale", [0.0, -0.0, 1e-50, -1e-50, 2.0**-150, 1e39, float("inf"), float("nan"), -1.0],
                         ids=repr)
def test_scales_the_python_path_refuses_are_never_served(module, backend, scale):
    # Only a scale > 0 as a float32 is served, whatever plan was kept: -0.0
    # compares equal to a plan's 0.0, and a plan of a refused scale would
    # serve it. (Before: the plan was kept and the call served.)
    q, k, v = qkv()
    options = (False, scale, None, None, 0.0, 0, 0)
    assert remember(module, q, k, v, options=options) is False
    assert plain_call(module, q, k, v, options) is None
    if scale == 0:
        assert remember(module, q, k, v, options=(False, 0.0 if str(scale)[0] == "-" else -0.0, None, None, 0.0,
                                                  0, 0)) is False
        assert plain_call(module, q, k, v, options) is None
    assert not backend.queued and not backend.allocated
    for good in (2.0**-149, 0.125, 2e38):
        options = (False, good, None, None, 0.0, 0, 0)
        assert remember(module, q, k, v, options=options) is True
        assert plain_call(module, q, k, v, options) is not None
    assert len(backend.queued) == 3


def test_grad_is_left_to_the_python_path(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v)
    k.requires_grad = True
    assert plain_call(module, q, k, v) is not None, "grad mode is off"
    backend.grad = True
    assert plain_call(module, q, k, v) is None, "the Python path refuses or detaches"
    k.requires_grad = False
    assert plain_call(module, q, k, v) is not None
    assert len(backend.queued) == 2


def test_a_failed_status_raises_the_binding_error(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v)
    backend.status = 3
    with pytest.raises(flashcore.InvalidArgumentError, match="status 3"):
        plain_call(module, q, k, v)


def test_remembering_again_replaces_the_plan(module, backend):
    q, k, v = qkv()
    assert remember(module, q, k, v, params=template(seqlen_q=7))
    assert remember(module, q, k, v, params=template(seqlen_q=9))
    plain_call(module, q, k, v)
    assert backend.queued[0][0].seqlen_q == 9


def test_plans_are_kept_up_to_a_limit(module, backend):
    shapes = [(1, 2, n, 64) for n in range(1, 40)]
    for s in shapes:
        assert remember(module, Tensor(s), Tensor(s), Tensor(s))
    served = [plain_call(module, Tensor(s), Tensor(s), Tensor(s)) is not None
              for s in shapes]
    assert served[-1] and not served[0], "the oldest plans make way for new ones"


def test_calls_it_does_not_serve_are_not_remembered(module, backend):
    q, k, v = qkv()
    assert remember(module, SubTensor(q.shape), k, v) is False
    assert remember(module, q, k, v, layout=1) is False
    with pytest.raises(ValueError, match="flashcore_forward_params"):
        remember(module, q, k, v, params=b"short")


def test_disabled_by_the_environment(module, monkeypatch):
    monkeypatch.setenv(_plan.DISABLE_ENV, "0")
    assert _plan.find() is None


# --------------------------------------------------------------------------
# The backward pass (issue 58): backward() serves flashcore::backward's
# dense calls that a remembered plan describes.
# --------------------------------------------------------------------------

BACKWARD_WORKSPACE = 4 * 8 * 16 * 64  # the fp32 dQ accumulator of qkv()'s q


def backward_template(**fields):
    params = _ffi.flashcore_backward_params()
    params.struct_size = ctypes.sizeof(params)
    params.seqlen_q = 7  # a field the plan sets and backward() must keep
    for name, value in fields.items():
        setattr(params, name, value)
    return bytes(params)


def backward_arrays(q=None, k=None, v=None, dout=None):
    """(dout, q, k, v, out, lse) of qkv()'s shapes."""
    if q is None:
        q, k, v = qkv()
    return (dout or Tensor(q.shape), q, k, v, Tensor(q.shape), Tensor((1, 8, 16), dtype=FLOAT32))


BACKWARD_OPTIONS = ("bhsd", True, None, None, 0.0, False)  # layout, causal, scale, window, softcap, deterministic
NO_SINKS = (0, None, False)  # attention_chunk, sinks, compute_dsinks


def backward_call(module, arrays, seqused_k=None, packed=(None, None, None, None), options=BACKWARD_OPTIONS,
                  sinks=NO_SINKS, sm_margin=0):
    return module.backward(*arrays, seqused_k, *packed, *options, *sinks, sm_margin)


def remember_backward(module, arrays, seqused_k=None, packed=(None, None, None, None), options=BACKWARD_OPTIONS,
                      params=None, workspace_bytes=BACKWARD_WORKSPACE, sinks=NO_SINKS, sm_margin=0):
    return module.remember_backward(*arrays, seqused_k, *packed, *options, *sinks, sm_margin,
                                    params if params is not None else backward_template(), workspace_bytes, "cuda:0",
                                    object(), HANDLE, 0)


def test_module_fits_the_backward_struct(module):
    size, offsets = module.backward_params_layout()
    assert size == ctypes.sizeof(_ffi.flashcore_backward_params)
    assert set(offsets) >= {"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", "seqused_k", "sinks", "dsinks"}
    assert _plan.fits_backward_struct(module)


def test_a_remembered_backward_is_queued_with_new_addresses(module, backend):
    assert remember_backward(module, backward_arrays()) is True
    arrays = backward_arrays()
    dq, dk, dv, dsinks = backward_call(module, arrays)
    assert dsinks is None
    allocated = [(how, t.shape, t.dtype) for how, t in backend.allocated]
    assert allocated == [("empty_like", (1, 8, 16, 64), FLOAT16), ("empty_like", (1, 2, 32, 64), FLOAT16),
                         ("empty_like", (1, 2, 32, 64), FLOAT16), ("empty", (BACKWARD_WORKSPACE,), UINT8)]
    assert [t for _, t in backend.allocated[:3]] == [dq, dk, dv]
    workspace = backend.allocated[3][1]
    (params, ws, ws_bytes, stream, handle), = backend.queued_backward
    dout, q, k, v, out, lse = arrays
    assert (params.dout, params.q, params.k, params.v, params.out, params.lse) == tuple(a.address for a in arrays)
    assert (params.dq, params.dk, params.dv) == (dq.address, dk.address, dv.address)
    assert params.seqlen_q == 7 and not params.seqused_k and not params.sinks and not params.dsinks
    assert (ws, ws_bytes, stream, handle) == (workspace.address, BACKWARD_WORKSPACE, backend.stream, HANDLE)
    assert not backend.queued, "the forward's callback is not the backward's"


def test_a_backward_with_sinks_gives_their_gradient_where_asked(module, backend):
    sinks = Tensor((8,), dtype=FLOAT32)
    wanted = (128, sinks, True)
    assert remember_backward(module, backward_arrays(), sinks=wanted, workspace_bytes=0,
                             params=backward_template(attention_chunk=128))
    for _ in range(2):
        backend.allocated.clear()
        sinks = Tensor((8,), dtype=FLOAT32)
        dq, dk, dv, dsinks = backward_call(module, backward_arrays(), sinks=(128, sinks, True))
        # dsinks is torch.empty_like(sinks): float32 [Hq], as the plan's sinks were.
        assert backend.allocated[-1] == ("empty_like", dsinks) and (dsinks.shape, dsinks.dtype) == ((8,), FLOAT32)
        params = backend.queued_backward[-1][0]
        assert (params.sinks, params.dsinks, params.attention_chunk) == (sinks.address, dsinks.address, 128)
    # Without compute_dsinks (sinks that need no gradient) it is another plan's;
    # once remembered, sinks are queued and no dsinks is made.
    assert backward_call(module, backward_arrays(), sinks=(128, sinks, False)) is None
    assert remember_backward(module, backward_arrays(), sinks=(128, sinks, False), workspace_bytes=0)
    backend.allocated.clear()
    *_, dsinks = backward_call(module, backward_arrays(), sinks=(128, sinks, False))
    assert dsinks is None and len(backend.allocated) == 3
    assert (backend.queued_backward[-1][0].sinks, backend.queued_backward[-1][0].dsinks) == (sinks.address, None)
    # compute_dsinks without sinks is the Python path's to refuse; another chunk is another plan's.
    assert backward_call(module, backward_arrays(), sinks=(128, None, True)) is None
    assert backward_call(module, backward_arrays(), sinks=(64, sinks, True)) is None
    assert backward_call(module, backward_arrays(), sinks=(128, Tensor((4,), dtype=FLOAT32), True)) is None
    assert len(backend.queued_backward) == 3


def test_a_backward_s_sm_margin_is_matched_with_the_plan(module, backend):
    assert remember_backward(module, backward_arrays(), params=backward_template(sm_margin=16), sm_margin=16)
    assert backward_call(module, backward_arrays(), sm_margin=16) is not None
    assert backend.queued_backward[-1][0].sm_margin == 16
    # Another one, or one of another type that compares equal, is another plan's.
    assert backward_call(module, backward_arrays()) is None
    assert backward_call(module, backward_arrays(), sm_margin=8) is None
    assert remember_backward(module, backward_arrays(), params=backward_template(sm_margin=1), sm_margin=1)
    assert backward_call(module, backward_arrays(), sm_margin=True) is None
    assert len(backend.queued_backward) == 1


def test_backward_with_seqused_k_and_no_workspace(module, backend):
    used = Tensor((1,), dtype=INT32)
    assert remember_backward(module, backward_arrays(), seqused_k=used, workspace_bytes=0)
    assert backward_call(module, backward_arrays()) is None, "seqused_k is part of the plan"
    other = Tensor((1,), dtype=INT32)
    assert backward_call(module, backward_arrays(), seqused_k=other) is not None
    (params, ws, ws_bytes, _, _), = backend.queued_backward
    assert params.seqused_k == other.address and (ws, ws_bytes) == (0, 0)
    assert [how for how, _ in backend.allocated] == ["empty_like"] * 3


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "device", "subclass", "layout", "causal",
                                    "causal_type", "scale", "scale_type", "window", "window_type", "softcap",
                                    "softcap_type", "deterministic", "torch_deterministic", "cu_seqlens",
                                    "max_seqlen", "misaligned_dout"])
def test_anything_else_is_handed_back_by_backward(module, backend, change):
    options = ("bhsd", True, 0.125, [8, 0], 5.0, False)
    assert remember_backward(module, backward_arrays(), options=options)
    arrays, packed = list(backward_arrays()), [None, None, None, None]
    layout, causal, scale, window, softcap, deterministic = options
    if change == "shape":
        arrays[4] = Tensor((1, 8, 16, 32))
    elif change == "stride":
        arrays[0] = Tensor((1, 8, 16, 64), strides=(8192, 64, 512, 1))
    elif change == "dtype":
        arrays[1] = Tensor((1, 8, 16, 64), dtype=BFLOAT16)
    elif change == "device":
        arrays[2] = Tensor((1, 2, 32, 64), device=1)
    elif change == "subclass":
        arrays[3] = SubTensor((1, 2, 32, 64))
    elif change == "layout":
        layout = "bshd"
    elif change == "causal":
        causal = False
    elif change == "causal_type":
        causal = 1
    elif change == "scale":
        scale = 0.25
    elif change == "scale_type":
        scale = 1
    elif change == "window":
        window = [8, 1]
    elif change == "window_type":
        window = [8.0, 0]
    elif change == "softcap":
        softcap = 6.0
    elif change == "softcap_type":
        softcap = 5
    elif change == "deterministic":
        deterministic = True
    elif change == "torch_deterministic":
        backend.deterministic = True
    elif change == "cu_seqlens":
        packed[0] = Tensor((2,), dtype=INT32)
    elif change == "max_seqlen":
        packed[2] = 16
    elif change == "misaligned_dout":
        arrays[0].address += 8
    assert backward_call(module, arrays, packed=packed,
                         options=(layout, causal, scale, window, softcap, deterministic)) is None
    assert not backend.queued_backward and not backend.allocated
    backend.deterministic = False
    # The same call as remembered is served (the window as a tuple too).
    assert backward_call(module, backward_arrays(), options=("bhsd", True, 0.125, (8, 0), 5.0, False)) is not None


def test_torch_deterministic_flag_serves_a_deterministic_plan(module, backend):
    assert remember_backward(module, backward_arrays(), options=BACKWARD_OPTIONS[:5] + (True,))
    assert backward_call(module, backward_arrays()) is None
    backend.deterministic = True
    assert backward_call(module, backward_arrays()) is not None


def test_a_failed_backward_status_raises_and_allocates_nothing_lasting(module, backend):
    assert remember_backward(module, backward_arrays())
    backend.status = 3
    with pytest.raises(flashcore.InvalidArgumentError, match="status 3"):
        backward_call(module, backward_arrays())


def test_backward_calls_it_does_not_serve_are_not_remembered(module, backend):
    packed = (Tensor((2,), dtype=INT32), Tensor((2,), dtype=INT32), 16, 32)
    assert remember_backward(module, backward_arrays(), packed=packed) is False
    with pytest.raises(ValueError, match="flashcore_backward_params"):
        remember_backward(module, backward_arrays(), params=b"short")
    with pytest.raises(TypeError, match="backward\\(\\) takes 21 arguments"):
        module.backward(*backward_arrays())


def test_clear_forgets_backward_plans(module, backend):
    assert remember_backward(module, backward_arrays())
    module.clear()
    assert backward_call(module, backward_arrays()) is None
