"""GPU tests with PyTorch: flashcore.attention against
torch.nn.functional.scaled_dot_product_attention in float64.

Tolerance: the relative L2 error of our output against the float64
reference must be within twice what torch's own float16/bfloat16 SDPA gets
against the same reference (or twice the error of merely rounding the
reference to that dtype, whichever is larger). SDPA has no softcap: with
one, torch's error is that of the same math done by torch at the kernels'
precision (see torch_low_precision), as with learnable sinks (the sink
logit one more column of each row's scores, as gpt-oss's reference
computes them). With fp8 K/V the reference is computed from the
dequantized K/V (k_descale * k, exact in float64), and torch's SDPA runs on
them rounded to q's dtype."""

import math
import threading

import pytest

import flashcore
from fc_testing import assert_one_graph, covering_pair, cuda_randn, gpu_head_dims, head_dim_id, need_head_dim

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16"]
SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (2, 4, 4, 128, 128),
    (1, 8, 2, 77, 133),  # grouped-query, odd lengths
    (2, 6, 1, 150, 61),  # multi-query; causal rows that see no key
    (3, 2, 2, 1, 257),  # one query row
    (1, 4, 2, 300, 300),  # several tiles
]
# Every (head_dim, head_dim_v) pair of the build, dims that round up to a
# larger kernel, and (192, 128).
HEAD_DIMS = gpu_head_dims()
NAN = float("nan")


@pytest.fixture
def torch(torch_cuda):
    return torch_cuda


def qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=0, dv=None):
    """[B, H, S, D] q and k, and v with head_dim_v dv (default d)."""
    return (cuda_randn(torch, (b, hq, sq, d), dtype, seed), cuda_randn(torch, (b, hkv, sk, d), dtype, seed + 1),
            cuda_randn(torch, (b, hkv, sk, d if dv is None else dv), dtype, seed + 2))


def visible(torch, sq, sk):
    """Bottom-right aligned causal mask: query i sees key j iff j <= i + sk - sq."""
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    return j <= i + (sk - sq)


def window_visible(torch, sq, sk, causal, window, device="cuda", chunk=0):
    """The [sq, sk] mask of causal, window=(left, right) and attention_chunk,
    built by flashcore.h's rule rather than from visible(): query i sees
    key j only where i + d - left <= j <= i + d + right, d = sk - sq, a
    bound of -1 dropping its side; causal is right = 0; with a chunk, only
    where j and the diagonal i + d are in the same chunk (floor division:
    a diagonal below key 0 is in no key's chunk). None where nothing is
    masked."""
    if window is None and not causal and not chunk:
        return None
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0  # the library takes only -1 or 0 with causal
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diagonal = i + (sk - sq)
    mask = torch.ones((sq, sk), dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= diagonal - left
    if right >= 0:
        mask &= j <= diagonal + right
    if chunk:
        mask &= torch.div(j, chunk, rounding_mode="floor") == torch.div(diagonal, chunk, rounding_mode="floor")
    return mask


def expand_kv(k, v, heads_q):
    group = heads_q // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def sink_rows(sinks, like):
    """The float64 sinks [H] as one column per row of like ([B, H, S]: lse's
    shape)."""
    return sinks.double().view(1, -1, 1).expand(like.shape)


def reference(torch, q, k, v, causal, scale, window=None, softcap=0.0, chunk=0, sinks=None):
    """float64 out, lse and the rows that see no key, for [B, H, S, D] views;
    each score s capped as softcap * tanh(s / softcap) where softcap > 0;
    with sinks (float32 [H]), head h's sinks[h] one more term of each row's
    softmax denominator: lse = log(exp(sinks[h]) + sum_j exp(s_j)), out =
    sum_j exp(s_j - lse) v_j (rows that see no key: out 0, lse the sink)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q64 = q.double()
    k64, v64 = expand_kv(k.double(), v.double(), q.shape[1])
    mask = window_visible(torch, q.shape[2], k.shape[2], causal, window, chunk=chunk)
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isneginf(lse)
    if sinks is not None:
        lse = torch.logaddexp(lse, sink_rows(sinks, lse))
    if softcap or sinks is not None:
        # SDPA cannot cap nor take a sink: the softmax by hand (rows whose
        # lse is -inf subtract 0 instead, and weigh nothing).
        weights = torch.exp(scores - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
        out = weights @ v64
    else:
        out = sdpa(q64, k64, v64, attn_mask=mask, scale=scale)
    out = torch.where(empty[..., None], torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out, lse, empty


def torch_low_precision(torch, q, k, v, causal, scale, window=None, softcap=0.0, chunk=0, sinks=None):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    k2, v2 = expand_kv(k, v, q.shape[1])
    sq, sk = q.shape[2], k.shape[2]
    mask = window_visible(torch, sq, sk, causal, window, chunk=chunk)
    if softcap or sinks is not None:
        # What a flash kernel does, in torch: float32 scores of the
        # float16/bfloat16 inputs, capped and softmaxed in float32 (the
        # sink one more column, dropped after), the probabilities rounded
        # to the inputs' dtype for P @ V.
        scores = (q.float() @ k2.float().transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is None:
            return torch.softmax(scores, dim=-1).to(q.dtype) @ v2
        column = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1].to(q.dtype) @ v2
    if causal and sq == sk and window is None and not chunk:
        return sdpa(q, k2, v2, is_causal=True, scale=scale)
    return sdpa(q, k2, v2, attn_mask=mask, scale=scale)


def rel_err(x, ref):
    diff = (x.double() - ref).norm().item()
    norm = ref.norm().item()
    return diff / norm if norm > 0 else diff


def check(torch, out, lse, q, k, v, causal, scale=None, window=None, softcap=0.0, chunk=0, sinks=None):
    """out (and lse, unless None) against the float64 reference; q, k, v, out
    as [B, H, S, D] views. k and v may be of a wider dtype than q's (the
    dequantized values of fp8 K/V, in float64): the reference is computed
    from them, torch's low-precision result from them rounded to q's dtype.
    With sinks, rows that see no key must give lse = their head's sink."""
    torch.cuda.synchronize()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ref, ref_lse, empty = reference(torch, q, k, v, causal, scale, window, softcap, chunk, sinks)
    valid = ~empty
    theirs = rel_err(torch_low_precision(torch, q, k.to(q.dtype), v.to(q.dtype), causal, scale, window,
                                         softcap, chunk, sinks)[valid], ref[valid])
    floor = rel_err(ref.to(q.dtype)[valid], ref[valid])
    assert torch.isfinite(out).all(), "non-finite values in out"
    ours = rel_err(out, ref)
    assert ours <= 2 * max(theirs, floor) + 1e-5, \
        "rel-L2 error %.3g vs torch's %.3g (rounding alone: %.3g)" % (ours, theirs, floor)
    assert (out[empty] == 0).all(), "rows that see no key must be 0"
    if lse is not None:
        assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(ref_lse.shape)
        if sinks is None:
            assert torch.equal(torch.isneginf(lse), empty), "lse must be -inf exactly for rows that see no key"
        else:
            # -inf where no key and no sink (a sink of -inf); the sink itself where no key.
            assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf where it must not be"
            sink = sink_rows(sinks, lse)
            no_key = empty & torch.isfinite(sink)
            if no_key.any():
                err = (lse.double() - sink)[no_key].abs().max().item()
                assert err <= 1e-6 * max(1.0, sink[no_key].abs().max().item()), \
                    "rows that see no key must give lse = their head's sink, off by %.3g" % err
        if valid.any():
            err = (lse.double() - ref_lse)[valid].abs().max().item()
            assert err <= 1e-3 * max(1.0, ref_lse[valid].abs().max().item()), "lse off by %.3g" % err


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_sdpa(torch, dtype, head_dims, causal, shape):
    b, hq, hkv, sq, sk = shape
    d, dv = head_dims
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=d + dv, dv=dv)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (b, hq, sq, dv) and out.dtype == q.dtype and out.device == q.device and out.is_contiguous()
    assert lse.shape == (b, hq, sq) and lse.is_contiguous()
    check(torch, out, lse, q, k, v, causal)


