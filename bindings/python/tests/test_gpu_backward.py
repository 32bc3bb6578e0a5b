"""GPU tests of the backward pass (issue 34): the gradients autograd gets
through flashcore (flashcore_backward) against float64 references, the
deterministic mode bit for bit, and training under
torch.compile(fullgraph=True); since 0.9 (issue 61) with chunked attention
and learnable sinks, whose gradient (dsinks) is held to the same bar.

Error bar, per gradient (dq, dk, dv, dsinks): the largest absolute difference from
the float64 reference (autograd through the definition in float64) must be
at most twice PyTorch's own, or twice what rounding the reference to the
dtype costs where that is larger, plus 1e-5. PyTorch's own is
scaled_dot_product_attention's float16/bfloat16 backward on the same
inputs, on a fused kernel (the flash backend, else the efficient one; with
its heads expanded for grouped-query attention and the mask given
explicitly where it is not PyTorch's top-left causal). Where SDPA cannot
compute the call (softcapping; sinks; no fused kernel for the shape; rows
that see no key, for which SDPA does not give flashcore's 0) it is the
same math done by torch at a flash kernel's precision instead
(flash_precision_gradients: float32 scores and products, the
probabilities and dS rounded to the dtype before the products that use
them; dsinks summed in float32 from the out rounded to the dtype). dsinks
is float32; its rounding term is still that of the inputs' dtype, whose
rounded out it is computed from."""

import math

import pytest

import flashcore
from fc_testing import (DEFAULT_HEAD_DIMS, MAX_BACKWARD_HEAD_DIM, assert_one_graph, cuda_randn, head_dim_id,
                        need_backward_smem, need_head_dim)

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16"]
# Absolute slack on top of the error bar, for gradients that are (nearly) 0.
ABSOLUTE_FLOOR = 1e-5


def head_dims():
    """The listed pairs the backward has kernels for (head dims up to MAX_BACKWARD_HEAD_DIM)."""
    try:
        listed = flashcore.supported_head_dims()
    except flashcore.FlashcoreError:  # LibraryError included: the tests skip then anyway
        listed = DEFAULT_HEAD_DIMS
    return [pair for pair in listed if pair[0] <= MAX_BACKWARD_HEAD_DIM]


@pytest.fixture
def torch(torch_cuda):
    return torch_cuda


