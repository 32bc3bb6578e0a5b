"""Chunked attention (attention_chunk) and learnable sinks (sinks, their
gradient dsinks, the merge's sinks), 0.9, issue 61, without a GPU: what
the params structs carry from every entry point, what the binding
refuses (the conversion of attention_chunk, the type and shape of the
sinks) and what it leaves to the library, the autograd wiring on the
fake GPU (conftest.py's fake_gpu: the backward fills dsinks with
FILL_DSINKS), the operators' schemas and traced calls
(torch.library.opcheck of both with chunk and sinks is
test_backward.py's), the compiled path both ways and flashcore.jax's
plans. What the kernels compute is test_gpu_torch.py's and
test_gpu_backward.py's."""

import ctypes
import os

import pytest

import flashcore
from fc_testing import (FakeCudaArray, FakeGpuHandle, assert_one_graph, fake_ptr, fake_qkv, fake_varlen,
                        raises_from_library, recording_backend)
from test_backward import fake_backward_arrays, filled, tensors
from test_package import fake_states

FILLS = (FakeGpuHandle.FILL_DQ, FakeGpuHandle.FILL_DK, FakeGpuHandle.FILL_DV)
HQ = 8  # fake_qkv's, fake_varlen's and fake_backward_arrays' query heads


def fake_sinks(heads=HQ, index=9, typestr="<f4", **kwargs):
    """Fake float32 [heads] sinks (index 9: no other fake array's)."""
    return FakeCudaArray((heads,), typestr=typestr, index=index, **kwargs)


# --------------------------------------------------------------------------
# The params structs
# --------------------------------------------------------------------------


def test_chunk_and_sinks_default_off(lib):
    forward, backward, merge = lib.new_params(), lib.new_backward_params(), lib.new_merge_params()
    assert (forward.attention_chunk, forward.sinks) == (0, None)
    assert (backward.attention_chunk, backward.sinks, backward.dsinks) == (0, None, None)
    assert merge.sinks is None
    p = flashcore.forward_params(*fake_qkv())
    assert (p.attention_chunk, p.sinks) == (0, None)
    b = flashcore.backward_params(*fake_backward_arrays())
    assert (b.attention_chunk, b.sinks, b.dsinks) == (0, None, None)


def test_forward_params_carry_chunk_and_sinks(lib):
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out, causal=True, window=(300, 0), attention_chunk=48, sinks=fake_sinks())
    flashcore.check_params(p)
    assert (p.attention_chunk, p.sinks, p.causal, p.use_window, p.window_left) == (48, fake_ptr(9), 1, 1, 300)


def _bshd(b=2, hq=HQ, hkv=2, sq=100, sk=120, d=64):
    return (FakeCudaArray((b, sq, hq, d), index=0), FakeCudaArray((b, sk, hkv, d), index=1),
            FakeCudaArray((b, sk, hkv, d), index=2), FakeCudaArray((b, sq, hq, d), index=3))


@pytest.mark.parametrize("api", ["attention", "attention_varlen", "attention_with_kvcache"])
def test_every_entry_point_queues_chunk_and_sinks(queued, api):
    sinks = fake_sinks()
    if api == "attention":
        q, k, v, out = fake_qkv()
        flashcore.attention(q, k, v, out=out, causal=True, attention_chunk=64, sinks=sinks)
    elif api == "attention_varlen":
        q, k, v, out, cu_q, cu_k = fake_varlen()
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 40, 50, out=out, causal=True, attention_chunk=64,
                                   sinks=sinks)
    elif api == "attention_with_kvcache":
        q, k, v, out = _bshd(sq=1)
        lengths = FakeCudaArray((2,), typestr="<i4", index=5)
        flashcore.attention_with_kvcache(q, k, v, lengths, out=out, causal=True, attention_chunk=64, sinks=sinks)
    (p,) = queued
    assert (p.attention_chunk, p.sinks, p.causal) == (64, fake_ptr(9), 1)


