"""Quantized (fp8) K/V without a GPU (issue 36): float8_e4m3fn k and v
beside float16/bfloat16 q mapped to flashcore_forward_params (kv_dtype,
strides in one-byte elements, out of q's dtype), the descale arguments
(q_descale, k_descale, v_descale) mapped to their pointers and strides,
what the binding and the library refuse, the backward pass's refusal, and
torch.compile / torch.export of such calls. Torch CPU tensors are queued
to a fake GPU (fake_gpu in conftest.py); the kernels' results are checked
on the GPU (test_gpu_torch.py)."""

import pytest

import flashcore
from flashcore import _arrays, _ffi
from fc_testing import FakeCudaArray, FakeDLPackArray, need_head_dim, raises_from_library

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
        (flashcore.UnsupportedError, "q_descale is for fp8 queries", fp8_k, fp8_v, dict(q_descale=scale)),
        (flashcore.InvalidArgumentError, "k_descale is set but k and v are not quantized", half_k, half_v,
         dict(k_descale=scale)),
    ]
    for cls, match, k, v, kwargs in cases:
        error = raises_from_library(lib, cls, lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out,
                                                                                                   **kwargs)))
        assert match in error.message
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


@pytest.mark.parametrize("case", ["q bfloat16, k float16", "k fp8, v float16", "q fp8", "out fp8"])
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
    elif case == "q fp8":
        q = q.to(torch.float8_e4m3fn)
        cls, match = flashcore.UnsupportedError, "q has dtype float8_e4m3fn; flashcore computes on float16 or bfloat16"
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
    with pytest.raises(TypeError, match="k_descale must be None or a torch tensor where q, k or v requires grad"):
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
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(calls)(q, k, v, k_descale, v_descale, lengths)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    fake_gpu.queued.clear()
    torch._dynamo.reset()
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
