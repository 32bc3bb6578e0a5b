"""GPU tests with CuPy arrays (float16; CuPy has no bfloat16).

The reference is computed on the host with NumPy in float64, and the device
side uses only copies and allocations, so these tests need no CuPy kernel
compilation. Tolerance: relative L2 error within three times that of merely
rounding the float64 reference to float16 (about 1e-3), which any correct
fp16 attention meets and a wrong one misses by orders of magnitude."""

import pytest

import flashcore
from fc_testing import gpu_head_dims, head_dim_id

pytestmark = pytest.mark.gpu

SHAPES = [  # batch, heads_q, heads_kv, seqlen_q, seqlen_k
    (2, 4, 4, 128, 128),
    (1, 8, 2, 77, 133),
    (2, 6, 1, 150, 61),
]
# Every (head_dim, head_dim_v) pair of the build, dims that round up to a
# larger kernel, and (192, 128).
HEAD_DIMS = gpu_head_dims()
MEMCPY_DEVICE_TO_DEVICE = 3


@pytest.fixture
def cp(cupy_cuda):
    return cupy_cuda


@pytest.fixture
def np(cupy_cuda):
    import numpy

    return numpy


def host_inputs(np, b, hq, hkv, sq, sk, d, seed=0, layout="bhsd", dv=None):
    """q, k with head_dim d and v with head_dim_v dv (default d)."""
    rng = np.random.default_rng(seed)

    def make(h, s, width):
        shape = (b, h, s, width) if layout == "bhsd" else (b, s, h, width)
        return rng.standard_normal(shape).astype(np.float16)

    return make(hq, sq, d), make(hkv, sk, d), make(hkv, sk, d if dv is None else dv)