def visible(torch, sq, sk, causal, window, device="cuda", chunk=0):
    """The [sq, sk] mask by flashcore.h's rule: query i sees key j only
    where i + d - left <= j <= i + d + right, d = sk - sq, a bound of -1
    dropping its side, causal being right = 0; with a chunk, only where j
    and the diagonal i + d lie in the same chunk (floor division). None
    where nothing is masked."""
    if window is None and not causal and not chunk:
        return None
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    mask = torch.ones((sq, sk), dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= i + (sk - sq) - left
    if right >= 0:
        mask &= j <= i + (sk - sq) + right
    if chunk:
        diagonal = i + (sk - sq)
        mask &= torch.div(j, chunk, rounding_mode="floor") == torch.div(diagonal, chunk, rounding_mode="floor")
    return mask


class Case:
    """One dense call: [B, H, S, D] q, k, v, the gradient dout of its out,
    its options (scale resolved; sinks a float32 [Hq] tensor or None) and
    its [Sq, Sk] mask (visible()'s, unless given: None where nothing is
    masked)."""

    def __init__(self, torch, q, k, v, dout, causal=False, scale=None, window=None, softcap=0.0, mask=None, chunk=0,
                 sinks=None):
        self.torch = torch
        self.q, self.k, self.v, self.dout = q, k, v, dout
        self.causal, self.window, self.softcap, self.chunk, self.sinks = causal, window, softcap, chunk, sinks
        self.scale = q.shape[-1] ** -0.5 if scale is None else scale
        self.mask = (visible(torch, q.shape[2], k.shape[2], causal, window, q.device, chunk) if mask is None
                     else mask)

    @property
    def group(self):
        return self.q.shape[1] // self.k.shape[1]

    def seen(self):
        """[Sq] bool: the rows that see a key."""
        if self.mask is None:
            return self.torch.full((self.q.shape[2],), self.k.shape[2] > 0, dtype=self.torch.bool,
                                   device=self.q.device)
        return self.mask.any(-1)


def _probabilities(torch, scores, case, seen, sinks=None):
    """softmax of the masked scores; rows that see no key give 0 (computed
    on zeros there, so that autograd meets no NaN). With sinks ([Hq],
    finite, of the scores' dtype): (P, P_sink), the softmax over the
    scores and the sink as one more column, split (rows that see no key:
    P 0, P_sink 1)."""
    if case.mask is not None:
        scores = scores.masked_fill(~case.mask, float("-inf"))
    if sinks is not None:
        column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
        return weights[..., :-1], weights[..., -1]
    scores = torch.where(seen[:, None], scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
    return torch.softmax(scores, dim=-1) * seen[:, None]


def reference_gradients(torch, case):
    """(dq, dk, dv) in float64, and dsinks where the case has sinks:
    autograd through the definition."""
    q, k, v = (x.detach().double().requires_grad_() for x in (case.q, case.k, case.v))
    inputs = (q, k, v)
    kk, vv = k.repeat_interleave(case.group, 1), v.repeat_interleave(case.group, 1)
    scores = q @ kk.transpose(-1, -2) * case.scale
    if case.softcap:
        scores = case.softcap * torch.tanh(scores / case.softcap)
    if case.sinks is None:
        p = _probabilities(torch, scores, case, case.seen())
    else:
        sinks = case.sinks.detach().double().requires_grad_()
        inputs += (sinks,)
        p, _ = _probabilities(torch, scores, case, case.seen(), sinks)
    return torch.autograd.grad(p @ vv, inputs, case.dout.double())


def _sum_groups(x, group):
    """[B, Hq, S, D] -> [B, Hq / group, S, D], summing each group of heads."""
    b, h, s, d = x.shape
    return x.view(b, h // group, group, s, d).sum(2)


def flash_precision_gradients(torch, case):
    """(dq, dk, dv) as a flash kernel computes them, in torch: float32
    scores of the float16/bfloat16 inputs, softcap and softmax in float32,
    the forward's out rounded to the dtype, P rounded to the dtype for
    dV = P^T dO, dS = P (dP - rowsum(dO out)) (times the softcap's
    derivative) rounded to the dtype for dQ = dS K and dK = dS^T Q, every
    product accumulated in float32, grouped heads summed in float32."""
    dtype, group = case.q.dtype, case.group
    q, dout = case.q.float(), case.dout.float()
    k, v = case.k.float().repeat_interleave(group, 1), case.v.float().repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * case.scale
    if case.softcap:
        capped = torch.tanh(scores / case.softcap)
        scores = case.softcap * capped
    p_sink = None
    if case.sinks is None:
        p = _probabilities(torch, scores, case, case.seen())
    else:
        p, p_sink = _probabilities(torch, scores, case, case.seen(), case.sinks.float())
    p_low = p.to(dtype).float()
    out = (p_low @ v).to(dtype).float()
    dv = _sum_groups(p_low.transpose(-1, -2) @ dout, group)
    delta = (dout * out).sum(-1, keepdim=True)
    ds = p * (dout @ v.transpose(-1, -2) - delta)
    if case.softcap:
        ds = ds * (1 - capped * capped)
    ds = ds.to(dtype).float()
    dq = ds @ k * case.scale
    dk = _sum_groups(ds.transpose(-1, -2) @ q, group) * case.scale
    grads = tuple(x.to(dtype) for x in (dq, dk, dv))
    if p_sink is None:
        return grads
    # The sink's column of dS, summed over each head's rows: it attends to nothing (its dP is 0).
    return grads + (-(p_sink * delta[..., 0]).sum((0, 2)),)


def sdpa_gradients(torch, case):
    """(dq, dk, dv) of PyTorch's scaled_dot_product_attention in the inputs'
    dtype on a fused kernel, and which one: see the module's docstring;
    None where SDPA cannot compute the call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if case.softcap or case.sinks is not None or not case.seen().all():
        return None
    q, k, v = (x.detach().requires_grad_() for x in (case.q, case.k, case.v))
    kk, vv = k.repeat_interleave(case.group, 1), v.repeat_interleave(case.group, 1)
    sq, sk = q.shape[2], k.shape[2]
    # PyTorch's is_causal is top-left aligned: flashcore's causal mask where Sq == Sk.
    top_left_is_ours = case.causal and case.window is None and sq == sk
    mask = None if top_left_is_ours else case.mask
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                                                   is_causal=top_left_is_ours, scale=case.scale)
            grads = torch.autograd.grad(out, (q, k, v), case.dout)
    except RuntimeError:  # no fused kernel for these inputs
        return None
    if not all(torch.isfinite(g).all() for g in grads):
        return None
    return grads


def low_precision_gradients(torch, case):
    """(gradients, what computed them): SDPA's where it can, else
    flash_precision_gradients."""
    grads = sdpa_gradients(torch, case)
    if grads is not None:
        return grads, "SDPA"
    return flash_precision_gradients(torch, case), "torch at flash precision"


def max_error(x, ref):
    return (x.double() - ref).abs().max().item() if ref.numel() else 0.0


def check_gradients(torch, ours, reference, theirs, baseline, dtype):
    """Each of ours within the error bar of the module's docstring (dsinks,
    the fourth where there is one, float32)."""
    torch.cuda.synchronize()
    assert len(ours) == len(reference) == len(theirs)
    for name, mine, exact, base in zip(("dq", "dk", "dv", "dsinks"), ours, reference, theirs):
        assert mine.dtype == (torch.float32 if name == "dsinks" else dtype), name
        assert tuple(mine.shape) == tuple(exact.shape), name
        assert torch.isfinite(mine).all(), "non-finite values in %s" % name
        error, their_error = max_error(mine, exact), max_error(base, exact)
        rounding = max_error(exact.to(dtype), exact)
        assert error <= 2 * max(their_error, rounding) + ABSOLUTE_FLOOR, \
            "%s: max error %.3g vs %s's %.3g (rounding alone: %.3g)" % (name, error, baseline, their_error, rounding)


def flashcore_gradients(torch, case, layout="bhsd", **kwargs):
    """(dq, dk, dv) through flashcore.attention and autograd, as [B, H, S, D]
    views (layout="bshd": given as [B, S, H, D] tensors), and dsinks where
    the case has sinks (an nn.Parameter, as a model's)."""
    inputs = [x.detach().clone() for x in (case.q, case.k, case.v)]
    if layout == "bshd":
        inputs = [x.transpose(1, 2).contiguous() for x in inputs]
    for x in inputs:
        x.requires_grad_(True)
    sinks = None if case.sinks is None else torch.nn.Parameter(case.sinks.detach().clone())
    out = flashcore.attention(*inputs, causal=case.causal, softmax_scale=case.scale, window=case.window,
                              softcap=case.softcap, layout=layout, attention_chunk=case.chunk, sinks=sinks, **kwargs)
    dout = case.dout if layout == "bhsd" else case.dout.transpose(1, 2)
    grads = torch.autograd.grad(out, inputs + ([] if sinks is None else [sinks]), dout)
    if layout == "bshd":
        grads = tuple(g.transpose(1, 2) for g in grads[:3]) + tuple(grads[3:])
    return grads


def make_case(torch, shape, dtype, seed, dv=None, sinks=False, **options):
    """A Case of random inputs; sinks=True draws float32 sink logits of
    ln(Sk) + N(0, 1), each head's taking from about a tenth to nine tenths
    of its rows' weight (test_gpu_torch.random_sinks' rule, none -inf)."""
    b, hq, hkv, sq, sk, d = shape
    dv = d if dv is None else dv
    q, k = cuda_randn(torch, (b, hq, sq, d), dtype, seed), cuda_randn(torch, (b, hkv, sk, d), dtype, seed + 1)
    v, dout = cuda_randn(torch, (b, hkv, sk, dv), dtype, seed + 2), cuda_randn(torch, (b, hq, sq, dv), dtype, seed + 3)
    if sinks:
        options["sinks"] = cuda_randn(torch, (hq,), "float32", seed + 4) + math.log(max(sk, 1))
    return Case(torch, q, k, v, dout, **options)


def run_case(torch, case, layout="bhsd", **kwargs):
    ours = flashcore_gradients(torch, case, layout, **kwargs)
    theirs, baseline = low_precision_gradients(torch, case)
    check_gradients(torch, ours, reference_gradients(torch, case), theirs, baseline, case.q.dtype)
    seen = case.seen()
    assert (ours[0][:, :, ~seen] == 0).all(), "rows that see no key must get dq = 0"
    return ours


# --------------------------------------------------------------------------
# Every head-dim pair
# --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims", head_dims(), ids=head_dim_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_every_head_dim(torch, dtype, dims, causal):
    d, dv = dims
    need_backward_smem(torch, d)
    # Grouped-query (4 query heads per key head), odd lengths, Sq != Sk.
    case = make_case(torch, (2, 8, 2, 97, 131, d), dtype, seed=d + dv, dv=dv, causal=causal)
    run_case(torch, case)


# --------------------------------------------------------------------------
# The options
# --------------------------------------------------------------------------

OPTION_CASES = {
    # name: ((batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim), options)
    "gqa1": ((2, 4, 4, 128, 128, 64), dict()),
    "gqa1 causal": ((2, 4, 4, 128, 128, 128), dict(causal=True)),
    "gqa4 causal": ((1, 8, 2, 200, 200, 64), dict(causal=True)),
    "gqa8 causal fewer queries": ((1, 8, 1, 77, 300, 128), dict(causal=True)),
    "gqa8": ((2, 8, 1, 65, 129, 64), dict()),
    "causal rows that see no key": ((2, 4, 2, 150, 61, 64), dict(causal=True)),
    "window": ((1, 4, 2, 250, 250, 64), dict(window=(32, 16))),
    "causal window": ((1, 4, 4, 190, 260, 128), dict(causal=True, window=(64, 0))),
    "window left only": ((1, 4, 2, 140, 100, 64), dict(window=(20, -1))),
    "diagonal window": ((1, 2, 2, 64, 64, 64), dict(window=(0, 0))),
    "softcap": ((1, 4, 2, 150, 170, 64), dict(softcap=30.0)),
    "softcap causal window": ((1, 4, 2, 180, 180, 128), dict(causal=True, window=(48, 0), softcap=20.0)),
    "scale": ((2, 4, 4, 100, 100, 64), dict(scale=0.05)),
    "one query": ((3, 4, 4, 1, 257, 64), dict()),
    "one key": ((2, 4, 4, 33, 1, 64), dict()),
    "many key blocks": ((1, 2, 2, 1030, 1030, 128), dict(causal=True)),
    # 0.9: learnable sinks (their gradient dsinks too) and chunked attention.
    "sinks": ((2, 4, 4, 128, 128, 64), dict(sinks=True)),
    "sinks causal gqa": ((2, 8, 2, 150, 150, 64), dict(causal=True, sinks=True)),
    "sinks causal window 128": ((1, 8, 2, 400, 400, 128), dict(causal=True, window=(128, 0), sinks=True)),
    "sinks rows that see no key": ((2, 4, 2, 150, 61, 64), dict(causal=True, sinks=True)),
    "sinks softcap": ((1, 4, 2, 150, 170, 64), dict(causal=True, softcap=20.0, sinks=True)),
    "chunk causal": ((1, 4, 2, 300, 300, 64), dict(causal=True, chunk=128)),
    "chunk causal fewer queries": ((1, 8, 2, 77, 333, 128), dict(causal=True, chunk=64)),
    "chunk causal more queries": ((2, 4, 2, 200, 130, 64), dict(causal=True, chunk=48)),
    "chunk both sides": ((1, 4, 2, 250, 250, 64), dict(chunk=100)),
    "chunk window sinks causal": ((1, 8, 2, 300, 300, 64), dict(causal=True, chunk=128, window=(100, 0), sinks=True)),
    # Head dim 512 (Gemma's): its 32-key blocks with the options.
    "d512 sinks causal window": ((1, 8, 2, 200, 200, 512), dict(causal=True, window=(64, 0), sinks=True)),
    "d512 softcap chunk": ((1, 4, 2, 150, 170, 512), dict(causal=True, softcap=20.0, chunk=64)),
}


@pytest.mark.parametrize("name", sorted(OPTION_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_with_options(torch, dtype, name):
    shape, options = OPTION_CASES[name]
    need_head_dim(shape[-1])
    need_backward_smem(torch, shape[-1])
    run_case(torch, make_case(torch, shape, dtype, seed=len(name), **options))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_of_bshd_tensors(torch, dtype):
    need_head_dim(64)
    case = make_case(torch, (2, 8, 2, 90, 110, 64), dtype, seed=70, causal=True)
    run_case(torch, case, layout="bshd")
    # [B, S, H, D] storage given as [B, H, S, D] views: the gradients have the inputs' strides.
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True) for x in (case.q, case.k, case.v))
    out = flashcore.attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), case.dout)
    assert [g.stride() for g in grads] == [x.stride() for x in (q, k, v)]
    reference = flashcore_gradients(torch, case, deterministic=True)
    for mine, theirs in zip(torch.autograd.grad(flashcore.attention(q, k, v, causal=True, deterministic=True),
                                                (q, k, v), case.dout), reference):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gradient_of_sum_is_read_whatever_its_strides(torch, dtype):
    # out.sum()'s gradient is one value expanded (stride 0): the binding
    # copies it for the library; the result is that of the same ones given dense.
    need_head_dim(64)
    q, k, v = (cuda_randn(torch, (2, 4, 80, 64), dtype, 80 + i).requires_grad_(True) for i in range(3))
    out = flashcore.attention(q, k, v, causal=True, deterministic=True)
    expanded = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)
    dense = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    for a, b in zip(expanded, dense):
        assert torch.equal(a, b)


