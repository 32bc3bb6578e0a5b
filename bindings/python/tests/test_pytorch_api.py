"""PyTorch's and FlashAttention's ways of calling, without a GPU (issue
18): flashcore.sdpa and flashcore.flash_attn_func (what they pass on, what
they refuse), attention's is_causal= and scale=, inputs that require grad,
and the torch operator flashcore::forward traced by torch.export and
torch.compile.
The tests that need torch skip without it; the kernels' results are checked
on the GPU (test_gpu_torch.py)."""

import os
import subprocess
import sys

import pytest

import flashcore
from flashcore import _dropin
from fc_testing import FakeCudaArray, fake_qkv


@pytest.fixture
def torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (CI: install CPU torch to run these)")
    return torch


@pytest.fixture
def passed_on(monkeypatch):
    """What flashcore.sdpa and flash_attn_func hand to flashcore.attention:
    a list of (q, k, v, keywords). The call answers with an empty output
    for torch tensors, else with q."""
    calls = []

    def attention(q, k, v, **kwargs):
        calls.append((q, k, v, kwargs))
        return q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],)) if hasattr(q, "new_empty") else q

    monkeypatch.setattr(_dropin, "attention", attention)
    return calls


# --------------------------------------------------------------------------
# flashcore.sdpa
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,argument", [
    (dict(attn_mask=FakeCudaArray((100, 120), typestr="|b1")), "attn_mask"),
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(scale=0.0), "scale"),
    (dict(scale=-0.5), "scale"),
    (dict(scale=float("nan")), "scale"),
])
def test_sdpa_refuses_what_flashcore_does_not_compute(kwargs, argument):
    q, k, v, _ = fake_qkv()
    with pytest.raises(NotImplementedError, match=r"flashcore\.sdpa: %s" % argument):
        flashcore.sdpa(q, k, v, **kwargs)


def test_sdpa_has_pytorch_s_signature(torch):
    import inspect
    assert str(inspect.signature(flashcore.sdpa)).startswith(
        "(query: Any, key: Any, value: Any, attn_mask: Optional[Any] = None, dropout_p: float = 0.0, "
        "is_causal: bool = False, *, scale: Optional[float] = None, enable_gqa: bool = False)")
    q, k, v, _ = fake_qkv()
    with pytest.raises(TypeError):
        flashcore.sdpa(q, k, v, None, 0.0, False, 0.5)  # scale is keyword-only, as in PyTorch


@pytest.mark.parametrize("sq,sk,causal,window,keys", [
    (100, 100, True, None, 100),
    (100, 60, False, (-1, 40), 60),  # top-left: query i sees keys j <= i, the bottom-right diagonal + 40
    (1, 7, True, None, 1),  # keys 1 and up are seen by no query
])
def test_sdpa_is_causal_is_top_left_aligned(torch, passed_on, sq, sk, causal, window, keys):
    q = torch.empty(2, 4, sq, 64, dtype=torch.float16)
    k, v = torch.empty(2, 4, sk, 64, dtype=torch.float16), torch.empty(2, 4, sk, 32, dtype=torch.float16)
    flashcore.sdpa(q, k, v, is_causal=True, scale=0.25)
    ((q2, k2, v2, kwargs),) = passed_on
    assert q2 is q and kwargs == dict(causal=causal, softmax_scale=0.25, window=window)
    assert tuple(k2.shape) == (2, 4, keys, 64) and tuple(v2.shape) == (2, 4, keys, 32)
    assert k2.data_ptr() == k.data_ptr()  # a view of the first keys, not a copy


def test_sdpa_is_causal_with_fewer_queries_needs_a_torch_tensor():
    q, k, v, _ = fake_qkv(hq=2, hkv=2, sq=10, sk=20)
    with pytest.raises(TypeError, match="torch tensors only"):
        flashcore.sdpa(q, k, v, is_causal=True)


