"""flashcore.jax: the trace-time checks, the planned struct and the custom
calls as lowered for CUDA (CPU only: jax's CPU wheel), and on a GPU the
results and gradients against a float64 reference and JAX's own attention.
Skipped, with the reason, where jax is not installed."""

import math

import pytest

import flashcore
from fc_testing import JAX_BACKWARD_WORKSPACE as BACKWARD_WORKSPACE
from fc_testing import JAX_FORWARD_WORKSPACE as FORWARD_WORKSPACE
from fc_testing import skip_or_fail

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
jnp = jax.numpy
np = pytest.importorskip("numpy")  # jax's own dependency

import flashcore.jax as fj  # noqa: E402  (after the skip)
from flashcore.jax import _ffi_call  # noqa: E402

S = jax.ShapeDtypeStruct


def _eval(fn, *arrays, **kwargs):
    return jax.eval_shape(lambda *a: fn(*a, **kwargs), *arrays)


@pytest.fixture
def handlers(lib):
    try:
        return _ffi_call._handlers_path()
    except flashcore.UnsupportedError as e:
        skip_or_fail(str(e))


def test_shapes_are_checked_at_trace_time(lib):
    q = S((2, 8, 128, 64), jnp.bfloat16)
    k = S((2, 3, 128, 64), jnp.bfloat16)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"num_heads_q \(8\) must be a multiple of num_heads_kv"):
        _eval(fj.attention, q, k, k)


def test_dtypes_are_checked_at_trace_time(lib):
    q = S((2, 8, 128, 64), jnp.float32)
    with pytest.raises(flashcore.UnsupportedError, match="q has dtype float32; flashcore computes on float16 or"):
        _eval(fj.attention, q, q, q)


def test_options_are_checked_at_trace_time(lib):
    q = S((1, 2, 16, 64), jnp.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match="softcap"):
        _eval(fj.attention, q, q, q, softcap=-1.0)
    with pytest.raises(TypeError, match="not both"):
        _eval(fj.attention, q, q, q, softmax_scale=0.5, scale=0.5)


def test_without_a_gpu_the_error_says_so(lib):
    if jax.default_backend() == "gpu":
        pytest.skip("JAX has a GPU here")
    q = S((1, 2, 16, 64), jnp.float16)
    with pytest.raises(flashcore.UnsupportedError, match="flashcore.jax runs on NVIDIA GPUs"):
        _eval(fj.attention, q, q, q)


def test_plan_is_the_bindings_struct(jax_planned):
    q = S((2, 8, 100, 64), jnp.bfloat16)
    k = S((2, 2, 300, 64), jnp.bfloat16)
    plan = _ffi_call.plan_forward(q, k, k, "bhsd", True, 0.2, None, 0.0, None)
    params = flashcore.ForwardParams.from_buffer_copy(plan.plan.tobytes())
    assert (params.batch_size, params.num_heads_q, params.num_heads_kv) == (2, 8, 2)
    assert (params.seqlen_q, params.seqlen_k, params.head_dim, params.head_dim_v) == (100, 300, 64, 64)
    assert params.causal == 1 and math.isclose(params.softmax_scale, 0.2, rel_tol=1e-6)
    assert params.dtype == flashcore._ffi.Dtype.BF16
    # Row-major strides, in elements, and no address left in the blob.
    assert (params.q_batch_stride, params.q_head_stride, params.q_seq_stride) == (8 * 100 * 64, 100 * 64, 64)
    for field in _ffi_call.POINTER_FIELDS:
        assert getattr(params, field) is None, field
    assert list(plan.fields) == [0, 1, 2, 3, 4]
    assert plan.out.shape == (2, 8, 100, 64) and plan.out.dtype == jnp.bfloat16
    assert plan.lse.shape == (2, 8, 100) and plan.lse.dtype == jnp.float32
    assert plan.workspace_bytes == FORWARD_WORKSPACE