def test_lse_given_from_the_forward(torch):
    # The lse the caller asks for is the one the backward reads; it carries no gradient.
    need_head_dim(64)
    case = make_case(torch, (2, 4, 2, 64, 96, 64), "float16", seed=90, causal=True)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (case.q, case.k, case.v))
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert not lse.requires_grad
    grads = torch.autograd.grad(out, (q, k, v), case.dout)
    direct = torch.ops.flashcore.backward(case.dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None,
                                          None, None, None, None, "bhsd", True, None, None, 0.0, True)
    for a, b in zip(direct, grads):
        assert (a.double() - b.double()).abs().max().item() <= 1e-2 * max(1.0, b.abs().max().item())
    check_gradients(torch, grads, reference_gradients(torch, case), *low_precision_gradients(torch, case),
                    torch.float16)


# --------------------------------------------------------------------------
# Packed sequences and per-sequence key counts
# --------------------------------------------------------------------------


def check_packed(torch, ours, q, k, v, dout, cu_q, cu_k, causal, dtype, used=None):
    """Packed gradients ([total, H, D]) against each sequence's dense case;
    rows outside every sequence, queries of sequences without keys and
    keys of sequences without queries (or past used[b]) must get 0."""
    reference, theirs, baseline = ([torch.zeros_like(x, dtype=torch.float64) for x in (q, k, v)],
                                   [torch.zeros_like(x) for x in (q, k, v)], set())
    taking_part = [torch.zeros(x.shape[0], dtype=torch.bool, device=x.device) for x in (q, k, k)]
    for b in range(len(cu_q) - 1):
        rows_q = slice(cu_q[b], cu_q[b + 1])
        n = cu_k[b + 1] - cu_k[b] if used is None else min(used[b], cu_k[b + 1] - cu_k[b])
        rows_k = slice(cu_k[b], cu_k[b] + n)
        if rows_q.stop == rows_q.start or n == 0:
            continue  # no query or no key: every gradient of the sequence is 0
        case = Case(torch, *(x[rows].transpose(0, 1)[None] for x, rows in ((q, rows_q), (k, rows_k), (v, rows_k),
                                                                            (dout, rows_q))), causal=causal)
        grads, what = low_precision_gradients(torch, case)
        baseline.add(what)
        for total, part, rows in zip(reference + theirs, list(reference_gradients(torch, case)) + list(grads),
                                     (rows_q, rows_k, rows_k) * 2):
            total[rows] = part[0].transpose(0, 1)
        for mask, rows in zip(taking_part, (rows_q, rows_k, rows_k)):
            mask[rows] = True
    check_gradients(torch, ours, reference, theirs, " and ".join(sorted(baseline)), dtype)
    for name, mine, mask in zip(("dq", "dk", "dv"), ours, taking_part):
        assert (mine[~mask] == 0).all(), "%s: rows that take no part must get 0" % name


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_of_packed_sequences(torch, dtype, causal):
    need_head_dim(64)
    # A sequence without queries, one without keys, one query, and rows past the last sequence.
    lengths_q, lengths_k = [5, 0, 65, 1, 129, 40], [7, 30, 64, 1, 200, 0]
    cu_q, cu_k = [0], [0]
    for a, b in zip(lengths_q, lengths_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    total_q, total_k, hq, hkv, d = cu_q[-1] + 3, cu_k[-1] + 5, 8, 2, 64
    q, dout = cuda_randn(torch, (total_q, hq, d), dtype, 100), cuda_randn(torch, (total_q, hq, d), dtype, 101)
    k, v = cuda_randn(torch, (total_k, hkv, d), dtype, 102), cuda_randn(torch, (total_k, hkv, d), dtype, 103)
    inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    cu = [torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cu_q, cu_k)]
    out = flashcore.attention_varlen(*inputs, *cu, max(lengths_q), max(lengths_k), causal=causal)
    ours = torch.autograd.grad(out, inputs, dout)
    check_packed(torch, ours, q, k, v, dout, cu_q, cu_k, causal, getattr(torch, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_with_seqused_k(torch, dtype):
    need_head_dim(128)
    b, hq, hkv, sq, sk, d, used = 3, 8, 2, 40, 300, 128, [300, 17, 0]
    q, dout = cuda_randn(torch, (b, hq, sq, d), dtype, 110), cuda_randn(torch, (b, hq, sq, d), dtype, 111)
    k, v = cuda_randn(torch, (b, hkv, sk, d), dtype, 112), cuda_randn(torch, (b, hkv, sk, d), dtype, 113)
    inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    lengths = torch.tensor(used, dtype=torch.int32, device="cuda")
    out = flashcore.attention(*inputs, causal=True, seqused_k=lengths)
    ours = torch.autograd.grad(out, inputs, dout)
    # As packed sequences: [B, H, S, D] rows laid end to end.
    packed = [x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]) for x in (q, k, v, dout)]
    ours_packed = [g.transpose(1, 2).reshape(-1, g.shape[1], g.shape[3]) for g in ours]
    check_packed(torch, ours_packed, *packed, [i * sq for i in range(b + 1)], [i * sk for i in range(b + 1)], True,
                 getattr(torch, dtype), used=used)


