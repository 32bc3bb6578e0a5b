"""flashcore.distributed without NCCL or a GPU: the zig-zag split, the ring's
steps against a brute-force causal mask, and the whole ring (emulated ranks)
on the CPU with a float64 attention and merge standing in for the
library's."""
import io
import math
import sys

import pytest

torch = pytest.importorskip("torch")

import flashcore
import flashcore._attention
import flashcore._backward
import flashcore._merge
from flashcore import distributed as fd


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_shard_and_unshard_are_inverse(world_size, causal, layout):
    seq = 2 * world_size * 3
    shape = (2, 3, seq, 4) if layout == "bhsd" else (2, seq, 3, 4)
    x = torch.randn(shape)
    slices = [fd.shard(x, r, world_size, causal=causal, layout=layout) for r in range(world_size)]
    assert all(s.shape == slices[0].shape for s in slices)
    assert torch.equal(fd.unshard(slices, causal=causal, layout=layout), x)


def test_zigzag_pairs_early_and_late_chunks():
    assert [fd.zigzag_chunks(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    with pytest.raises(flashcore.InvalidArgumentError, match="rank"):
        fd.zigzag_chunks(4, 4)
    with pytest.raises(flashcore.InvalidArgumentError, match="equal chunks"):
        fd.shard(torch.zeros(1, 1, 10, 8), 0, 3, causal=True)


def _rows(which, n):
    half = n // 2
    return {"all": range(n), "first": range(half), "second": range(half, n)}[which]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_steps_cover_the_mask_once(world_size, causal):
    """Every (query, key) pair the global mask allows is computed by exactly
    one step of its query's rank, every step's local mask is the global one
    on the pairs it computes, and nothing else is computed."""
    chunk = 3
    seq = 2 * world_size * chunk
    positions = torch.arange(seq)
    slices = [fd.shard(positions.view(1, 1, seq, 1), r, world_size, causal=causal).flatten().tolist()
              for r in range(world_size)]
    for rank in range(world_size):
        steps = fd.ring_schedule(rank, world_size, causal)
        assert sorted(s.source for s in steps) == list(range(world_size))
        assert steps[0].source == rank
        seen = {}
        queries = slices[rank]
        for step in steps:
            keys = slices[step.source]
            q_rows = list(_rows(step.query_rows, len(queries)))
            k_rows = list(_rows(step.key_rows, len(keys)))
            for qi in q_rows:
                for kj in k_rows:
                    allowed = (not causal) or keys[kj] <= queries[qi]
                    if step.causal:
                        # the local causal mask (bottom-right, Sq == Sk)
                        local = kj <= qi
                        assert local == allowed, (rank, step, qi, kj)
                        if not local:
                            continue
                    else:
                        assert allowed, ("an unmasked step computes a masked pair", rank, step, qi, kj)
                    pair = (queries[qi], keys[kj])
                    assert pair not in seen, ("computed twice", rank, step, pair)
                    seen[pair] = step
        expected = {(q, kk) for q in queries for kk in range(seq) if (not causal) or kk <= q}
        assert set(seen) == expected


# What the stand-ins were called with, in order, where a test asks:
# ("attention" or "gradients", sm_margin); and the ring's transfers
# ("exchange", buffers sent).
CALLS = None


def _log(*entry):
    if CALLS is not None:
        CALLS.append(entry)


def _cpu_attention(q, k, v, *, causal=False, softmax_scale=None, layout="bhsd", out=None, return_lse=False,
                   sm_margin=0):
    """float64 attention with flashcore's conventions (bottom-right causal,
    GQA, lse of the scaled scores), writing into out."""
    _log("attention", sm_margin)
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q64, k64, v64 = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k64, v64 = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = q64 @ k64.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    o = torch.nan_to_num(torch.exp(scores - lse[..., None])) @ v64
    if layout == "bshd":
        o = o.transpose(1, 2)
    out.copy_(o)
    return (out, lse.float()) if return_lse else out


def _cpu_merge(partial_out, partial_lse, *, layout="bhsd", return_lse=True, **_):
    lse = torch.logsumexp(partial_lse.double(), 0)
    weights = torch.nan_to_num(torch.exp(partial_lse.double() - lse))  # [K, B, H, S]
    if layout == "bshd":
        weights = weights.transpose(2, 3)
    out = (weights[..., None] * partial_out.double()).sum(0).to(partial_out.dtype)
    return (out, lse.float()) if return_lse else out


@pytest.fixture
def cpu_kernels(monkeypatch):
    """The library's attention, merge and backward replaced by float64 CPU
    stand-ins with the same conventions: the ring's arithmetic, checked
    without a GPU."""
    monkeypatch.setattr(flashcore._attention, "attention", _cpu_attention)
    monkeypatch.setattr(flashcore._merge, "merge_states", _cpu_merge)
    monkeypatch.setattr(flashcore._backward, "gradients", _cpu_gradients)


ring_cases = pytest.mark.parametrize("world_size,causal,layout", [
    (w, c, lay) for w in (1, 2, 3, 4) for c in (False, True) for lay in ("bhsd", "bshd")])


@ring_cases
def test_emulated_ring_is_the_single_call(cpu_kernels, world_size, causal, layout):
    torch.manual_seed(world_size)
    seq = 2 * world_size * 5
    hq, hkv, d, dv = 4, 2, 8, 16
    mk = (lambda h, dd: torch.randn(2, h, seq, dd)) if layout == "bhsd" else (lambda h, dd: torch.randn(2, seq, h, dd))
    q, k, v = mk(hq, d).double(), mk(hkv, d).double(), mk(hkv, dv).double()
    out, lse = fd.emulate_ring_attention(q, k, v, world_size, causal=causal, layout=layout, return_lse=True)
    ref_out = torch.empty_like(out)
    _, ref_lse = _cpu_attention(q, k, v, causal=causal, layout=layout, out=ref_out, return_lse=True)
    assert torch.allclose(out, ref_out, atol=1e-5), (out - ref_out).abs().max()
    assert torch.allclose(lse, ref_lse, atol=1e-5)


def test_emulated_forward_refuses_gradients():
    q = torch.randn(1, 2, 8, 8, requires_grad=True)
    with pytest.raises(flashcore.UnsupportedError, match="emulate_ring_gradients"):
        fd.emulate_ring_attention(q, q.detach(), q.detach(), 2, causal=True)


def _cpu_gradients(dout, q, k, v, out, lse, seqused_k, cu_q, cu_k, max_q, max_k, layout, causal, softmax_scale,
                   window, softcap, deterministic, attention_chunk=0, sinks=None, compute_dsinks=False, sm_margin=0):
    """flashcore's backward in float64 from the given out and lse (as the
    library: P = exp(scale * q.k - lse), delta = rowsum(dO * O)); no
    sinks' gradient (the ring takes none)."""
    _log("gradients", sm_margin)
    bshd = layout == "bshd"
    if bshd:
        dout, q, k, v, out = (t.transpose(1, 2) for t in (dout, q, k, v, out))
    group = q.shape[1] // k.shape[1]
    q64, k64, v64, o64, do64 = (t.double() for t in (q, k, v, out, dout))
    ke, ve = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = q64 @ ke.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        scores = scores.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    p = torch.exp(scores - lse.double()[..., None])
    dv = p.transpose(-1, -2) @ do64
    dp = do64 @ ve.transpose(-1, -2)
    delta = (do64 * o64).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = ds @ ke
    dk = ds.transpose(-1, -2) @ q64
    fold = lambda g: g.view(g.shape[0], k.shape[1], group, *g.shape[2:]).sum(2)
    dk, dv = fold(dk), fold(dv)
    grads = [dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)]
    return (tuple(g.transpose(1, 2) for g in grads) if bshd else tuple(grads)) + (None,)


@ring_cases
def test_emulated_ring_gradients_are_the_single_calls(cpu_kernels, world_size, causal, layout):
    torch.manual_seed(10 + world_size)
    seq = 2 * world_size * 4
    hq, hkv, d = 4, 2, 8
    mk = (lambda h: torch.randn(1, h, seq, d)) if layout == "bhsd" else (lambda h: torch.randn(1, seq, h, d))
    q, k, v, dout = mk(hq).double(), mk(hkv).double(), mk(hkv).double(), mk(hq).double()
    grads = fd.emulate_ring_gradients(q, k, v, dout, world_size, causal=causal, layout=layout)
    # Reference: autograd through a float64 attention of the whole sequence.
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    tr = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    group = hq // hkv
    scores = tr(qr) @ tr(kr).repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
    out = tr(torch.softmax(scores, -1) @ tr(vr).repeat_interleave(group, 1))
    out.backward(dout)
    for name, got, want in zip("qkv", grads, (qr.grad, kr.grad, vr.grad)):
        assert torch.allclose(got, want, atol=1e-5), (name, (got - want).abs().max())


def test_ring_attention_needs_an_initialised_group():
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(flashcore.InvalidArgumentError, match="init_process_group"):
        fd.ring_attention(x, x, x, causal=True)


def _gloo_rank(rank, world_size, port, causal, sm_margin, results):
    """One rank of test_ring_over_gloo: ring_attention's forward and backward
    through torch.distributed (gloo, CPU) with the float64 stand-ins, and
    the order of the rank's kernel calls and transfers."""
    global CALLS
    import torch.distributed as dist
    flashcore._attention.attention = _cpu_attention
    flashcore._merge.merge_states = _cpu_merge
    flashcore._backward.gradients = _cpu_gradients
    exchange = fd._exchange
    fd._exchange = lambda group, send, *rest: _log("exchange", len(send)) or exchange(group, send, *rest)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # every rank draws the same full tensors
        seq = 2 * world_size * 3
        q, k, v, dout = (torch.randn(1, h, seq, 8, dtype=torch.float64) for h in (4, 2, 2, 4))
        mine = lambda t: fd.shard(t, rank, world_size, causal=causal)
        ql, kl, vl = (mine(t).requires_grad_() for t in (q, k, v))
        CALLS = []
        out = fd.ring_attention(ql, kl, vl, causal=causal, sm_margin=sm_margin)
        out.backward(mine(dout))
        # As bytes: a tensor put on the queue travels as a file descriptor
        # that this process shares, and the parent's read failed when the
        # rank had exited first (FileNotFoundError from the resource sharer).
        buffer = io.BytesIO()
        torch.save((out.detach(), ql.grad, kl.grad, vl.grad, CALLS), buffer)
        results.put((rank, buffer.getvalue()))
    finally:
        dist.destroy_process_group()


# The order of a rank's kernel calls and transfers on world_size ranks
# (each transfer: ("exchange", buffers sent)). With a margin, each step's
# transfer of the next K/V slice is queued before its kernel (the forward's
# last step, with none beside it, leaves no SMs); in the
# backward the accumulators of the slice in hand follow the step's kernel
# (then run beside the next step's). Without one every transfer follows its
# step's kernel, in one batch (K/V and the accumulators).
def _expected_order(sm_margin, world_size):
    hops = world_size - 1
    if sm_margin:
        return ([("exchange", 1), ("attention", sm_margin)] * hops + [("attention", 0)]
                + [("exchange", 1), ("gradients", sm_margin), ("exchange", 1)] * hops
                + [("gradients", sm_margin), ("exchange", 1)])
    return ([("attention", 0), ("exchange", 1)] * hops + [("attention", 0)]
            + [("gradients", 0), ("exchange", 2)] * hops + [("gradients", 0), ("exchange", 1)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sm_margin", [0, 8])
@pytest.mark.parametrize("world_size", [3, 4])
def test_ring_over_gloo_is_the_emulated_ring(causal, sm_margin, world_size):
    """ring_attention's own transfers (batch_isend_irecv, the backward's
    travelling dK/dV) on 3 and 4 CPU ranks over gloo give what the
    emulated ring gives: the communication paths, checked without NCCL or
    a GPU, with the transfers beside each step's kernels (a margin) and
    after them; every kernel call beside a transfer gets the margin."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world_size, port, causal, sm_margin, results))
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    got = {r: torch.load(io.BytesIO(data)) for r, data in (results.get(timeout=120) for _ in procs)}
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    # The same computation, emulated in this process.
    import flashcore._attention as fa, flashcore._merge as fm, flashcore._backward as fb
    saved = (fa.attention, fm.merge_states, fb.gradients)
    fa.attention, fm.merge_states, fb.gradients = _cpu_attention, _cpu_merge, _cpu_gradients
    try:
        torch.manual_seed(0)
        seq = 2 * world_size * 3
        q, k, v, dout = (torch.randn(1, h, seq, 8, dtype=torch.float64) for h in (4, 2, 2, 4))
        out = fd.emulate_ring_attention(q, k, v, world_size, causal=causal)
        grads = fd.emulate_ring_gradients(q, k, v, dout, world_size, causal=causal)
    finally:
        fa.attention, fm.merge_states, fb.gradients = saved
    mine = lambda t, r: fd.shard(t, r, world_size, causal=causal)
    # The gradients accumulate in float32, in ring order on the ranks and in
    # rank order in the emulation: equal to float32 rounding.
    for r in range(world_size):
        for name, a, b, tol in zip(("out", "dq", "dk", "dv"), got[r][:4], (out,) + tuple(grads),
                                   (1e-12, 1e-6, 1e-6, 1e-6)):
            assert torch.allclose(a, mine(b, r), atol=tol), (r, name, (a - mine(b, r)).abs().max())
        assert got[r][4] == _expected_order(sm_margin, world_size), (r, got[r][4])


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", None])
def test_ring_sm_margin_is_an_int_at_least_0(bad):
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(flashcore.InvalidArgumentError, match="sm_margin must be an int >= 0"):
        fd.ring_attention(x, x, x, causal=True, sm_margin=bad)


def test_ranks_and_world_sizes_are_ints_not_bools():
    # Audit item 8 of issue 59: True passed as rank 1.
    for bad in (True, False, 1.0):
        with pytest.raises(flashcore.InvalidArgumentError, match="rank must be an int in"):
            fd.zigzag_chunks(bad, 2)
        with pytest.raises(flashcore.InvalidArgumentError, match="world_size must be an int"):
            fd.ring_schedule(0, bad, causal=True)


def test_shard_checks_its_arguments_before_importing_torch(monkeypatch):
    # (Audit item 8: torch was imported first, so a machine without it got
    # ImportError for a bad rank.)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(flashcore.InvalidArgumentError, match="rank must be an int in"):
        fd.shard(object(), 5, 2, causal=False)