@pytest.mark.parametrize("chunk,cls,match", [
    (True, flashcore.InvalidArgumentError, "attention_chunk must be an int, not a bool"),
    (1.5, TypeError, "attention_chunk must be an int, got float 1.5"),
    (None, TypeError, "attention_chunk must be an int, got NoneType"),
    (2**31, flashcore.InvalidArgumentError, r"attention_chunk \(2147483648\) does not fit the C API's int32_t"),
])
def test_attention_chunk_conversion_refusals(lib, chunk, cls, match):
    q, k, v, out = fake_qkv()
    with pytest.raises(cls, match=match):
        flashcore.attention(q, k, v, out=out, attention_chunk=chunk)


def test_a_negative_chunk_is_the_library_s_to_refuse(lib):
    q, k, v, out = fake_qkv()
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(
        q, k, v, out=out, attention_chunk=-1))
    assert "attention_chunk (-1)" in err.message
    arrays = fake_backward_arrays()
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_backward_params(
        flashcore.backward_params(*arrays, attention_chunk=-8)))
    assert "attention_chunk (-8)" in err.message


@pytest.mark.parametrize("bad,match", [
    (dict(typestr="<f2"), r"sinks must be float32 of shape \[Hq\] = \[8\] \(one logit per query head\), got "
                          r"float16 \[8\]"),
    (dict(heads=4), r"sinks must be float32 of shape \[Hq\] = \[8\] .*got float32 \[4\]"),
    (dict(strides=(8,)), "sinks must be contiguous, got stride 2"),
])
def test_the_sinks_type_and_shape_are_the_binding_s_to_check(lib, bad, match):
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError, match=match):
        flashcore.attention(q, k, v, out=out, sinks=fake_sinks(**bad))
    with pytest.raises(flashcore.InvalidArgumentError, match="sinks must be float32"):
        flashcore.attention(q, k, v, out=out, sinks=FakeCudaArray((1, HQ), typestr="<f4", index=9))


def test_the_sinks_address_is_the_library_s_to_check(lib):
    q, k, v, out = fake_qkv()
    err = raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.check_params(
        flashcore.forward_params(q, k, v, out, sinks=fake_sinks(ptr=fake_ptr(9, 2)))))
    assert "sinks" in err.message
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_params(
        flashcore.forward_params(q, k, v, out, sinks=fake_sinks(ptr=fake_ptr(3)))))
    assert "sinks" in err.message and "overlaps out" in err.message


def test_backward_params_carry_chunk_sinks_and_dsinks(lib):
    arrays = fake_backward_arrays()
    p = flashcore.backward_params(*arrays, causal=True, attention_chunk=64, sinks=fake_sinks(index=12),
                                  dsinks=fake_sinks(index=13))
    flashcore.check_backward_params(p)
    assert (p.attention_chunk, p.sinks, p.dsinks, p.causal) == (64, fake_ptr(12), fake_ptr(13), 1)
    # Sinks without their gradient (sinks that need none).
    p = flashcore.backward_params(*arrays, sinks=fake_sinks(index=12))
    flashcore.check_backward_params(p)
    assert (p.sinks, p.dsinks) == (fake_ptr(12), None)


def test_backward_refusals_of_dsinks(lib):
    arrays = fake_backward_arrays()
    sinks = fake_sinks(index=12)
    with pytest.raises(flashcore.InvalidArgumentError, match="dsinks is read-only"):
        flashcore.backward_params(*arrays, sinks=sinks, dsinks=fake_sinks(index=13, readonly=True))
    with pytest.raises(flashcore.InvalidArgumentError, match=r"dsinks must be float32 of shape \[Hq\] = \[8\]"):
        flashcore.backward_params(*arrays, sinks=sinks, dsinks=fake_sinks(heads=2, index=13))
    # What needs the call as a whole is the library's: dsinks needs sinks,
    # and must overlap nothing it reads or writes.
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_backward_params(
        flashcore.backward_params(*arrays, dsinks=fake_sinks(index=13))))
    assert "dsinks is set but sinks is NULL" in err.message
    for ptr, other in ((fake_ptr(6), "dq"), (fake_ptr(12), "sinks")):
        err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_backward_params(
            flashcore.backward_params(*arrays, sinks=sinks, dsinks=fake_sinks(ptr=ptr))))
        assert "dsinks" in err.message and "overlaps %s" % other in err.message