# --------------------------------------------------------------------------
# PyTorch's and FlashAttention's ways of calling
# --------------------------------------------------------------------------


@pytest.mark.parametrize("sq,sk", [(128, 128), (200, 77), (33, 300)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_gradients_match_pytorch(torch, dtype, sq, sk):
    # PyTorch's top-left is_causal (flashcore.sdpa's translation), as an explicit mask.
    need_head_dim(64)
    q, k, v = (cuda_randn(torch, (2, 8, s, 64), dtype, 120 + i) for i, s in enumerate((sq, sk, sk)))
    dout = cuda_randn(torch, (2, 8, sq, 64), dtype, 123)
    top_left = torch.ones((sq, sk), dtype=torch.bool, device="cuda").tril()
    case = Case(torch, q, k, v, dout, mask=top_left)
    inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ours = torch.autograd.grad(flashcore.sdpa(*inputs, is_causal=True), inputs, dout)
    check_gradients(torch, ours, reference_gradients(torch, case), *low_precision_gradients(torch, case),
                    getattr(torch, dtype))


def test_flash_attn_func_gradients(torch):
    need_head_dim(128)
    case = make_case(torch, (2, 8, 2, 100, 140, 128), "bfloat16", seed=130, causal=True, window=(40, 0))
    q, k, v = (x.transpose(1, 2).contiguous().requires_grad_(True) for x in (case.q, case.k, case.v))
    out = flashcore.flash_attn_func(q, k, v, causal=True, window_size=(40, -1), deterministic=True)
    ours = [g.transpose(1, 2) for g in torch.autograd.grad(out, (q, k, v), case.dout.transpose(1, 2))]
    check_gradients(torch, ours, reference_gradients(torch, case), *low_precision_gradients(torch, case),
                    torch.bfloat16)


# --------------------------------------------------------------------------
# Deterministic mode
# --------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_gradients_are_bitwise_identical_under_contention(torch, d):
    need_head_dim(d)
    case = make_case(torch, (2, 8, 2, 1024, 1024, d), "bfloat16", seed=140)
    side = torch.cuda.Stream()
    load = cuda_randn(torch, (4096, 4096), "bfloat16", 141)

    def contend():
        # Work on another stream, queued to run beside the backward pass.
        with torch.cuda.stream(side):
            for _ in range(16):
                load @ load

    runs = []
    for _ in range(5):
        contend()
        runs.append(flashcore_gradients(torch, case, deterministic=True))
    contend()  # (before the flag: cuBLAS would want CUBLAS_WORKSPACE_CONFIG under it)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs.append(flashcore_gradients(torch, case))  # torch's flag asks for the same mode
    finally:
        torch.use_deterministic_algorithms(was)
    torch.cuda.synchronize()
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(a, b), "%s differs between runs" % name
    # The default mode adds dq in any order: the same values but for rounding.
    default = flashcore_gradients(torch, case)
    check_gradients(torch, default, reference_gradients(torch, case), runs[0], "the deterministic mode",
                    torch.bfloat16)


# --------------------------------------------------------------------------
# The operators: torch.library's own check, and training under torch.compile
# --------------------------------------------------------------------------


def test_operators_pass_opcheck(torch):
    need_head_dim(64)
    q, k, v = (cuda_randn(torch, s, "float16", 150 + i).requires_grad_(True)
               for i, s in enumerate([(2, 8, 70, 64), (2, 2, 90, 64), (2, 2, 90, 64)]))
    # deterministic: opcheck compares runs of the backward.
    args = (q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, [32, 0], 0.0, True, True)
    torch.library.opcheck(torch.ops.flashcore.forward.default, args)
    out, lse = torch.ops.flashcore.forward(*args)
    dout = cuda_randn(torch, out.shape, "float16", 160)
    torch.library.opcheck(torch.ops.flashcore.backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, None, None, None, None,
                           "bhsd", True, None, [32, 0], 0.0, True))


def test_operators_with_chunk_and_sinks_pass_opcheck(torch):
    need_head_dim(64)
    q, k, v = (cuda_randn(torch, s, "float16", 155 + i).requires_grad_(True)
               for i, s in enumerate([(2, 8, 170, 64), (2, 2, 190, 64), (2, 2, 190, 64)]))
    sinks = torch.nn.Parameter(cuda_randn(torch, (8,), "float32", 158) + 5.0)
    args = (q, k, v, None, None, None, None, None, None, "bhsd", True, None, None, [100, 0], 0.0, True, True, None,
            None, None, 64, sinks)
    torch.library.opcheck(torch.ops.flashcore.forward.default, args)
    out, lse = torch.ops.flashcore.forward(*args)
    dout = cuda_randn(torch, out.shape, "float16", 159)
    torch.library.opcheck(torch.ops.flashcore.backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, None, None, None, None,
                           "bhsd", True, None, [100, 0], 0.0, True, 64, sinks.detach(), True))


