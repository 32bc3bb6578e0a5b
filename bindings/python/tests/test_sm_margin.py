"""sm_margin (issue 65: SMs a call leaves to kernels on other streams, as
FlashAttention 3's sm_margin), without a GPU: what the params structs
carry from every entry point, forward and backward; that it is part of
each plan's key (a call differing only in sm_margin is planned anew, not
served the other's params); what the binding refuses (its conversion to
an int32) and what it leaves to the library (>= 0 at the check, leaving
an SM at planning, which an emulated GPU's handle answers:
FLASHCORE_TEST_EMULATE_GPU); the autograd wiring on the fake GPU, eagerly,
through the operators, traced and on the compiled path (the backward
leaves the forward's SMs); and flashcore.jax's plans. That the results do
not change is test_gpu_backward.py's."""

import ctypes

import pytest

import flashcore
from flashcore import _backward, _plan
from fc_testing import (FakeCudaArray, assert_one_graph, fake_ptr, fake_qkv, fake_varlen, raises_from_library,
                        recording_backend)
from test_backward import fake_backward_arrays, filled, tensors
from test_sinks_and_chunks import _bshd, fake_sinks

HQ = 8  # fake_qkv's and fake_backward_arrays' query heads
# The emulated GPU's SMs (src/handle.cpp's table: an H100 SXM has 132).
H100_SMS = 132


# --------------------------------------------------------------------------
# The params structs
# --------------------------------------------------------------------------


def test_sm_margin_defaults_to_0(lib):
    assert (lib.new_params().sm_margin, lib.new_backward_params().sm_margin) == (0, 0)
    assert flashcore.forward_params(*fake_qkv()).sm_margin == 0
    assert flashcore.backward_params(*fake_backward_arrays()).sm_margin == 0


def test_params_carry_sm_margin(lib):
    p = flashcore.forward_params(*fake_qkv(), causal=True, attention_chunk=64, sm_margin=16)
    flashcore.check_params(p)
    assert (p.sm_margin, p.attention_chunk, p.causal) == (16, 64, 1)
    b = flashcore.backward_params(*fake_backward_arrays(), causal=True, deterministic=True, sm_margin=16)
    flashcore.check_backward_params(b)
    assert (b.sm_margin, b.deterministic, b.causal) == (16, 1, 1)


@pytest.mark.parametrize("api", ["attention", "attention_varlen", "attention_with_kvcache"])
def test_every_entry_point_queues_sm_margin(queued, api):
    if api == "attention":
        q, k, v, out = fake_qkv()
        flashcore.attention(q, k, v, out=out, causal=True, sm_margin=16)
    elif api == "attention_varlen":
        q, k, v, out, cu_q, cu_k = fake_varlen()
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 40, 50, out=out, causal=True, sm_margin=16)
    else:
        q, k, v, out = _bshd(sq=1)
        lengths = FakeCudaArray((2,), typestr="<i4", index=5)
        flashcore.attention_with_kvcache(q, k, v, lengths, out=out, causal=True, sm_margin=16, sinks=fake_sinks())
    (p,) = queued
    assert (p.sm_margin, p.causal) == (16, 1)


# --------------------------------------------------------------------------
# The plans' keys
# --------------------------------------------------------------------------


def test_sm_margin_is_part_of_the_forward_plan_s_key(queued, monkeypatch):
    monkeypatch.setattr(_plan, "_plans", {})
    q, k, v, out = fake_qkv()
    for margin in (16, 0, 16, 8, 0):
        flashcore.attention(q, k, v, out=out, sm_margin=margin)
    assert [p.sm_margin for p in queued] == [16, 0, 16, 8, 0]
    assert len(_plan._plans) == 3, "one plan per sm_margin"
    arrays = (q, k, v, out) + (None,) * 9
    keys = {}
    for margin in (0, 8, 16):
        key, plan, _, _ = _plan.plan_of(arrays, "bhsd", (False, None, None, None, 0.0, 0, margin), False, None,
                                        None, None)
        assert flashcore.ForwardParams.from_buffer_copy(plan.template).sm_margin == margin
        keys[margin] = key
    assert len(set(keys.values())) == 3


def test_sm_margin_is_part_of_the_backward_plan_s_key(lib):
    arrays = tuple(fake_backward_arrays()) + (None,) * 5
    keys = [_plan.backward_key(arrays, "bhsd", (True, None, None, 0.0, 0, margin), False, None, None)[0]
            for margin in (0, 8, 16)]
    assert None not in keys and len(set(keys)) == 3