def test_merge_params_carry_sinks(lib):
    partial, plse, out, lse = fake_states()  # [3, 2, 8, 100, 64]: 8 heads
    p = flashcore.merge_params(partial, plse, out, lse=lse, sinks=fake_sinks())
    lib.check(lib.cdll.flashcore_merge_check(ctypes.byref(p)))
    assert p.sinks == fake_ptr(9)
    assert flashcore.merge_params(partial, plse, out).sinks is None
    with pytest.raises(flashcore.InvalidArgumentError, match=r"sinks must be float32 of shape \[Hq\] = \[8\]"):
        flashcore.merge_params(partial, plse, out, sinks=fake_sinks(heads=2))
    p = flashcore.merge_params(partial, plse, out, sinks=fake_sinks(ptr=fake_ptr(9, 2)))
    raises_from_library(lib, flashcore.MisalignedError,
                        lambda: lib.check(lib.cdll.flashcore_merge_check(ctypes.byref(p))))
    with pytest.raises(flashcore.InvalidArgumentError, match="sinks must be float32"):
        flashcore.merge_states(partial, plse, out=out, sinks=fake_sinks(typestr="<f2"))


# --------------------------------------------------------------------------
# Autograd on the fake GPU: the sinks' gradient, attention_chunk in both
# directions
# --------------------------------------------------------------------------


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def sinks_parameter(torch, heads=HQ, requires_grad=True):
    return torch.nn.Parameter(torch.linspace(-1.0, 1.0, heads), requires_grad=requires_grad)


def test_sinks_get_their_gradient(torch, fake_gpu):
    q, k, v = tensors(torch, [(2, HQ, 16, 64), (2, 2, 24, 64), (2, 2, 24, 64)])
    sinks = sinks_parameter(torch)
    out = flashcore.attention(q, k, v, causal=True, attention_chunk=8, sinks=sinks)
    assert out.requires_grad
    out.float().sum().backward()
    assert [filled(torch, x.grad, fill) for x, fill in zip((q, k, v), FILLS)] == [True] * 3
    assert sinks.grad.dtype == torch.float32 and filled(torch, sinks.grad, FakeGpuHandle.FILL_DSINKS)
    (path, fwd), (back_path, bwd) = fake_gpu.queued
    assert (path, back_path) == ("launch", "backward")
    assert (fwd.sinks, fwd.attention_chunk) == (sinks.data_ptr(), 8)
    assert (bwd.sinks, bwd.attention_chunk, bwd.causal) == (sinks.data_ptr(), 8, 1)
    assert bwd.dsinks == sinks.grad.data_ptr()


def test_sinks_that_need_no_gradient_are_still_passed_to_the_backward(torch, fake_gpu):
    q, k, v = tensors(torch, [(1, HQ, 16, 64), (1, 2, 16, 64), (1, 2, 16, 64)])
    sinks = sinks_parameter(torch, requires_grad=False)
    flashcore.attention(q, k, v, sinks=sinks).float().sum().backward()
    (bwd,) = fake_gpu.backward_params()
    assert (bwd.sinks, bwd.dsinks) == (sinks.data_ptr(), None) and sinks.grad is None
    assert filled(torch, q.grad, FakeGpuHandle.FILL_DQ)


def test_sinks_alone_make_the_call_differentiable(torch, fake_gpu):
    q, k, v = tensors(torch, [(1, HQ, 16, 64), (1, 2, 16, 64), (1, 2, 16, 64)], grad=(False, False, False))
    sinks = sinks_parameter(torch)
    out = flashcore.attention(q, k, v, sinks=sinks)
    assert out.requires_grad
    out.float().sum().backward()
    assert filled(torch, sinks.grad, FakeGpuHandle.FILL_DSINKS) and q.grad is None and k.grad is None
    # detach=True and no_grad compute from the values: no graph, no backward.
    assert not flashcore.attention(q, k, v, sinks=sinks, detach=True).requires_grad
    with torch.no_grad():
        assert not flashcore.attention(q, k, v, sinks=sinks).requires_grad
    assert len(fake_gpu.backward_params()) == 1


