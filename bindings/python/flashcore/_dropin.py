"""Drop-ins under other libraries' names and conventions:
flashcore.sdpa has the signature and semantics of PyTorch's
torch.nn.functional.scaled_dot_product_attention, flashcore.flash_attn_func
those of FlashAttention 2's flash_attn_func (with FlashAttention 3's fp8
inputs and descale keywords). Both run flashcore.attention
and refuse, with NotImplementedError naming the argument, what it does not
compute."""

import math
import numbers
from typing import Any, Optional, Tuple

from ._arrays import Array, is_torch, shape_of
from ._attention import attention
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._fields import shown
from ._params import _softmax_scale
from ._torch_ops import tracing

# Why flashcore.sdpa reshapes and broadcasts only torch tensors: the other
# arrays are read as they are.
_TORCH_ONLY = ("flashcore.sdpa broadcasts and reshapes torch tensors only: give other arrays as [B, H, S, D] with "
               "one B and H (or, with enable_gqa, key and value heads that divide the query's)")


def _broadcast(sizes, what, hint=""):
    """PyTorch's broadcast of query's, key's and value's leading sizes
    (tuples aligned at the right)."""
    length = max(len(s) for s in sizes)
    out = []
    for i in range(length):
        dims = {s[len(s) - length + i] for s in sizes if len(s) - length + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise InvalidArgumentError("the %s of query, key and value (%s) do not broadcast (PyTorch's rule: equal, "
                                       "or 1)%s" % (what, ", ".join(str(list(s)) for s in sizes), hint))
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _as_bhsd(x, name, shape, batch, heads):
    """x ([..., S, D], leading dims broadcasting to batch, its heads at -3
    or 1 where it has fewer than 3 dimensions) as a [B, heads, S, D] view,
    B the product of batch."""
    rows = (math.prod(batch), heads) + shape[-2:]
    if shape == rows:
        return x  # already [B, H, S, D]: read as given, whatever kind of array
    if not is_torch(x):
        raise TypeError("%s has shape %s: %s" % (name, list(shape), _TORCH_ONLY))
    if len(shape) < 3:
        x = x.unsqueeze(-3)
    return x.expand(batch + (heads,) + shape[-2:]).reshape(rows)


def sdpa(query: Array, key: Array, value: Array, attn_mask: Optional[Array] = None, dropout_p: float = 0.0,
         is_causal: bool = False, *, scale: Optional[float] = None, enable_gqa: bool = False) -> Array:
    """torch.nn.functional.scaled_dot_product_attention, same signature and
    semantics, computed by flashcore (float16/bfloat16):

        out = softmax(query @ key^T * scale [+ causal mask]) @ value

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev]
    (any number of leading dims, broadcast as PyTorch does; without
    enable_gqa the head dims broadcast too, with it Hkv must divide Hq);
    the result is [..., Hq, L, Ev], contiguous. Reshaping and broadcasting
    need torch tensors; other arrays must already be [B, H, S, D] (what
    flashcore.attention takes).

    is_causal: PyTorch's mask, top-left aligned: query i sees key j iff
        j <= i. flashcore's causal is bottom-right aligned, so where L != S
        this is not causal=True: with L > S it is the window (-1, L - S);
        with L < S keys L and up are seen by no query, and the call runs on
        the first L keys with causal=True (the same mask, square).
    scale: None for 1 / sqrt(E); else a float > 0 that a float32 holds
        (a positive float32 is at least 1.4e-45 and at most 3.4e38: others
        raise InvalidArgumentError).
    attn_mask, dropout_p != 0, and scale <= 0 raise NotImplementedError
        naming the argument: flashcore has no arbitrary masks, no dropout,
        and takes softmax scales > 0 only.

    As for every flashcore call, the result is differentiable where an
    input requires grad (grad mode on): autograd computes the gradients of
    query, key and value with flashcore's backward pass (deterministic
    where torch.use_deterministic_algorithms(True) is in effect); under
    torch.compile the call is the flashcore::forward operator, forward and
    backward.
    """
    if attn_mask is not None:
        raise NotImplementedError("flashcore.sdpa: attn_mask is not supported: flashcore masks only causally "
                                  "(is_causal) or by a sliding window (flashcore.attention's window=)")
    if dropout_p != 0:
        raise NotImplementedError("flashcore.sdpa: dropout_p=%r is not supported: flashcore has no dropout (pass "
                                  "0.0)" % (dropout_p,))
    if scale is not None:
        # (Traced by torch.compile, the scale may be symbolic: flashcore::forward checks it as softmax_scale.)
        if not tracing() and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
            raise InvalidArgumentTypeError("flashcore.sdpa: scale must be None or a real number, got %s %s"
                                           % (type(scale).__name__, shown(scale)))
        if not scale > 0:
            raise NotImplementedError("flashcore.sdpa: scale=%r is not supported: flashcore takes a softmax scale > 0 "
                                      "only" % (scale,))
        if not tracing():
            _softmax_scale(scale, "scale")  # one a float32 cannot hold, refused under the name it was given
    shapes = [shape_of(x, name) for x, name in ((query, "query"), (key, "key"), (value, "value"))]
    for shape, name in zip(shapes, ("query", "key", "value")):
        if len(shape) < 2:
            raise InvalidArgumentError("%s must have at least 2 dimensions ([..., S, E]), got shape %s"
                                       % (name, list(shape)))
    heads = [s[-3] if len(s) >= 3 else 1 for s in shapes]
    batch = _broadcast([s[:-3] for s in shapes], "batch dims")
    hq, hk, hv = heads
    if enable_gqa:
        if hq % hk or hq % hv:
            raise InvalidArgumentError("enable_gqa: the number of heads in key (%d) and value (%d) must divide "
                                       "the number of heads in query (%d)" % (hk, hv, hq))
        if hk != hv:
            raise NotImplementedError("flashcore.sdpa: enable_gqa with key and value of different head counts "
                                      "(%d and %d) is not supported" % (hk, hv))
        heads_out, heads_kv = hq, hk
    else:
        (heads_out,) = _broadcast([(h,) for h in heads], "head counts", "; enable_gqa=True groups query heads")
        # Key and value heads broadcast alike (1, as in multi-query attention) are flashcore's own grouping.
        heads_kv = hk if hk == hv and hq == heads_out else heads_out
    q = _as_bhsd(query, "query", shapes[0], batch, heads_out)
    k = _as_bhsd(key, "key", shapes[1], batch, heads_kv)
    v = _as_bhsd(value, "value", shapes[2], batch, heads_kv)
    seqlen_q, seqlen_k = shapes[0][-2], shapes[1][-2]
    causal, window = False, None
    if is_causal:
        if seqlen_q > seqlen_k:
            window = (-1, seqlen_q - seqlen_k)  # j <= i: right bound L - S past the bottom-right diagonal
        else:
            causal = True
            if seqlen_q < seqlen_k:
                if not is_torch(k):
                    raise TypeError("key has shape %s: %s" % (list(shapes[1]), _TORCH_ONLY))
                k, v = k[:, :, :seqlen_q], v[:, :, :seqlen_q]
    out = attention(q, k, v, causal=causal, softmax_scale=scale, window=window)
    out_shape = batch + ((heads_out,) if max(len(s) for s in shapes) >= 3 else ()) + (seqlen_q, shapes[2][-1])
    return out if shape_of(out, "out") == out_shape else out.reshape(out_shape)


def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Any] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, q_descale: Optional[Array] = None,
                    k_descale: Optional[Array] = None, v_descale: Optional[Array] = None, attention_chunk: int = 0,
                    sinks: Optional[Array] = None, sm_margin: int = 0) -> Array:
    """FlashAttention 2's flash_attn_func, same signature and semantics,
    computed by flashcore: q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk,
    Hkv, Dv] (Hkv dividing Hq), out [B, Sq, Hq, Dv]; causal and
    window_size bottom-right aligned, as flashcore.attention's causal and
    window (causal=True makes the window's right bound 0, as FlashAttention
    does); softcap as attention's. Differentiable as attention's result is;
    deterministic makes the backward pass's dq bitwise identical from run
    to run, as FlashAttention's does (flashcore's forward, dk and dv are
    deterministic either way).

    FlashAttention 3's fp8 inputs and keywords: k and v may be
    float8_e4m3fn with a float16/bfloat16 q (out has q's dtype), or q, k
    and v all float8_e4m3fn, as FlashAttention 3's fp8 forward (out is
    bfloat16; sm_90 GPUs only, kernels at head dims 64, 128 and 256, no
    softcap);
    q_descale, k_descale and v_descale are their descale factors (float32
    tensors of one element or of shape [B, Hkv]), as for
    flashcore.attention. Such a call has no backward pass.

    FlashAttention 3's attention_chunk (chunked attention, Llama 4's),
    sm_margin (SMs left to kernels on other streams, the backward pass's
    too) and sinks (learnable sinks, gpt-oss's; FlashAttention 4 calls them
    learnable_sink): keyword arguments as flashcore.attention takes them,
    sinks a float32 [Hq] tensor, differentiable.

    dropout_p != 0, alibi_slopes and return_attn_probs raise
    NotImplementedError naming the argument; for the log-sum-exp that
    return_attn_probs also returns, call flashcore.attention(q, k, v,
    layout="bshd", return_lse=True).
    """
    if dropout_p != 0:
        raise NotImplementedError("flashcore.flash_attn_func: dropout_p=%r is not supported: flashcore has no "
                                  "dropout (pass 0.0)" % (dropout_p,))
    if alibi_slopes is not None:
        raise NotImplementedError("flashcore.flash_attn_func: alibi_slopes is not supported: flashcore has no ALiBi "
                                  "bias")
    if return_attn_probs:
        raise NotImplementedError("flashcore.flash_attn_func: return_attn_probs is not supported: flashcore does not "
                                  "return probabilities (flashcore.attention(q, k, v, layout='bshd', "
                                  "return_lse=True) returns the log-sum-exp)")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError("window_size must be a pair (left, right), got %r" % (window_size,))
    left, right = window_size
    if causal:
        right = 0
    unbounded = (-1, 0) if causal else (-1, -1)  # what causal alone, or nothing, already masks
    window = None if (left, right) == unbounded else (left, right)
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
                     layout="bshd", deterministic=deterministic, q_descale=q_descale, k_descale=k_descale,
                     v_descale=v_descale, attention_chunk=attention_chunk, sinks=sinks, sm_margin=sm_margin)