# --------------------------------------------------------------------------
# What the binding refuses, and what it leaves to the library
# --------------------------------------------------------------------------


REFUSALS = [
    (True, flashcore.InvalidArgumentError, "sm_margin must be an int, not a bool"),
    (1.5, flashcore.InvalidArgumentError, "sm_margin must be an int, got float 1.5"),
    (None, flashcore.InvalidArgumentError, "sm_margin must be an int, got NoneType"),
    ("16", flashcore.InvalidArgumentError, "sm_margin must be an int, got str"),
    (2**31, flashcore.InvalidArgumentError, r"sm_margin \(2147483648\) does not fit the C API's int32_t"),
    (-2**31 - 1, flashcore.InvalidArgumentError, r"sm_margin \(-2147483649\) does not fit the C API's int32_t"),
]


@pytest.mark.parametrize("margin,cls,match", REFUSALS)
def test_sm_margin_conversion_refusals(lib, margin, cls, match):
    q, k, v, out = fake_qkv()
    with pytest.raises(cls, match=match):
        flashcore.attention(q, k, v, out=out, sm_margin=margin)
    with pytest.raises(cls, match=match):
        flashcore.forward_params(q, k, v, out, sm_margin=margin)
    with pytest.raises(cls, match=match):
        flashcore.backward_params(*fake_backward_arrays(), sm_margin=margin)


def test_a_non_int_is_a_type_error_too(lib):
    q, k, v, out = fake_qkv()
    with pytest.raises(TypeError, match="sm_margin must be an int"):
        flashcore.attention(q, k, v, out=out, sm_margin=1.5)


def test_a_negative_sm_margin_is_the_library_s_to_refuse(lib):
    q, k, v, out = fake_qkv()
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(
        q, k, v, out=out, sm_margin=-1))
    assert "sm_margin (-1)" in err.message
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_backward_params(
        flashcore.backward_params(*fake_backward_arrays(), sm_margin=-8)))
    assert "sm_margin (-8)" in err.message


@pytest.fixture
def emulated_h100(lib, monkeypatch):
    """A handle for an emulated H100 (FLASHCORE_TEST_EMULATE_GPU: made
    without the driver; its calls plan, then stop where they would launch,
    NoDeviceError naming the plan), which flashcore.attention's calls go
    to."""
    monkeypatch.setenv("FLASHCORE_TEST_EMULATE_GPU", "h100")
    handle = flashcore.Handle()
    monkeypatch.setattr(_plan, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_plan, "check_known_to_driver", lambda infos: None)
    monkeypatch.setattr(_plan, "_plans", {})
    yield handle
    handle.close()


@pytest.mark.parametrize("margin", [0, 16, H100_SMS - 1])
def test_the_plan_leaves_sm_margin_sms(emulated_h100, margin):
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.NoDeviceError, match="on %d of %d SMs" % (H100_SMS - margin, H100_SMS)):
        flashcore.attention(q, k, v, out=out, sm_margin=margin)
    params = flashcore.backward_params(*fake_backward_arrays(), sm_margin=margin)
    nbytes = emulated_h100.backward_workspace_size(params)
    with pytest.raises(flashcore.NoDeviceError, match="on %d of %d SMs" % (H100_SMS - margin, H100_SMS)):
        emulated_h100.backward(params, workspace=fake_ptr(20), workspace_bytes=nbytes)


def test_a_margin_that_leaves_no_sm_is_the_library_s_to_refuse(lib, emulated_h100):
    q, k, v, out = fake_qkv()
    words = "sm_margin (%d) leaves none of device 0's %d SMs" % (H100_SMS, H100_SMS)
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(
        q, k, v, out=out, sm_margin=H100_SMS))
    assert words in err.message
    params = flashcore.backward_params(*fake_backward_arrays(), sm_margin=H100_SMS)
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                              lambda: emulated_h100.backward_workspace_size(params))
    assert words in err.message


# --------------------------------------------------------------------------
# Autograd on the fake GPU: the backward leaves the forward's SMs
# --------------------------------------------------------------------------


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _qkv(torch, grad=(True, True, True)):
    return tensors(torch, [(2, HQ, 16, 64), (2, 2, 24, 64), (2, 2, 24, 64)], grad=grad)