def test_packed_sequences_pass_chunk_and_sinks(torch, fake_gpu):
    q, k, v = tensors(torch, [(30, HQ, 64), (50, 2, 64), (50, 2, 64)])
    cu_q = torch.tensor([0, 10, 10, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 20, 50], dtype=torch.int32)
    sinks = sinks_parameter(torch)
    out = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 20, 30, causal=True, attention_chunk=16, sinks=sinks)
    out.float().sum().backward()
    (bwd,) = fake_gpu.backward_params()
    assert (bwd.cu_seqlens_q, bwd.attention_chunk, bwd.sinks, bwd.dsinks) == (cu_q.data_ptr(), 16, sinks.data_ptr(),
                                                                               sinks.grad.data_ptr())
    assert filled(torch, sinks.grad, FakeGpuHandle.FILL_DSINKS)


def test_what_a_differentiable_call_with_sinks_refuses(torch, fake_gpu):
    q, k, v = tensors(torch, [(1, HQ, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)])
    with pytest.raises(TypeError, match="sinks must be None or a torch tensor where q, k, v or sinks requires grad"):
        flashcore.attention(q, k, v, sinks=FakeCudaArray((HQ,), typestr="<f4", index=9))
    with pytest.raises(flashcore.InvalidArgumentError, match="sinks must be float32"):
        flashcore.attention(q, k, v, sinks=torch.zeros(HQ, dtype=torch.float16, requires_grad=True))
    flashcore.register_torch_ops()
    with pytest.raises(ValueError, match="compute_dsinks needs sinks"):
        torch.ops.flashcore.backward(q.detach(), q.detach(), k.detach(), v.detach(), q.detach(),
                                     torch.zeros(1, HQ, 8), None, None, None, None, None, "bhsd", False, None, None,
                                     0.0, False, 0, None, True)
    assert not fake_gpu.backward_params()


def test_the_operators_schemas(torch, lib):
    flashcore.register_torch_ops()
    forward = str(torch.ops.flashcore.forward.default._schema)
    backward = str(torch.ops.flashcore.backward.default._schema)
    # (custom_op writes a Python int as SymInt: symbolic under torch.compile's dynamic shapes.)
    # sm_margin after them, the last of each (test_sm_margin.py's).
    assert forward.endswith("Tensor? v_descale=None, SymInt attention_chunk=0, Tensor? sinks=None, "
                            "SymInt sm_margin=0) -> (Tensor, Tensor)"), forward
    assert backward.endswith("bool deterministic, SymInt attention_chunk=0, Tensor? sinks=None, "
                             "bool compute_dsinks=False, SymInt sm_margin=0) -> (Tensor, Tensor, Tensor, "
                             "Tensor)"), backward


def test_the_operators_route_gives_the_sinks_gradient(torch, fake_gpu):
    q, k, v = tensors(torch, [(1, HQ, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)])
    sinks = sinks_parameter(torch)
    out, _ = torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, None,
                                         0.0, True, False, None, None, None, 4, sinks)
    grads = torch.autograd.grad(out, (q, k, v, sinks), torch.ones_like(out))
    assert [filled(torch, g, fill) for g, fill in zip(grads, FILLS + (FakeGpuHandle.FILL_DSINKS,))] == [True] * 4
    (bwd,) = fake_gpu.backward_params()
    assert (bwd.attention_chunk, bwd.sinks, bwd.dsinks) == (4, sinks.data_ptr(), grads[3].data_ptr())
    # Without sinks the backward operator gives an empty dsinks.
    dq, dk, dv, dsinks = torch.ops.flashcore.backward(torch.ones_like(out), q.detach(), k.detach(), v.detach(),
                                                      out.detach(), torch.zeros(1, HQ, 8), None, None, None, None,
                                                      None, "bhsd", True, None, None, 0.0, False)
    assert tuple(dsinks.shape) == (0,) and dsinks.dtype == torch.float32