def test_sdpa_passes_4d_arrays_as_they_are(passed_on):
    q, k, v, _ = fake_qkv(hq=8, hkv=2)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"head counts of query, key and value \(\[8\], \[2\], "
                                                             r"\[2\]\) do not broadcast .*enable_gqa=True"):
        flashcore.sdpa(q, k, v)  # 8 and 2 heads without enable_gqa: PyTorch refuses them too
    assert flashcore.sdpa(q, k, v, enable_gqa=True) is q
    ((q2, k2, v2, kwargs),) = passed_on
    assert (q2, k2, v2) == (q, k, v) and kwargs == dict(causal=False, softmax_scale=None, window=None)


def test_sdpa_enable_gqa_follows_pytorch(torch):
    q = torch.empty(1, 8, 16, 64, dtype=torch.float16)
    kv3 = torch.empty(1, 3, 16, 64, dtype=torch.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"key \(3\) and value \(3\) must divide .* query \(8\)"):
        flashcore.sdpa(q, kv3, kv3, enable_gqa=True)
    with pytest.raises(NotImplementedError, match="different head counts"):
        flashcore.sdpa(q, torch.empty(1, 2, 16, 64), torch.empty(1, 4, 16, 64), enable_gqa=True)


@pytest.mark.parametrize("q_shape,kv_shape,gqa,want_q,want_kv,out_shape", [
    ((3, 16, 64), (3, 20, 64), False, (1, 3, 16, 64), (1, 3, 20, 64), (3, 16, 64)),  # [N, L, E]
    ((16, 64), (20, 64), False, (1, 1, 16, 64), (1, 1, 20, 64), (16, 64)),  # [L, E]
    ((2, 3, 4, 16, 64), (2, 3, 4, 20, 64), False, (6, 4, 16, 64), (6, 4, 20, 64), (2, 3, 4, 16, 64)),
    ((2, 8, 16, 64), (1, 1, 20, 64), False, (2, 8, 16, 64), (2, 1, 20, 64), (2, 8, 16, 64)),  # broadcast B, MQA
    ((1, 1, 16, 64), (2, 4, 20, 64), False, (2, 4, 16, 64), (2, 4, 20, 64), (2, 4, 16, 64)),  # q broadcast
    ((2, 8, 16, 64), (1, 2, 20, 64), True, (2, 8, 16, 64), (2, 2, 20, 64), (2, 8, 16, 64)),
])
def test_sdpa_shapes_and_broadcasting_as_pytorch(torch, passed_on, q_shape, kv_shape, gqa, want_q, want_kv,
                                                 out_shape):
    q, k, v = torch.empty(q_shape), torch.empty(kv_shape), torch.empty(kv_shape)
    passed_on.clear()
    result = flashcore.sdpa(q, k, v, enable_gqa=gqa)
    ((q2, k2, v2, _),) = passed_on
    assert (tuple(q2.shape), tuple(k2.shape), tuple(v2.shape)) == (want_q, want_kv, want_kv)
    assert tuple(result.shape) == out_shape
    # PyTorch's own shape for the same call.
    assert tuple(torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa).shape) == out_shape


# --------------------------------------------------------------------------
# flashcore.flash_attn_func
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,argument", [
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(alibi_slopes=FakeCudaArray((8,), typestr="<f4")), "alibi_slopes"),
    (dict(return_attn_probs=True), "return_attn_probs"),
])
def test_flash_attn_func_refuses_what_flashcore_does_not_compute(kwargs, argument):
    q, k, v, _ = fake_qkv()
    with pytest.raises(NotImplementedError, match=r"flashcore\.flash_attn_func: %s" % argument):
        flashcore.flash_attn_func(q, k, v, **kwargs)


