"""flashcore for JAX: fused attention as an XLA FFI custom call, under
jax.jit, with gradients (docs/log/jax.md).

    import flashcore.jax
    out = flashcore.jax.attention(q, k, v, causal=True)   # q: [B, Hq, Sq, D]

The call is planned at trace time with the same checks and messages as
flashcore.attention; XLA allocates out, lse and the workspace, and runs the
library on its own stream. Importable only where JAX is installed.
"""

from functools import partial

try:
    import jax
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("flashcore.jax needs JAX: pip install jax (jax[cuda13] for NVIDIA GPUs)") from e

from . import _ffi_call

__all__ = ["attention", "attention_varlen", "attention_with_kvcache"]


def attention(q, k, v, *, causal=False, softmax_scale=None, window=None, softcap=0.0, layout="bhsd",
              return_lse=False, num_splits=None, seqused_k=None, deterministic=False, scale=None,
              q_descale=None, k_descale=None, v_descale=None, attention_chunk=0, sinks=None, sm_margin=0):
    """Fused scaled-dot-product attention of JAX arrays, as
    flashcore.attention takes it:

        out = softmax(cap(softmax_scale * q @ k^T) [+ causal/window mask]) @ v

    q: [B, Hq, Sq, D]; k: [B, Hkv, Sk, D]; v: [B, Hkv, Sk, Dv] (layout="bshd":
    [B, S, H, D]), float16 or bfloat16, Hq a multiple of Hkv. Returns out
    ([B, Hq, Sq, Dv], q's dtype), or (out, lse) with return_lse (lse:
    float32 [B, Hq, Sq], without a gradient of its own, as
    FlashAttention's). causal, softmax_scale (scale: PyTorch's name for
    it), window, softcap, num_splits, seqused_k (an int32 [B] array), the
    float8_e4m3fn inputs with their descales, attention_chunk (a Python
    int: chunked attention), sinks (a float32 [Hq] array: learnable sinks)
    and sm_margin (a Python int: SMs left to kernels on other streams, by
    the backward pass too) mean what they mean to flashcore.attention;
    deterministic asks the backward pass for bitwise-reproducible
    gradients. Gradients flow to q, k, v and sinks through
    flashcore_backward (16-bit inputs). Arrays are row-major (XLA's
    layout); the last dimension of each is its contiguous one.
    """
    if scale is not None:
        if softmax_scale is not None:
            raise TypeError("pass softmax_scale or scale (PyTorch's name for it), not both")
        softmax_scale = scale
    arrays = dict(seqused_k=seqused_k, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, sinks=sinks)
    return _call(q, k, v, arrays, layout, causal, softmax_scale, window, softcap, num_splits, deterministic,
                 return_lse, attention_chunk=attention_chunk, sm_margin=sm_margin)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     softmax_scale=None, window=None, softcap=0.0, return_lse=False, num_splits=None,
                     seqused_k=None, deterministic=False, q_descale=None, k_descale=None, v_descale=None,
                     attention_chunk=0, sinks=None, sm_margin=0):
    """flashcore.attention_varlen for JAX arrays: sequences of different
    lengths packed without padding. q: [total_q, Hq, D]; k: [total_k, Hkv,
    D]; v: [total_k, Hkv, Dv]; cu_seqlens_q, cu_seqlens_k: int32 [B + 1]
    offsets; max_seqlen_q, max_seqlen_k: Python ints (they size the grid and
    the workspace at trace time). out: [total_q, Hq, Dv]; lse (return_lse):
    float32 [Hq, total_q]; attention_chunk, sinks and sm_margin as for
    attention().
    Differentiable as attention() is (rows outside every sequence get zero
    gradients)."""
    arrays = dict(seqused_k=seqused_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, q_descale=q_descale,
                  k_descale=k_descale, v_descale=v_descale, sinks=sinks)
    return _call(q, k, v, arrays, "bshd", causal, softmax_scale, window, softcap, num_splits, deterministic,
                 return_lse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, attention_chunk=attention_chunk,
                 sm_margin=sm_margin)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, *, block_table=None, cu_seqlens_q=None,
                           max_seqlen_q=None, causal=False, softmax_scale=None, window=None, softcap=0.0,
                           return_lse=False, num_splits=None, deterministic=False, q_descale=None,
                           k_descale=None, v_descale=None, attention_chunk=0, sinks=None, sm_margin=0):
    """flashcore.attention_with_kvcache for JAX arrays: new queries
    against a KV cache, [B, S, H, D] storage. q: [B, Sq, Hq, D] (or packed
    [total_q, Hq, D] with cu_seqlens_q and max_seqlen_q); k_cache, v_cache:
    [B, S_cache, Hkv, D] and [.., Dv], or page pools [num_pages, page_size,
    Hkv, D] with block_table (int32 [B, max_pages]); cache_seqlens: an int32
    [B] array, an int for every sequence, or None for the whole cache; a
    float8_e4m3fn cache with k_descale and v_descale. The split-KV decode
    kernels run here as in the torch binding (num_splits None: the
    library's choice). attention_chunk, sinks and sm_margin as for
    attention().
    Differentiable for a contiguous 16-bit cache; a paged or float8_e4m3fn
    one's gradient is refused at trace time."""
    if cache_seqlens is not None and not hasattr(cache_seqlens, "shape"):
        if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
            raise TypeError("cache_seqlens must be None, an int or an int32 array of shape [B], got %s"
                            % type(cache_seqlens).__name__)
        batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
        cache_seqlens = jax.numpy.full((batch,), cache_seqlens, dtype=jax.numpy.int32)
    arrays = dict(seqused_k=cache_seqlens, cu_seqlens_q=cu_seqlens_q, block_table=block_table, q_descale=q_descale,
                  k_descale=k_descale, v_descale=v_descale, sinks=sinks)
    return _call(q, k_cache, v_cache, arrays, "bshd", causal, softmax_scale, window, softcap, num_splits,
                 deterministic, return_lse, max_seqlen_q=max_seqlen_q, seqused_k_name="cache_seqlens",
                 attention_chunk=attention_chunk, sm_margin=sm_margin)