@pytest.mark.parametrize("deterministic", [False, True])
def test_dsinks_are_bitwise_identical_from_run_to_run(torch, deterministic):
    # flashcore.h: dsinks is the same bit for bit from run to run in both modes.
    need_head_dim(128)
    case = make_case(torch, (2, 8, 2, 1024, 1024, 128), "bfloat16", seed=145, causal=True, sinks=True)
    runs = [flashcore_gradients(torch, case, deterministic=deterministic)[3] for _ in range(4)]
    torch.cuda.synchronize()
    assert all(torch.equal(runs[0], run) for run in runs[1:])


# --------------------------------------------------------------------------
# sm_margin (issue 65): the SMs a call leaves to kernels on other streams
# change its plan (the split count, the persistent grid, the deterministic
# schedule), not what it computes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape", [(2, 8, 2, 512, 512, 128), (8, 16, 2, 1, 4096, 128)], ids=["prefill", "decode"])
def test_sm_margin_matches_the_call_without_it(torch, shape, deterministic):
    need_head_dim(128)
    case = make_case(torch, shape, "float16", seed=170, causal=True)
    results = {}
    for margin in (0, 16):
        q, k, v = (x.detach().clone().requires_grad_(True) for x in (case.q, case.k, case.v))
        out = flashcore.attention(q, k, v, causal=True, deterministic=deterministic, sm_margin=margin)
        results[margin] = (out,) + torch.autograd.grad(out, (q, k, v), case.dout)
    torch.cuda.synchronize()
    # Another split count or order of dq's additions rounds differently: a few units in the last place.
    for name, with_margin, without in zip(("out", "dq", "dk", "dv"), results[16], results[0]):
        torch.testing.assert_close(with_margin, without, atol=1e-2, rtol=1e-2,
                                   msg=lambda message: "%s with sm_margin=16: %s" % (name, message))
    check_gradients(torch, results[16][1:], reference_gradients(torch, case), *low_precision_gradients(torch, case),
                    torch.float16)