def test_compile_traces_sinks_and_their_gradient(torch, fake_gpu):
    graphs = []
    backend = recording_backend(graphs)

    def block(q, k, v, sinks):
        return flashcore.attention(q, k, v, causal=True, attention_chunk=8, sinks=sinks).float().sum()

    q, k, v = tensors(torch, [(1, HQ, 16, 64), (1, 2, 16, 64), (1, 2, 16, 64)])
    sinks = sinks_parameter(torch)
    assert_one_graph(torch, block, q, k, v, sinks)
    torch.compile(block, fullgraph=True, backend=backend)(q, k, v, sinks).backward()
    assert graphs == [{"flashcore.forward.default"}, {"flashcore.backward.default"}]
    (bwd,) = fake_gpu.backward_params()
    assert (bwd.attention_chunk, bwd.sinks, bwd.dsinks) == (8, sinks.data_ptr(), sinks.grad.data_ptr())
    assert filled(torch, sinks.grad, FakeGpuHandle.FILL_DSINKS) and filled(torch, q.grad, FakeGpuHandle.FILL_DQ)


def test_repeated_steps_with_sinks_take_the_compiled_path_both_ways(torch, compiled_on_fake_gpu):
    fake_gpu = compiled_on_fake_gpu
    q, k, v = tensors(torch, [(2, HQ, 16, 64), (2, 2, 24, 64), (2, 2, 24, 64)])
    sinks = sinks_parameter(torch)
    for step in range(3):
        out = flashcore.attention(q, k, v, causal=True, window=(8, 0), attention_chunk=4, sinks=sinks)
        dq, dk, dv, dsinks = torch.autograd.grad(out, (q, k, v, sinks), torch.ones_like(out))
        assert filled(torch, dsinks, FakeGpuHandle.FILL_DSINKS) and filled(torch, dq, FakeGpuHandle.FILL_DQ)
        fwd, bwd = fake_gpu.queued[-2][1], fake_gpu.queued[-1][1]
        assert (fwd.sinks, fwd.attention_chunk, bwd.sinks, bwd.attention_chunk) == (sinks.data_ptr(), 4,
                                                                                     sinks.data_ptr(), 4)
        assert bwd.dsinks == dsinks.data_ptr()
    assert [path for path, _ in fake_gpu.queued] == ["launch", "backward", "launch_plain", "compiled backward",
                                                     "compiled", "compiled backward"]
    # Inference (grad mode off) with the same parameter, which requires
    # grad: planned as any call (the full path, then the Python quick path,
    # which gives the plan to the compiled one), no backward.
    q, k, v = q.detach(), k.detach(), v.detach()
    with torch.no_grad():
        for _ in range(3):
            flashcore.attention(q, k, v, causal=True, window=(8, 0), attention_chunk=4, sinks=sinks)
    assert [path for path, _ in fake_gpu.queued[-3:]] == ["launch", "launch_plain", "compiled"]
    assert fake_gpu.queued[-1][1].sinks == sinks.data_ptr()


# --------------------------------------------------------------------------
# flashcore.jax: the plans (lowered for CUDA without a GPU)
# --------------------------------------------------------------------------