def _call(q, k, v, arrays, layout, causal, softmax_scale, window, softcap, num_splits, deterministic, return_lse,
          max_seqlen_q=None, max_seqlen_k=None, seqused_k_name="seqused_k", attention_chunk=0, sm_margin=0):
    # The static attributes of the call's plans (sm_margin changes the
    # plan: the split-KV choice and the persistent grid).
    config = (layout, bool(causal), softmax_scale, None if window is None else tuple(window), softcap, num_splits,
              bool(deterministic), max_seqlen_q, max_seqlen_k, seqused_k_name, attention_chunk, sm_margin)
    out, lse = _attention(config, q, k, v, arrays)
    lse = jax.lax.stop_gradient(lse)
    return (out, lse) if return_lse else out


def _forward_plan(config, q, k, v, arrays):
    (layout, causal, softmax_scale, window, softcap, num_splits, _, max_seqlen_q, max_seqlen_k, name, chunk,
     margin) = config
    return _ffi_call.plan_forward(q, k, v, layout, causal, softmax_scale, window, softcap, num_splits, arrays,
                                  max_seqlen_q, max_seqlen_k, name, chunk, margin)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, arrays):
    return _ffi_call.forward(_forward_plan(config, q, k, v, arrays), q, k, v, arrays)


def _attention_forward(config, q, k, v, arrays):
    out, lse = _ffi_call.forward(_forward_plan(config, q, k, v, arrays), q, k, v, arrays)
    return (out, lse), (q, k, v, out, lse, arrays)


def _attention_backward(config, residuals, cotangents):
    q, k, v, out, lse, arrays = residuals
    dout, _ = cotangents  # lse's is zero: _call stops its gradient
    (layout, causal, softmax_scale, window, softcap, _, deterministic, max_seqlen_q, max_seqlen_k, name, chunk,
     margin) = config
    plan = _ffi_call.plan_backward(q, k, v, out, lse, layout, causal, softmax_scale, window, softcap, deterministic,
                                   arrays, max_seqlen_q, max_seqlen_k, name, chunk, margin)
    dq, dk, dv, dsinks = _ffi_call.backward(plan, q, k, v, out, dout.astype(out.dtype), lse, arrays)
    # The integer arrays and the descales get no gradient; the sinks do.
    return dq, dk, dv, {key: dsinks if key == "sinks" else None for key in arrays}


_attention.defvjp(_attention_forward, _attention_backward)