@pytest.mark.parametrize("causal,window_size,window", [
    (False, (-1, -1), None),
    (True, (-1, -1), None),
    (True, (-1, 5), None),  # causal makes the right bound 0, as in FlashAttention
    (True, (128, -1), (128, 0)),
    (False, (64, 16), (64, 16)),
    (False, (-1, 0), (-1, 0)),
])
def test_flash_attn_func_passes_flashattention_s_meaning(passed_on, causal, window_size, window):
    q, k, v, _ = fake_qkv()
    flashcore.flash_attn_func(q, k, v, 0.0, 0.125, causal, window_size, 30.0, None, True)
    ((_, _, _, kwargs),) = passed_on
    assert kwargs == dict(causal=causal, softmax_scale=0.125, window=window, softcap=30.0, layout="bshd",
                          deterministic=True, q_descale=None, k_descale=None, v_descale=None, attention_chunk=0,
                          sinks=None, sm_margin=0)


def test_flash_attn_func_passes_flashattention_3_s_descales(passed_on):
    q, k, v, _ = fake_qkv()
    scales = [FakeCudaArray((2, 2), typestr="<f4", index=8 + i) for i in range(3)]
    flashcore.flash_attn_func(q, k, v, causal=True, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    ((_, _, _, kwargs),) = passed_on
    assert (kwargs["q_descale"], kwargs["k_descale"], kwargs["v_descale"]) == tuple(scales)


def test_flash_attn_func_passes_chunk_and_sinks(passed_on):
    # FlashAttention 3's attention_chunk and our sinks (FlashAttention 4's
    # learnable_sink), keywords as flashcore.attention takes them.
    q, k, v, _ = fake_qkv()
    sinks = FakeCudaArray((8,), typestr="<f4", index=9)
    flashcore.flash_attn_func(q, k, v, causal=True, attention_chunk=1024, sinks=sinks)
    ((_, _, _, kwargs),) = passed_on
    assert (kwargs["attention_chunk"], kwargs["sinks"], kwargs["causal"]) == (1024, sinks, True)
    with pytest.raises(TypeError, match="learnable_sink"):
        flashcore.flash_attn_func(q, k, v, learnable_sink=sinks)


def test_flash_attn_func_passes_sm_margin(passed_on):
    # FlashAttention 3's sm_margin, a keyword as flashcore.attention takes it.
    q, k, v, _ = fake_qkv()
    flashcore.flash_attn_func(q, k, v, causal=True, sm_margin=16)
    ((_, _, _, kwargs),) = passed_on
    assert (kwargs["sm_margin"], kwargs["causal"]) == (16, True)


def test_flash_attn_func_queues_bshd_params(queued):
    b, sq, sk, hq, hkv, d = 2, 50, 70, 8, 2, 64
    q, k, v = (FakeCudaArray(s, index=i) for i, s in enumerate([(b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)]))
    with pytest.raises(TypeError, match="out="):
        flashcore.flash_attn_func(q, k, v, causal=True)  # generic arrays: no allocation, as for attention
    out = FakeCudaArray((b, sq, hq, d), index=3)
    flashcore.attention(q, k, v, out=out, layout="bshd", causal=True, window=(16, 0))
    (p,) = queued
    assert (p.num_heads_q, p.seqlen_q, p.q_seq_stride, p.q_head_stride) == (hq, sq, hq * d, d)
    assert (p.causal, p.use_window, p.window_left, p.window_right) == (1, 1, 16, 0)


# --------------------------------------------------------------------------
# attention's PyTorch names
# --------------------------------------------------------------------------


def test_scale_is_softmax_scale(queued):
    q, k, v, out = fake_qkv()
    flashcore.attention(q, k, v, out=out, scale=0.3)
    assert queued[-1].softmax_scale == pytest.approx(0.3)
    with pytest.raises(TypeError, match="softmax_scale or scale"):
        flashcore.attention(q, k, v, out=out, scale=0.3, softmax_scale=0.3)


def test_is_causal_where_it_means_causal(queued):
    q, k, v, out = fake_qkv(sq=64, sk=64)
    flashcore.attention(q, k, v, out=out, is_causal=True)
    flashcore.attention(q, k, v, out=out, is_causal=False)
    assert [p.causal for p in queued] == [1, 0]
    with pytest.raises(TypeError, match="causal or is_causal"):
        flashcore.attention(q, k, v, out=out, is_causal=True, causal=True)
    q, k, v, out = fake_qkv(sq=64, sk=100)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"Sq = 64 != Sk = 100 .*flashcore\.sdpa"):
        flashcore.attention(q, k, v, out=out, is_causal=True)
    q, k, v = (FakeCudaArray(s, index=i) for i, s in enumerate([(2, 64, 8, 64), (2, 64, 2, 64), (2, 64, 2, 64)]))
    flashcore.attention(q, k, v, out=FakeCudaArray((2, 64, 8, 64), index=3), layout="bshd", is_causal=True)
    assert queued[-1].causal == 1 and queued[-1].seqlen_q == 64