@pytest.mark.parametrize("heads", [16, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_latent_cache(torch, dtype, heads):
    """DeepSeek MLA decode on its latent cache: q of 576 dims, one K/V head of 576 per token, v the cache's first
    512 columns as a view (the same storage), FlashAttention's [B, S, H, D] layout, MLA's softmax scale; then the
    same cache as a paged pool (pages of 64, the table in reverse order) through attention_with_kvcache with
    cache_seqlens. A v of its own at these head dims is refused."""
    if (576, 512) not in flashcore.supported_head_dims():
        pytest.skip("this build has no kernel for head dims (576, 512): %s" % flashcore.supported_head_dims())
    b, sq, pages, sk = 2, 1, 11, 700
    scale = (128 + 64) ** -0.5
    q = cuda_randn(torch, (b, sq, heads, 576), dtype, 70)
    storage = cuda_randn(torch, (b, pages * 64, 1, 576), dtype, 71)
    cache = storage[:, :sk]
    out, lse = flashcore.attention(q, cache, cache[..., :512], layout="bshd", softmax_scale=scale, return_lse=True)
    assert out.shape == (b, sq, heads, 512)
    t = [x.transpose(1, 2) for x in (out, q, cache, cache[..., :512])]
    check(torch, t[0], lse, t[1], t[2], t[3], False, scale=scale)
    pool = storage.view(b * pages, 64, 1, 576)
    table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
    seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    paged = flashcore.attention_with_kvcache(q, pool, pool[..., :512], seqlens, block_table=table,
                                             softmax_scale=scale)
    assert torch.equal(paged, out), "the paged call must give the contiguous call's bits"
    with pytest.raises(flashcore.UnsupportedError, match="pass v = k"):
        flashcore.attention(q, cache, cache[..., :512].clone(), layout="bshd", softmax_scale=scale)


@pytest.mark.parametrize("head_dims", [(128, 128), (192, 128), (80, 80)], ids=head_dim_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bshd_layout(torch, dtype, causal, head_dims):
    b, sq, sk, hq, hkv = 2, 97, 130, 8, 4
    d, dv = head_dims
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 10)
    k, v = cuda_randn(torch, (b, sk, hkv, d), dtype, 11), cuda_randn(torch, (b, sk, hkv, dv), dtype, 12)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, layout="bshd")
    assert out.shape == (b, sq, hq, dv) and out.is_contiguous() and lse.shape == (b, hq, sq)
    t = [x.transpose(1, 2) for x in (out, q, k, v)]
    check(torch, t[0], lse, t[1], t[2], t[3], causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bshd_storage_given_as_bhsd_views(torch, dtype):
    b, sq, sk, hq, hkv, d = 2, 64, 200, 4, 2, 64
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 20).transpose(1, 2)
    k = cuda_randn(torch, (b, sk, hkv, d), dtype, 21).transpose(1, 2)
    v = cuda_randn(torch, (b, sk, hkv, d), dtype, 22).transpose(1, 2)
    assert not q.is_contiguous()
    out = flashcore.attention(q, k, v, causal=True)
    assert out.shape == (b, hq, sq, d)
    check(torch, out, None, q, k, v, True)


@pytest.mark.parametrize("head_dims", [(128, 128), (192, 128), (112, 112)], ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_in_and_out(torch, dtype, head_dims):
    b, hq, hkv, sq, sk = 2, 4, 2, 90, 111
    d, dv = head_dims
    q = cuda_randn(torch, (b, hq, sq, d + 16), dtype, 30)[..., 8:8 + d]  # padded rows, 16-byte offset
    k = cuda_randn(torch, (b, 2 * hkv, sk, d), dtype, 31)[:, ::2]  # every other head
    v = cuda_randn(torch, (b, hkv, sk + 5, dv), dtype, 32)[:, :, 5:]  # starts 5 rows in
    out_storage = torch.full((b, sq, hq, dv + 8), NAN, dtype=q.dtype, device="cuda")
    out = out_storage[..., :dv].transpose(1, 2)  # [B, H, S, Dv] view of padded [B, S, H, Dv]
    result, lse = flashcore.attention(q, k, v, out=out, causal=True, return_lse=True)
    assert result is out
    check(torch, out, lse, q, k, v, True)
    assert torch.isnan(out_storage[..., dv:]).all(), "wrote outside out"


@pytest.mark.parametrize("dtype", DTYPES)
def test_given_out_and_lse(torch, dtype):
    q, k, v = qkv(torch, 2, 8, 2, 70, 70, 64, dtype, 40)
    out = torch.full_like(q, NAN)
    lse = torch.full((2, 8, 70), NAN, dtype=torch.float32, device="cuda")
    res_out, res_lse = flashcore.attention(q, k, v, out=out, lse=lse, return_lse=True, softmax_scale=0.3)
    assert res_out is out and res_lse is lse
    check(torch, out, lse, q, k, v, False, scale=0.3)
    lse.fill_(NAN)
    assert flashcore.attention(q, k, v, out=out, lse=lse, causal=True) is out
    check(torch, out, lse, q, k, v, True)


def test_views_the_library_cannot_take(torch):
    b, h, s, d = 1, 2, 64, 64
    k = v = cuda_randn(torch, (b, h, s, d), "float16", 50)
    out = torch.full((b, h, s, d), NAN, dtype=torch.float16, device="cuda")
    transposed = cuda_randn(torch, (b, h, d, s), "float16", 51).transpose(-1, -2)  # head_dim not contiguous
    with pytest.raises(flashcore.InvalidArgumentError, match="contiguous"):
        flashcore.attention(transposed, k, v, out=out)
    shifted = cuda_randn(torch, (b * h * s * d + 1,), "float16", 52)[1:].view(b, h, s, d)  # 2-byte offset
    with pytest.raises(flashcore.MisalignedError) as info:
        flashcore.attention(shifted, k, v, out=out)
    assert "q" in info.value.message
    odd_rows = cuda_randn(torch, (b, h, s, d + 1), "float16", 53)[..., :d]  # row stride d+1
    with pytest.raises(flashcore.MisalignedError, match="seq_stride"):
        flashcore.attention(odd_rows, k, v, out=out)
    with pytest.raises(flashcore.UnsupportedError):
        flashcore.attention(k.float(), k.float(), k.float())
    too_wide = max(pair[0] for pair in flashcore.supported_head_dims()) + 8  # no kernel covers it
    q_wide = cuda_randn(torch, (b, h, s, too_wide), "float16", 54)
    with pytest.raises(flashcore.UnsupportedError, match="head_dim"):
        flashcore.attention(q_wide, q_wide, q_wide)
    with pytest.raises(flashcore.InvalidArgumentError, match="out must have"):
        flashcore.attention(k, k, k[..., :32], out=out)  # out has head_dim 64, v head_dim_v 32
    q6, k4 = cuda_randn(torch, (b, 6, s, d), "float16", 55), cuda_randn(torch, (b, 4, s, d), "float16", 56)
    with pytest.raises(flashcore.InvalidArgumentError, match="num_heads"):
        flashcore.attention(q6, k4, k4)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a failed call wrote to out"


def delay(torch):
    """Keeps the current stream busy for tens of milliseconds."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(100_000_000)
        return
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(40):
        a = (a @ a) * 1e-3


def poisoned_copies(torch, *tensors):
    copies = [torch.full_like(t, NAN) for t in tensors]
    torch.cuda.synchronize()
    return copies


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_runs_on_the_current_stream(torch, compiled):
    q, k, v = qkv(torch, 2, 4, 4, 256, 256, 64, "float16", 60)

    def attend(q, k, v):
        return flashcore.attention(q, k, v, causal=True)

    if compiled:  # the torch operator flashcore::forward (issue 18)
        attend = torch.compile(attend, fullgraph=True)
    expected = attend(q, k, v)
    q2, k2, v2 = poisoned_copies(torch, q, k, v)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        delay(torch)  # the inputs are written only after this
        for dst, src in ((q2, q), (k2, k), (v2, v)):
            dst.copy_(src)
        out = attend(q2, k2, v2)
    s.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("form", ["torch.cuda.Stream", "int"])
def test_runs_on_a_given_stream(torch, form):
    q, k, v = qkv(torch, 1, 8, 2, 200, 300, 128, "bfloat16", 70)
    expected, expected_lse = flashcore.attention(q, k, v, return_lse=True)
    q2, k2, v2 = poisoned_copies(torch, q, k, v)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        delay(torch)
        for dst, src in ((q2, q), (k2, k), (v2, v)):
            dst.copy_(src)
    # The current stream is the default one again; the work must go to s.
    out, lse = flashcore.attention(q2, k2, v2, return_lse=True, stream=s if form != "int" else s.cuda_stream)
    s.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_cuda_graph_capture(torch):
    q, k, v = qkv(torch, 2, 8, 4, 128, 160, 64, "float16", 80)
    out = torch.empty_like(q)
    flashcore.attention(q, k, v, out=out, causal=True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcore.attention(q, k, v, out=out, causal=True)
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, flashcore.attention(q, k, v, causal=True))


def test_low_level_calls(torch):
    q, k, v = qkv(torch, 2, 8, 2, 150, 180, 128, "float16", 90)
    out = torch.full_like(q, NAN)
    lse = torch.full((2, 8, 150), NAN, dtype=torch.float32, device="cuda")
    params = flashcore.forward_params(q, k, v, out, lse=lse, causal=True)
    flashcore.check_params(params)
    handle = flashcore.get_handle(q.device.index)
    assert handle is flashcore.get_handle(q.device.index) and handle.device == q.device.index
    needed = handle.workspace_size(params)
    workspace = torch.empty(max(needed, 16), dtype=torch.uint8, device="cuda")
    handle.forward(params, workspace.data_ptr(), needed, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    expected, expected_lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    check(torch, out, lse, q, k, v, True)
    again = flashcore.attention(q, k, v, causal=True, workspace=workspace)
    torch.cuda.synchronize()
    assert torch.equal(again, expected)
    if needed > 0:
        with pytest.raises(flashcore.WorkspaceTooSmallError):
            handle.forward(params, workspace.data_ptr(), needed - 1, 0)
        with pytest.raises(flashcore.WorkspaceTooSmallError):
            flashcore.attention(q, k, v, causal=True, workspace=workspace[: needed - 1])


def test_handles_per_thread_and_device(torch):
    dev = torch.cuda.current_device()
    main = flashcore.get_handle(dev)
    seen = []
    t = threading.Thread(target=lambda: seen.append(flashcore.get_handle(dev)))
    t.start()
    t.join()
    assert seen[0] is not main and seen[0].device == main.device == dev


class DLPackOnly:
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class CudaArrayInterfaceOnly:
    def __init__(self, t):
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


@pytest.mark.parametrize("wrap,dtype", [(DLPackOnly, "float16"), (DLPackOnly, "bfloat16"),
                                        (CudaArrayInterfaceOnly, "float16")])
def test_dlpack_and_cuda_array_interface_inputs(torch, wrap, dtype):
    b, hq, hkv, sq, sk, d = 2, 4, 2, 65, 130, 64
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 100).transpose(1, 2)
    k, v = cuda_randn(torch, (b, hkv, sk, d), dtype, 101), cuda_randn(torch, (b, hkv, sk, d), dtype, 102)
    out = torch.full_like(q, NAN)
    lse = torch.full((b, hq, sq), NAN, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    res_out, res_lse = flashcore.attention(wrap(q), wrap(k), wrap(v), out=wrap(out), lse=wrap(lse),
                                           return_lse=True, causal=True)
    assert res_out.t is out and res_lse.t is lse
    torch.cuda.synchronize()
    check(torch, out, lse, q, k, v, True)
    with pytest.raises(TypeError, match="out="):
        flashcore.attention(wrap(q), wrap(k), wrap(v))


def test_other_device(torch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with torch.cuda.device(0):
        q, k, v = (t.to("cuda:1") for t in qkv(torch, 1, 4, 4, 100, 100, 64, "float16", 110))
        out = flashcore.attention(q, k, v, causal=True)
    assert out.device == q.device
    assert flashcore.get_handle(1).device == 1
    with torch.cuda.device(1):
        check(torch, out, None, q, k, v, True)


# --------------------------------------------------------------------------
# Split-KV (attention's num_splits) and merge_states
#
# merge_states is checked against a float64 merge of the same partials: its
# relative L2 error must be within twice that of merely rounding the float64
# result to out's dtype (+ 1e-5, the float32 arithmetic), rows that no part
# sees must be exactly 0 with lse exactly -inf, and lse must be within 1e-4
# (relative to its magnitude, at least 1). Attention with num_splits and
# merged attention over parts of the keys use check() above, like every
# other attention result.
# --------------------------------------------------------------------------

MERGE_DTYPES = ["float16", "bfloat16", "float32"]
NUM_SPLITS = [None, 1, 2, 3, 7]  # None: the library's heuristic
DECODE_SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (1, 32, 8, 1, 1000),
    (2, 32, 8, 5, 1037),
    (1, 32, 8, 16, 999),
]
NEG_INF = float("-inf")


def merge_reference(torch, partial_out, partial_lse):
    """float64 merge of [K, B, H, S, D] partials (as [B, H, S, D] states)
    with their [K, B, H, S] lse: out, lse and the rows no part sees."""
    lse_s = partial_lse.double()
    lse = torch.logsumexp(lse_s, dim=0)  # -inf where every part is -inf
    empty = torch.isneginf(lse)
    weights = torch.exp(lse_s - torch.where(empty, torch.zeros_like(lse), lse)[None])  # 0 for -inf parts
    out = (weights[..., None] * partial_out.double()).sum(0)
    return out, lse, empty


def random_states(torch, k, b, h, s, d, dtype, seed, empty_state=False):
    """[K, B, H, S, D] partial outputs and [K, B, H, S] float32 lse with a
    wide spread, some rows -inf in every part (rows that no part sees) and,
    with empty_state, one part -inf everywhere (its rows see no key). The
    outputs of -inf rows are finite noise: a part that saw no key must
    contribute nothing whatever its out holds."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    partial = torch.randn((k, b, h, s, d), generator=g, device="cuda", dtype=torch.float32).to(getattr(torch, dtype))
    lse = torch.randn((k, b, h, s), generator=g, device="cuda", dtype=torch.float32) * 3 + 2
    lse[:, 0, 0, : min(3, s)] = NEG_INF
    lse[:, b - 1, h - 1, s - 1] = NEG_INF
    if empty_state:
        lse[k // 2] = NEG_INF
    return partial, lse


def check_merge(torch, out, lse, partial_out, partial_lse):
    """out ([B, H, S, D] view) and lse (unless None) against merge_reference."""
    torch.cuda.synchronize()
    ref, ref_lse, empty = merge_reference(torch, partial_out, partial_lse)
    assert torch.isfinite(out).all(), "non-finite values in out"
    floor = rel_err(ref.to(out.dtype), ref)
    ours = rel_err(out, ref)
    assert ours <= 2 * floor + 1e-5, "rel-L2 error %.3g (rounding alone: %.3g)" % (ours, floor)
    assert (out[empty] == 0).all(), "rows that no part sees must be 0"
    if lse is not None:
        assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(ref_lse.shape)
        assert torch.equal(torch.isneginf(lse), empty), "lse must be -inf exactly for rows that no part sees"
        valid = ~empty
        if valid.any():
            err = (lse.double() - ref_lse)[valid].abs().max().item()
            assert err <= 1e-4 * max(1.0, ref_lse[valid].abs().max().item()), "lse off by %.3g" % err


@pytest.mark.parametrize("d", [40, 128, 200])  # 200: two passes of 128 columns
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("num_states", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", MERGE_DTYPES)
def test_merge_states_matches_reference(torch, dtype, num_states, layout, d):
    b, h, s = 2, 6, 77
    partial, plse = random_states(torch, num_states, b, h, s, d, dtype, seed=num_states * 100 + d)
    given = partial if layout == "bhsd" else partial.transpose(2, 3).contiguous()  # [K, B, S, H, D]
    out, lse = flashcore.merge_states(given, plse, layout=layout)
    want = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
    assert out.shape == want and out.dtype == partial.dtype and out.is_contiguous() and out.device == partial.device
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32 and lse.is_contiguous()
    check_merge(torch, out if layout == "bhsd" else out.transpose(1, 2), lse, partial, plse)


@pytest.mark.parametrize("num_states", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", MERGE_DTYPES)
def test_merge_states_part_that_sees_no_key(torch, dtype, num_states):
    # One part is -inf everywhere (with K = 1: every row is one no part sees).
    partial, plse = random_states(torch, num_states, 2, 4, 50, 64, dtype, seed=7 + num_states, empty_state=True)
    out, lse = flashcore.merge_states(partial, plse)
    check_merge(torch, out, lse, partial, plse)
    if num_states == 1:
        torch.cuda.synchronize()
        assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("dtype,out_dtype", [
    ("float16", "float32"), ("bfloat16", "float32"), ("float32", "float16"), ("float32", "bfloat16"),
    ("float16", "bfloat16"),
])
def test_merge_states_out_dtype(torch, dtype, out_dtype):
    partial, plse = random_states(torch, 3, 2, 4, 40, 128, dtype, seed=11)
    out, lse = flashcore.merge_states(partial, plse, out_dtype=getattr(torch, out_dtype))
    assert out.dtype == getattr(torch, out_dtype)
    check_merge(torch, out, lse, partial, plse)
    given = torch.full_like(out, NAN)
    assert flashcore.merge_states(partial, plse, out=given, return_lse=False) is given  # out's dtype
    check_merge(torch, given, None, partial, plse)


@pytest.mark.parametrize("dtype", MERGE_DTYPES)
def test_merge_states_strided_views(torch, dtype):
    k, b, h, s, d = 3, 2, 4, 33, 64
    t = getattr(torch, dtype)
    # partial_out: a [K, B, H, S, D] view of padded [B, S, K, H, D + 16] storage, 16 bytes in.
    g = torch.Generator(device="cuda").manual_seed(5)
    storage = torch.randn((b, s, k, h, d + 16), generator=g, device="cuda").to(t)
    partial = storage[..., 8:8 + d].permute(2, 0, 3, 1, 4)
    # partial_lse: a [K, B, H, S] view of [B, H, S, K] storage.
    plse = (torch.randn((b, h, s, k), generator=g, device="cuda") * 3).permute(3, 0, 1, 2)
    plse[:, 1, 2, 5] = NEG_INF
    assert not partial.is_contiguous() and not plse.is_contiguous()
    out_storage = torch.full((b, s, h, d + 8), NAN, dtype=t, device="cuda")
    out = out_storage[..., :d].transpose(1, 2)  # [B, H, S, D] view of padded [B, S, H, D + 8]
    lse = torch.full((b, h, s), NAN, dtype=torch.float32, device="cuda")
    res_out, res_lse = flashcore.merge_states(partial, plse, out=out, lse=lse)
    assert res_out is out and res_lse is lse
    check_merge(torch, out, lse, partial, plse)
    assert torch.isnan(out_storage[..., d:]).all(), "wrote outside out"


def test_merge_states_low_level_and_determinism(torch):
    partial, plse = random_states(torch, 4, 2, 8, 64, 128, "bfloat16", seed=21)
    expected, expected_lse = flashcore.merge_states(partial, plse)
    out = torch.full_like(expected, NAN)
    lse = torch.full_like(expected_lse, NAN)
    params = flashcore.merge_params(partial, plse, out, lse=lse)
    assert (params.num_states, params.batch_size, params.num_heads, params.seqlen, params.head_dim) == (4, 2, 8, 64, 128)
    handle = flashcore.get_handle(partial.device.index)
    handle.merge_states(params, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse), "two merges differ"
    check_merge(torch, out, lse, partial, plse)


def test_merge_states_on_a_given_stream(torch):
    partial, plse = random_states(torch, 3, 2, 8, 100, 64, "float16", seed=31)
    expected, expected_lse = flashcore.merge_states(partial, plse)
    partial2, plse2 = poisoned_copies(torch, partial, plse)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        delay(torch)  # the inputs are written only after this
        partial2.copy_(partial)
        plse2.copy_(plse)
    out, lse = flashcore.merge_states(partial2, plse2, stream=s)
    s.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_merge_states_cuda_graph_capture(torch):
    partial, plse = random_states(torch, 2, 2, 4, 64, 64, "float16", seed=41)
    out, lse = flashcore.merge_states(partial, plse)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcore.merge_states(partial, plse, out=out, lse=lse)
    out.fill_(NAN)
    lse.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    check_merge(torch, out, lse, partial, plse)


def test_merge_states_the_library_refuses(torch):
    partial, plse = random_states(torch, 2, 1, 2, 16, 64, "float16", seed=51)
    out = torch.full((1, 2, 16, 64), NAN, dtype=torch.float16, device="cuda")
    shifted = torch.empty(partial.numel() + 1, dtype=torch.float16, device="cuda")[1:].view(partial.shape)  # 2 bytes in
    with pytest.raises(flashcore.MisalignedError):
        flashcore.merge_states(shifted, plse, out=out, return_lse=False)
    odd_rows = torch.zeros((2, 1, 2, 16, 65), dtype=torch.float16, device="cuda")[..., :64]  # row stride 65
    with pytest.raises(flashcore.MisalignedError):
        flashcore.merge_states(odd_rows, plse, out=out, return_lse=False)
    no_states = torch.zeros((0, 1, 2, 16, 64), dtype=torch.float16, device="cuda")
    with pytest.raises(flashcore.InvalidArgumentError):
        flashcore.merge_states(no_states, plse[:0], out=out, return_lse=False)
    narrow = torch.zeros((2, 1, 2, 16, 64), dtype=torch.float16, device="cuda")[..., :60]  # head_dim 60
    with pytest.raises((flashcore.InvalidArgumentError, flashcore.UnsupportedError, flashcore.MisalignedError)):
        flashcore.merge_states(narrow, plse, out=torch.zeros((1, 2, 16, 64), dtype=torch.float16,
                                                             device="cuda")[..., :60], return_lse=False)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a failed call wrote to out"


def check_split_call(torch, q, k, v, causal, num_splits, **options):
    """A call with num_splits checked against the reference, and the same
    call again, bit for bit (deterministic for a given num_splits).
    options: keywords attention() and check() both take (window, softcap,
    sinks)."""
    out, lse = flashcore.attention(q, k, v, causal=causal, num_splits=num_splits, return_lse=True, **options)
    check(torch, out, lse, q, k, v, causal, **options)
    again, again_lse = flashcore.attention(q, k, v, causal=causal, num_splits=num_splits, return_lse=True, **options)
    torch.cuda.synchronize()
    assert torch.equal(out, again) and torch.equal(lse, again_lse), "not deterministic for a given num_splits"


@pytest.mark.parametrize("num_splits", NUM_SPLITS, ids=lambda n: "auto" if n is None else "n%d" % n)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_num_splits_matches_sdpa(torch, dtype, causal, shape, num_splits):
    need_head_dim(128)
    b, hq, hkv, sq, sk = shape
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 128, dtype, seed=sq + sk)
    check_split_call(torch, q, k, v, causal, num_splits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_num_splits_more_than_key_tiles(torch, dtype):
    # Most of the parts see no key tile at all.
    need_head_dim(64)
    q, k, v = qkv(torch, 1, 8, 2, 3, 200, 64, dtype, seed=61)
    for causal in (False, True):
        out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, num_splits=flashcore.MAX_NUM_SPLITS)
        check(torch, out, lse, q, k, v, causal)


@pytest.mark.parametrize("num_splits", [2, 3, 7])
def test_num_splits_workspace(torch, num_splits):
    need_head_dim(128)
    q, k, v = qkv(torch, 1, 32, 8, 4, 1000, 128, "float16", seed=71)
    out = torch.full_like(q, NAN)
    handle = flashcore.get_handle(q.device.index)
    assert handle.workspace_size(flashcore.forward_params(q, k, v, out, num_splits=1)) == 0
    params = flashcore.forward_params(q, k, v, out, num_splits=num_splits)
    needed = handle.workspace_size(params)
    assert needed > 0, "a split call needs a workspace"
    # The size depends on shapes and num_splits only, not on pointers.
    assert handle.workspace_size(flashcore.forward_params(q, k, v, None, num_splits=num_splits)) == needed
    workspace = torch.empty(needed + 16, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(flashcore.WorkspaceTooSmallError):
        handle.forward(params, workspace.data_ptr(), needed - 1, stream)
    with pytest.raises(flashcore.InvalidArgumentError):
        handle.forward(params, 0, needed, stream)
    with pytest.raises(flashcore.MisalignedError):
        handle.forward(params, workspace.data_ptr() + 8, needed, stream)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a failed call wrote to out"
    workspace.fill_(0xFF)  # contents do not matter
    handle.forward(params, workspace.data_ptr(), needed, stream)
    torch.cuda.synchronize()
    check(torch, out, None, q, k, v, False)
    expected = flashcore.attention(q, k, v, num_splits=num_splits)
    given = flashcore.attention(q, k, v, num_splits=num_splits, workspace=workspace[:needed])
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(given, expected)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("shape", [(1, 32, 8, 16, 1000, 500), (2, 8, 2, 77, 300, 123), (1, 4, 4, 200, 150, 149)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_over_two_halves_merged(torch, dtype, shape, layout):
    """attention over keys [0, split) and [split, Sk), each with its lse,
    merged, is attention over all keys."""
    need_head_dim(128)
    b, hq, hkv, sq, sk, split = shape
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 128, dtype, seed=sk + split)
    seq = 2 if layout == "bhsd" else 1
    if layout == "bshd":  # the same values, stored as [B, S, H, D]
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    halves = [flashcore.attention(q, k.narrow(seq, start, length), v.narrow(seq, start, length), return_lse=True,
                                  layout=layout) for start, length in ((0, split), (split, sk - split))]
    partial_out = torch.stack([o for o, _ in halves])
    partial_lse = torch.stack([lse for _, lse in halves])
    out, lse = flashcore.merge_states(partial_out, partial_lse, layout=layout)
    full, full_lse = flashcore.attention(q, k, v, return_lse=True, layout=layout)
    as_bhsd = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(1, 2))
    check(torch, as_bhsd(out), lse, as_bhsd(q), as_bhsd(k), as_bhsd(v), False)
    check_merge(torch, as_bhsd(out), lse, torch.stack([as_bhsd(o) for o, _ in halves]), partial_lse)
    check(torch, as_bhsd(full), full_lse, as_bhsd(q), as_bhsd(k), as_bhsd(v), False)
    assert (lse - full_lse).abs().max().item() <= 1e-3 * max(1.0, full_lse.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_prefix_and_causal_suffix_merged(torch, dtype):
    """A shared prefix that every query sees whole (attention without a mask)
    and the request's own keys (causal, bottom-right aligned), merged, are
    causal attention over prefix + own keys."""
    need_head_dim(64)
    b, hq, hkv, sq, prefix, own = 2, 8, 2, 40, 300, 64
    q, k, v = qkv(torch, b, hq, hkv, sq, prefix + own, 64, dtype, seed=81)
    a = flashcore.attention(q, k[:, :, :prefix], v[:, :, :prefix], return_lse=True)
    c = flashcore.attention(q, k[:, :, prefix:], v[:, :, prefix:], return_lse=True, causal=True)
    out, lse = flashcore.merge_states(torch.stack([a[0], c[0]]), torch.stack([a[1], c[1]]), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    check(torch, out.to(q.dtype), lse, q, k, v, True)
    check_merge(torch, out, lse, torch.stack([a[0], c[0]]), torch.stack([a[1], c[1]]))


# --------------------------------------------------------------------------
# Sliding window and softcap (0.4)
#
# check() with window= and softcap=: the float64 reference masks by
# window_visible (flashcore.h's rule, written out) and caps each score s as
# softcap * tanh(s / softcap); the error bar is check()'s.
# --------------------------------------------------------------------------

WINDOW_SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (2, 4, 4, 256, 256),
    (1, 8, 2, 77, 333),  # fewer queries than keys: the diagonal starts 256 keys in
    (2, 4, 2, 190, 130),  # more queries than keys: the first rows' windows hold no key
]
WINDOWS = [  # (window, causal)
    ((0, 0), False),  # the diagonal key only
    ((0, 0), True),
    ((1, -1), False),
    ((-1, 2), False),
    ((17, 0), True),  # causal, a window shorter than a key tile
    ((63, 0), True),
    ((63, -1), True),  # right -1 with causal: causal's bound 0
    ((40, 25), False),  # bounded on both sides: tiles outside are skipped
    ((100, 3), False),
    ((5000, 5000), False),  # wider than the sequences: nothing masked
    ((5000, 0), True),  # wider than the sequences: causal alone
    ((-1, -1), False),  # unbounded on both sides
]
SOFTCAP = 30.0


def window_id(case):
    (left, right), causal = case
    return "w%d_%d%s" % (left, right, "-causal" if causal else "")


def test_window_visible_follows_the_rule():
    # The reference's mask, against cases worked out by hand (CPU only).
    torch = pytest.importorskip("torch")

    def rows(sq, sk, causal, window):
        mask = window_visible(torch, sq, sk, causal, window, device="cpu")
        return [[j for j in range(sk) if mask[i, j]] for i in range(sq)]

    # d = 2: query i's diagonal is key i + 2.
    assert rows(3, 5, False, (1, 0)) == [[1, 2], [2, 3], [3, 4]]
    assert rows(3, 5, False, (0, 1)) == [[2, 3], [3, 4], [4]]
    assert rows(3, 5, False, (-1, 0)) == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert rows(3, 5, True, (0, -1)) == [[2], [3], [4]]
    # d = -2: the first two queries' windows hold no key.
    assert rows(4, 2, False, (0, 0)) == [[], [], [0], [1]]
    assert rows(4, 2, False, (1, 1)) == [[], [0], [0, 1], [0, 1]]
    assert window_visible(torch, 3, 5, False, None, device="cpu") is None
    assert rows(3, 5, True, None) == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert rows(2, 3, False, (-1, -1)) == [[0, 1, 2]] * 2


@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", WINDOWS, ids=window_id)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_window_matches_reference(torch, dtype, d, case, shape):
    need_head_dim(d)
    window, causal = case
    b, hq, hkv, sq, sk = shape
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=sq + sk + d)
    out, lse = flashcore.attention(q, k, v, causal=causal, window=window, return_lse=True)
    check(torch, out, lse, q, k, v, causal, window=window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_of_the_diagonal_only_copies_v(torch, dtype):
    # window (0, 0): each row's softmax is over one key, so out is that
    # key's value row and lse its scaled score; rows before the diagonal
    # reaches a key give 0 and -inf.
    need_head_dim(64)
    b, hq, hkv, d = 2, 4, 2, 64
    for sq, sk in ((100, 150), (150, 100)):
        q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=sq)
        out, lse = flashcore.attention(q, k, v, window=(0, 0), return_lse=True)
        torch.cuda.synchronize()
        k2, v2 = expand_kv(k, v, hq)
        rows = torch.arange(sq, device="cuda")
        keys = rows + (sk - sq)
        seen = keys >= 0
        want = v2[:, :, keys[seen]]
        assert torch.allclose(out[:, :, seen].float(), want.float(), rtol=2**-10, atol=0)
        assert (out[:, :, ~seen] == 0).all() and torch.isneginf(lse[:, :, ~seen]).all()
        scores = (q[:, :, seen].double() * k2[:, :, keys[seen]].double()).sum(-1) * d**-0.5
        assert (lse[:, :, seen].double() - scores).abs().max().item() <= 1e-3 * max(1.0, scores.abs().max().item())


@pytest.mark.parametrize("softmax_scale", [None, 0.5])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", [(64, 64), (128, 128), (192, 128)], ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_with_large_logits(torch, dtype, head_dims, causal, softmax_scale):
    d, dv = head_dims
    need_head_dim(d)
    b, hq, hkv, sq, sk = 2, 4, 2, 150, 170
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=d + 7, dv=dv)
    # Scaled scores of standard deviation 16 (more with softmax_scale 0.5), many
    # beyond the cap; a power of 2, so q stays exact in both dtypes.
    q = q * 16
    out, lse = flashcore.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, softcap=SOFTCAP,
                                   return_lse=True)
    check(torch, out, lse, q, k, v, causal, scale=softmax_scale, softcap=SOFTCAP)
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    assert lse.max().item() <= SOFTCAP + math.log(sk) + 1e-3, "lse beyond what capped scores can give"
    # The cap changes the result: these logits are far from the identity's range.
    uncapped = flashcore.attention(q, k, v, causal=causal, softmax_scale=softmax_scale)
    torch.cuda.synchronize()
    assert rel_err(uncapped, reference(torch, q, k, v, causal, scale, softcap=SOFTCAP)[0]) > 0.05


@pytest.mark.parametrize("case", [((32, 0), True), ((50, 20), False), ((-1, 0), True)], ids=window_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_window_softcap_and_gqa(torch, dtype, case):
    need_head_dim(128)
    window, causal = case
    b, hq, hkv, sq, sk, d = 2, 8, 2, 200, 260, 128
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=91)
    q = q * 8
    out, lse = flashcore.attention(q, k, v, causal=causal, window=window, softcap=SOFTCAP, return_lse=True)
    check(torch, out, lse, q, k, v, causal, window=window, softcap=SOFTCAP)


@pytest.mark.parametrize("case", [((24, 8), False), ((40, 0), True)], ids=window_id)
@pytest.mark.parametrize("softcap", [0.0, SOFTCAP])
@pytest.mark.parametrize("dtype", DTYPES)
def test_window_and_softcap_bshd_layout(torch, dtype, softcap, case):
    need_head_dim(128)
    window, causal = case
    b, sq, sk, hq, hkv, d = 2, 97, 230, 8, 4, 128
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 92) * 8
    k, v = cuda_randn(torch, (b, sk, hkv, d), dtype, 93), cuda_randn(torch, (b, sk, hkv, d), dtype, 94)
    out, lse = flashcore.attention(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True,
                                   layout="bshd")
    assert out.shape == (b, sq, hq, d) and out.is_contiguous() and lse.shape == (b, hq, sq)
    t = [x.transpose(1, 2) for x in (out, q, k, v)]
    check(torch, t[0], lse, t[1], t[2], t[3], causal, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_and_softcap_given_out_and_lse(torch, dtype):
    need_head_dim(64)
    q, k, v = qkv(torch, 2, 8, 2, 120, 90, 64, dtype, 95)  # rows before the diagonal see no key
    q = q * 8
    out = torch.full_like(q, NAN)
    lse = torch.full((2, 8, 120), NAN, dtype=torch.float32, device="cuda")
    window = (10, 0)
    res_out, res_lse = flashcore.attention(q, k, v, out=out, lse=lse, return_lse=True, causal=True, window=window,
                                           softcap=SOFTCAP, softmax_scale=0.2)
    assert res_out is out and res_lse is lse
    check(torch, out, lse, q, k, v, True, scale=0.2, window=window, softcap=SOFTCAP)
    # A window reaching past the diagonal contradicts causal: refused, nothing written.
    out.fill_(NAN)
    lse.fill_(NAN)
    with pytest.raises(flashcore.InvalidArgumentError, match="window_right"):
        flashcore.attention(q, k, v, out=out, lse=lse, causal=True, window=(10, 2))
    torch.cuda.synchronize()
    assert torch.isnan(out).all() and torch.isnan(lse).all(), "a failed call wrote to out or lse"


@pytest.mark.parametrize("num_splits", NUM_SPLITS, ids=lambda n: "auto" if n is None else "n%d" % n)
@pytest.mark.parametrize("dtype", DTYPES)
def test_window_and_softcap_with_num_splits(torch, dtype, num_splits):
    # Decode-like (few rows, many keys): the window bounds the keys each
    # split part sees; parts that get none must contribute nothing.
    need_head_dim(128)
    q, k, v = qkv(torch, 1, 32, 8, 16, 1000, 128, dtype, seed=96)
    q = q * 8
    for window, causal in (((200, 0), True), ((300, 100), False)):
        check_split_call(torch, q, k, v, causal, num_splits, window=window, softcap=SOFTCAP)


# --------------------------------------------------------------------------
# seqused_k and attention_with_kvcache (0.5): each sequence against the
# float64 reference on its own slice of the cache; the cache's unused rows
# hold NaN and infinity, which must not reach the output.
# --------------------------------------------------------------------------

KVCACHE_CASES = [  # batch, heads_q, heads_kv, seqlen_q, cache rows, per-sequence lengths
    (4, 8, 2, 1, 1000, (0, 1, 513, 1000)),  # decode, GQA 4
    (3, 4, 4, 1, 4096, (4000, 129, 2048)),
    (2, 8, 1, 16, 700, (300, 16)),  # MQA, several queries
    (3, 4, 2, 37, 600, (37, 100, 20)),  # a count below seqlen_q: causal rows that see nothing
]


def fill_unused(cache, lengths):
    """[B, S, H, D]: rows past each sequence's length become NaN and inf."""
    for b, n in enumerate(lengths):
        cache[b, n::2] = float("nan")
        cache[b, n + 1::2] = float("inf")


def check_sequence(torch, out, lse, q, k, v, causal, **kwargs):
    """check() for one sequence as [1, H, S, D] views (lse [1, H, Sq]),
    which may have no queries (nothing to check) or no keys (out 0, lse
    -inf, or each head's sink with sinks=)."""
    if q.shape[2] == 0:
        return
    if k.shape[2] == 0:
        torch.cuda.synchronize()
        sinks = kwargs.get("sinks")
        assert (out == 0).all(), "a sequence without keys must give 0"
        if sinks is None:
            assert torch.isneginf(lse).all(), "a sequence without keys must give lse -inf"
        else:
            want = sinks.float().view(1, -1, 1).expand(lse.shape)
            assert torch.allclose(lse, want, rtol=1e-6, atol=1e-6), "a sequence without keys must give lse = the sink"
        return
    check(torch, out, lse, q, k, v, causal, **kwargs)


def check_per_sequence(torch, out, lse, q, k, v, lengths, causal, **kwargs):
    """[B, H, S, D] views; sequence b against its first lengths[b] keys."""
    torch.cuda.synchronize()
    for b, n in enumerate(lengths):
        check_sequence(torch, out[b:b + 1], lse[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal,
                       **kwargs)


@pytest.mark.parametrize("case", KVCACHE_CASES, ids=lambda c: "x".join(map(str, c[:5])))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_kvcache_matches_reference(torch, dtype, causal, case):
    need_head_dim(128)
    b, hq, hkv, sq, rows, lengths = case
    q = cuda_randn(torch, (b, sq, hq, 128), dtype, seed=sq)
    k_cache = cuda_randn(torch, (b, rows, hkv, 128), dtype, seed=rows)
    v_cache = cuda_randn(torch, (b, rows, hkv, 128), dtype, seed=rows + 1)
    fill_unused(k_cache, lengths)
    fill_unused(v_cache, lengths)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flashcore.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, causal=causal, return_lse=True)
    assert out.shape == (b, sq, hq, 128)
    check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k_cache.transpose(1, 2),
                       v_cache.transpose(1, 2), lengths, causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_seqused_k_with_window_softcap_and_splits(torch, dtype):
    need_head_dim(64)
    b, hq, hkv, sq, sk, lengths = 2, 4, 2, 8, 2048, (2000, 333)
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 64, dtype, seed=5)
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # fill rows in [B, S, H, D]
    fill_unused(k, lengths)
    fill_unused(v, lengths)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for num_splits in (None, 1, 3):
        out, lse = flashcore.attention(q, k, v, causal=True, window=(300, 0), softcap=SOFTCAP, seqused_k=used,
                                       num_splits=num_splits, return_lse=True)
        check_per_sequence(torch, out, lse, q, k, v, lengths, True, window=(300, 0), softcap=SOFTCAP)


def test_attention_with_kvcache_int_length(torch):
    # An int applies to every sequence: the same as the whole cache sliced.
    need_head_dim(64)
    q = cuda_randn(torch, (3, 1, 4, 64), "bfloat16", seed=1)
    k_cache = cuda_randn(torch, (3, 256, 2, 64), "bfloat16", seed=2)
    v_cache = cuda_randn(torch, (3, 256, 2, 64), "bfloat16", seed=3)
    fill_unused(k_cache, (100, 100, 100))
    fill_unused(v_cache, (100, 100, 100))
    # One split each: the heuristic would split the two calls differently.
    out = flashcore.attention_with_kvcache(q, k_cache, v_cache, 100, num_splits=1)
    want = flashcore.attention(q, k_cache[:, :100], v_cache[:, :100], layout="bshd", num_splits=1)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


# --------------------------------------------------------------------------
# Variable-length batches (attention_varlen) and paged KV caches
# (attention_with_kvcache's block_table), 0.6: each sequence against the
# float64 reference on its own rows (check_sequence). Rows outside every
# sequence, the rest of each sequence's last page and the pages no
# sequence uses hold NaN and infinity, which must not reach the output.
# --------------------------------------------------------------------------

# Rows after the last sequence of each packed tensor, outside every sequence.
PAD_ROWS = 3
VARLEN_CASES = [  # heads_q, heads_kv, query lengths, key lengths
    (4, 4, (128, 1, 77, 300), (128, 1, 200, 300)),
    (8, 2, (0, 1, 37, 513, 16), (5, 1, 0, 600, 16)),  # GQA; no queries; no keys
    (6, 1, (150, 90, 3), (61, 90, 200)),  # MQA; more queries than keys: causal rows that see nothing
]


def varlen_id(case):
    hq, hkv, q_lengths, k_lengths = case
    return "h%d-%d_q%s_k%s" % (hq, hkv, "-".join(map(str, q_lengths)), "-".join(map(str, k_lengths)))


def need_head_dims(d, dv):
    if covering_pair(flashcore.supported_head_dims(), d, dv) is None:
        pytest.skip("this build has no kernel covering head dims (%d, %d)" % (d, dv))


def cu_seqlens(torch, lengths):
    """int32 [B + 1]: where each sequence of these lengths starts when
    packed one after another, then the end."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device="cuda")


def packed(torch, lengths, heads, d, dtype, seed):
    """Random sequences of these lengths packed one after another into
    [total + PAD_ROWS, heads, d] (the trailing PAD_ROWS NaN), and their
    cu_seqlens."""
    total = sum(lengths)
    x = cuda_randn(torch, (total + PAD_ROWS, heads, d), dtype, seed)
    x[total:] = NAN
    return x, cu_seqlens(torch, lengths)


def as_sequence(rows):
    """[n, H, D] packed rows as a [1, H, n, D] view."""
    return rows.transpose(0, 1).unsqueeze(0)


def unpacked(x, lengths):
    """Each sequence of a packed [total, H, D] tensor as a [1, H, n, D] view."""
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [as_sequence(x[start:start + n]) for start, n in zip(starts, lengths)]


def check_packed_queries(torch, out, lse, q, q_lengths, kv, causal, **kwargs):
    """Packed [total_q, H, D] out and q and [H, total_q] lse; kv[b] is
    sequence b's (k, v) as [1, Hkv, n, D] views."""
    torch.cuda.synchronize()
    start = 0
    for n, (k, v) in zip(q_lengths, kv):
        rows = slice(start, start + n)
        check_sequence(torch, as_sequence(out[rows]), lse[:, rows].unsqueeze(0), as_sequence(q[rows]), k, v, causal,
                       **kwargs)
        start += n


def varlen_inputs(torch, case, d, dv, dtype, seed):
    hq, hkv, q_lengths, k_lengths = case
    q, cu_q = packed(torch, q_lengths, hq, d, dtype, seed)
    k, cu_k = packed(torch, k_lengths, hkv, d, dtype, seed + 1)
    v, _ = packed(torch, k_lengths, hkv, dv, dtype, seed + 2)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("case", VARLEN_CASES, ids=varlen_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", [(64, 64), (128, 128), (192, 128)], ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_varlen_matches_reference(torch, dtype, head_dims, causal, case):
    d, dv = head_dims
    need_head_dims(d, dv)
    hq, hkv, q_lengths, k_lengths = case
    q, k, v, cu_q, cu_k = varlen_inputs(torch, case, d, dv, dtype, seed=d + len(q_lengths))
    out = torch.full((q.shape[0], hq, dv), NAN, dtype=q.dtype, device="cuda")
    lse = torch.full((hq, q.shape[0]), NAN, dtype=torch.float32, device="cuda")
    result = flashcore.attention_varlen(q, k, v, cu_q, cu_k, max(q_lengths), max(k_lengths), causal=causal, out=out,
                                        lse=lse, return_lse=True)
    assert result[0] is out and result[1] is lse
    check_packed_queries(torch, out, lse, q, q_lengths,
                         list(zip(unpacked(k, k_lengths), unpacked(v, k_lengths))), causal)
    assert torch.isnan(out[sum(q_lengths):]).all(), "wrote rows outside every sequence"


@pytest.mark.parametrize("case", [((32, 0), True), ((50, 20), False), ((0, 0), False), ((-1, 0), True)],
                         ids=window_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_varlen_window_softcap_and_splits(torch, dtype, case):
    need_head_dim(128)
    window, causal = case
    hq, hkv = 8, 2
    q_lengths, k_lengths = (200, 1, 0, 77, 333, 5), (260, 40, 10, 77, 100, 0)
    q, k, v, cu_q, cu_k = varlen_inputs(torch, (hq, hkv, q_lengths, k_lengths), 128, 128, dtype, seed=97)
    q = q * 8
    kv = list(zip(unpacked(k, k_lengths), unpacked(v, k_lengths)))
    for num_splits in (None, 1, 3):
        out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, max(q_lengths), max(k_lengths), causal=causal,
                                              window=window, softcap=SOFTCAP, num_splits=num_splits, return_lse=True)
        # Allocated by the call: q's rows with v's head_dim_v, lse [Hq, total_q].
        assert out.shape == (q.shape[0], hq, 128) and out.dtype == q.dtype and out.is_contiguous()
        assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
        check_packed_queries(torch, out, lse, q, q_lengths, kv, causal, window=window, softcap=SOFTCAP)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_varlen_seqused_k(torch, dtype):
    # Each sequence uses the first min(seqused_k[b], its length) of its keys;
    # causal aligns to that count.
    need_head_dim(64)
    hq, hkv = 4, 2
    q_lengths, k_lengths, used = (16, 1, 30, 8), (100, 50, 64, 9), (60, 0, 500, 9)
    q, k, v, cu_q, cu_k = varlen_inputs(torch, (hq, hkv, q_lengths, k_lengths), 64, 64, dtype, seed=98)
    seqused_k = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, max(q_lengths), max(k_lengths), causal=True,
                                          seqused_k=seqused_k, return_lse=True)
    kv = [(ks[:, :, :min(n, nk)], vs[:, :, :min(n, nk)])
          for ks, vs, n, nk in zip(unpacked(k, k_lengths), unpacked(v, k_lengths), used, k_lengths)]
    check_packed_queries(torch, out, lse, q, q_lengths, kv, True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_varlen_strided_qkv(torch, dtype):
    # FlashAttention's packed qkv [total, 3, H, D]: q, k and v are strided views.
    need_head_dim(128)
    lengths, h, d = (70, 1, 129, 0, 64), 4, 128
    total = sum(lengths)
    qkv = cuda_randn(torch, (total, 3, h, d), dtype, seed=99)
    q, k, v = qkv.unbind(1)
    assert q.stride() == (3 * h * d, d, 1)
    cu = cu_seqlens(torch, lengths)
    out, lse = flashcore.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_lse=True)
    check_packed_queries(torch, out, lse, q, lengths, list(zip(unpacked(k, lengths), unpacked(v, lengths))), True)


def test_attention_varlen_equal_lengths_match_attention(torch):
    # Sequences all of one length, packed: the same as the dense batch.
    need_head_dim(64)
    b, s, hq, hkv, d = 3, 96, 8, 2, 64
    q = cuda_randn(torch, (b, s, hq, d), "float16", seed=100)
    k = cuda_randn(torch, (b, s, hkv, d), "float16", seed=101)
    v = cuda_randn(torch, (b, s, hkv, d), "float16", seed=102)
    cu = cu_seqlens(torch, (s,) * b)
    out, lse = flashcore.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, s, s,
                                          causal=True, return_lse=True)
    # Back to [B, H, S, D] (and lse [B, H, S]): one check of the whole batch.
    check(torch, out.view(b, s, hq, d).transpose(1, 2), lse.view(hq, b, s).transpose(0, 1), q.transpose(1, 2),
          k.transpose(1, 2), v.transpose(1, 2), True)


PAGED_CASES = [  # batch, heads_q, heads_kv, seqlen_q, per-sequence key counts
    (4, 8, 2, 1, (0, 1, 513, 1000)),  # decode, GQA 4, an empty sequence
    (3, 4, 4, 1, (2048, 129, 256)),  # counts on and off page boundaries
    (2, 8, 1, 16, (300, 16)),  # MQA, several queries
    (3, 4, 2, 7, (7, 100, 3)),  # a count below seqlen_q: causal rows that see nothing
]


def paged_cache(torch, k, v, lengths, page_size, seed, spare_columns=0):
    """k, v [B, S, Hkv, D] (S a multiple of page_size) moved into page
    pools in shuffled order: (k_pool, v_pool [num_pages, page_size, Hkv,
    D], block_table [B, S / page_size] int32). Sequence b's first
    lengths[b] rows are copied into its pages; every other row of the pools
    is NaN or inf, and the table's entries past a sequence's pages point
    outside the pool (the library clamps them and uses none of their keys).
    spare_columns > 0 gives the table as a [:, :max_pages] view of a wider
    one."""
    batch, capacity = k.shape[:2]
    max_pages = capacity // page_size
    width = max_pages + spare_columns
    num_pages = batch * width + 3  # a few pages no sequence lists
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    table = order[:batch * width].view(batch, width).to(torch.int32)  # on the host while filling
    pools = []
    for dense in (k, v):
        pool = torch.empty((num_pages, page_size) + tuple(dense.shape[2:]), dtype=dense.dtype, device="cuda")
        pool[:, 0::2] = NAN
        pool[:, 1::2] = float("inf")
        for b, n in enumerate(lengths):
            for first in range(0, n, page_size):
                rows = min(page_size, n - first)
                pool[int(table[b, first // page_size]), :rows] = dense[b, first:first + rows]
        pools.append(pool)
    for b, n in enumerate(lengths):
        used = -(-n // page_size)
        table[b, used:] = -1 if b % 2 else num_pages + 100
    return pools[0], pools[1], table.to("cuda")[:, :max_pages]


def paged_inputs(torch, b, hq, hkv, sq, lengths, page_size, d, dtype, seed, spare_columns=0):
    """q [B, Sq, Hq, D], the dense k and v [B, capacity, Hkv, D] the
    reference reads, and their paged copies (paged_cache); the capacity is
    one page more than the longest sequence needs."""
    capacity = (-(-max(lengths) // page_size) + 1) * page_size
    q = cuda_randn(torch, (b, sq, hq, d), dtype, seed)
    k = cuda_randn(torch, (b, capacity, hkv, d), dtype, seed + 1)
    v = cuda_randn(torch, (b, capacity, hkv, d), dtype, seed + 2)
    return (q, k, v) + paged_cache(torch, k, v, lengths, page_size, seed, spare_columns)


@pytest.mark.parametrize("case", PAGED_CASES, ids=lambda c: "x".join(map(str, c[:4])) + "_" + "-".join(map(str, c[4])))
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kvcache_matches_reference(torch, dtype, causal, page_size, case):
    need_head_dim(128)
    b, hq, hkv, sq, lengths = case
    q, k, v, k_pool, v_pool, table = paged_inputs(torch, b, hq, hkv, sq, lengths, page_size, 128, dtype,
                                                  seed=sq + page_size)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens, block_table=table, causal=causal,
                                                return_lse=True)
    assert out.shape == (b, sq, hq, 128) and lse.shape == (b, hq, sq)
    check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                       lengths, causal)


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kvcache_full_capacity_and_padded_table(torch, dtype, page_size):
    # Without cache_seqlens every sequence uses its table row's whole
    # capacity (max_pages * page_size); the table is a view with a row
    # stride larger than its width.
    need_head_dim(64)
    b, hq, hkv, sq, d = 3, 8, 2, 5, 64
    capacity = 1024
    q = cuda_randn(torch, (b, sq, hq, d), dtype, seed=page_size)
    k = cuda_randn(torch, (b, capacity, hkv, d), dtype, seed=1)
    v = cuda_randn(torch, (b, capacity, hkv, d), dtype, seed=2)
    k_pool, v_pool, table = paged_cache(torch, k, v, (capacity,) * b, page_size, seed=3, spare_columns=5)
    assert table.stride(0) == capacity // page_size + 5
    for causal in (False, True):
        out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, block_table=table, causal=causal,
                                                    return_lse=True)
        check(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kvcache_window_softcap_and_splits(torch, dtype, page_size):
    need_head_dim(128)
    b, hq, hkv, sq, lengths = 3, 8, 2, 4, (1500, 17, 700)
    q, k, v, k_pool, v_pool, table = paged_inputs(torch, b, hq, hkv, sq, lengths, page_size, 128, dtype, seed=7)
    q = q * 8
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for num_splits in (None, 1, 3):
        out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens, block_table=table, causal=True,
                                                    window=(300, 0), softcap=SOFTCAP, num_splits=num_splits,
                                                    return_lse=True)
        check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                           lengths, True, window=(300, 0), softcap=SOFTCAP)


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kvcache_with_packed_queries(torch, dtype, page_size):
    # Chunked prefill: each sequence's new queries, packed, against its
    # paged keys (the chunk's own keys are the last of them).
    need_head_dim(128)
    hq, hkv = 8, 2
    q_lengths, k_lengths = (1, 0, 37, 64), (300, 10, 37, 700)
    q, cu_q = packed(torch, q_lengths, hq, 128, dtype, seed=11)
    _, k, v, k_pool, v_pool, table = paged_inputs(torch, len(k_lengths), hq, hkv, 1, k_lengths, page_size, 128,
                                                  dtype, seed=12)
    cache_seqlens = torch.tensor(k_lengths, dtype=torch.int32, device="cuda")
    out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens, block_table=table,
                                                cu_seqlens_q=cu_q, max_seqlen_q=max(q_lengths), causal=True,
                                                return_lse=True)
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    kv = [(k[b:b + 1, :n].transpose(1, 2), v[b:b + 1, :n].transpose(1, 2)) for b, n in enumerate(k_lengths)]
    check_packed_queries(torch, out, lse, q, q_lengths, kv, True)


def test_paged_kvcache_int_length_and_the_library_s_refusals(torch):
    need_head_dim(64)
    q, k, v, k_pool, v_pool, table = paged_inputs(torch, 2, 4, 2, 1, (100, 100), 16, 64, "bfloat16", seed=13)
    # An int cache_seqlens applies to every sequence.
    out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, 100, block_table=table, return_lse=True)
    check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                       (100, 100), False)
    as_array = torch.full((2,), 100, dtype=torch.int32, device="cuda")
    again = flashcore.attention_with_kvcache(q, k_pool, v_pool, as_array, block_table=table)
    torch.cuda.synchronize()
    assert torch.equal(out, again)
    # Pages of 8 keys: refused by the library, nothing written.
    small = torch.zeros((40, 8, 2, 64), dtype=torch.bfloat16, device="cuda")
    out.fill_(NAN)
    with pytest.raises(flashcore.UnsupportedError, match="page_size"):
        flashcore.attention_with_kvcache(q, small, small, 100, block_table=table, out=out)
    with pytest.raises(flashcore.InvalidArgumentError, match="block_table must be int32"):
        flashcore.attention_with_kvcache(q, k_pool, v_pool, 100, block_table=table.long())
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a failed call wrote to out"