def test_compiled_training_step_without_graph_breaks(torch):
    need_head_dim(64)
    heads, dim, seqlen = 4, 256, 128

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.proj = torch.nn.Linear(dim, dim)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, heads, dim // heads).unbind(2)
            y = flashcore.attention(q, k, v, causal=True, layout="bshd", deterministic=True)
            return x + self.proj(y.reshape(b, s, dim))

    torch.manual_seed(170)
    block = Block().cuda().to(torch.bfloat16)
    x = cuda_randn(torch, (2, seqlen, dim), "bfloat16", 171)

    def step(model):
        block.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in block.parameters()]

    eager_loss, eager_grads = step(block)
    torch._dynamo.utils.counters.clear()
    assert_one_graph(torch, block, x)
    compiled_loss, compiled_grads = step(torch.compile(block, fullgraph=True))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert abs(compiled_loss.item() - eager_loss.item()) <= 1e-2 * abs(eager_loss.item())
    for eager, compiled in zip(eager_grads, compiled_grads):
        scale = eager.float().abs().max().item()
        assert (compiled.float() - eager.float()).abs().max().item() <= 5e-2 * scale + 1e-6
    assert math.isfinite(compiled_loss.item())


# --------------------------------------------------------------------------
# The training step's host path (issue 58): no synchronisation, and a whole
# step captured into a CUDA graph.
# --------------------------------------------------------------------------