# --------------------------------------------------------------------------
# Inputs that require grad (the backward pass itself: test_backward.py)
# --------------------------------------------------------------------------


def test_inputs_that_require_grad_are_differentiated(torch, monkeypatch):
    # Once refused (NoBackwardError): now the call is the differentiable
    # operator, whose implementation refuses these CPU tensors for what they are.
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16, requires_grad=True)
    k = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    assert not hasattr(flashcore, "NoBackwardError")
    cpu = "q is on the CPU"
    for call in (lambda: flashcore.attention(q, k, k), lambda: flashcore.sdpa(q, q, q),
                 lambda: flashcore.flash_attn_func(q, k, k), lambda: flashcore.attention(q, k, k, detach=True)):
        with pytest.raises(flashcore.InvalidArgumentError, match=cpu):
            call()
    with torch.no_grad():
        with pytest.raises(flashcore.InvalidArgumentError, match=cpu):
            flashcore.attention(q, k, k)


# --------------------------------------------------------------------------
# The torch operator (traced on the CPU: its fake implementation; its real
# one runs on the GPU)
# --------------------------------------------------------------------------


def test_operator_is_registered_with_torch(torch):
    op = flashcore.register_torch_ops()
    assert flashcore.register_torch_ops() is op
    assert torch.ops.flashcore.forward.default is not None


def _exported(torch, fn, *args):
    class Module(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    with torch.no_grad():
        return torch.export.export(Module(), args)


def test_export_traces_every_entry_point(torch):
    def model(q, k, v, cu_q, cu_k):
        a = flashcore.attention(q, k, v, causal=True)
        b, lse = flashcore.sdpa(q, k, v, is_causal=True), None
        c, lse = flashcore.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                                     return_lse=True)
        d = flashcore.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), window_size=(8, 0))
        packed_q, packed_kv = q[0].transpose(0, 1), k[0].transpose(0, 1)
        e, lse_packed = flashcore.attention_varlen(packed_q, packed_kv, packed_kv, cu_q, cu_k, 8, 12,
                                                   return_lse=True)
        f = flashcore.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 12)
        return a, b, c, lse, d, e, lse_packed, f

    q = torch.empty(2, 4, 16, 64, dtype=torch.float16)
    k = v = torch.empty(2, 4, 24, 64, dtype=torch.float16)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32), torch.tensor([0, 12, 24], dtype=torch.int32)
    program = _exported(torch, model, q, k, v, *cu)
    calls = [n for n in program.graph.nodes if n.target is torch.ops.flashcore.forward.default]
    assert len(calls) == 6
    a, b, c, lse, d, e, lse_packed, f = (n.meta["val"] for n in program.graph.output_node().args[0])
    assert tuple(a.shape) == tuple(b.shape) == (2, 4, 16, 64) and a.is_contiguous()
    assert tuple(c.shape) == tuple(d.shape) == tuple(f.shape) == (2, 16, 4, 64)
    assert tuple(lse.shape) == (2, 4, 16) and lse.dtype == torch.float32
    assert tuple(e.shape) == (16, 4, 64) and tuple(lse_packed.shape) == (4, 16)
    layouts = [n.args[9] for n in calls]
    assert layouts == ["bhsd", "bhsd", "bshd", "bshd", "bshd", "bshd"]
    assert [n.args[13] for n in calls][3] == [8, 0]