def test_jax_plans_carry_chunk_and_sinks(jax_planned):
    jax, _ffi_call = jax_planned
    S, jnp = jax.ShapeDtypeStruct, jax.numpy
    q, k, sinks = S((2, HQ, 100, 64), jnp.bfloat16), S((2, 2, 300, 64), jnp.bfloat16), S((HQ,), jnp.float32)
    plan = _ffi_call.plan_forward(q, k, k, "bhsd", True, None, None, 0.0, None, {"sinks": sinks},
                                  attention_chunk=128)
    params = flashcore.ForwardParams.from_buffer_copy(plan.plan.tobytes())
    assert (params.attention_chunk, params.sinks) == (128, None)  # the address is the handler's to put in
    # The operands q, k, v, sinks, then the results out and lse.
    assert list(plan.fields) == [0, 1, 2, _ffi_call.POINTER_FIELDS.index("sinks"), 3, 4]
    back = _ffi_call.plan_backward(q, k, k, S((2, HQ, 100, 64), jnp.bfloat16), S((2, HQ, 100), jnp.float32), "bhsd",
                                   True, None, None, 0.0, False, {"sinks": sinks}, attention_chunk=128)
    params = flashcore.BackwardParams.from_buffer_copy(back.plan.tobytes())
    assert params.attention_chunk == 128 and back.sinks
    fields = _ffi_call.BACKWARD_POINTER_FIELDS
    assert list(back.fields) == [0, 1, 2, 3, 4, 5, fields.index("sinks"), 6, 7, 8, fields.index("dsinks")]
    with pytest.raises(flashcore.InvalidArgumentError, match=r"sinks must be float32 of shape \[Hq\] = \[8\]"):
        _ffi_call.plan_forward(q, k, k, "bhsd", True, None, None, 0.0, None, {"sinks": S((4,), jnp.float32)})


def test_jax_gradient_reaches_the_sinks(jax_planned):
    jax, _ffi_call = jax_planned
    try:
        _ffi_call._handlers_path()
    except flashcore.UnsupportedError as e:
        pytest.skip(str(e))
    import flashcore.jax as fj
    S, jnp = jax.ShapeDtypeStruct, jax.numpy
    q, k, sinks = S((2, 50, HQ, 64), jnp.bfloat16), S((2, 70, 2, 64), jnp.bfloat16), S((HQ,), jnp.float32)

    def loss(q, k, v, sinks):
        out = fj.attention(q, k, v, layout="bshd", causal=True, attention_chunk=32, sinks=sinks)
        return out.astype(jnp.float32).sum()

    grads = jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, k, sinks)
    assert [(g.shape, g.dtype) for g in grads] == [(q.shape, q.dtype), (k.shape, k.dtype), (k.shape, k.dtype),
                                                   ((HQ,), jnp.float32)]
    text = jax.jit(jax.grad(loss, argnums=3)).trace(q, k, k, sinks).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("@flashcore_forward") == 1 and text.count("@flashcore_backward") == 1


# --------------------------------------------------------------------------
# The example's reference (examples/python/gpt_oss_block.py), on the CPU:
# the eager attention with the sink as an extra column of the scores, as
# gpt-oss's reference writes it, against the sinks' definition.
# --------------------------------------------------------------------------


def _example():
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python", "gpt_oss_block.py")
    spec = importlib.util.spec_from_file_location("gpt_oss_block", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize("window", [None, 5])
def test_the_example_s_reference_is_the_sinks_definition(torch, window):
    example = _example()
    g = torch.Generator().manual_seed(3)
    b, hq, hkv, s, d = 2, 8, 2, 13, 16
    q = torch.randn(b, s, hq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(hq, generator=g, dtype=torch.float64)
    out = example.reference_attention(q, k, v, sinks, window)
    # The definition: out = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)) over the keys a row sees.
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(4, 1), v.transpose(1, 2).repeat_interleave(4, 1)
    scores = qh @ kh.transpose(-1, -2) / d ** 0.5
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    seen = (j <= i) if window is None else (j <= i) & (j >= i - window)
    weights = torch.exp(scores).masked_fill(~seen, 0.0)
    expected = (weights @ vh) / (weights.sum(-1, keepdim=True) + torch.exp(sinks)[None, :, None, None])
    assert torch.allclose(out, expected.transpose(1, 2), rtol=1e-12, atol=1e-12)
    # Sinks of -inf are none: causal softmax attention.
    plain = example.reference_attention(q, k, v, torch.full((hq,), float("-inf"), dtype=torch.float64), window)
    softmax = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1) @ vh
    assert torch.allclose(plain, softmax.transpose(1, 2), rtol=1e-12, atol=1e-12)