def test_bshd_and_different_value_head_dim(jax_planned, handlers):
    q = S((2, 50, 4, 192), jnp.float16)
    k = S((2, 70, 4, 192), jnp.float16)
    v = S((2, 70, 4, 128), jnp.float16)
    out, lse = _eval(fj.attention, q, k, v, layout="bshd", return_lse=True)
    assert out.shape == (2, 50, 4, 128) and out.dtype == jnp.float16
    assert lse.shape == (2, 4, 50) and lse.dtype == jnp.float32


def _custom_calls(fn, *arrays):
    text = jax.jit(fn).trace(*arrays).lower(lowering_platforms=("cuda",)).as_text()
    return [line for line in text.splitlines() if "stablehlo.custom_call" in line]


def test_lowered_for_cuda(jax_planned, handlers):
    q = S((2, 8, 128, 64), jnp.bfloat16)
    k = S((2, 2, 128, 64), jnp.bfloat16)
    calls = _custom_calls(lambda q, k, v: fj.attention(q, k, v, causal=True), q, k, k)
    assert len(calls) == 1 and "@flashcore_forward" in calls[0]
    assert "tensor<%dxui8>" % FORWARD_WORKSPACE in calls[0]


def test_gradients_lowered_for_cuda(jax_planned, handlers):
    q = S((2, 8, 128, 64), jnp.bfloat16)
    k = S((2, 2, 128, 64), jnp.bfloat16)

    def loss(q, k, v):
        return fj.attention(q, k, v, causal=True, deterministic=True).astype(jnp.float32).sum()

    calls = _custom_calls(jax.grad(loss, argnums=(0, 1, 2)), q, k, k)
    assert [("@flashcore_forward" in c, "@flashcore_backward" in c) for c in calls] == [(True, False), (False, True)]
    assert "tensor<%dxui8>" % BACKWARD_WORKSPACE in calls[1]
    # The backward's plan asks for the deterministic mode.
    blob = calls[1].split("plan = dense<\"0x")[1].split("\"")[0]
    params = flashcore.BackwardParams.from_buffer_copy(bytes.fromhex(blob))
    assert params.deterministic == 1 and params.num_heads_kv == 2


