#!/usr/bin/env python3
"""A pure-JAX transformer block whose attention is flashcore.jax.attention,
trained for a few steps under jax.jit beside the same block on
jax.nn.dot_product_attention, from the same weights and batches; the two
loss curves must agree within --tolerance.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/jax_transformer_block.py

(or the wheel, which carries the library and flashcore.jax's handlers).
Needs jax with a CUDA GPU (pip install jax[cuda13]); elsewhere
flashcore.jax says so at trace time.

The block: pre-norm causal self-attention with grouped-query heads
(layout "bshd", as jax.nn.dot_product_attention takes it) and a GELU MLP,
bf16 activations, fp32 weights, plain SGD on a next-token loss over random
tokens (the point is the numbers agreeing, not the model learning much).
"""

import argparse
import sys

import jax
import jax.numpy as jnp

import flashcore.jax


def init(key, vocab, width, heads, heads_kv, head_dim):
    keys = jax.random.split(key, 6)
    normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])
    return {
        "embed": jax.random.normal(keys[0], (vocab, width), jnp.float32) * 0.02,
        "wq": normal(keys[1], (width, heads * head_dim)),
        "wkv": normal(keys[2], (width, 2 * heads_kv * head_dim)),
        "wo": normal(keys[3], (heads * head_dim, width)),
        "w1": normal(keys[4], (width, 4 * width)),
        "w2": normal(keys[5], (4 * width, width)),
    }


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def block(params, tokens, attend, heads, heads_kv, head_dim):
    """Logits of one block over tokens [B, S]; attend(q, k, v) takes and
    returns [B, S, H, D] bf16 arrays."""
    batch, seqlen = tokens.shape
    x = params["embed"][tokens]
    h = layer_norm(x).astype(jnp.bfloat16)
    q = (h @ params["wq"].astype(jnp.bfloat16)).reshape(batch, seqlen, heads, head_dim)
    kv = (h @ params["wkv"].astype(jnp.bfloat16)).reshape(batch, seqlen, 2, heads_kv, head_dim)
    a = attend(q, kv[:, :, 0], kv[:, :, 1]).reshape(batch, seqlen, heads * head_dim)
    x = x + (a @ params["wo"].astype(jnp.bfloat16)).astype(jnp.float32)
    h = layer_norm(x).astype(jnp.bfloat16)
    x = x + (jax.nn.gelu(h @ params["w1"].astype(jnp.bfloat16)) @ params["w2"].astype(jnp.bfloat16)).astype(
        jnp.float32)
    return layer_norm(x) @ params["embed"].T


def flashcore_attention(q, k, v):
    return flashcore.jax.attention(q, k, v, causal=True, layout="bshd")


def jax_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def make_step(attend, heads, heads_kv, head_dim, learning_rate):
    def loss(params, tokens):
        logits = block(params, tokens[:, :-1], attend, heads, heads_kv, head_dim)
        labels = jax.nn.one_hot(tokens[:, 1:], logits.shape[-1])
        return -(jax.nn.log_softmax(logits) * labels).sum(-1).mean()

    @jax.jit
    def step(params, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads), value

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest loss difference allowed")
    args = parser.parse_args(argv)
    vocab, width, heads, heads_kv, head_dim = 256, 256, 8, 2, 64
    params = init(jax.random.PRNGKey(0), vocab, width, heads, heads_kv, head_dim)
    data = jax.random.randint(jax.random.PRNGKey(1), (args.steps, args.batch, args.seqlen + 1), 0, vocab)
    curves = {}
    for name, attend in (("flashcore", flashcore_attention), ("jax", jax_attention)):
        step = make_step(attend, heads, heads_kv, head_dim, learning_rate=0.5)
        weights, losses = params, []
        for tokens in data:
            weights, value = step(weights, tokens)
            losses.append(float(value))
        curves[name] = losses
    worst = max(abs(a - b) for a, b in zip(curves["flashcore"], curves["jax"]))
    for i in range(0, args.steps, max(1, args.steps // 5)):
        print("step %3d  loss flashcore %.4f  jax %.4f" % (i, curves["flashcore"][i], curves["jax"][i]))
    print("largest difference %.4f (tolerance %.4f)" % (worst, args.tolerance))
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