def test_the_backward_leaves_the_forward_s_sms(torch, fake_gpu):
    q, k, v = _qkv(torch)
    out = flashcore.attention(q, k, v, causal=True, sm_margin=12)
    out.float().sum().backward()
    assert filled(torch, q.grad, fake_gpu.FILL_DQ)
    (path, fwd), (back_path, bwd) = fake_gpu.queued
    assert (path, back_path) == ("launch", "backward")
    assert (fwd.sm_margin, bwd.sm_margin, bwd.causal) == (12, 12, 1)


def test_sm_margin_with_chunk_and_sinks(torch, fake_gpu):
    q, k, v = _qkv(torch)
    sinks = torch.nn.Parameter(torch.linspace(-1.0, 1.0, HQ))
    out = flashcore.attention(q, k, v, causal=True, attention_chunk=8, sinks=sinks, sm_margin=4)
    out.float().sum().backward()
    (_, fwd), (_, bwd) = fake_gpu.queued
    assert (fwd.sm_margin, fwd.attention_chunk, bwd.sm_margin, bwd.attention_chunk) == (4, 8, 4, 8)
    assert bwd.dsinks == sinks.grad.data_ptr()


def test_flash_attn_func_s_sm_margin_reaches_both_directions(torch, fake_gpu):
    q, k, v = tensors(torch, [(2, 16, HQ, 64), (2, 24, 2, 64), (2, 24, 2, 64)])
    flashcore.flash_attn_func(q, k, v, causal=True, sm_margin=16).float().sum().backward()
    (_, fwd), (_, bwd) = fake_gpu.queued
    assert (fwd.sm_margin, bwd.sm_margin, fwd.q_seq_stride) == (16, 16, HQ * 64)


def test_gradients_take_sm_margin(torch, fake_gpu):
    # As flashcore.distributed's ring steps call it: a trailing keyword.
    q, k, v = (x.detach() for x in _qkv(torch))
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    dq, dk, dv, dsinks = _backward.gradients(torch.ones_like(out), q, k, v, out, lse, None, None, None, None, None,
                                             "bhsd", False, None, None, 0.0, False, sm_margin=20)
    assert dsinks is None and filled(torch, dk, fake_gpu.FILL_DK)
    assert fake_gpu.backward_params()[-1].sm_margin == 20
    with pytest.raises(TypeError, match="sm_margin must be an int"):
        _backward.gradients(torch.ones_like(out), q, k, v, out, lse, None, None, None, None, None, "bhsd", False,
                            None, None, 0.0, False, sm_margin=2.0)


def test_the_operators_carry_sm_margin_to_the_backward(torch, fake_gpu):
    flashcore.register_torch_ops()
    schema = str(torch.ops.flashcore.forward.default._schema)
    assert schema.endswith("Tensor? sinks=None, SymInt sm_margin=0) -> (Tensor, Tensor)"), schema
    q, k, v = _qkv(torch)
    # The last argument, after sinks: callers of the schema before it keep their positions.
    out, _ = torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, None,
                                         0.0, True, False, None, None, None, 0, None, 24)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert filled(torch, grads[2], fake_gpu.FILL_DV)
    (_, fwd), (_, bwd) = fake_gpu.queued
    assert (fwd.sm_margin, bwd.sm_margin) == (24, 24)
    # The backward operator takes it last, after compute_dsinks.
    dq, *_ = torch.ops.flashcore.backward(torch.ones_like(out), q.detach(), k.detach(), v.detach(), out.detach(),
                                          torch.zeros(2, HQ, 16), None, None, None, None, None, "bhsd", True, None,
                                          None, 0.0, False, 0, None, False, 6)
    assert fake_gpu.backward_params()[-1].sm_margin == 6


def test_a_differentiable_call_refuses_what_the_schema_would_not_take(torch, fake_gpu):
    q, k, v = _qkv(torch)
    for margin in (1.5, True, None):
        with pytest.raises(TypeError, match="sm_margin must be an int"):
            flashcore.attention(q, k, v, sm_margin=margin)
    assert not fake_gpu.queued