def test_export_checks_the_options(torch):
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match="window's left bound"):
        _exported(torch, lambda q: flashcore.attention(q, q, q, window=(-2, 0)), q)


@pytest.mark.parametrize("kwargs,wrong_type,match", [
    (dict(softmax_scale=10**400), False, r"softmax_scale 1000.* does not fit a float32"),
    (dict(softcap=-10**400), False, "softcap must be finite"),
    (dict(softmax_scale=1e-50), False, r"softmax_scale 1e-50 is 0\.0 as a float32"),
    (dict(window=(1.5, 0)), True, "window's left bound must be an int, got float 1.5"),
    (dict(layout=1.5), True, "layout must be an int, got float 1.5"),
    (dict(num_splits=2.0), True, "num_splits must be an int, got float 2.0"),
])
def test_export_refuses_options_the_operator_would_convert(torch, kwargs, wrong_type, match):
    # Before: float() raised OverflowError, int() made the window [1, 0] and
    # the layout "bshd", 1e-50 became the default scale.
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match=match) as info:
        _exported(torch, lambda q: flashcore.attention(q, q, q, **kwargs), q)
    assert isinstance(info.value, TypeError) == wrong_type


def test_compile_refuses_options_the_operator_would_convert(torch):
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(Exception, match=r"softmax_scale 1000.* does not fit a float32"):
        torch.compile(lambda q: flashcore.attention(q, q, q, softmax_scale=10**400), fullgraph=True,
                      backend="eager")(q)


def test_compile_takes_scales_and_sizes_as_inputs(torch):
    # Floats and ints given to the compiled function become symbolic when
    # they change: traced without a graph break still (to the real call,
    # which refuses these CPU tensors).
    def block(q, scale, splits):
        return flashcore.attention(q, q, q, softmax_scale=scale, num_splits=splits).sum() + flashcore.sdpa(
            q, q, q, scale=scale).sum() + flashcore.attention(q, q, q, scale=scale).sum()

    compiled = torch.compile(block, fullgraph=True, backend="eager")
    for scale, splits in ((0.5, 1), (0.25, 2), (0.125, 3)):
        with pytest.raises(flashcore.InvalidArgumentError, match="q is on the CPU"):
            compiled(torch.zeros(1, 2, 16, 64, dtype=torch.float16), scale, splits)


def test_compile_traces_without_graph_breaks(torch):
    # fullgraph=True fails on any graph break; the call then reaches the
    # operator's real implementation, which refuses these CPU tensors.
    def block(x, w):
        q = (x @ w).view(1, 8, 2, 64).transpose(1, 2)
        return flashcore.attention(q, q, q, causal=True).sum() + flashcore.sdpa(q, q, q, is_causal=True).sum()

    compiled = torch.compile(block, fullgraph=True, backend="eager")
    with pytest.raises(flashcore.InvalidArgumentError, match="q is on the CPU"):
        compiled(torch.zeros(1, 8, 128, dtype=torch.float16), torch.zeros(128, 128, dtype=torch.float16))


def test_compile_takes_inputs_that_require_grad(torch, monkeypatch):
    # Traced without a graph break, forward and backward, to the real call,
    # which refuses these CPU tensors (test_backward.py runs it on a fake GPU).
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16, requires_grad=True)
    for detach in (False, True):
        with pytest.raises(flashcore.InvalidArgumentError, match="q is on the CPU"):
            torch.compile(lambda q: flashcore.attention(q, q, q, detach=detach), fullgraph=True, backend="eager")(q)


