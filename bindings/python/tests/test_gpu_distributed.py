"""flashcore.distributed on one GPU: the ring for N virtual ranks
(emulate_ring_attention, emulate_ring_gradients: the same steps and merge as
across GPUs, without the transfers) against the float64 reference, within
the error bar of test_gpu_torch.check (twice torch's own SDPA error), and
close to a single flashcore call over the whole sequence. The runs across
GPUs are bench/context_parallel.py --check (torchrun)."""

import pytest

import flashcore
from flashcore import distributed as fd
from test_gpu_torch import check, qkv

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch(torch_cuda):
    return torch_cuda


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 4, 64, 64), (1, 8, 2, 96, 128), (1, 4, 1, 75, 64)],
                         ids=["mha", "gqa4_d96x128", "mqa_odd_chunks"])
def test_emulated_ring_matches_reference(torch, dtype, world_size, causal, shape):
    b, hq, hkv, chunk, d = shape
    seq = 2 * world_size * chunk  # zig-zag: 2 x world_size chunks (75: odd chunk lengths)
    dv = 128 if d == 96 else d
    q, k, v = qkv(torch, b, hq, hkv, seq, seq, d, dtype, seed=world_size, dv=dv)
    out, lse = fd.emulate_ring_attention(q, k, v, world_size, causal=causal, return_lse=True)
    check(torch, out, lse, q, k, v, causal)
    single = flashcore.attention(q, k, v, causal=causal)
    # Each step's partial result is rounded to q's dtype before the merge.
    scale = single.abs().max().item()
    assert (out.float() - single.float()).abs().max().item() <= 2 * torch.finfo(q.dtype).eps * max(scale, 1.0)


@pytest.mark.parametrize("world_size", [2, 4])
def test_emulated_ring_bshd(torch, world_size):
    q, k, v = qkv(torch, 1, 8, 2, 2 * world_size * 40, 2 * world_size * 40, 64, "bfloat16", seed=7)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out = fd.emulate_ring_attention(q, k, v, world_size, causal=True, layout="bshd")
    check(torch, out.transpose(1, 2), None, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True)


def _reference_grads(torch, q, k, v, dout, causal):
    """float64 gradients through torch's own attention (math), [B, H, S, D]."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = sdpa(q64, k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1), is_causal=causal)
    out.backward(dout.double())
    return q64.grad, k64.grad, v64.grad


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_ring_gradients_match_reference(torch, dtype, world_size, causal):
    """The ring's backward (emulate_ring_gradients: each virtual rank's steps
    with flashcore's backward and the merged out and lse) against float64
    gradients, within twice the error of one flashcore call's gradients
    over the whole sequence (tests/test_gpu_backward.py holds those to
    torch's own)."""
    seq = 2 * world_size * 96
    q, k, v = qkv(torch, 1, 8, 2, seq, seq, 64, dtype, seed=30 + world_size)
    dout = qkv(torch, 1, 8, 8, seq, seq, 64, dtype, seed=40 + world_size)[0]
    ring = fd.emulate_ring_gradients(q, k, v, dout, world_size, causal=causal)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    flashcore.attention(qg, kg, vg, causal=causal).backward(dout)
    refs = _reference_grads(torch, q, k, v, dout, causal)
    for name, got, single, ref in zip("qkv", ring, (qg.grad, kg.grad, vg.grad), refs):
        assert torch.isfinite(got).all(), name
        floor = _rel(ref.to(q.dtype), ref)
        assert _rel(got, ref) <= 2 * max(_rel(single, ref), floor) + 1e-5, \
            "d%s: rel-L2 %.3g against one call's %.3g" % (name, _rel(got, ref), _rel(single, ref))