def reference(np, q, k, v, causal, scale=None):
    """float64 out, lse, and rows that see no key, for [B, H, S, D] arrays."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        seen = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(seen, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    empty = total[..., 0] == 0
    out = np.einsum("bhqk,bhkd->bhqd", p, v) / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total[..., 0])) + m[..., 0])
    return out, lse, empty


def rel_err(np, x, ref):
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(x.astype(np.float64) - ref)
    return diff / norm if norm > 0 else diff


def check(np, out, lse, q, k, v, causal):
    """Host copies of out and lse against the reference ([B, H, S, D])."""
    ref, ref_lse, empty = reference(np, q, k, v, causal)
    valid = ~empty
    floor = rel_err(np, ref.astype(np.float16)[valid], ref[valid])
    assert np.isfinite(out).all()
    ours = rel_err(np, out, ref)
    assert ours <= 3 * floor + 1e-4, "rel-L2 error %.3g (rounding alone: %.3g)" % (ours, floor)
    assert (out[empty] == 0).all()
    if lse is not None:
        assert lse.dtype == np.float32 and lse.shape == ref_lse.shape
        assert (np.isneginf(lse) == empty).all()
        if valid.any():
            err = np.abs(lse.astype(np.float64) - ref_lse)[valid].max()
            assert err <= 1e-3 * max(1.0, np.abs(ref_lse[valid]).max())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", HEAD_DIMS, ids=head_dim_id)
def test_cupy_matches_reference(cp, np, head_dims, causal, shape):
    d, dv = head_dims
    q, k, v = host_inputs(np, *shape, d, seed=d + dv, dv=dv)
    out, lse = flashcore.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal, return_lse=True)
    assert isinstance(out, cp.ndarray) and isinstance(lse, cp.ndarray)
    assert out.shape == q.shape[:3] + (dv,) and out.dtype == np.float16 and out.flags.c_contiguous
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    check(np, out.get(), lse.get(), q, k, v, causal)


def test_cupy_layouts_and_views(cp, np):
    b, hq, hkv, sq, sk, d = 2, 8, 4, 97, 130, 128
    q, k, v = host_inputs(np, b, hq, hkv, sq, sk, d, seed=1, layout="bshd")
    dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    # FlashAttention-style [B, S, H, D] arguments.
    out, lse = flashcore.attention(dq, dk, dv, causal=True, return_lse=True, layout="bshd")
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    t = [x.transpose(0, 2, 1, 3) for x in (out.get(), q, k, v)]
    check(np, t[0], lse.get(), t[1], t[2], t[3], True)
    # The same storage as [B, H, S, D] views, into a padded output view.
    views = [x.transpose(0, 2, 1, 3) for x in (dq, dk, dv)]
    assert not views[0].flags.c_contiguous
    storage = cp.asarray(np.full((b, hq, sq, d + 8), np.nan, dtype=np.float16))
    out_view = storage[..., :d]
    assert flashcore.attention(*views, out=out_view, causal=True) is out_view
    host = storage.get()
    check(np, host[..., :d], None, t[1], t[2], t[3], True)
    assert np.isnan(host[..., d:]).all(), "wrote outside out"


def test_cupy_validation(cp, np):
    q, k, v = host_inputs(np, 1, 6, 4, 32, 32, 64, seed=2)
    with pytest.raises(flashcore.InvalidArgumentError, match="num_heads"):
        flashcore.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v))
    # head_dim not contiguous: a [B, H, D, S] array seen as [B, H, S, D].
    v_t = cp.asarray(np.ascontiguousarray(v.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
    with pytest.raises(flashcore.InvalidArgumentError, match="contiguous"):
        flashcore.attention(cp.asarray(np.ascontiguousarray(q[:, :4])), cp.asarray(k), v_t)


def delay(cp, stream):
    """Keeps stream busy for milliseconds with device-to-device copies."""
    half = 256 << 20
    buf = cp.empty(2 * half, dtype=cp.uint8)
    for _ in range(64):
        cp.cuda.runtime.memcpyAsync(buf.data.ptr + half, buf.data.ptr, half, MEMCPY_DEVICE_TO_DEVICE, stream.ptr)
    return buf


def poisoned_copies_after_delay(cp, np, stream, arrays):
    """Copies of arrays that hold NaN until stream, after a delay, fills them."""
    copies = [cp.asarray(np.full(a.shape, np.nan, dtype=a.dtype)) for a in arrays]
    cp.cuda.runtime.deviceSynchronize()
    keep = delay(cp, stream)
    for dst, src in zip(copies, arrays):
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, MEMCPY_DEVICE_TO_DEVICE, stream.ptr)
    return copies, keep


@pytest.mark.parametrize("how", ["current", "stream object", "int"])
def test_cupy_streams(cp, np, how):
    q, k, v = (cp.asarray(x) for x in host_inputs(np, 2, 4, 2, 200, 256, 64, seed=3))
    expected = flashcore.attention(q, k, v, causal=True).get()
    stream = cp.cuda.Stream(non_blocking=True)
    (q2, k2, v2), keep = poisoned_copies_after_delay(cp, np, stream, (q, k, v))
    if how == "current":
        with stream:
            out = flashcore.attention(q2, k2, v2, causal=True)
    else:
        out = flashcore.attention(q2, k2, v2, causal=True, stream=stream if how == "stream object" else stream.ptr)
    stream.synchronize()
    cp.cuda.runtime.deviceSynchronize()
    del keep
    assert np.array_equal(out.get(), expected)


def merge_reference(np, partial_out, partial_lse):
    """float64 merge of [K, B, H, S, D] partials with [K, B, H, S] lse."""
    lse_s = partial_lse.astype(np.float64)
    m = lse_s.max(axis=0)
    m0 = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lse_s - m0)  # 0 for parts that see no key
    total = w.sum(axis=0)
    empty = total == 0
    out = np.einsum("kbhs,kbhsd->bhsd", w, partial_out.astype(np.float64)) / np.where(empty, 1.0, total)[..., None]
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total)) + m0)
    return out, lse, empty


@pytest.mark.parametrize("out_dtype", [None, "float32"])
@pytest.mark.parametrize("num_states", [1, 3])
def test_cupy_merge_states(cp, np, num_states, out_dtype):
    rng = np.random.default_rng(num_states)
    partial = rng.standard_normal((num_states, 2, 4, 50, 64)).astype(np.float16)
    plse = (rng.standard_normal((num_states, 2, 4, 50)) * 3).astype(np.float32)
    plse[:, 0, 0, :2] = -np.inf  # rows that no part sees
    out, lse = flashcore.merge_states(cp.asarray(partial), cp.asarray(plse), out_dtype=out_dtype)
    assert isinstance(out, cp.ndarray) and isinstance(lse, cp.ndarray)
    assert out.shape == (2, 4, 50, 64) and out.dtype == (out_dtype or np.float16) and lse.dtype == np.float32
    ref, ref_lse, empty = merge_reference(np, partial, plse)
    host, host_lse = out.get(), lse.get()
    floor = rel_err(np, ref.astype(host.dtype), ref)
    assert rel_err(np, host, ref) <= 2 * floor + 1e-5
    assert (host[empty] == 0).all() and (np.isneginf(host_lse) == empty).all()
    valid = ~empty
    assert np.abs(host_lse.astype(np.float64) - ref_lse)[valid].max() <= 1e-4 * max(1.0, np.abs(ref_lse[valid]).max())


@pytest.mark.parametrize("num_splits", [1, 3])
def test_cupy_num_splits(cp, np, num_splits):
    q, k, v = host_inputs(np, 1, 8, 2, 4, 700, 64, seed=4)
    out, lse = flashcore.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), return_lse=True,
                                   num_splits=num_splits)  # the workspace comes from cupy
    check(np, out.get(), lse.get(), q, k, v, False)