# --------------------------------------------------------------------------
# PyTorch's and FlashAttention's ways of calling (issue 18): flashcore.sdpa
# against PyTorch's own scaled_dot_product_attention in float64 (its
# semantics: top-left is_causal, broadcasting), flash_attn_func against
# check() above, the torch operator flashcore::forward under torch.compile
# and CUDA graphs, the call cache on fresh tensors, and inputs that require grad.
# --------------------------------------------------------------------------


def check_against_sdpa(torch, out, q, k, v, is_causal=False, scale=None, enable_gqa=False):
    """out against torch's scaled_dot_product_attention of the same
    arguments in float64: relative L2 error within twice that of torch's
    SDPA in q's dtype (given the mask explicitly, so that every backend
    computes the same thing), or of rounding the reference, + 1e-5."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    torch.cuda.synchronize()
    ref = sdpa(q.double(), k.double(), v.double(), is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    mask = None
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device="cuda").tril()
        explicit = sdpa(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        assert torch.allclose(explicit, ref), "PyTorch's is_causal is not the top-left tril mask"
    theirs = rel_err(sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), ref)
    floor = rel_err(ref.to(q.dtype), ref)
    assert tuple(out.shape) == tuple(ref.shape) and out.dtype == q.dtype and out.is_contiguous()
    assert torch.isfinite(out).all(), "non-finite values in out"
    ours = rel_err(out, ref)
    assert ours <= 2 * max(theirs, floor) + 1e-5, \
        "rel-L2 error %.3g vs torch's %.3g (rounding alone: %.3g)" % (ours, theirs, floor)


SDPA_SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (2, 8, 8, 128, 128),
    (1, 8, 2, 200, 77),  # Sq > Sk: top-left is_causal is the window (-1, Sq - Sk)
    (2, 4, 4, 33, 300),  # Sq < Sk: top-left is_causal runs on the first Sq keys
    (1, 32, 8, 1, 500),  # decoding: is_causal sees key 0 only
]


@pytest.mark.parametrize("shape", SDPA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_matches_pytorch(torch, dtype, is_causal, shape):
    need_head_dim(64)
    b, hq, hkv, sq, sk = shape
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 64, dtype, seed=sq + sk)
    gqa = hq != hkv
    out = flashcore.sdpa(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    check_against_sdpa(torch, out, q, k, v, is_causal, enable_gqa=gqa)
    scaled = flashcore.sdpa(q, k, v, None, 0.0, is_causal, scale=0.3, enable_gqa=gqa)
    check_against_sdpa(torch, scaled, q, k, v, is_causal, scale=0.3, enable_gqa=gqa)


@pytest.mark.parametrize("q_shape,kv_shape,gqa", [
    ((6, 50, 64), (6, 70, 64), False),  # [N, L, E]
    ((2, 3, 4, 40, 64), (2, 3, 4, 40, 64), False),  # two batch dims
    ((2, 8, 60, 64), (1, 1, 90, 64), False),  # batch and heads broadcast
    ((2, 8, 60, 64), (2, 2, 30, 64), True),
])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_shapes_like_pytorch(torch, q_shape, kv_shape, gqa, is_causal):
    need_head_dim(64)
    q = cuda_randn(torch, q_shape, "float16", 200)
    k, v = cuda_randn(torch, kv_shape, "float16", 201), cuda_randn(torch, kv_shape, "float16", 202)
    check_against_sdpa(torch, flashcore.sdpa(q, k, v, is_causal=is_causal, enable_gqa=gqa), q, k, v, is_causal,
                       enable_gqa=gqa)


@pytest.mark.parametrize("case", [
    dict(causal=False), dict(causal=True), dict(causal=True, window_size=(32, -1)),
    dict(causal=True, window_size=(-1, 7)), dict(window_size=(20, 10)), dict(softcap=SOFTCAP, causal=True),
    dict(softmax_scale=0.2),
], ids=lambda c: "-".join("%s=%s" % item for item in c.items()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_func_matches_reference(torch, dtype, case):
    need_head_dim(128)
    b, sq, sk, hq, hkv, d = 2, 90, 150, 8, 2, 128
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 300)
    k, v = cuda_randn(torch, (b, sk, hkv, d), dtype, 301), cuda_randn(torch, (b, sk, hkv, d), dtype, 302)
    out = flashcore.flash_attn_func(q, k, v, **case)
    assert out.shape == (b, sq, hq, d) and out.is_contiguous()
    window = case.get("window_size")
    # FlashAttention's rules: causal makes the right bound 0 (check() does the same), (-1, -1) is no window.
    check(torch, out.transpose(1, 2), None, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
          case.get("causal", False), case.get("softmax_scale"), window=None if window == (-1, -1) else window,
          softcap=case.get("softcap", 0.0))


def test_operator_is_the_eager_call(torch):
    need_head_dim(64)
    op = flashcore.register_torch_ops()
    q, k, v = qkv(torch, 2, 8, 2, 100, 130, 64, "bfloat16", 400)
    out, lse = torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", True, None, None,
                                           [64, 0], 0.0, True)
    expected, expected_lse = flashcore.attention(q, k, v, causal=True, window=(64, 0), return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    check(torch, out, lse, q, k, v, True, window=(64, 0))
    only_out, empty = op(q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, None, 0.0, False)
    torch.cuda.synchronize()
    assert empty.numel() == 0 and torch.equal(only_out, flashcore.attention(q, k, v, causal=True))
    # PyTorch's own checks of a custom operator: schema, fake against real
    # outputs, tracing with dynamic shapes.
    for return_lse in (False, True):
        torch.library.opcheck(op, (q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, [64, 0],
                                   0.0, return_lse))


class TransformerBlock:
    """A pre-norm transformer block (grouped-query causal self-attention,
    GELU MLP) whose attention is flashcore's (`attend`) or PyTorch's SDPA."""

    def __init__(self, torch, dim=256, heads=8, kv_heads=2, seed=0):
        torch.manual_seed(seed)
        nn = torch.nn
        self.torch, self.heads, self.kv_heads, self.head_dim = torch, heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = nn.Linear(heads * self.head_dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.modules = nn.ModuleList([self.norm1, self.norm2, self.qkv, self.proj, self.mlp]).cuda()

    def to(self, dtype):
        self.modules.to(dtype)
        return self

    def __call__(self, x, attend):
        b, s, _ = x.shape
        h, hkv, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split([h * d, hkv * d, hkv * d], dim=-1)
        q, k, v = (t.view(b, s, n, d).transpose(1, 2) for t, n in ((q, h), (k, hkv), (v, hkv)))
        o = attend(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h * d))
        return x + self.mlp(self.norm2(x))


ATTENDS = {
    "attention": lambda q, k, v: flashcore.attention(q, k, v, causal=True),
    "sdpa": lambda q, k, v: flashcore.sdpa(q, k, v, is_causal=True, enable_gqa=True),
    "flash_attn_func": lambda q, k, v: flashcore.flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2),
}


@pytest.mark.parametrize("entry", sorted(ATTENDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_transformer_block_matches_eager_sdpa(torch, dtype, entry):
    # issue 18's done-when 1: torch.compile(fullgraph=True) of a block using
    # flashcore, against the same block with PyTorch's SDPA, eager, and no
    # graph break in torch._dynamo.explain.
    need_head_dim(32)
    torch_sdpa = torch.nn.functional.scaled_dot_product_attention
    block = TransformerBlock(torch).to(getattr(torch, dtype))
    reference = TransformerBlock(torch).to(torch.float64)  # the same weights (same seed)
    x = cuda_randn(torch, (2, 96, 256), dtype, 500)
    attend = ATTENDS[entry]

    def forward(x):
        return block(x, attend)

    with torch.no_grad():
        assert_one_graph(torch, forward, x)
        compiled = torch.compile(forward, fullgraph=True)
        ours = compiled(x)
        eager_sdpa = block(x, lambda q, k, v: torch_sdpa(q, k, v, is_causal=True, enable_gqa=True))
        ref = reference(x.double(), lambda q, k, v: torch_sdpa(q, k, v, is_causal=True, enable_gqa=True))
        again = compiled(cuda_randn(torch, (2, 96, 256), dtype, 501))  # the compiled graph, called again
    torch.cuda.synchronize()
    assert torch.isfinite(ours).all() and torch.isfinite(again).all()
    theirs, floor = rel_err(eager_sdpa, ref), rel_err(ref.to(x.dtype), ref)
    assert rel_err(ours, ref) <= 2 * max(theirs, floor) + 1e-5, \
        "compiled flashcore block %.3g vs eager SDPA block %.3g" % (rel_err(ours, ref), theirs)


def test_compiled_varlen_and_kvcache_match_eager(torch):
    need_head_dim(64)
    lengths_q, lengths_k = [5, 0, 37], [40, 3, 37]
    q, cu_q = packed(torch, lengths_q, 8, 64, "float16", 600)
    k, cu_k = packed(torch, lengths_k, 2, 64, "float16", 601)
    v, _ = packed(torch, lengths_k, 2, 64, "float16", 602)
    cache_q = cuda_randn(torch, (3, 2, 8, 64), "float16", 603)
    k_cache = cuda_randn(torch, (3, 50, 2, 64), "float16", 604)
    v_cache = cuda_randn(torch, (3, 50, 2, 64), "float16", 605)
    used = torch.tensor([50, 17, 1], dtype=torch.int32, device="cuda")

    def calls(q, k, v, cu_q, cu_k, cache_q, k_cache, v_cache, used):
        return (flashcore.attention_varlen(q, k, v, cu_q, cu_k, 37, 40, causal=True, return_lse=True),
                flashcore.attention_with_kvcache(cache_q, k_cache, v_cache, used, causal=True),
                flashcore.attention_with_kvcache(cache_q, k_cache, v_cache, 20))

    args = (q, k, v, cu_q, cu_k, cache_q, k_cache, v_cache, used)
    with torch.no_grad():
        eager = calls(*args)
        compiled = torch.compile(calls, fullgraph=True)(*args)
    torch.cuda.synchronize()
    total = sum(lengths_q)
    (out, lse), (eager_out, eager_lse) = compiled[0], eager[0]
    assert torch.equal(out[:total], eager_out[:total]) and torch.equal(lse[:, :total], eager_lse[:, :total])
    assert torch.equal(compiled[1], eager[1]) and torch.equal(compiled[2], eager[2])


def test_operator_cuda_graph_capture(torch):
    need_head_dim(64)
    q, k, v = qkv(torch, 1, 32, 8, 1, 1000, 64, "float16", 700)  # decoding: split, with a workspace
    flashcore.register_torch_ops()

    def step(q, k, v):
        return torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", False, None, None,
                                           None, 0.0, False)[0]

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(q, k, v)  # warm-up outside the capture (handle, plan)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(q, k, v)
    for seed in (701, 702):
        for dst, src in zip((q, k, v), qkv(torch, 1, 32, 8, 1, 1000, 64, "float16", seed)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, flashcore.attention(q, k, v))
    check(torch, captured, None, q, k, v, False)


def test_compiled_with_cuda_graphs(torch):
    need_head_dim(64)

    def attend(q, k, v):
        return flashcore.sdpa(q, k, v, is_causal=True, enable_gqa=True) * 2

    from torch._dynamo.utils import counters
    counters.clear()
    compiled = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for seed in (710, 711, 712, 713):  # the first calls record, the later ones replay
            q, k, v = qkv(torch, 2, 8, 2, 64, 64, 64, "bfloat16", seed)
            out = compiled(q, k, v).clone()
            torch.cuda.synchronize()
            assert torch.equal(out, flashcore.sdpa(q, k, v, is_causal=True, enable_gqa=True) * 2)
    assert counters["inductor"]["cudagraph_skips"] == 0, "the compiled call ran without a CUDA graph"


def test_cached_calls_take_each_call_s_tensors(torch):
    # One key for every call below: fresh tensors, and views at other offsets
    # of one buffer, each computed from its own data.
    need_head_dim(64)
    b, h, s, d = 2, 4, 80, 64
    buffer = cuda_randn(torch, (4, b, h, s, d), "float16", 800)
    for i in range(3):
        q, k, v = buffer[i], buffer[i + 1], cuda_randn(torch, (b, h, s, d), "float16", 801 + i)
        out = flashcore.attention(q, k, v, causal=True)
        check(torch, out, None, q, k, v, True)


def test_inputs_that_require_grad_are_differentiated_on_the_gpu(torch, monkeypatch):
    # The gradients themselves: test_gpu_backward.py.
    need_head_dim(64)
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    q, k, v = qkv(torch, 1, 4, 4, 50, 50, 64, "float16", 900)
    q.requires_grad_(True)
    out = flashcore.attention(q, k, v)
    assert out.requires_grad and out.grad_fn is not None
    detached = flashcore.attention(q, k, v, detach=True)
    assert not detached.requires_grad and detached.grad_fn is None
    with torch.no_grad():
        plain = flashcore.attention(q, k, v)
    # The differentiable call also writes the lse, which changes nothing in out.
    assert torch.equal(out, plain) and torch.equal(detached, plain)


# --------------------------------------------------------------------------
# The quickest cached path (plain torch tensors on the current stream, issue
# 18): each call's own tensors and values, the kept split-KV workspaces, and
# what it must still refuse.
# --------------------------------------------------------------------------

def split_decode_inputs(torch, seed):
    """A decode step whose call splits its keys (so it needs a workspace)."""
    q, k, v = qkv(torch, 1, 32, 8, 1, 4096, 64, "float16", seed)
    params = flashcore.forward_params(q, k, v, torch.empty_like(q))
    assert flashcore.get_handle(q.device.index).workspace_size(params) > 0, "the call does not split"
    return q, k, v


def test_quick_path_decode_shares_a_workspace_per_stream(torch):
    need_head_dim(64)
    from flashcore import _plan
    flashcore.release_workspaces()
    q, k, v = split_decode_inputs(torch, 950)
    for _ in range(3):  # the full path, then the quick path (then the compiled one, where built)
        check(torch, flashcore.attention(q, k, v), None, q, k, v, False)
    assert len(_plan._kept_workspaces) == 1
    # Two streams at once, several calls each on data of its own: one
    # workspace per stream, written by one call at a time.
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [split_decode_inputs(torch, 960 + 3 * i) for i in range(len(streams))]
    torch.cuda.synchronize()
    results = []
    for stream, (q2, k2, v2) in zip(streams, inputs):
        with torch.cuda.stream(stream):
            delay(torch)
            results.append([flashcore.attention(q2, k2, v2) for _ in range(4)])
    torch.cuda.synchronize()
    for (q2, k2, v2), outs in zip(inputs, results):
        for out in outs:
            check(torch, out, None, q2, k2, v2, False)
    assert len(_plan._kept_workspaces) == 1 + len(streams)
    flashcore.release_workspaces()
    assert not _plan._kept_workspaces


def test_quick_path_under_cuda_graph_capture(torch):
    # The captured call's workspace is the graph's own (torch's allocator),
    # not the one kept for eager calls, which may run between replays.
    need_head_dim(64)
    from flashcore import _plan
    q, k, v = split_decode_inputs(torch, 970)
    out = torch.empty_like(q)
    for _ in range(3):
        flashcore.attention(q, k, v, out=out)
    torch.cuda.synchronize()
    kept = dict(_plan._kept_workspaces)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcore.attention(q, k, v, out=out)
    assert _plan._kept_workspaces == kept, "the capture kept a workspace"
    other_q, other_k, other_v = split_decode_inputs(torch, 973)
    for _ in range(5):
        out.fill_(NAN)
        graph.replay()
        eager = flashcore.attention(other_q, other_k, other_v)  # the kept workspace, between replays
        torch.cuda.synchronize()
        check(torch, out, None, q, k, v, False)
        check(torch, eager, None, other_q, other_k, other_v, False)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("given_out", [False, True])
def test_quick_path_takes_each_call_s_tensors(torch, given_out, return_lse):
    need_head_dim(128)
    b, hq, hkv, s, d = 2, 8, 2, 300, 128
    for seed in range(980, 986, 2):
        q, k, v = qkv(torch, b, hq, hkv, s, s, d, "bfloat16", seed)
        out = torch.full_like(q, NAN) if given_out else None
        result = flashcore.attention(q, k, v, causal=True, out=out, return_lse=return_lse)
        got, lse = result if return_lse else (result, None)
        assert out is None or got is out
        check(torch, got, lse, q, k, v, True)


def test_quick_path_kvcache_decode_steps(torch):
    # A decode loop: the same cache tensors, counts that change in place.
    need_head_dim(128)
    b, hq, hkv, rows = 3, 8, 2, 1024
    k_cache = cuda_randn(torch, (b, rows, hkv, 128), "float16", seed=990)
    v_cache = cuda_randn(torch, (b, rows, hkv, 128), "float16", seed=991)
    cache_seqlens = torch.tensor([1, 500, 1000], dtype=torch.int32, device="cuda")
    for step in range(4):
        q = cuda_randn(torch, (b, 1, hq, 128), "float16", seed=992 + step)
        out, lse = flashcore.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, return_lse=True)
        lengths = cache_seqlens.tolist()
        check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k_cache.transpose(1, 2),
                           v_cache.transpose(1, 2), lengths, False)
        cache_seqlens += 7


def test_quick_path_hands_grad_calls_to_autograd(torch, monkeypatch):
    need_head_dim(64)
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    q, k, v = qkv(torch, 1, 4, 4, 50, 50, 64, "float16", 995)
    for _ in range(3):
        flashcore.attention(q, k, v)
    k.requires_grad_(True)
    out = flashcore.attention(q, k, v)
    assert out.grad_fn is not None
    (dk,) = torch.autograd.grad(out.float().sum(), k)
    assert dk.shape == k.shape and torch.isfinite(dk).all()
    with torch.no_grad():
        for _ in range(3):
            check(torch, flashcore.attention(q, k, v), None, q, k, v, False)
    assert flashcore.attention(q, k, v).grad_fn is not None


# --------------------------------------------------------------------------
# The compiled call path (flashcore/_fastcall.c): the calls it serves give
# what the Python path gives, bit for bit (the same params, the same kernel).
# --------------------------------------------------------------------------

COMPILED_CASES = {
    # name: (shape b, hq, hkv, sq, sk, d), dtype, attention keywords
    "prefill causal": ((1, 8, 2, 300, 300, 64), "float16", dict(causal=True)),
    "decode split-KV": ((1, 32, 8, 1, 4096, 64), "float16", dict()),
    "lse and scale": ((2, 4, 4, 77, 133, 128), "bfloat16", dict(return_lse=True, softmax_scale=0.2)),
    "window and softcap": ((1, 4, 2, 200, 260, 64), "bfloat16", dict(window=(64, 0), softcap=30.0)),
    "bshd": ((2, 6, 2, 90, 90, 64), "float16", dict(layout="bshd", causal=True)),
    "seqused_k": ((3, 8, 2, 1, 512, 128), "bfloat16", dict(seqused=True)),
    "out given": ((2, 8, 8, 64, 64, 64), "float16", dict(out_given=True)),
    "sinks and chunk": ((1, 8, 2, 300, 300, 64), "bfloat16", dict(causal=True, attention_chunk=128, sinks=True)),
    "decode with sm_margin": ((1, 32, 8, 1, 4096, 64), "float16", dict(sm_margin=16)),
}


@pytest.mark.parametrize("case", sorted(COMPILED_CASES))
def test_compiled_path_gives_the_python_paths_results(torch, case):
    from flashcore import _attention
    (b, hq, hkv, sq, sk, d), dtype, kwargs = COMPILED_CASES[case]
    need_head_dim(d)
    kwargs = dict(kwargs)
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=990)
    if kwargs.get("layout") == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    if kwargs.pop("seqused", False):
        kwargs["seqused_k"] = torch.tensor([512, 7, 300], dtype=torch.int32, device="cuda")
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = torch.nn.Parameter(random_sinks(torch, hq, sk, seed=991))  # a model's, requiring grad
    given = kwargs.pop("out_given", False)

    def run():
        if given:
            kwargs["out"] = torch.full_like(q, NAN)
        return flashcore.attention(q, k, v, **kwargs)

    saved = _attention._fast
    try:
        # (Inference calls: the sinks, a parameter, require grad.)
        with torch.no_grad():
            _attention._fast = False
            python = [run() for _ in range(3)]  # the full path, then the Python quick path
            _attention._fast = None  # looked for again by the next call
            run()  # through the Python quick path, which gives the compiled path the plan
            if not _attention._fast:
                pytest.skip("flashcore._fastcall is not built: every call takes the Python path")
            options = (kwargs.get("causal", False), kwargs.get("softmax_scale"), None, kwargs.get("window"),
                       kwargs.get("softcap", 0.0), kwargs.get("attention_chunk", 0), kwargs.get("sm_margin", 0))
            out = kwargs["out"] = torch.full_like(q, NAN) if given else None
            compiled = _attention._fast.call(q, k, v, out, kwargs.get("seqused_k"), None, None, None,
                                             kwargs.get("sinks"), kwargs.get("layout", "bhsd"), options,
                                             kwargs.get("return_lse", False))
            assert compiled is not None, "the compiled path did not serve the call"
            again = run()
        torch.cuda.synchronize()
    finally:
        _attention._fast = saved
    for result in (compiled, again):
        for mine, theirs in zip(result if isinstance(result, tuple) else (result,),
                                python[-1] if isinstance(python[-1], tuple) else (python[-1],)):
            assert torch.equal(mine, theirs)
    if given:
        assert compiled is out


# --------------------------------------------------------------------------
# Quantized (fp8) KV caches (0.8, issue 36): float8_e4m3fn k and v beside
# float16/bfloat16 q, each with its descale factors (one for the tensor,
# or one per sequence and K/V head). check() against the float64
# reference of the dequantized K/V (k_descale * k, exact in float64), the
# error bar that of torch's SDPA in q's dtype on the dequantized K/V.
# --------------------------------------------------------------------------

# The quantized values use up to this magnitude (float8_e4m3fn's largest is
# 448; torch turns values past it into NaN).
FP8_RANGE = 400.0
FP8_SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (2, 4, 4, 128, 128),
    (1, 8, 2, 77, 133),  # grouped-query, odd lengths
    (3, 8, 2, 1, 500),  # decode, split-KV
]
FP8_HEAD_DIMS = [(64, 64), (128, 128), (256, 256), (192, 128)]
DESCALES = ["per-tensor", "per-head"]


def spread(torch, x, heads_axis):
    """x with each (batch, head) scaled by its own factor (0.5 to 4), so that
    a descale read for the wrong sequence or head shows in the result."""
    b, h = x.shape[0], x.shape[heads_axis]
    g = torch.Generator(device="cuda").manual_seed(b * 1000 + h)
    factors = 0.5 + 3.5 * torch.rand((b, h), generator=g, device="cuda")
    shape = [b] + [1] * (x.dim() - 1)
    shape[heads_axis] = h
    return x * factors.view(shape).to(x.dtype)


def quantize(torch, x, per_head, heads_axis=1):
    """(x as float8_e4m3fn, its float32 CUDA descale, the dequantized values
    in float64) for a 16-bit x of [B, H, S, D] (heads_axis 1) or [B, S, H,
    D] (heads_axis 2): a 0-d descale per tensor, else [B, H], each the
    largest magnitude it covers over FP8_RANGE. x8 keeps x's strides."""
    x32 = x.float()
    seq_axis = 3 - heads_axis
    if per_head:
        descale = x32.abs().amax(dim=(seq_axis, 3)) / FP8_RANGE  # [B, H]
        shape = [x.shape[0], 1, 1, 1]
        shape[heads_axis] = x.shape[heads_axis]
        wide = descale.view(shape)
    else:
        descale = x32.abs().amax() / FP8_RANGE
        wide = descale
    x8 = (x32 / wide).to(torch.float8_e4m3fn)
    return x8, descale, x8.double() * wide.double()