def test_compile_traces_sm_margin_both_ways(torch, fake_gpu):
    graphs = []
    backend = recording_backend(graphs)

    def block(q, k, v):
        return flashcore.attention(q, k, v, causal=True, sm_margin=10).float().sum()

    q, k, v = _qkv(torch)
    assert_one_graph(torch, block, q, k, v)
    torch.compile(block, fullgraph=True, backend=backend)(q, k, v).backward()
    assert graphs == [{"flashcore.forward.default"}, {"flashcore.backward.default"}]
    (_, fwd), (_, bwd) = fake_gpu.queued[-2:]  # (explain ran the forward too)
    assert (fwd.sm_margin, bwd.sm_margin) == (10, 10)
    assert filled(torch, q.grad, fake_gpu.FILL_DQ)


def test_repeated_steps_take_the_compiled_path_with_their_sm_margin(torch, compiled_on_fake_gpu):
    fake_gpu = compiled_on_fake_gpu
    q, k, v = _qkv(torch)
    for step in range(3):
        out = flashcore.attention(q, k, v, causal=True, sm_margin=16)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        fwd, bwd = fake_gpu.queued[-2][1], fake_gpu.queued[-1][1]
        assert (fwd.sm_margin, bwd.sm_margin) == (16, 16)
    assert [path for path, _ in fake_gpu.queued] == ["launch", "backward", "launch_plain", "compiled backward",
                                                     "compiled", "compiled backward"]
    # Another margin is another plan: the full path, both ways, then the compiled one.
    for _ in range(2):
        out = flashcore.attention(q, k, v, causal=True, sm_margin=0)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert [(path, params.sm_margin) for path, params in fake_gpu.queued[-4:]] == [
        ("launch", 0), ("backward", 0), ("launch_plain", 0), ("compiled backward", 0)]
    # Inference: planned as any call.
    q, k, v = q.detach(), k.detach(), v.detach()
    for margin in (16, 16, 16, 8):
        flashcore.attention(q, k, v, causal=True, sm_margin=margin)
    assert [(path, params.sm_margin) for path, params in fake_gpu.queued[-4:]] == [
        ("launch", 16), ("launch_plain", 16), ("compiled", 16), ("launch", 8)]


# --------------------------------------------------------------------------
# flashcore.jax: a static attribute of the plans
# --------------------------------------------------------------------------


def test_jax_plans_carry_sm_margin(jax_planned):
    jax, _ffi_call = jax_planned
    S, jnp = jax.ShapeDtypeStruct, jax.numpy
    q, k = S((2, HQ, 100, 64), jnp.bfloat16), S((2, 2, 300, 64), jnp.bfloat16)
    plan = _ffi_call.plan_forward(q, k, k, "bhsd", True, None, None, 0.0, None, sm_margin=16)
    assert flashcore.ForwardParams.from_buffer_copy(plan.plan.tobytes()).sm_margin == 16
    back = _ffi_call.plan_backward(q, k, k, S((2, HQ, 100, 64), jnp.bfloat16), S((2, HQ, 100), jnp.float32), "bhsd",
                                   True, None, None, 0.0, False, sm_margin=16)
    assert flashcore.BackwardParams.from_buffer_copy(back.plan.tobytes()).sm_margin == 16
    with pytest.raises(flashcore.InvalidArgumentError, match="sm_margin must be an int, got float"):
        _ffi_call.plan_forward(q, k, k, "bhsd", True, None, None, 0.0, None, sm_margin=1.0)


def test_jax_attention_plans_both_ways_with_sm_margin(jax_planned, monkeypatch):
    jax, _ffi_call = jax_planned
    try:
        _ffi_call._handlers_path()
    except flashcore.UnsupportedError as e:
        pytest.skip(str(e))
    import flashcore.jax as fj
    planned = []
    for name in ("plan_forward", "plan_backward"):
        real = getattr(_ffi_call, name)

        def recording(*args, _real=real, _name=name):
            plan = _real(*args)
            planned.append((_name, ctypes.c_int32.from_buffer_copy(plan.plan.tobytes(), _margin_offset(_name)).value))
            return plan

        monkeypatch.setattr(_ffi_call, name, recording)
    S, jnp = jax.ShapeDtypeStruct, jax.numpy
    q, k = S((2, 50, HQ, 64), jnp.bfloat16), S((2, 70, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        return fj.attention(q, k, v, layout="bshd", causal=True, sm_margin=12).astype(jnp.float32).sum()

    jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), q, k, k)
    assert ("plan_forward", 12) in planned and ("plan_backward", 12) in planned


def _margin_offset(plan_name):
    struct = flashcore.ForwardParams if plan_name == "plan_forward" else flashcore.BackwardParams
    return struct.sm_margin.offset
