"""Quantized (fp8) inputs without a GPU (issue 36): float8_e4m3fn k and v
beside float16/bfloat16 q mapped to flashcore_forward_params (kv_dtype,
strides in one-byte elements, out of q's dtype), and fp8 queries (fp8
prefill: q, k and v all float8_e4m3fn; dtype FP8_E4M3, out bfloat16,
out_dtype BF16); the descale arguments (q_descale, k_descale, v_descale)
mapped to their pointers and strides, what the binding and the library
refuse, the backward pass's refusal, and torch.compile / torch.export of
such calls (the fake implementation's out dtype). Torch CPU tensors are
queued to a fake GPU (fake_gpu in conftest.py); the kernels' results are
checked on the GPU (test_gpu_torch.py, test_gpu_fp8_prefill.py)."""

import pytest

import flashcore
from flashcore import _arrays, _ffi
from fc_testing import FakeCudaArray, FakeDLPackArray, assert_one_graph, need_head_dim, raises_from_library

FP8 = _ffi.Dtype.FP8_E4M3
# DLPack's kDLFloat8_e4m3fn.
DL_FLOAT8_E4M3FN = 10
B, HQ, HKV, SQ, SK, D = 2, 8, 2, 16, 48, 64


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    return torch


def randn(torch, shape, dtype, seed):
    """Seeded standard-normal values on the CPU, drawn in float32 and cast
    to `dtype` (a torch dtype's name)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(getattr(torch, dtype))


def fp8_qkv(torch, dtype="float16", layout="bhsd", b=B, hq=HQ, hkv=HKV, sq=SQ, sk=SK, d=D):
    """q of `dtype`, k and v float8_e4m3fn, [B, H, S, D] (or [B, S, H, D]
    with layout="bshd"), contiguous."""
    def shape(heads, seqlen):
        return (b, heads, seqlen, d) if layout == "bhsd" else (b, seqlen, heads, d)

    return (randn(torch, shape(hq, sq), dtype, 1), randn(torch, shape(hkv, sk), "float8_e4m3fn", 2),
            randn(torch, shape(hkv, sk), "float8_e4m3fn", 3))


def queued_params(fake_gpu):
    """The params of the one call the test queued."""
    ((_, params),) = fake_gpu.queued
    return params


# --------------------------------------------------------------------------
# float8_e4m3fn k and v: kv_dtype, strides in elements, out of q's dtype
# --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fp8_kv_is_kv_dtype_with_strides_in_elements(torch, fake_gpu, dtype, layout):
    need_head_dim(D)
    q, k, v = fp8_qkv(torch, dtype, layout)
    out = flashcore.attention(q, k, v, layout=layout, causal=True)
    assert out.dtype == q.dtype and tuple(out.shape) == tuple(q.shape)
    p = queued_params(fake_gpu)
    assert p.dtype == flashcore.Dtype[{"float16": "FP16", "bfloat16": "BF16"}[dtype]]
    assert (p.kv_dtype, p.out_dtype) == (FP8, 0)
    # One byte per element: the strides are the tensors' own, in elements.
    axes = (0, 1, 2) if layout == "bhsd" else (0, 2, 1)  # batch, heads, seqlen
    for prefix, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        strides = tuple(x.stride(a) for a in axes)
        assert (getattr(p, prefix + "_batch_stride"), getattr(p, prefix + "_head_stride"),
                getattr(p, prefix + "_seq_stride")) == strides, prefix
    assert (p.k, p.v, p.out) == (k.data_ptr(), v.data_ptr(), out.data_ptr())
    for prefix in ("q", "k", "v"):
        assert getattr(p, prefix + "_descale") is None
        assert (getattr(p, prefix + "_descale_batch_stride"), getattr(p, prefix + "_descale_head_stride")) == (0, 0)


def test_fp8_kv_views_keep_their_strides(torch, fake_gpu):
    # A [B, S, Hkv, 80] cache of which the first 64 columns are k: the row
    # and head strides of the view, in bytes as in elements.
    need_head_dim(D)
    q = randn(torch, (B, SQ, HQ, D), "bfloat16", 4)
    cache = randn(torch, (B, SK, HKV, 80), "float8_e4m3fn", 5)
    k, v = cache[..., :D], cache[..., 16:16 + D]
    flashcore.attention(q, k, v, layout="bshd")
    p = queued_params(fake_gpu)
    assert (p.k_batch_stride, p.k_seq_stride, p.k_head_stride) == (SK * HKV * 80, HKV * 80, 80)
    assert p.v == cache.data_ptr() + 16 and p.v_seq_stride == HKV * 80


def test_fp8_kv_from_dlpack(lib):
    # DLPack's kDLFloat8_e4m3fn is float8_e4m3fn, one byte.
    need_head_dim(D)
    info = _arrays.describe(FakeDLPackArray((B, HKV, SK, D), code=DL_FLOAT8_E4M3FN, bits=8, index=1), "k")
    assert (info.dtype, info.itemsize, info.strides[2]) == ("float8_e4m3fn", 1, D)
    q, out = FakeCudaArray((B, HQ, SQ, D), index=0), FakeCudaArray((B, HQ, SQ, D), index=3)
    k, v = (FakeDLPackArray((B, HKV, SK, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in (1, 2))
    p = flashcore.forward_params(q, k, v, out)
    flashcore.check_params(p)
    assert (p.kv_dtype, p.k_batch_stride, p.k_head_stride, p.k_seq_stride) == (FP8, HKV * SK * D, SK * D, D)


# --------------------------------------------------------------------------
# The descale arguments
# --------------------------------------------------------------------------

# name: (descale as made of torch, the (batch, head) strides it maps to)
DESCALE_FORMS = {
    "0-d": (lambda torch: torch.tensor(0.5), (0, 0)),
    "[1]": (lambda torch: torch.tensor([0.5]), (0, 0)),
    "[1, 1]": (lambda torch: torch.tensor([[0.5]]), (0, 0)),
    "[B, Hkv]": (lambda torch: torch.rand(B, HKV), (HKV, 1)),
    "[B, Hkv] expanded from one": (lambda torch: torch.tensor(0.5).expand(B, HKV), (0, 0)),
    "[B, Hkv] expanded per sequence": (lambda torch: torch.rand(B, 1).expand(B, HKV), (1, 0)),
    "[B, Hkv] expanded per head": (lambda torch: torch.rand(1, HKV).expand(B, HKV), (0, 1)),
    "[B, Hkv] transposed": (lambda torch: torch.rand(HKV, B).t(), (1, B)),
    "[B, Hkv] a column of a wider table": (lambda torch: torch.rand(B, 3 * HKV)[:, 1::3], (3 * HKV, 3)),
}


@pytest.mark.parametrize("form", sorted(DESCALE_FORMS))
def test_descale_forms_map_to_their_strides(torch, fake_gpu, form):
    need_head_dim(D)
    make, strides = DESCALE_FORMS[form]
    q, k, v = fp8_qkv(torch)
    k_descale, v_descale = make(torch), torch.rand(B, HKV)
    flashcore.attention(q, k, v, k_descale=k_descale, v_descale=v_descale)
    p = queued_params(fake_gpu)
    assert (p.k_descale, p.v_descale, p.q_descale) == (k_descale.data_ptr(), v_descale.data_ptr(), None)
    assert (p.k_descale_batch_stride, p.k_descale_head_stride) == strides
    assert (p.v_descale_batch_stride, p.v_descale_head_stride) == (HKV, 1)
    assert (p.q_descale_batch_stride, p.q_descale_head_stride) == (0, 0)


def test_descales_of_one_sequence(torch, fake_gpu):
    # B = 1: the batch stride is never stepped along; 0 whatever torch gives.
    need_head_dim(D)
    q, k, v = fp8_qkv(torch, b=1)
    k_descale = torch.rand(1, HKV)
    flashcore.attention(q, k, v, k_descale=k_descale)
    p = queued_params(fake_gpu)
    assert (p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride) == (k_descale.data_ptr(), 0, 1)
    assert p.v_descale is None


def test_descales_on_every_entry_point(torch, fake_gpu):
    need_head_dim(D)
    k_descale, v_descale = torch.tensor([0.25]), torch.rand(3, HKV)
    # attention_varlen: B from cu_seqlens_q (3 sequences).
    q = randn(torch, (30, HQ, D), "float16", 6)
    k, v = (randn(torch, (50, HKV, D), "float8_e4m3fn", seed) for seed in (7, 8))
    cu_q = torch.tensor([0, 10, 10, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 20, 50], dtype=torch.int32)
    out = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 20, 30, k_descale=k_descale, v_descale=v_descale)
    assert out.dtype == torch.float16
    # attention_with_kvcache on a paged fp8 cache (pages of 16 keys, one byte each).
    q = randn(torch, (3, 1, HQ, D), "bfloat16", 9)
    pages = randn(torch, (12, 16, HKV, D), "float8_e4m3fn", 10)
    table = torch.randperm(12).to(torch.int32).view(3, 4)
    lengths = torch.tensor([64, 1, 30], dtype=torch.int32)
    out = flashcore.attention_with_kvcache(q, pages, pages, lengths, block_table=table, k_descale=k_descale,
                                           v_descale=v_descale)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (3, 1, HQ, D)
    # flash_attn_func, FlashAttention 3's keywords.
    q, k, v = fp8_qkv(torch, "bfloat16", "bshd", b=3)
    flashcore.flash_attn_func(q, k, v, causal=True, k_descale=k_descale, v_descale=v_descale)
    varlen, paged, drop_in = (params for _, params in fake_gpu.queued)
    assert (varlen.batch_size, varlen.kv_dtype, varlen.k_seq_stride, varlen.k_head_stride) == (3, FP8, HKV * D, D)
    assert (paged.kv_dtype, paged.page_size, paged.num_pages, paged.k_batch_stride) == (FP8, 16, 12, 16 * HKV * D)
    assert (paged.k_seq_stride, paged.k_head_stride, paged.block_table) == (HKV * D, D, table.data_ptr())
    assert (drop_in.kv_dtype, drop_in.causal, drop_in.k_seq_stride) == (FP8, 1, HKV * D)
    for p in (varlen, paged, drop_in):
        assert (p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride) == (k_descale.data_ptr(), 0, 0)
        assert (p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride) == (v_descale.data_ptr(), HKV, 1)
    # forward_params, for the low-level calls.
    q, k, v = fp8_qkv(torch, b=3)
    p = flashcore.forward_params(q, k, v, torch.empty_like(q), k_descale=k_descale, v_descale=v_descale)
    assert (p.kv_dtype, p.k_descale, p.v_descale_batch_stride) == (FP8, k_descale.data_ptr(), HKV)


@pytest.mark.parametrize("value", [0.5, 2, True], ids=["float", "int", "bool"])
def test_a_python_number_is_refused_naming_the_argument(torch, fake_gpu, value):
    # No hidden allocation: the factors are read on the GPU.
    q, k, v = fp8_qkv(torch)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"k_descale must be None or a float32 CUDA tensor.*"
                       r"pass a tensor instead \(e\.g\. torch\.tensor\(\[") as info:
        flashcore.attention(q, k, v, k_descale=value)
    assert isinstance(info.value, TypeError)
    assert not fake_gpu.queued


@pytest.mark.parametrize("case", ["float64", "float16", "int32", "[B, Hq]", "[Hkv]", "[B, Hkv, 1]", "[B]", "empty"])
def test_descales_of_other_dtypes_and_shapes_are_refused(torch, fake_gpu, case):
    q, k, v = fp8_qkv(torch)
    descale = {
        "float64": torch.rand(B, HKV, dtype=torch.float64), "float16": torch.rand(B, HKV).half(),
        "int32": torch.ones(B, HKV, dtype=torch.int32), "[B, Hq]": torch.rand(B, HQ), "[Hkv]": torch.rand(HKV),
        "[B, Hkv, 1]": torch.rand(B, HKV, 1), "[B]": torch.rand(B), "empty": torch.rand(0),
    }[case]
    with pytest.raises(flashcore.InvalidArgumentError,
                       match=r"v_descale must be None or a float32 CUDA tensor: of one element \(shape \[\] or \[1\]"
                             r".* or of shape \[B, Hkv\] = \[2, 2\] .*; got %s \[" % str(descale.dtype)[6:]):
        flashcore.attention(q, k, v, v_descale=descale)
    assert not fake_gpu.queued


def test_a_descale_in_host_memory_is_refused(lib, torch):
    q, out = FakeCudaArray((B, HQ, SQ, D), index=0), FakeCudaArray((B, HQ, SQ, D), index=3)
    k, v = (FakeDLPackArray((B, HKV, SK, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in (1, 2))
    with pytest.raises(flashcore.InvalidArgumentError, match=r"k_descale is on the CPU; .*k_descale\.cuda\(\)\); "
                       r"k_descale must be None or a float32 CUDA tensor"):
        flashcore.attention(q, k, v, out=out, k_descale=torch.tensor(0.5))
    with pytest.raises(TypeError, match=r"v_descale must be None or a float32 CUDA tensor.*; got list") as info:
        flashcore.attention(q, k, v, out=out, v_descale=[0.5])
    assert isinstance(info.value, flashcore.InvalidArgumentError)


def test_what_the_library_refuses_of_descales(lib):
    # The binding maps; the library says what the fields may not hold.
    need_head_dim(D)
    q, out = FakeCudaArray((B, HQ, SQ, D), index=0), FakeCudaArray((B, HQ, SQ, D), index=3)
    fp8_k, fp8_v = (FakeDLPackArray((B, HKV, SK, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in (1, 2))
    half_k, half_v = FakeCudaArray((B, HKV, SK, D), index=1), FakeCudaArray((B, HKV, SK, D), index=2)
    scale = FakeCudaArray((), typestr="<f4", index=8)
    cases = [
        (flashcore.InvalidArgumentError, "k_descale is set but k and v are not quantized", half_k, half_v,
         dict(k_descale=scale)),
    ]
    for cls, match, k, v, kwargs in cases:
        error = raises_from_library(lib, cls, lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out,
                                                                                                   **kwargs)))
        assert match in error.message
    # q_descale is for fp8 queries: refused under 16-bit q (the library's
    # status and words for it are its own; the binding passes it on).
    with pytest.raises((flashcore.UnsupportedError, flashcore.InvalidArgumentError)) as info:
        flashcore.check_params(flashcore.forward_params(q, fp8_k, fp8_v, out, q_descale=scale))
    assert "q_descale" in info.value.message
    assert info.value.message == lib.cdll.flashcore_last_error_message().decode()
    misaligned = FakeCudaArray((), typestr="<f4", ptr=scale.__cuda_array_interface__["data"][0] + 2)
    error = raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.check_params(
        flashcore.forward_params(q, fp8_k, fp8_v, out, v_descale=misaligned)))
    assert "v_descale" in error.message


def test_what_the_library_refuses_of_fp8_kv(lib):
    # Head dims and strides in whole 16-byte vectors of one-byte elements.
    q, out = FakeCudaArray((B, HQ, SQ, 40), index=0), FakeCudaArray((B, HQ, SQ, 40), index=3)
    k, v = (FakeDLPackArray((B, HKV, SK, 40), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in (1, 2))
    error = raises_from_library(lib, flashcore.UnsupportedError,
                                lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out)))
    assert "multiple of 16" in error.message
    need_head_dim(D)
    q, out = FakeCudaArray((B, HQ, SQ, D), index=0), FakeCudaArray((B, HQ, SQ, D), index=3)
    k, v = (FakeDLPackArray((B, HKV, SK, D), code=DL_FLOAT8_E4M3FN, bits=8, strides=(HKV * SK * 72, SK * 72, 72, 1),
                            index=i) for i in (1, 2))
    error = raises_from_library(lib, flashcore.MisalignedError,
                                lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out)))
    assert "k_seq_stride (72)" in error.message


@pytest.mark.parametrize("case", ["q bfloat16, k float16", "k fp8, v float16", "q fp8, k and v float16", "out fp8"])
def test_dtype_combinations_the_binding_refuses(torch, fake_gpu, case):
    q, k, v = fp8_qkv(torch)
    kwargs = {}
    if case == "q bfloat16, k float16":
        # Mixed 16-bit dtypes stay refused.
        q, k, v = q.bfloat16(), k.half(), v.half()
        cls, match = flashcore.InvalidArgumentError, (r"k has dtype float16 but q has bfloat16: all must match \(or k "
                                                      r"and v both float8_e4m3fn: a quantized KV cache\)")
    elif case == "k fp8, v float16":
        v = v.half()
        cls, match = flashcore.InvalidArgumentError, "k has dtype float8_e4m3fn but v has float16: quantized K/V"
    elif case == "q fp8, k and v float16":
        # fp8 queries take fp8 K/V only (test_what_fp8_queries_refuse).
        q, k, v = q.to(torch.float8_e4m3fn), k.half(), v.half()
        cls, match = flashcore.UnsupportedError, ("k has dtype float16 but q has float8_e4m3fn: fp8 queries take "
                                                  "float8_e4m3fn k and v only")
    else:
        kwargs["out"] = torch.empty(q.shape, dtype=torch.float8_e4m3fn)
        cls, match = flashcore.InvalidArgumentError, "out has dtype float8_e4m3fn but q has float16: all must match$"
    with pytest.raises(cls, match=match):
        flashcore.attention(q, k, v, **kwargs)
    assert not fake_gpu.queued


# --------------------------------------------------------------------------
# No backward pass: fp8 K/V are for inference only
# --------------------------------------------------------------------------


def test_a_call_to_differentiate_is_refused(torch, fake_gpu, monkeypatch):
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    need_head_dim(D)
    q, k, v = fp8_qkv(torch)
    k_descale = torch.tensor(0.5)
    inference_only = r"float8_e4m3fn: an fp8 KV cache, for inference only\) are not computed.*detach=True"
    q.requires_grad_(True)
    for call in (lambda: flashcore.attention(q, k, v, k_descale=k_descale),
                 lambda: flashcore.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
                 lambda: flashcore.attention(q.detach(), k.requires_grad_(True), v)):
        with pytest.raises(flashcore.UnsupportedError, match=inference_only):
            call()
    k.requires_grad_(False)
    assert not fake_gpu.queued
    # The operator itself, called to be differentiated: its autograd
    # formula refuses once the forward has run.
    with pytest.raises(flashcore.UnsupportedError, match=inference_only):
        torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", False, None, None, None,
                                    0.0, True)
    fake_gpu.queued.clear()
    # From the values alone: detach=True, torch.no_grad(), FLASHCORE_DETACH=1.
    assert not flashcore.attention(q, k, v, k_descale=k_descale, detach=True).requires_grad
    with torch.no_grad():
        assert not flashcore.attention(q, k, v, k_descale=k_descale).requires_grad
    monkeypatch.setenv("FLASHCORE_DETACH", "1")
    assert not flashcore.attention(q, k, v).requires_grad
    assert [params.kv_dtype for _, params in fake_gpu.queued] == [FP8] * 3
    assert not fake_gpu.backward_params()


def test_an_operator_call_takes_torch_descales_only(torch, fake_gpu, monkeypatch):
    # A call to differentiate is the torch operator, whose schema takes tensors.
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    q, k, v = fp8_qkv(torch)
    q, k, v = q.requires_grad_(True), k.half(), v.half()
    with pytest.raises(TypeError, match="k_descale must be None or a torch tensor where q, k, v or sinks requires "
                                        "grad"):
        flashcore.attention(q, k, v, k_descale=FakeCudaArray((), typestr="<f4", index=8))
    with pytest.raises(flashcore.InvalidArgumentError, match="pass a tensor instead"):
        flashcore.attention(q, k, v, v_descale=0.5)
    assert not fake_gpu.queued


def test_backward_params_refuse_fp8_kv(lib):
    arrays = [FakeCudaArray((1, 4, 16, D), index=i) for i in range(9)]
    arrays[1], arrays[2] = (FakeDLPackArray((1, 4, 16, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in (1, 2))
    arrays[5] = FakeCudaArray((1, 4, 16), typestr="<f4", index=5)
    with pytest.raises(flashcore.UnsupportedError, match="k has dtype float8_e4m3fn: gradients through quantized K/V"):
        flashcore.backward_params(*arrays)


# --------------------------------------------------------------------------
# torch.export and torch.compile (fullgraph: no graph break)
# --------------------------------------------------------------------------


def test_export_gives_out_of_q_s_dtype_and_passes_the_descales(torch):
    def model(q, k, v, k_descale, v_descale):
        return (flashcore.attention(q, k, v, causal=True, k_descale=k_descale, v_descale=v_descale),
                flashcore.attention(q, k, v))

    class Module(torch.nn.Module):
        def forward(self, *args):
            return model(*args)

    q, k, v = fp8_qkv(torch, "bfloat16")
    with torch.no_grad():
        program = torch.export.export(Module(), (q, k, v, torch.tensor(0.5), torch.rand(B, HKV)))
    calls = [n for n in program.graph.nodes if n.target is torch.ops.flashcore.forward.default]
    assert len(calls) == 2
    for node in program.graph.output_node().args[0]:
        out = node.meta["val"]
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(q.shape)
    descaled, plain = calls
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    assert descaled.args[17] is None and list(descaled.args[18:]) == placeholders[3:5]
    assert len(plain.args) <= 17  # a call without descales is traced as before they existed


def test_compile_traces_fp8_kv_without_graph_breaks(torch):
    # fullgraph=True fails on any graph break; the call then reaches the
    # operator's real implementation, which refuses these CPU tensors.
    def block(x, w, k, v, k_descale, v_descale):
        q = (x @ w).view(1, 8, HQ, D).transpose(1, 2)
        return flashcore.attention(q, k, v, causal=True, k_descale=k_descale, v_descale=v_descale).float().sum()

    args = (torch.zeros(1, 8, HQ * D, dtype=torch.float16), torch.zeros(HQ * D, HQ * D, dtype=torch.float16),
            *fp8_qkv(torch, b=1)[1:], torch.tensor(0.5), torch.rand(1, HKV))
    torch._dynamo.reset()
    with pytest.raises(flashcore.InvalidArgumentError, match="q is on the CPU"):
        torch.compile(block, fullgraph=True, backend="eager")(*args)


def test_compile_refuses_a_python_number_descale(torch):
    q, k, v = fp8_qkv(torch)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"k_descale must be None or a float32 CUDA tensor.*pass a tensor instead"):
        torch.compile(lambda q, k, v: flashcore.attention(q, k, v, k_descale=0.5), fullgraph=True,
                      backend="eager")(q, k, v)


def test_compiled_calls_queue_fp8_kv_and_descales(torch, fake_gpu, monkeypatch):
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    need_head_dim(D)

    def calls(q, k, v, k_descale, v_descale, lengths):
        return (flashcore.attention(q, k, v, k_descale=k_descale, v_descale=v_descale, return_lse=True),
                flashcore.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), lengths,
                                                 causal=True, k_descale=k_descale))

    q, k, v = fp8_qkv(torch, "bfloat16")
    k_descale, v_descale = torch.rand(B, HKV), torch.tensor(0.5).expand(B, HKV)
    lengths = torch.tensor([SK, 7], dtype=torch.int32)
    assert_one_graph(torch, calls, q, k, v, k_descale, v_descale, lengths)
    fake_gpu.queued.clear()
    (out, lse), cached = torch.compile(calls, fullgraph=True, backend="eager")(q, k, v, k_descale, v_descale,
                                                                              lengths)
    assert out.dtype == cached.dtype == torch.bfloat16 and lse.dtype == torch.float32
    dense, kvcache = (params for _, params in fake_gpu.queued)
    for p in (dense, kvcache):
        assert (p.kv_dtype, p.k_descale) == (FP8, k_descale.data_ptr())
        assert (p.k_descale_batch_stride, p.k_descale_head_stride) == (HKV, 1)
    assert (dense.v_descale, dense.v_descale_batch_stride, dense.v_descale_head_stride) == (v_descale.data_ptr(), 0, 0)
    assert kvcache.v_descale is None and kvcache.seqused_k == lengths.data_ptr()
    # Where q requires grad, the traced call is refused as the eager one is.
    torch._dynamo.reset()
    with pytest.raises(Exception, match="for inference only"):
        torch.compile(calls, fullgraph=True, backend="eager")(q.requires_grad_(True), k, v, k_descale, v_descale,
                                                              lengths)


# --------------------------------------------------------------------------
# fp8 queries (fp8 prefill, as FlashAttention 3's fp8 forward): q, k and v
# all float8_e4m3fn, each with its descale; out bfloat16. The library's
# verdict on whether it runs them (sm_90a kernels only) is set aside by
# fp8_queries_checked (conftest.py) where a test queues such calls.
# --------------------------------------------------------------------------

BF16 = _ffi.Dtype.BF16
# DLPack's kDLBfloat.
DL_BFLOAT = 4


def fp8_queries(torch, layout="bhsd", **kwargs):
    """q, k and v all float8_e4m3fn (fp8_qkv's shapes)."""
    return fp8_qkv(torch, "float8_e4m3fn", layout, **kwargs)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_fp8_queries_are_dtype_fp8_with_a_bfloat16_out(torch, fake_gpu, fp8_queries_checked, layout):
    need_head_dim(D)
    q, k, v = fp8_queries(torch, layout)
    out, lse = flashcore.attention(q, k, v, layout=layout, causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(q.shape)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (B, HQ, SQ)
    p = queued_params(fake_gpu)
    # dtype FP8_E4M3 (q, k and v); kv_dtype 0, "q's"; out_dtype BF16, said
    # outright though 0 means the same for fp8 queries.
    assert (p.dtype, p.kv_dtype, p.out_dtype) == (FP8, 0, BF16)
    assert (p.q, p.k, p.v, p.out, p.lse) == (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
    # Strides in elements: one byte each for q, k and v, two for out.
    axes = (0, 1, 2) if layout == "bhsd" else (0, 2, 1)  # batch, heads, seqlen
    for prefix, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        strides = tuple(x.stride(a) for a in axes)
        assert (getattr(p, prefix + "_batch_stride"), getattr(p, prefix + "_head_stride"),
                getattr(p, prefix + "_seq_stride")) == strides, prefix
    assert (p.causal, p.head_dim, p.num_heads_q, p.num_heads_kv) == (1, D, HQ, HKV)
    for prefix in ("q", "k", "v"):
        assert getattr(p, prefix + "_descale") is None


def test_fp8_queries_given_out(torch, fake_gpu, fp8_queries_checked):
    # A bfloat16 out= is written in place, any strides the C API takes.
    need_head_dim(D)
    q, k, v = fp8_queries(torch, "bshd")
    wide = torch.empty(B, SQ, HQ, 2 * D, dtype=torch.bfloat16)
    out = wide[..., D:]
    assert flashcore.attention(q, k, v, layout="bshd", out=out) is out
    p = queued_params(fake_gpu)
    assert (p.out, p.out_seq_stride, p.out_head_stride, p.out_dtype) == (out.data_ptr(), HQ * 2 * D, 2 * D, BF16)


@pytest.mark.parametrize("form", sorted(DESCALE_FORMS))
def test_q_descale_forms_map_to_their_strides(torch, fake_gpu, fp8_queries_checked, form):
    # q_descale is indexed by (batch, K/V head), as FlashAttention 3's: [B,
    # Hkv] with Hq = 8 query heads over Hkv = 2.
    need_head_dim(D)
    make, strides = DESCALE_FORMS[form]
    q, k, v = fp8_queries(torch)
    q_descale, k_descale, v_descale = make(torch), torch.tensor([0.25]), torch.rand(B, HKV)
    flashcore.attention(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    p = queued_params(fake_gpu)
    assert (p.q_descale, p.k_descale, p.v_descale) == (q_descale.data_ptr(), k_descale.data_ptr(),
                                                       v_descale.data_ptr())
    assert (p.q_descale_batch_stride, p.q_descale_head_stride) == strides
    assert (p.k_descale_batch_stride, p.k_descale_head_stride) == (0, 0)
    assert (p.v_descale_batch_stride, p.v_descale_head_stride) == (HKV, 1)


def test_q_descale_per_query_head_is_refused(torch, fake_gpu):
    # [B, Hq] is no form of it: one factor per K/V head (the group's).
    q, k, v = fp8_queries(torch)
    with pytest.raises(flashcore.InvalidArgumentError,
                       match=r"q_descale must be None or a float32 CUDA tensor: .* or of shape \[B, Hkv\] = \[2, 2\] "
                             r".*; got float32 \[2, 8\]"):
        flashcore.attention(q, k, v, q_descale=torch.rand(B, HQ))
    with pytest.raises(flashcore.InvalidArgumentError, match="q_descale must be None .*pass a tensor instead"):
        flashcore.attention(q, k, v, q_descale=0.5)
    assert not fake_gpu.queued


def test_fp8_queries_on_every_entry_point(torch, fake_gpu, fp8_queries_checked):
    need_head_dim(D)
    q_descale, k_descale, v_descale = torch.rand(3, HKV), torch.tensor(0.5), torch.tensor([0.25])
    descales = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    # attention_varlen: B from cu_seqlens_q (3 sequences), lse [Hq, total_q].
    q = randn(torch, (30, HQ, D), "float8_e4m3fn", 6)
    k, v = (randn(torch, (50, HKV, D), "float8_e4m3fn", seed) for seed in (7, 8))
    cu_q = torch.tensor([0, 10, 10, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 20, 50], dtype=torch.int32)
    out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 20, 30, causal=True, return_lse=True, **descales)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (30, HQ, D) and tuple(lse.shape) == (HQ, 30)
    # attention_with_kvcache: chunked prefill against a contiguous fp8
    # cache, and against a paged one.
    q = randn(torch, (3, 16, HQ, D), "float8_e4m3fn", 9)
    cache = randn(torch, (3, 64, HKV, D), "float8_e4m3fn", 10)
    lengths = torch.tensor([64, 16, 30], dtype=torch.int32)
    out = flashcore.attention_with_kvcache(q, cache, cache, lengths, causal=True, **descales)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (3, 16, HQ, D)
    pages = randn(torch, (12, 16, HKV, D), "float8_e4m3fn", 11)
    table = torch.randperm(12).to(torch.int32).view(3, 4)
    out = flashcore.attention_with_kvcache(q, pages, pages, lengths, block_table=table, causal=True, **descales)
    assert out.dtype == torch.bfloat16
    # flash_attn_func, FlashAttention 3's inputs and keywords.
    q, k, v = fp8_queries(torch, "bshd", b=3)
    out = flashcore.flash_attn_func(q, k, v, causal=True, window_size=(8, 0), **descales)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(q.shape)
    varlen, cached, paged, drop_in = (params for _, params in fake_gpu.queued)
    assert (varlen.batch_size, varlen.total_seqlen_q, varlen.q_seq_stride, varlen.q_head_stride) == (3, 30, HQ * D, D)
    assert (cached.seqlen_q, cached.q_seq_stride, cached.k_batch_stride) == (16, HQ * D, 64 * HKV * D)
    assert cached.seqused_k == paged.seqused_k == lengths.data_ptr()
    assert (paged.page_size, paged.num_pages, paged.block_table) == (16, 12, table.data_ptr())
    assert (drop_in.causal, drop_in.use_window, drop_in.window_left, drop_in.window_right) == (1, 1, 8, 0)
    for p in (varlen, cached, paged, drop_in):
        assert (p.dtype, p.kv_dtype, p.out_dtype) == (FP8, 0, BF16)
        assert (p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride) == (q_descale.data_ptr(), HKV, 1)
        assert (p.k_descale, p.v_descale) == (k_descale.data_ptr(), v_descale.data_ptr())
    # forward_params, for the low-level calls.
    q, k, v = fp8_queries(torch, b=3)
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    p = flashcore.forward_params(q, k, v, out, **descales)
    assert (p.dtype, p.kv_dtype, p.out_dtype, p.q_descale) == (FP8, 0, BF16, q_descale.data_ptr())


def test_fp8_queries_from_dlpack(lib):
    # DLPack's kDLFloat8_e4m3fn q, k, v and a kDLBfloat out.
    q, k, v = (FakeDLPackArray((B, h, s, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i)
               for i, (h, s) in enumerate(((HQ, SQ), (HKV, SK), (HKV, SK))))
    out = FakeDLPackArray((B, HQ, SQ, D), code=DL_BFLOAT, bits=16, index=3)
    scale = FakeCudaArray((B, HKV), typestr="<f4", index=8)
    p = flashcore.forward_params(q, k, v, out, q_descale=scale)
    assert (p.dtype, p.kv_dtype, p.out_dtype) == (FP8, 0, BF16)
    assert (p.q_batch_stride, p.q_head_stride, p.q_seq_stride) == (HQ * SQ * D, SQ * D, D)
    assert (p.out_batch_stride, p.out_head_stride, p.out_seq_stride) == (HQ * SQ * D, SQ * D, D)
    assert (p.q_descale_batch_stride, p.q_descale_head_stride) == (HKV, 1)
    # An out of another dtype: a float16 __cuda_array_interface__ one.
    with pytest.raises(flashcore.UnsupportedError, match="out has dtype float16: float8_e4m3fn queries give a "
                                                         "bfloat16 result"):
        flashcore.forward_params(q, k, v, FakeCudaArray((B, HQ, SQ, D), index=3))


def test_the_library_s_verdict_on_fp8_queries(lib):
    # The params the binding builds for fp8 queries are the library's to
    # take or refuse: a library with fp8 prefill takes them (whatever the
    # GPU, before looking at it) where its build has the sm_90a kernels; a
    # build without them, or an older library, refuses them as UNSUPPORTED.
    # Never another status: the fields are well formed.
    need_head_dim(D)
    q, k, v = (FakeDLPackArray((B, h, s, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i)
               for i, (h, s) in enumerate(((HQ, SQ), (HKV, SK), (HKV, SK))))
    out = FakeDLPackArray((B, HQ, SQ, D), code=DL_BFLOAT, bits=16, index=3)
    scale = FakeCudaArray((), typestr="<f4", index=8)
    params = flashcore.forward_params(q, k, v, out, causal=True, q_descale=scale, k_descale=scale, v_descale=scale)
    try:
        flashcore.check_params(params)
    except flashcore.UnsupportedError as e:
        assert e.message == lib.cdll.flashcore_last_error_message().decode()


@pytest.mark.parametrize("case", ["k and v float16", "k and v bfloat16", "k fp8, v bfloat16", "k bfloat16, v fp8",
                                  "out float16", "out fp8", "out float32", "softcap", "softcap, flash_attn_func"])
def test_what_fp8_queries_refuse(torch, fake_gpu, case):
    # Refused by the binding before anything is allocated or queued (the
    # library refuses 16-bit K/V, another out_dtype and softcap under fp8
    # queries too, as UNSUPPORTED: the binding's errors say the same).
    q, k, v = fp8_queries(torch)
    kwargs, call = {}, flashcore.attention
    only = "fp8 queries take float8_e4m3fn k and v only"
    if case.startswith("k and v"):
        dtype = case.split()[-1]
        k, v = k.to(getattr(torch, dtype)), v.to(getattr(torch, dtype))
        cls, match = flashcore.UnsupportedError, "k has dtype %s but q has float8_e4m3fn: %s" % (dtype, only)
    elif case.startswith("k fp8"):
        v = v.bfloat16()
        cls, match = flashcore.InvalidArgumentError, ("k has dtype float8_e4m3fn but v has bfloat16: with "
                                                      "float8_e4m3fn queries both must be float8_e4m3fn")
    elif case.startswith("k bfloat16"):
        k = k.bfloat16()
        cls, match = flashcore.InvalidArgumentError, "k has dtype bfloat16 but v has float8_e4m3fn"
    elif case.startswith("out"):
        dtype = {"fp8": "float8_e4m3fn"}.get(case.split()[-1], case.split()[-1])
        kwargs["out"] = torch.empty(tuple(q.shape), dtype=getattr(torch, dtype))
        cls, match = flashcore.UnsupportedError, (r"out has dtype %s: float8_e4m3fn queries give a bfloat16 result "
                                                  r"\(as FlashAttention 3's fp8 forward\); pass a bfloat16 out" % dtype)
    else:
        kwargs["softcap"] = 30.0
        cls, match = flashcore.UnsupportedError, r"softcap is not supported with fp8 \(float8_e4m3fn\) queries"
        if "flash_attn_func" in case:
            q, k, v = fp8_queries(torch, "bshd")
            call = flashcore.flash_attn_func
    with pytest.raises(cls, match=match):
        call(q, k, v, **kwargs)
    assert not fake_gpu.queued


def test_fp8_queries_are_not_differentiated(torch, fake_gpu, fp8_queries_checked, monkeypatch):
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    need_head_dim(D)
    q, k, v = fp8_queries(torch)
    q_descale = torch.tensor(0.5)
    inference_only = r"gradients through fp8 queries \(float8_e4m3fn q, k and v: fp8 prefill, for inference only\) " \
                     r"are not computed.*detach=True"
    for call in (lambda: flashcore.attention(q.requires_grad_(True), k, v, q_descale=q_descale),
                 lambda: flashcore.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
                 lambda: flashcore.attention(q.detach(), k, v.requires_grad_(True)),
                 # fp8 queries beside 16-bit K/V that require grad: the
                 # gradients' refusal comes first.
                 lambda: flashcore.attention(q, k.bfloat16().requires_grad_(True), v.bfloat16())):
        with pytest.raises(flashcore.UnsupportedError, match=inference_only):
            call()
    v.requires_grad_(False)
    assert not fake_gpu.queued
    # The operator itself, called to be differentiated: its autograd
    # formula refuses once the forward has run.
    with pytest.raises(flashcore.UnsupportedError, match=inference_only):
        torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", False, None, None, None,
                                    0.0, True)
    fake_gpu.queued.clear()
    # From the values alone: detach=True, torch.no_grad(), FLASHCORE_DETACH=1.
    results = [flashcore.attention(q, k, v, q_descale=q_descale, detach=True)]
    with torch.no_grad():
        results.append(flashcore.attention(q, k, v, q_descale=q_descale))
    monkeypatch.setenv("FLASHCORE_DETACH", "1")
    results.append(flashcore.attention(q, k, v))
    assert all(not r.requires_grad and r.dtype == torch.bfloat16 for r in results)
    assert [(p.dtype, p.out_dtype) for _, p in fake_gpu.queued] == [(FP8, BF16)] * 3
    assert not fake_gpu.backward_params()


def test_backward_params_refuse_fp8_queries(lib):
    arrays = [FakeDLPackArray((1, 4, 16, D), code=DL_FLOAT8_E4M3FN, bits=8, index=i) for i in range(3)]
    arrays += [FakeCudaArray((1, 4, 16, D), index=i) for i in range(3, 9)]
    arrays[5] = FakeCudaArray((1, 4, 16), typestr="<f4", index=5)
    with pytest.raises(flashcore.UnsupportedError, match="q has dtype float8_e4m3fn: gradients through fp8 queries"):
        flashcore.backward_params(*arrays)


def test_export_gives_a_bfloat16_out_for_fp8_queries(torch):
    # The operator's fake implementation: out bfloat16 for fp8 queries (q's
    # dtype otherwise), lse float32; the descales are tensor arguments.
    def model(q, k, v, q_descale, k_descale, v_descale, q16):
        return (flashcore.attention(q, k, v, causal=True, return_lse=True, q_descale=q_descale, k_descale=k_descale,
                                    v_descale=v_descale),
                flashcore.attention(q16, k, v, k_descale=k_descale))

    class Module(torch.nn.Module):
        def forward(self, *args):
            return model(*args)

    q, k, v = fp8_queries(torch)
    args = (q, k, v, torch.rand(B, HKV), torch.tensor(0.5), torch.rand(B, HKV), q.half())
    with torch.no_grad():
        program = torch.export.export(Module(), args)
    fp8_call, kv_call = [n for n in program.graph.nodes if n.target is torch.ops.flashcore.forward.default]
    out, lse, kv_out = (node.meta["val"] for node in program.graph.output_node().args[0])
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(q.shape)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (B, HQ, SQ)
    assert kv_out.dtype == torch.float16
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    assert fp8_call.args[0] is placeholders[0] and list(fp8_call.args[17:20]) == placeholders[3:6]
    assert kv_call.args[0] is placeholders[6]


def test_compile_traces_fp8_queries_without_graph_breaks(torch):
    # fullgraph=True fails on any graph break; the call then reaches the
    # operator's real implementation, which refuses these CPU tensors.
    def block(q, k, v, q_descale):
        return flashcore.attention(q, k, v, causal=True, q_descale=q_descale).float().sum()

    torch._dynamo.reset()
    with pytest.raises(flashcore.InvalidArgumentError, match="q is on the CPU"):
        torch.compile(block, fullgraph=True, backend="eager")(*fp8_queries(torch, b=1), torch.rand(1, HKV))


@pytest.mark.parametrize("case", ["softcap", "k and v float16", "out float16"])
def test_compile_refuses_what_fp8_queries_do_not_take(torch, case):
    # Traced, as eager: the error the eager call gives (out= would
    # otherwise be copied into whatever its dtype).
    q, k, v = fp8_queries(torch)
    kwargs = {}
    if case == "softcap":
        kwargs["softcap"] = 30.0
        match = r"softcap is not supported with fp8 \(float8_e4m3fn\) queries"
    elif case == "k and v float16":
        k, v = k.half(), v.half()
        match = "k has dtype float16 but q has float8_e4m3fn: fp8 queries take float8_e4m3fn k and v only"
    else:
        kwargs["out"] = torch.empty(tuple(q.shape), dtype=torch.float16)
        match = "out has dtype float16: float8_e4m3fn queries give a bfloat16 result"
    torch._dynamo.reset()
    with pytest.raises(Exception, match=match):
        torch.compile(lambda q, k, v: flashcore.attention(q, k, v, **kwargs), fullgraph=True, backend="eager")(q, k, v)


def test_compiled_calls_queue_fp8_queries(torch, fake_gpu, fp8_queries_checked, monkeypatch):
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    need_head_dim(D)

    def calls(q, k, v, q_descale, k_descale, lengths):
        out = torch.empty(tuple(q.shape), dtype=torch.bfloat16)
        return (flashcore.attention(q, k, v, q_descale=q_descale, k_descale=k_descale, return_lse=True),
                flashcore.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), lengths,
                                                 causal=True, q_descale=q_descale, out=out.transpose(1, 2)))

    q, k, v = fp8_queries(torch)
    q_descale, k_descale = torch.rand(B, HKV), torch.tensor(0.5).expand(B, HKV)
    lengths = torch.tensor([SK, 7], dtype=torch.int32)
    assert_one_graph(torch, calls, q, k, v, q_descale, k_descale, lengths)
    fake_gpu.queued.clear()
    (out, lse), cached = torch.compile(calls, fullgraph=True, backend="eager")(q, k, v, q_descale, k_descale, lengths)
    assert out.dtype == cached.dtype == torch.bfloat16 and lse.dtype == torch.float32
    dense, kvcache = (params for _, params in fake_gpu.queued)
    for p in (dense, kvcache):
        assert (p.dtype, p.kv_dtype, p.out_dtype) == (FP8, 0, BF16)
        assert (p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride) == (q_descale.data_ptr(), HKV, 1)
    assert (dense.k_descale, dense.k_descale_batch_stride, dense.k_descale_head_stride) == (k_descale.data_ptr(), 0, 0)
    assert kvcache.k_descale is None and kvcache.seqused_k == lengths.data_ptr()