def test_vmap_loops_over_the_call(jax_planned, handlers):
    q = S((3, 2, 8, 128, 64), jnp.bfloat16)
    k = S((3, 2, 2, 128, 64), jnp.bfloat16)
    attend = jax.vmap(lambda q, k, v: fj.attention(q, k, v))
    assert _eval(attend, q, k, k).shape == (3, 2, 8, 128, 64)
    text = jax.jit(attend).trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.while" in text and text.count("@flashcore_forward") == 1
    grads = jax.vmap(jax.grad(lambda q, k, v: fj.attention(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
    assert [g.shape for g in _eval(grads, q, k, k)] == [q.shape, k.shape, k.shape]


def test_varlen(jax_planned, handlers):
    q, k = S((300, 8, 64), jnp.bfloat16), S((500, 2, 64), jnp.bfloat16)
    cu_q, cu_k = S((4,), jnp.int32), S((4,), jnp.int32)

    def attend(q, k, v, cu_q, cu_k):
        return fj.attention_varlen(q, k, v, cu_q, cu_k, 200, 300, causal=True, return_lse=True)

    out, lse = _eval(attend, q, k, k, cu_q, cu_k)
    assert out.shape == (300, 8, 64) and lse.shape == (8, 300)
    calls = _custom_calls(lambda q, k, v, a, b: attend(q, k, v, a, b)[0], q, k, k, cu_q, cu_k)
    assert "fields = dense<[0, 1, 2, 6, 7, 3, 4]>" in calls[0]

    def loss(q, k, v, cu_q, cu_k):
        return attend(q, k, v, cu_q, cu_k)[0].astype(jnp.float32).sum()

    grads = _eval(jax.grad(loss, argnums=(0, 1, 2)), q, k, k, cu_q, cu_k)
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]
    calls = _custom_calls(jax.grad(loss, argnums=(0, 1, 2)), q, k, k, cu_q, cu_k)
    assert "@flashcore_backward" in calls[1] and "fields = dense<[0, 1, 2, 3, 4, 5, 10, 11, 6, 7, 8]>" in calls[1]
    with pytest.raises(TypeError, match="cu_seqlens_q needs max_seqlen_q"):
        _eval(lambda q, k, v, a, b: fj.attention_varlen(q, k, v, a, b, None, 300), q, k, k, cu_q, cu_k)


def test_seqused_k_gets_no_gradient(jax_planned, handlers):
    q, k = S((2, 4, 64, 64), jnp.float16), S((2, 4, 256, 64), jnp.float16)
    used = S((2,), jnp.int32)

    def loss(q, k, v, used):
        return fj.attention(q, k, v, seqused_k=used).astype(jnp.float32).sum()

    grads = _eval(jax.grad(loss, argnums=(0, 1, 2)), q, k, k, used)
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]


def test_kvcache(jax_planned, handlers):
    q = S((4, 1, 8, 128), jnp.bfloat16)
    pool = S((64, 16, 2, 128), jnp.bfloat16)  # 64 pages of 16 keys
    table, used = S((4, 16), jnp.int32), S((4,), jnp.int32)

    def paged(q, k, v, table, used):
        return fj.attention_with_kvcache(q, k, v, used, block_table=table, causal=True)

    assert _eval(paged, q, pool, pool, table, used).shape == (4, 1, 8, 128)
    calls = _custom_calls(paged, q, pool, pool, table, used)
    assert "fields = dense<[0, 1, 2, 5, 8, 3, 4]>" in calls[0]
    with pytest.raises(flashcore.UnsupportedError, match="paged"):
        _eval(jax.grad(lambda q, k, v, t, u: paged(q, k, v, t, u).astype(jnp.float32).sum()), q, pool, pool, table,
              used)
    cache = S((4, 1000, 2, 128), jnp.bfloat16)
    contiguous = lambda q, k, v: fj.attention_with_kvcache(q, k, v, 700)
    assert _eval(contiguous, q, cache, cache).shape == (4, 1, 8, 128)
    grads = _eval(jax.grad(lambda q, k, v: contiguous(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)), q,
                  cache, cache)
    assert [g.shape for g in grads] == [q.shape, cache.shape, cache.shape]


def test_the_example_block_traces(jax_planned, handlers):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python", "jax_transformer_block.py")
    spec = importlib.util.spec_from_file_location("jax_transformer_block", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    params = example.init(jax.random.PRNGKey(0), 64, 64, 4, 2, 32)
    step = example.make_step(example.flashcore_attention, 4, 2, 32, learning_rate=0.1)
    tokens = S((2, 129), jnp.int32)
    new_params, loss = jax.eval_shape(step, params, tokens)
    assert loss.shape == () and new_params["wq"].shape == params["wq"].shape
    text = step.trace(params, tokens).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("@flashcore_forward") == 1 and text.count("@flashcore_backward") == 1


# ---- on a GPU ----------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_gpu(lib):
    if jax.default_backend() != "gpu":
        skip_or_fail("JAX has no GPU here (pip install jax[cuda13] on a machine with one)")
    return jax.local_devices(backend="gpu")[0]


def _reference(q, k, v, causal, softmax_scale, window=None, softcap=0.0):
    """float64 attention of [B, H, S, D] numpy arrays (k, v repeated for
    GQA), bottom-right aligned masks as flashcore's."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * softmax_scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    sq, sk = q.shape[2], k.shape[2]
    i = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
    s = np.where(visible, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    denominator = p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p / np.where(denominator == 0, 1, denominator), v)


def _random(key, shape, dtype):
    return jax.random.normal(key, shape, dtype=jnp.float32).astype(dtype)


CASES = [
    # (B, Hq, Hkv, Sq, Sk, D, dtype, causal, window, softcap)
    (2, 4, 4, 128, 128, 64, jnp.bfloat16, False, None, 0.0),
    (2, 8, 2, 100, 300, 128, jnp.float16, True, None, 0.0),
    (1, 4, 1, 257, 129, 64, jnp.bfloat16, True, None, 0.0),
    (2, 4, 2, 200, 200, 128, jnp.float16, False, (50, 10), 0.0),
    (1, 2, 2, 64, 200, 64, jnp.bfloat16, False, None, 30.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b%d_hq%d_hkv%d_sq%d_sk%d_d%d_%s%s%s%s" % (
    c[0], c[1], c[2], c[3], c[4], c[5], np.dtype(c[6]).name, "_causal" if c[7] else "",
    "_window%d_%d" % c[8] if c[8] else "", "_softcap" if c[9] else ""))
def test_jitted_attention_matches_the_reference(jax_gpu, case):
    b, hq, hkv, sq, sk, d, dtype, causal, window, softcap = case
    keys = jax.random.split(jax.random.PRNGKey(sum(case[:6])), 3)
    q, k, v = (_random(key, shape, dtype) for key, shape in zip(keys, ((b, hq, sq, d), (b, hkv, sk, d),
                                                                          (b, hkv, sk, d))))
    scale = 1 / math.sqrt(d)
    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=causal, window=window, softcap=softcap))(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    ref = _reference(q, k, v, causal, scale, window, softcap)
    error = np.max(np.abs(np.asarray(out, dtype=np.float64) - ref))
    # The same computation in the same dtype by XLA, against the same reference.
    group = hq // hkv
    kx, vx = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, kx).astype(jnp.float32) * scale
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    i = jnp.arange(sq)[:, None] + sk - sq
    j = jnp.arange(sk)[None, :]
    visible = jnp.ones((sq, sk), bool)
    if causal:
        visible &= j <= i
    if window is not None:
        visible &= (j >= i - window[0]) & (j <= i + window[1])
    p = jax.nn.softmax(jnp.where(visible, s, -jnp.inf), axis=-1)
    # Rows that see no key (bottom-right causal, Sq > Sk): zeros, as
    # flashcore and the reference give, not softmax's NaN.
    p = jnp.where(visible.any(-1, keepdims=True), p, 0).astype(dtype)
    peer = jnp.einsum("bhqk,bhkd->bhqd", p, vx)
    peer_error = np.max(np.abs(np.asarray(peer, dtype=np.float64) - ref))
    assert error <= 2 * peer_error + 1e-6, (error, peer_error)


@pytest.mark.gpu
def test_matches_jax_dot_product_attention(jax_gpu):
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    shape = (2, 256, 8, 64)  # jax.nn.dot_product_attention's [B, S, H, D]
    q, k, v = (_random(key, shape, jnp.bfloat16) for key in keys)
    ours = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True, layout="bshd"))(q, k, v)
    theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    ref = np.swapaxes(_reference(*(np.swapaxes(np.asarray(x, np.float64), 1, 2) for x in (q, k, v)), True,
                                 1 / 8), 1, 2)
    ours_error = np.max(np.abs(np.asarray(ours, np.float64) - ref))
    theirs_error = np.max(np.abs(np.asarray(theirs, np.float64) - ref))
    assert ours_error <= 2 * theirs_error + 1e-6, (ours_error, theirs_error)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients_match_jax_attention(jax_gpu, deterministic):
    keys = jax.random.split(jax.random.PRNGKey(11), 4)
    b, s, hq, hkv, d = 2, 200, 8, 2, 64
    q = _random(keys[0], (b, s, hq, d), jnp.bfloat16)
    k = _random(keys[1], (b, s, hkv, d), jnp.bfloat16)
    v = _random(keys[2], (b, s, hkv, d), jnp.bfloat16)
    dout = _random(keys[3], (b, s, hq, d), jnp.float32)

    def ours(q, k, v):
        out = fj.attention(q, k, v, causal=True, layout="bshd", deterministic=deterministic)
        return jnp.sum(out.astype(jnp.float32) * dout)

    def reference(q, k, v):  # float32 XLA attention, GQA as jax.nn's
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        return jnp.sum(out.astype(jnp.float32) * dout)

    grads = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
    f32 = tuple(x.astype(jnp.float32) for x in (q, k, v))
    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(*f32)
    peer = jax.jit(jax.grad(reference, argnums=(0, 1, 2)))(q, k, v)
    for name, got, want, other in zip("qkv", grads, expected, peer):
        assert got.dtype == jnp.bfloat16
        error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)))
        peer_error = float(jnp.max(jnp.abs(other.astype(jnp.float32) - want)))
        assert error <= 2 * peer_error + 1e-3, (name, error, peer_error)
    if deterministic:
        again = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
        for got, repeat in zip(grads, again):
            assert bool(jnp.all(got == repeat))


@pytest.mark.gpu
def test_seqused_k(jax_gpu):
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    q = _random(keys[0], (2, 4, 1, 64), jnp.float16)
    k = _random(keys[1], (2, 4, 512, 64), jnp.float16)
    v = _random(keys[2], (2, 4, 512, 64), jnp.float16)
    used = jnp.array([100, 512], dtype=jnp.int32)
    out = jax.jit(lambda q, k, v, used: fj.attention(q, k, v, seqused_k=used))(q, k, v, used)
    for i, n in enumerate((100, 512)):
        ref = _reference(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], False, 1 / 8)
        assert np.max(np.abs(np.asarray(out[i:i + 1], np.float64) - ref)) < 2e-3


@pytest.mark.gpu
def test_varlen_matches_each_sequence(jax_gpu):
    lengths_q, lengths_k = (37, 1, 200), (50, 129, 200)
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    q = _random(keys[0], (sum(lengths_q), 4, 64), jnp.bfloat16)
    k = _random(keys[1], (sum(lengths_k), 2, 64), jnp.bfloat16)
    v = _random(keys[2], (sum(lengths_k), 2, 64), jnp.bfloat16)
    cu_q = jnp.array(np.concatenate([[0], np.cumsum(lengths_q)]), dtype=jnp.int32)
    cu_k = jnp.array(np.concatenate([[0], np.cumsum(lengths_k)]), dtype=jnp.int32)
    out = jax.jit(lambda *a: fj.attention_varlen(*a, max(lengths_q), max(lengths_k), causal=True))(q, k, v, cu_q,
                                                                                                    cu_k)
    for b in range(len(lengths_q)):
        rows, keys_b = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        per = lambda x, r: np.swapaxes(np.asarray(x[r], np.float64), 0, 1)[None]
        ref = _reference(per(q, rows), per(k, keys_b), per(v, keys_b), True, 1 / 8)[0]
        got = np.swapaxes(np.asarray(out[rows], np.float64), 0, 1)
        assert np.max(np.abs(got - ref)) < 2e-2, b


@pytest.mark.gpu
def test_paged_decode_matches_the_contiguous_cache(jax_gpu):
    batch, pages, page_size, max_pages, heads, heads_kv, d = 3, 40, 16, 8, 8, 2, 128
    keys = jax.random.split(jax.random.PRNGKey(9), 3)
    q = _random(keys[0], (batch, 1, heads, d), jnp.bfloat16)
    k_pool = _random(keys[1], (pages, page_size, heads_kv, d), jnp.bfloat16)
    v_pool = _random(keys[2], (pages, page_size, heads_kv, d), jnp.bfloat16)
    table = jnp.array(np.random.default_rng(0).permutation(pages)[:batch * max_pages].reshape(batch, max_pages),
                      dtype=jnp.int32)
    used = jnp.array([5, 128, 77], dtype=jnp.int32)
    paged = jax.jit(lambda *a: fj.attention_with_kvcache(*a[:3], a[4], block_table=a[3]))(q, k_pool, v_pool, table,
                                                                                          used)
    k_cache = k_pool[table].reshape(batch, max_pages * page_size, heads_kv, d)
    v_cache = v_pool[table].reshape(batch, max_pages * page_size, heads_kv, d)
    for b in range(batch):
        n = int(used[b])
        per = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)
        ref = _reference(per(q[b:b + 1]), per(k_cache[b:b + 1, :n]), per(v_cache[b:b + 1, :n]), False,
                         1 / math.sqrt(d))
        assert np.max(np.abs(per(paged[b:b + 1]) - ref)) < 2e-2, b


def _cache_reference(q, k_cache, v_cache, used, k_scale=None, v_scale=None):
    """float64 decode of bshd q [B, Sq, Hq, D] against each sequence's first
    used[b] cache rows (dequantized by [B, Hkv] scales where given),
    bottom-right causal-free; [B, Sq, Hq, Dv]."""
    per = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)
    k, v = per(k_cache), per(v_cache)
    if k_scale is not None:
        k = k * np.asarray(k_scale, np.float64)[:, :, None, None]
        v = v * np.asarray(v_scale, np.float64)[:, :, None, None]
    rows = [np.swapaxes(_reference(per(q[b:b + 1]), k[b:b + 1, :, :n], v[b:b + 1, :, :n], False,
                                   1 / math.sqrt(q.shape[-1])), 1, 2) for b, n in enumerate(used)]
    return np.concatenate(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_split_kv_decode(jax_gpu, num_splits):
    # The split-KV decode kernels and their merge, through XLA's workspace.
    batch, cache, heads, heads_kv, d = 3, 2048, 8, 2, 128
    keys = jax.random.split(jax.random.PRNGKey(13), 3)
    q = _random(keys[0], (batch, 1, heads, d), jnp.bfloat16)
    k = _random(keys[1], (batch, cache, heads_kv, d), jnp.bfloat16)
    v = _random(keys[2], (batch, cache, heads_kv, d), jnp.bfloat16)
    used = (2048, 1000, 17)
    out = jax.jit(lambda q, k, v, n: fj.attention_with_kvcache(q, k, v, n, num_splits=num_splits))(
        q, k, v, jnp.array(used, dtype=jnp.int32))
    error = np.max(np.abs(np.asarray(out, np.float64) - _cache_reference(q, k, v, used)))
    assert error < 1e-2, error


@pytest.mark.gpu
def test_fp8_kv_cache(jax_gpu):
    # A float8_e4m3fn cache under bf16 queries, per-(batch, head) descales.
    batch, cache, heads, heads_kv, d = 2, 512, 8, 2, 128
    keys = jax.random.split(jax.random.PRNGKey(17), 5)
    q = _random(keys[0], (batch, 1, heads, d), jnp.bfloat16)
    k = _random(keys[1], (batch, cache, heads_kv, d), jnp.float8_e4m3fn)
    v = _random(keys[2], (batch, cache, heads_kv, d), jnp.float8_e4m3fn)
    k_scale = jax.random.uniform(keys[3], (batch, heads_kv), jnp.float32, 0.05, 0.2)
    v_scale = jax.random.uniform(keys[4], (batch, heads_kv), jnp.float32, 0.5, 2.0)
    used = (512, 300)
    out = jax.jit(lambda *a: fj.attention_with_kvcache(*a[:4], k_descale=a[4], v_descale=a[5]))(
        q, k, v, jnp.array(used, dtype=jnp.int32), k_scale, v_scale)
    assert out.dtype == jnp.bfloat16
    ref = _cache_reference(q, k, v, used, k_scale, v_scale)
    # bf16 output of values up to a few units: a few bf16 ulps.
    assert np.max(np.abs(np.asarray(out, np.float64) - ref)) < 3e-2


@pytest.mark.gpu
def test_vmap_runs_each_slice(jax_gpu):
    keys = jax.random.split(jax.random.PRNGKey(19), 3)
    q, k, v = (_random(key, (3, 2, 4, 96, 64), jnp.float16) for key in keys)
    call = lambda q, k, v: fj.attention(q, k, v, causal=True)
    mapped = jax.jit(jax.vmap(call))(q, k, v)
    for i in range(3):
        assert bool(jnp.all(mapped[i] == jax.jit(call)(q[i], k[i], v[i])))


@pytest.mark.gpu
def test_committed_to_the_device(jax_gpu):
    # jax.Arrays placed on (sharded onto) one device: the call runs there.
    keys = jax.random.split(jax.random.PRNGKey(23), 3)
    q, k, v = (jax.device_put(_random(key, (1, 4, 128, 64), jnp.bfloat16), jax_gpu) for key in keys)
    out = jax.jit(lambda q, k, v: fj.attention(q, k, v))(q, k, v)
    assert out.devices() == {jax_gpu}
    ref = _reference(q, k, v, False, 1 / 8)
    assert np.max(np.abs(np.asarray(out, np.float64) - ref)) < 2e-2