def fp8_inputs(torch, b, hq, hkv, sq, sk, d, dv, dtype, seed, per_head):
    """[B, H, S, D] q of `dtype`, fp8 k and v from fresh random values (each
    head at its own scale), their descales and dequantized float64 values:
    (q, k8, v8, k_descale, v_descale, k64, v64)."""
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed, dv)
    k8, k_descale, k64 = quantize(torch, spread(torch, k, 1), per_head)
    v8, v_descale, v64 = quantize(torch, spread(torch, v, 1), per_head)
    return q, k8, v8, k_descale, v_descale, k64, v64


@pytest.mark.parametrize("descales", DESCALES)
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", FP8_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kv_matches_reference(torch, dtype, head_dims, causal, shape, descales):
    d, dv = head_dims
    need_head_dims(d, dv)
    b, hq, hkv, sq, sk = shape
    q, k8, v8, k_descale, v_descale, k64, v64 = fp8_inputs(torch, b, hq, hkv, sq, sk, d, dv, dtype, seed=sq + d,
                                                           per_head=descales == "per-head")
    out, lse = flashcore.attention(q, k8, v8, causal=causal, k_descale=k_descale, v_descale=v_descale,
                                   return_lse=True)
    assert out.dtype == q.dtype and out.shape == (b, hq, sq, dv)
    check(torch, out, lse, q, k64, v64, causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kv_window_softcap_and_splits(torch, dtype):
    need_head_dim(128)
    q, k8, v8, k_descale, v_descale, k64, v64 = fp8_inputs(torch, 2, 8, 2, 40, 1500, 128, 128, dtype, seed=1100,
                                                           per_head=True)
    q = q * 8
    for num_splits in (None, 1, 3):
        for window, causal, softcap in (((300, 0), True, SOFTCAP), ((64, 16), False, 0.0), (None, True, SOFTCAP)):
            out, lse = flashcore.attention(q, k8, v8, causal=causal, window=window, softcap=softcap,
                                           num_splits=num_splits, k_descale=k_descale, v_descale=v_descale,
                                           return_lse=True)
            check(torch, out, lse, q, k64, v64, causal, window=window, softcap=softcap)


def test_fp8_descale_forms_read_alike(torch):
    # One factor given as 0-d, [1] and [B, Hkv] expanded; factors per
    # sequence and head contiguous and as a transposed view: each pair
    # bitwise equal (the kernels read the same floats).
    need_head_dim(64)
    b, hkv = 3, 2
    q, k8, v8, k_descale, v_descale, k64, v64 = fp8_inputs(torch, b, 8, hkv, 5, 300, 64, 64, "float16", seed=1200,
                                                           per_head=False)
    outs = [flashcore.attention(q, k8, v8, k_descale=form(k_descale), v_descale=form(v_descale))
            for form in (lambda s: s, lambda s: s.reshape(1), lambda s: s.expand(b, hkv))]
    check(torch, outs[0], None, q, k64, v64, False)
    per_head = torch.rand((b, hkv), device="cuda") + 0.5
    transposed = per_head.t().contiguous().t()
    assert transposed.stride() == (1, b)
    outs += [flashcore.attention(q, k8, v8, k_descale=per_head, v_descale=per_head),
             flashcore.attention(q, k8, v8, k_descale=transposed, v_descale=transposed)]
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert torch.equal(outs[3], outs[4])
    wide = per_head.double()[:, :, None, None]
    check(torch, outs[3], None, q, k8.double() * wide, v8.double() * wide, False)


@pytest.mark.parametrize("descales", DESCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_attention_varlen(torch, dtype, descales):
    need_head_dim(128)
    hq, hkv = 8, 2
    q_lengths, k_lengths = (16, 1, 0, 77, 200), (300, 40, 9, 77, 0)
    case = (hq, hkv, q_lengths, k_lengths)
    q, k, v, cu_q, cu_k = varlen_inputs(torch, case, 128, 128, dtype, seed=1300)
    total = sum(k_lengths)
    per_head = descales == "per-head"
    # Each sequence's K/V at its own scale, quantized per sequence and
    # head ([B, Hkv]) or for the whole tensor; the pad rows stay NaN.
    batch_rows = [torch.full((n, hkv, 1), 1.0 + i, device="cuda") for i, n in enumerate(k_lengths)]
    scale_rows = torch.cat(batch_rows).to(k.dtype)
    k8, v8 = (torch.full(x.shape, NAN, device="cuda").to(torch.float8_e4m3fn) for x in (k, v))
    descale_of = {}
    for name, x, x8 in (("k", k, k8), ("v", v, v8)):
        x = x[:total] * scale_rows
        if per_head:
            amax = torch.stack([rows.float().abs().amax(dim=(0, 2)) if len(rows) else torch.ones(hkv, device="cuda")
                                for rows in x.split(list(k_lengths))])  # [B, Hkv]
            descale = amax / FP8_RANGE
            wide = torch.cat([descale[i].expand(n, hkv) for i, n in enumerate(k_lengths)])[:, :, None]
        else:
            descale = x.float().abs().amax() / FP8_RANGE
            wide = descale
        x8[:total] = (x.float() / wide).to(torch.float8_e4m3fn)
        descale_of[name] = (descale, x8[:total].double() * wide.double())
    (k_descale, k64), (v_descale, v64) = descale_of["k"], descale_of["v"]
    for num_splits in (None, 1, 3):
        out, lse = flashcore.attention_varlen(q, k8, v8, cu_q, cu_k, max(q_lengths), max(k_lengths), causal=True,
                                              num_splits=num_splits, k_descale=k_descale, v_descale=v_descale,
                                              return_lse=True)
        assert out.dtype == q.dtype
        check_packed_queries(torch, out, lse, q, q_lengths, list(zip(unpacked(k64, k_lengths),
                                                                     unpacked(v64, k_lengths))), True)


@pytest.mark.parametrize("descales", DESCALES)
@pytest.mark.parametrize("num_splits", [None, 1, 4], ids=lambda n: "auto" if n is None else "n%d" % n)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kvcache_matches_reference(torch, dtype, num_splits, descales):
    # A contiguous [B, S_cache, Hkv, D] fp8 cache whose rows past each
    # sequence's count are NaN.
    need_head_dim(128)
    b, hq, hkv, rows, lengths = 4, 8, 2, 1000, (0, 1, 513, 1000)
    q = cuda_randn(torch, (b, 1, hq, 128), dtype, seed=1400)
    k = spread(torch, cuda_randn(torch, (b, rows, hkv, 128), dtype, seed=1401), 2)
    v = spread(torch, cuda_randn(torch, (b, rows, hkv, 128), dtype, seed=1402), 2)
    k8, k_descale, k64 = quantize(torch, k, descales == "per-head", heads_axis=2)
    v8, v_descale, v64 = quantize(torch, v, descales == "per-head", heads_axis=2)
    for cache in (k8, v8):
        for i, n in enumerate(lengths):
            cache[i, n:] = NAN
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for causal in (False, True):
        out, lse = flashcore.attention_with_kvcache(q, k8, v8, cache_seqlens, causal=causal, num_splits=num_splits,
                                                    k_descale=k_descale, v_descale=v_descale, return_lse=True)
        check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k64.transpose(1, 2),
                           v64.transpose(1, 2), lengths, causal)


@pytest.mark.parametrize("descales", DESCALES)
@pytest.mark.parametrize("case", PAGED_CASES, ids=lambda c: "x".join(map(str, c[:4])) + "_" + "-".join(map(str, c[4])))
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_paged_kvcache_matches_reference(torch, dtype, page_size, case, descales):
    # Pages in shuffled order (paged_cache): every row outside a sequence's
    # keys NaN, table entries past its pages outside the pool.
    need_head_dim(128)
    b, hq, hkv, sq, lengths = case
    capacity = (-(-max(lengths) // page_size) + 1) * page_size
    q = cuda_randn(torch, (b, sq, hq, 128), dtype, seed=1500 + sq)
    k = spread(torch, cuda_randn(torch, (b, capacity, hkv, 128), dtype, seed=1501), 2)
    v = spread(torch, cuda_randn(torch, (b, capacity, hkv, 128), dtype, seed=1502), 2)
    k8, k_descale, k64 = quantize(torch, k, descales == "per-head", heads_axis=2)
    v8, v_descale, v64 = quantize(torch, v, descales == "per-head", heads_axis=2)
    k_pool, v_pool, table = paged_cache(torch, k8, v8, lengths, page_size, seed=1503)
    assert k_pool.dtype == torch.float8_e4m3fn
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for causal, num_splits in ((False, None), (True, 3)):
        out, lse = flashcore.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens, block_table=table,
                                                    causal=causal, num_splits=num_splits, k_descale=k_descale,
                                                    v_descale=v_descale, return_lse=True)
        assert out.dtype == q.dtype and out.shape == (b, sq, hq, 128)
        check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k64.transpose(1, 2),
                           v64.transpose(1, 2), lengths, causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kv_compiled_and_quick_paths_match_eager(torch, dtype):
    # torch.compile(fullgraph=True) with fp8 K/V and descales: no graph
    # break, the eager call's results bit for bit; then the cached quick
    # paths (the Python one and the compiled one, where built) on fresh
    # descale tensors each call.
    need_head_dim(64)
    q, k8, v8, k_descale, v_descale, k64, v64 = fp8_inputs(torch, 3, 8, 2, 4, 700, 64, 64, dtype, seed=1600,
                                                           per_head=True)
    pages = k8.transpose(1, 2).contiguous()  # [B, S, Hkv, D], the kvcache call's

    def calls(q, k8, v8, pages, k_descale, v_descale, lengths):
        return (flashcore.attention(q, k8, v8, causal=True, k_descale=k_descale, v_descale=v_descale),
                flashcore.attention_with_kvcache(q.transpose(1, 2), pages, pages, lengths, k_descale=k_descale))

    lengths = torch.tensor([700, 3, 350], dtype=torch.int32, device="cuda")
    args = (q, k8, v8, pages, k_descale, v_descale, lengths)
    with torch.no_grad():
        eager = calls(*args)
        assert_one_graph(torch, calls, *args)
        compiled = torch.compile(calls, fullgraph=True)(*args)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    check(torch, eager[0], None, q, k64, v64, True)
    for _ in range(3):
        out = flashcore.attention(q, k8, v8, causal=True, k_descale=k_descale.clone(), v_descale=v_descale.clone())
        torch.cuda.synchronize()
        assert torch.equal(out, eager[0])


def test_fp8_kv_refusals_write_nothing(torch, monkeypatch):
    monkeypatch.delenv("FLASHCORE_DETACH", raising=False)
    need_head_dim(64)
    q, k8, v8, k_descale, v_descale, k64, v64 = fp8_inputs(torch, 1, 4, 2, 16, 64, 64, 64, "bfloat16", seed=1700,
                                                           per_head=True)
    out = torch.full_like(q, NAN)
    # q_descale is for fp8 queries (test_gpu_fp8_prefill.py): the library
    # refuses it beside 16-bit q, in its own words.
    with pytest.raises((flashcore.UnsupportedError, flashcore.InvalidArgumentError), match="q_descale"):
        flashcore.attention(q, k8, v8, out=out, q_descale=k_descale[0, 0])
    with pytest.raises(flashcore.InvalidArgumentError, match="k_descale is set but k and v are not quantized"):
        flashcore.attention(q, k64.to(q.dtype), v64.to(q.dtype), out=out, k_descale=k_descale)
    with pytest.raises(flashcore.InvalidArgumentError, match="pass a tensor instead"):
        flashcore.attention(q, k8, v8, out=out, k_descale=0.01)
    with pytest.raises(flashcore.UnsupportedError, match="for inference only"):
        flashcore.attention(q.clone().requires_grad_(True), k8, v8, k_descale=k_descale)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call wrote to out"
    # detach=True: computed from the values alone.
    detached = flashcore.attention(q.clone().requires_grad_(True), k8, v8, k_descale=k_descale, v_descale=v_descale,
                                   detach=True)
    assert not detached.requires_grad
    check(torch, detached, None, q, k64, v64, False)


# --------------------------------------------------------------------------
# Chunked attention and learnable sinks (0.9, issue 61). check() with
# chunk= (window_visible's chunk rule, written out from flashcore.h) and
# sinks= (each head's sink one more term of its rows' softmax denominator;
# torch's low-precision result that of the sink as one more column of the
# float32 scores, gpt-oss's reference); its error bar. Rows that see no key
# must give out 0 and lse the head's sink (-inf for a head whose sink is
# -inf: no sink).
# --------------------------------------------------------------------------


def test_chunk_mask_follows_the_rule():
    # The reference's chunk mask, against cases worked out by hand (CPU only).
    torch = pytest.importorskip("torch")

    def rows(sq, sk, causal, window, chunk):
        mask = window_visible(torch, sq, sk, causal, window, device="cpu", chunk=chunk)
        return [[j for j in range(sk) if mask[i, j]] for i in range(sq)]

    # d = 0, chunks of 4 keys: causal within each chunk (the last one short).
    assert rows(6, 6, True, None, 4) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [4], [4, 5]]
    # Without causal: the whole of the diagonal's chunk, on both sides.
    assert rows(6, 6, False, None, 4) == [[0, 1, 2, 3]] * 4 + [[4, 5]] * 2
    # d = 3: query i's diagonal is key i + 3.
    assert rows(3, 6, True, None, 4) == [[0, 1, 2, 3], [4], [4, 5]]
    # d = -2: the diagonals -2 and -1 are in chunk -1 (floor division), which holds no key.
    assert rows(4, 2, True, None, 2) == [[], [], [0], [0, 1]]
    # With a window: a key must pass both.
    assert rows(6, 6, True, (1, 0), 4) == [[0], [0, 1], [1, 2], [2, 3], [4], [4, 5]]
    assert rows(3, 5, False, (1, 1), 100) == [[1, 2, 3], [2, 3, 4], [3, 4]]


def chunk_id(case):
    b, hq, hkv, sq, sk, chunk, causal, window = case
    return "%dx%dx%dx%dx%d_chunk%d%s%s" % (b, hq, hkv, sq, sk, chunk, "-causal" if causal else "",
                                           "" if window is None else "-w%d_%d" % window)


CHUNK_CASES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k, attention_chunk, causal, window
    (1, 8, 2, 300, 300, 128, True, None),  # Llama 4's: causal within chunks; 300 is 2 chunks and 44
    (2, 4, 4, 77, 333, 64, True, None),  # fewer queries than keys: the diagonals from key 256 on
    (2, 4, 2, 200, 130, 48, True, None),  # more queries than keys: diagonals below key 0 see nothing
    (1, 4, 2, 250, 250, 100, False, None),  # no causal: each row's whole chunk, both sides
    (1, 8, 2, 400, 400, 256, True, (100, 0)),  # a chunk and a window: both bound the keys
    (2, 4, 4, 129, 129, 1, True, None),  # chunks of one key: the diagonal key only
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=chunk_id)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_chunk_matches_reference(torch, dtype, d, case):
    need_head_dim(d)
    b, hq, hkv, sq, sk, chunk, causal, window = case
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=chunk + sq + d)
    out, lse = flashcore.attention(q, k, v, causal=causal, window=window, attention_chunk=chunk, return_lse=True)
    check(torch, out, lse, q, k, v, causal, window=window, chunk=chunk)
    # The same in FlashAttention's [B, S, H, D] storage.
    t = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    out_bshd = flashcore.attention(*t, causal=causal, window=window, attention_chunk=chunk, layout="bshd")
    check(torch, out_bshd.transpose(1, 2), None, q, k, v, causal, window=window, chunk=chunk)


