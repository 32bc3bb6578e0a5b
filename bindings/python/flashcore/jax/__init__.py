"""flashcore for JAX: fused attention as an XLA FFI custom call, under
jax.jit, with gradients (docs/jax-notes.md).

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

__all__ = ["attention"]


def attention(q, k, v, *, causal=False, softmax_scale=None, window=None, softcap=0.0, layout="bhsd",
              return_lse=False, num_splits=None, seqused_k=None, deterministic=False, scale=None):
    """Fused scaled-dot-product attention of JAX arrays, as
    flashcore.attention takes it:

        out = softmax(cap(softmax_scale * q @ k^T) [+ causal/window mask]) @ v

    q: [B, Hq, Sq, D]; k: [B, Hkv, Sk, D]; v: [B, Hkv, Sk, Dv] (layout="bshd":
    [B, S, H, D]), float16 or bfloat16, Hq a multiple of Hkv. Returns out
    ([B, Hq, Sq, Dv], q's dtype), or (out, lse) with return_lse (lse:
    float32 [B, Hq, Sq], without a gradient of its own, as
    FlashAttention's). causal, softmax_scale (scale: PyTorch's name for
    it), window, softcap, num_splits and seqused_k (an int32 [B] array)
    mean what they mean to flashcore.attention; deterministic asks the
    backward pass for bitwise-reproducible gradients. Gradients flow to q,
    k and v through flashcore_backward. Arrays are row-major (XLA's
    layout); the last dimension of each is its contiguous one.
    """
    if scale is not None:
        if softmax_scale is not None:
            raise TypeError("pass softmax_scale or scale (PyTorch's name for it), not both")
        softmax_scale = scale
    config = (layout, bool(causal), softmax_scale, None if window is None else tuple(window), softcap, num_splits,
              bool(deterministic))
    out, lse = _attention(config, q, k, v, seqused_k)
    lse = jax.lax.stop_gradient(lse)
    return (out, lse) if return_lse else out


def _forward_plan(config, q, k, v, seqused_k):
    layout, causal, softmax_scale, window, softcap, num_splits, _ = config
    return _ffi_call.plan_forward(q, k, v, layout, causal, softmax_scale, window, softcap, num_splits, seqused_k)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, seqused_k):
    return _ffi_call.forward(_forward_plan(config, q, k, v, seqused_k), q, k, v, seqused_k)


def _attention_forward(config, q, k, v, seqused_k):
    out, lse = _ffi_call.forward(_forward_plan(config, q, k, v, seqused_k), q, k, v, seqused_k)
    return (out, lse), (q, k, v, out, lse, seqused_k)


def _attention_backward(config, residuals, cotangents):
    q, k, v, out, lse, seqused_k = residuals
    dout, _ = cotangents  # lse's is zero: attention() stops its gradient
    layout, causal, softmax_scale, window, softcap, _, deterministic = config
    plan = _ffi_call.plan_backward(q, k, v, out, lse, layout, causal, softmax_scale, window, softcap, deterministic,
                                   seqused_k)
    dq, dk, dv = _ffi_call.backward(plan, q, k, v, out, dout.astype(out.dtype), lse, seqused_k)
    return dq, dk, dv, None


_attention.defvjp(_attention_forward, _attention_backward)