def _training_block(torch, seed):
    """A small attention block (qkv projection, flashcore.attention in
    [B, S, H, D], output projection) in bfloat16 and an input for it."""
    torch.manual_seed(seed)
    heads, dim = 4, 256
    qkv, proj = torch.nn.Linear(dim, 3 * dim).cuda().bfloat16(), torch.nn.Linear(dim, dim).cuda().bfloat16()

    def block(x, deterministic=False):
        b, s, _ = x.shape
        q, k, v = qkv(x).view(b, s, 3, heads, dim // heads).unbind(2)
        y = flashcore.attention(q, k, v, causal=True, layout="bshd", deterministic=deterministic)
        return x + proj(y.reshape(b, s, dim))

    return block, (qkv, proj), cuda_randn(torch, (2, 192, dim), "bfloat16", seed + 1)


def test_a_training_step_does_not_synchronize(torch):
    need_head_dim(64)
    block, _, x = _training_block(torch, 180)
    x.requires_grad_(True)
    q, k, v = (cuda_randn(torch, (1, 8, 136, 64), "float16", 181 + i).requires_grad_(True) for i in range(3))
    dout = cuda_randn(torch, (1, 8, 136, 64), "float16", 184)
    torch.cuda.synchronize()
    assert torch.cuda.get_sync_debug_mode() == 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            x.sum().item()  # the mode catches what it should
        # First steps (planned by the full paths), then repeated ones (the
        # plans, the compiled path): forward and backward, in a model and alone.
        for _ in range(3):
            block(x).float().square().mean().backward()
            torch.autograd.grad(flashcore.attention(q, k, v, causal=True), (q, k, v), dout)
            torch.autograd.grad(flashcore.sdpa(q, k, v, is_causal=True), (q, k, v), dout)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert all(torch.isfinite(t.grad).all() for t in (x, q, k, v) if t.grad is not None)


def test_a_whole_training_step_is_captured_into_a_cuda_graph(torch):
    need_head_dim(64)
    block, layers, x = _training_block(torch, 190)
    params = [p for layer in layers for p in layer.parameters()]
    static_x = x.clone().requires_grad_(True)

    def step():
        loss = block(static_x, deterministic=True).float().square().mean()
        return (loss,) + torch.autograd.grad(loss, [static_x] + params)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()  # warm-up outside the capture (handles, plans, the compiled path's plans)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    losses = []
    for seed in (191, 192):
        with torch.no_grad():
            static_x.copy_(cuda_randn(torch, x.shape, "bfloat16", seed))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        # (Bitwise equal but where cuBLAS chose other kernels under capture.)
        for name, a, b in zip(["loss", "dx"] + ["param %d" % i for i in range(len(params))], captured, eager):
            scale = b.float().abs().max().item()
            assert (a.float() - b.float()).abs().max().item() <= 1e-2 * scale + 1e-6, \
                "%s differs between the graph's replay and the eager step" % name
        losses.append(captured[0].item())
    assert losses[0] != losses[1], "the replays computed from their inputs"