@pytest.mark.parametrize("num_splits", NUM_SPLITS, ids=lambda n: "auto" if n is None else "n%d" % n)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_chunk_with_num_splits(torch, dtype, num_splits):
    # Decode-like rows over many keys: each row sees the last chunk up to
    # its diagonal (keys 2048 on); split parts that fall before it see none.
    need_head_dim(128)
    q, k, v = qkv(torch, 1, 32, 8, 16, 3000, 128, dtype, seed=1801)
    out, lse = flashcore.attention(q, k, v, causal=True, attention_chunk=1024, num_splits=num_splits,
                                   return_lse=True)
    check(torch, out, lse, q, k, v, True, chunk=1024)


def random_sinks(torch, heads, keys, seed, no_sink_head=True):
    """float32 [heads] sink logits on the GPU, in the units of the scaled
    scores: ln(keys) + N(0, 1), so that each head's sink takes from about a
    tenth to nine tenths of its rows' weight (scores of unit-variance q and
    k scaled by 1/sqrt(d) are about N(0, 1); their exponentials sum to
    about 1.6 * keys). With no_sink_head, head 1's is -inf: no sink."""
    sinks = cuda_randn(torch, (heads,), "float32", seed) + math.log(max(keys, 1))
    if no_sink_head:
        sinks[1] = float("-inf")
    return sinks