@pytest.mark.parametrize("order", ["flashcore first", "torch first"])
def test_operator_whatever_the_import_order(torch, order):
    imports = "import flashcore, torch" if order == "flashcore first" else "import torch, flashcore"
    code = "\n".join([
        imports,
        "import sys",
        "print(hasattr(torch.ops.flashcore, 'forward'))",
        "q = torch.empty(1, 2, 16, 64, dtype=torch.float16)",
        "class M(torch.nn.Module):",
        "    def forward(self, q): return flashcore.attention(q, q, q)",
        "program = torch.export.export(M(), (q,))",
        "print(sum(n.target is torch.ops.flashcore.forward.default for n in program.graph.nodes))",
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashcore.__file__))]
                                                      + sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    registered_at_import, traced = proc.stdout.split()
    assert registered_at_import == str(order == "torch first") and traced == "1"


def flashcore_semantics(torch, q, k, v, causal=False, softmax_scale=None, window=None):
    """flashcore.attention's result by flashcore.h's rules, in float64 on the
    CPU: [B, H, S, D] arrays, key/value head h // (Hq / Hkv), query i seeing
    key j iff i + d - left <= j <= i + d + right (d = Sk - Sq; -1 drops a
    side; causal is right = 0); rows that see no key give 0."""
    sq, sk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        mask &= j >= i + sk - sq - left
    if right >= 0:
        mask &= j <= i + sk - sq + right
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("q_shape,kv_shape,gqa", [
    ((2, 4, 30, 16), (2, 4, 30, 16), False),
    ((1, 8, 40, 16), (1, 2, 13, 16), True),  # Sq > Sk
    ((2, 4, 5, 16), (2, 4, 31, 16), False),  # Sq < Sk
    ((1, 6, 1, 16), (1, 6, 9, 16), False),  # one query
    ((3, 12, 16), (3, 20, 16), False),
    ((2, 4, 20, 16), (1, 1, 11, 16), False),
])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_computes_pytorch_s_result_with_flashcore_s_masks(torch, monkeypatch, q_shape, kv_shape, gqa, is_causal):
    # flashcore.attention replaced by its semantics in float64: what sdpa
    # asks of it must be PyTorch's result (top-left is_causal included).
    monkeypatch.setattr(_dropin, "attention", lambda q, k, v, **kwargs: flashcore_semantics(torch, q, k, v, **kwargs))
    g = torch.Generator().manual_seed(sum(q_shape) + sum(kv_shape))
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in (q_shape, kv_shape, kv_shape))
    ours = flashcore.sdpa(q, k, v, is_causal=is_causal, scale=0.3, enable_gqa=gqa)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3,
                                                              enable_gqa=gqa)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------
# One planning path (issue 33): a repeated call on torch tensors is planned
# once, by the full path, under its one key; the Python quick path
# (_plan.launch_plain) and the compiled one (flashcore/_fastcall.c) run
# that plan. On CPU tensors described as device 0's, queued nowhere.
# --------------------------------------------------------------------------


@pytest.fixture
def queued_as_on_a_gpu(torch, fake_gpu, monkeypatch):
    """(path, params) of each call queued, path "launch" (launch()),
    "launch_plain" or "compiled", for calls on CPU tensors planned as a
    GPU's would be."""
    import ctypes

    from flashcore import _attention, _ffi, _plan
    queued = fake_gpu.queued
    api = _plan.torch_api()
    monkeypatch.setitem(_plan._handles, 0, fake_gpu)
    forward_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_ffi.flashcore_forward_params),
                                    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)

    @forward_type
    def compiled_forward(raw_handle, params, *unused):
        queued.append(("compiled", _ffi.flashcore_forward_params.from_buffer_copy(params.contents)))
        return 0

    module = _plan.load(api, _plan._kept_workspaces, ctypes.cast(compiled_forward, ctypes.c_void_p).value)
    _attention._fast = module
    yield queued
    if module:
        module.clear()
    _attention._fast = None  # configured again, with flashcore_forward, by the next call


def _without_addresses(params):
    params = type(params).from_buffer_copy(params)
    for field in ("q", "k", "v", "out"):
        setattr(params, field, None)
    return bytes(params)


