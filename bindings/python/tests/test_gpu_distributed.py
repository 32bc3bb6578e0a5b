"""flashcore.distributed on one GPU: the ring for N virtual ranks
(emulate_ring_attention: the same steps and merge as across GPUs, without the
transfers) against the float64 reference, within the error bar of
test_gpu_torch.check (twice torch's own SDPA error), and close to a single
flashcore call over the whole sequence. The runs across GPUs are
tests/dist_ring_check.py (torchrun)."""

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