SINK_CASES = {  # name: ((batch, heads_q, heads_kv, seqlen_q, seqlen_k), attention()'s keywords)
    "causal": ((2, 4, 4, 128, 128), dict(causal=True)),
    "causal window 128 gqa": ((1, 8, 2, 500, 500), dict(causal=True, window=(128, 0))),  # gpt-oss's sliding layers
    "window both sides gqa": ((2, 8, 2, 300, 260), dict(window=(128, 64))),
    "no mask mqa": ((2, 6, 1, 150, 61), dict()),
    "causal rows that see no key": ((2, 6, 1, 150, 61), dict(causal=True)),  # the first 89 rows: lse = the sink
    "causal chunk": ((1, 8, 2, 300, 300), dict(causal=True, attention_chunk=128)),
    "causal softcap": ((1, 4, 2, 150, 170), dict(causal=True, softcap=SOFTCAP)),
    "one query": ((3, 8, 2, 1, 257), dict(causal=True)),
}


@pytest.mark.parametrize("name", sorted(SINK_CASES))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_match_reference(torch, dtype, d, name):
    need_head_dim(d)
    (b, hq, hkv, sq, sk), options = SINK_CASES[name]
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, d, dtype, seed=len(name) + d)
    sinks = random_sinks(torch, hq, sk, seed=len(name))
    out, lse = flashcore.attention(q, k, v, sinks=sinks, return_lse=True, **options)
    mask_options = dict(window=options.get("window"), softcap=options.get("softcap", 0.0),
                        chunk=options.get("attention_chunk", 0))
    check(torch, out, lse, q, k, v, options.get("causal", False), sinks=sinks, **mask_options)
    # The sinks take their share: the call without them is far from the reference.
    plain = flashcore.attention(q, k, v, **options)
    torch.cuda.synchronize()
    ref, _, empty = reference(torch, q, k, v, options.get("causal", False), d ** -0.5, sinks=sinks, **mask_options)
    assert rel_err(plain[~empty], ref[~empty]) > 0.05, "the sinks changed nothing"


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_bshd_layout_and_given_out_and_lse(torch, dtype):
    need_head_dim(64)
    b, sq, sk, hq, hkv, d = 2, 97, 230, 8, 2, 64
    q = cuda_randn(torch, (b, sq, hq, d), dtype, 1810)
    k, v = cuda_randn(torch, (b, sk, hkv, d), dtype, 1811), cuda_randn(torch, (b, sk, hkv, d), dtype, 1812)
    sinks = random_sinks(torch, hq, sk, seed=1813)
    out = torch.full_like(q, NAN)
    lse = torch.full((b, hq, sq), NAN, dtype=torch.float32, device="cuda")
    result = flashcore.attention(q, k, v, causal=True, window=(128, 0), sinks=sinks, layout="bshd", out=out,
                                 lse=lse, return_lse=True)
    assert result[0] is out and result[1] is lse
    t = [x.transpose(1, 2) for x in (out, q, k, v)]
    check(torch, t[0], lse, t[1], t[2], t[3], True, window=(128, 0), sinks=sinks)