def test_one_plan_serves_every_path(torch, queued_as_on_a_gpu):
    from flashcore import _attention, _plan
    q = torch.randn(1, 8, 16, 64, dtype=torch.float16)
    k, v = (torch.randn(1, 2, 32, 64, dtype=torch.float16) for _ in range(2))
    outs = [flashcore.attention(q, k, v, causal=True) for _ in range(3)]
    # softcap=0 is softcap=0.0 to the key: the same plan, through the quick path.
    outs.append(flashcore.attention(q, k, v, causal=True, softcap=0))
    assert len(_plan._plans) == 1
    compiled = "compiled" if _attention._fast else "launch_plain"
    assert [path for path, _ in queued_as_on_a_gpu] == ["launch", "launch_plain", compiled, "launch_plain"]
    assert len({_without_addresses(params) for _, params in queued_as_on_a_gpu}) == 1
    for (_, params), out in zip(queued_as_on_a_gpu, outs):
        assert (params.q, params.k, params.v, params.out) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                              out.data_ptr())


def test_one_plan_serves_every_path_with_fp8_kv_and_descales(torch, queued_as_on_a_gpu):
    # Quantized K/V and their descales (issue 36) take the same paths, each
    # call with its own descale tensors.
    from flashcore import _attention, _plan
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    q = torch.randn(2, 8, 16, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 32, 64).to(torch.float8_e4m3fn) for _ in range(2))
    scales = [(torch.rand(2, 2), torch.tensor(0.5)) for _ in range(4)]
    outs = [flashcore.attention(q, k, v, k_descale=k_descale, v_descale=v_descale) for k_descale, v_descale in scales]
    assert len(_plan._plans) == 1 and all(out.dtype == torch.bfloat16 for out in outs)
    compiled = "compiled" if _attention._fast else "launch_plain"
    assert [path for path, _ in queued_as_on_a_gpu] == ["launch", "launch_plain", compiled, compiled]
    templates = set()
    for (_, params), (k_descale, v_descale) in zip(queued_as_on_a_gpu, scales):
        assert (params.kv_dtype, params.k_descale, params.v_descale) == (4, k_descale.data_ptr(), v_descale.data_ptr())
        params.k_descale = params.v_descale = None
        templates.add(_without_addresses(params))
    assert len(templates) == 1


def test_one_plan_serves_every_path_with_fp8_queries(torch, queued_as_on_a_gpu, fp8_queries_checked):
    # fp8 queries (fp8 prefill): out is bfloat16, not q's dtype, on every
    # path (the plan allocates it with torch.empty, never empty_like(q)).
    from flashcore import _attention, _plan
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    q = torch.randn(2, 8, 16, 64).to(torch.float8_e4m3fn)
    k, v = (torch.randn(2, 2, 32, 64).to(torch.float8_e4m3fn) for _ in range(2))
    scales = [torch.rand(2, 2) for _ in range(4)]
    outs = [flashcore.attention(q, k, v, causal=True, q_descale=q_descale) for q_descale in scales]
    (plan,) = _plan._plans.values()
    assert plan.dtype == torch.bfloat16 and not plan.out_like_q
    assert all(out.dtype == torch.bfloat16 and out.shape == q.shape for out in outs)
    compiled = "compiled" if _attention._fast else "launch_plain"
    assert [path for path, _ in queued_as_on_a_gpu] == ["launch", "launch_plain", compiled, compiled]
    templates = set()
    for (_, params), q_descale, out in zip(queued_as_on_a_gpu, scales, outs):
        assert (params.dtype, params.out_dtype, params.q_descale) == (4, 2, q_descale.data_ptr())
        assert params.out == out.data_ptr()
        params.q_descale = None
        templates.add(_without_addresses(params))
    assert len(templates) == 1
    # A given bfloat16 out, on the same paths.
    given = torch.empty(q.shape, dtype=torch.bfloat16)
    assert all(flashcore.attention(q, k, v, causal=True, out=given) is given for _ in range(3))