@pytest.mark.parametrize("num_splits", NUM_SPLITS, ids=lambda n: "auto" if n is None else "n%d" % n)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_with_split_kv_decode(torch, dtype, shape, num_splits):
    # Split-KV: each part computed without the sink, which the merge counts
    # once; deterministic for a given num_splits.
    need_head_dim(128)
    b, hq, hkv, sq, sk = shape
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 128, dtype, seed=sq + sk + 1820)
    sinks = random_sinks(torch, hq, sk, seed=1821)
    for window in (None, (128, 0)):
        check_split_call(torch, q, k, v, True, num_splits, window=window, sinks=sinks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_with_a_kv_cache_decode(torch, dtype):
    # attention_with_kvcache's decode (a sequence with an empty cache: out
    # 0, lse the sink), split and not.
    need_head_dim(128)
    b, hq, hkv, sq, rows, lengths = 4, 8, 2, 1, 1000, (0, 1, 513, 1000)
    q = cuda_randn(torch, (b, sq, hq, 128), dtype, seed=1830)
    k_cache, v_cache = (cuda_randn(torch, (b, rows, hkv, 128), dtype, seed=1831 + i) for i in range(2))
    fill_unused(k_cache, lengths)
    fill_unused(v_cache, lengths)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    sinks = random_sinks(torch, hq, 500, seed=1833, no_sink_head=False)
    for num_splits in (None, 1, 4):
        out, lse = flashcore.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, causal=True, sinks=sinks,
                                                    num_splits=num_splits, return_lse=True)
        check_per_sequence(torch, out.transpose(1, 2), lse, q.transpose(1, 2), k_cache.transpose(1, 2),
                           v_cache.transpose(1, 2), lengths, True, sinks=sinks)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_with_packed_sequences(torch, dtype, causal):
    # GQA; a sequence without queries, one without keys (lse = the sink),
    # one query; sliding window 128 and split-KV too.
    need_head_dim(64)
    hq, hkv, q_lengths, k_lengths = 8, 2, (0, 1, 37, 513, 16, 5), (5, 1, 0, 600, 16, 300)
    q, k, v, cu_q, cu_k = varlen_inputs(torch, (hq, hkv, q_lengths, k_lengths), 64, 64, dtype, seed=1840)
    kv = list(zip(unpacked(k, k_lengths), unpacked(v, k_lengths)))
    sinks = random_sinks(torch, hq, 300, seed=1841, no_sink_head=False)
    for window, num_splits in ((None, None), ((128, 0) if causal else (128, 64), 3)):
        out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, max(q_lengths), max(k_lengths), causal=causal,
                                              window=window, sinks=sinks, num_splits=num_splits, return_lse=True)
        check_packed_queries(torch, out, lse, q, q_lengths, kv, causal, window=window, sinks=sinks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_halves_without_sinks_merged_with_them(torch, dtype):
    """attention over two halves of the keys, each without the sinks,
    merged with them (flashcore.merge_states(sinks=)), is attention with
    the sinks over all the keys; rows that no part sees get out 0 and lse
    the sink."""
    need_head_dim(128)
    b, hq, hkv, sq, sk, split = 2, 8, 2, 77, 300, 123
    q, k, v = qkv(torch, b, hq, hkv, sq, sk, 128, dtype, seed=1850)
    sinks = random_sinks(torch, hq, sk, seed=1851)
    halves = [flashcore.attention(q, k[:, :, start:start + n], v[:, :, start:start + n], return_lse=True,
                                  causal=causal)
              for start, n, causal in ((0, split, False), (split, sk - split, True))]
    out, lse = flashcore.merge_states(torch.stack([o for o, _ in halves]), torch.stack([l for _, l in halves]),
                                      sinks=sinks)
    check(torch, out, lse, q, k, v, True, sinks=sinks)
    full, full_lse = flashcore.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    torch.cuda.synchronize()
    finite = torch.isfinite(full_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(full_lse))
    assert (lse - full_lse)[finite].abs().max().item() <= 1e-3 * max(1.0, full_lse[finite].abs().max().item())
    # Parts that all saw no key: out 0 and lse the sink.
    empty = torch.full((2, b, hq, 5), float("-inf"), device="cuda")
    merged_out, merged_lse = flashcore.merge_states(torch.zeros((2, b, hq, 5, 128), dtype=q.dtype, device="cuda"),
                                                    empty, sinks=sinks)
    torch.cuda.synchronize()
    assert (merged_out == 0).all() and torch.allclose(merged_lse, sinks.view(1, -1, 1).expand(b, hq, 5),
                                                      rtol=1e-6, atol=1e-6)
