#!/usr/bin/env python3
"""flashcore from PyTorch: causal grouped-query attention, checked against
torch's own scaled_dot_product_attention.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/torch_attention.py

(or pip install bindings/python and put libflashcore where the dynamic loader
finds it). Needs a CUDA GPU (sm_80 or newer) and torch.
"""

import torch
import torch.nn.functional as F

import flashcore

batch, heads_q, heads_kv, seqlen, head_dim = 2, 16, 4, 1024, 128
q = torch.randn(batch, heads_q, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
k = torch.randn(batch, heads_kv, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)

# Same arguments as F.scaled_dot_product_attention; runs on the current stream.
out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)

expected = F.scaled_dot_product_attention(q, k.repeat_interleave(heads_q // heads_kv, 1),
                                          v.repeat_interleave(heads_q // heads_kv, 1), is_causal=True)
print("flashcore %s (library %s)" % (flashcore.__version__, flashcore.library_version()))
print("out %s %s, lse %s" % (tuple(out.shape), out.dtype, tuple(lse.shape)))
print("max |flashcore - torch| = %.3g" % (out.float() - expected.float()).abs().max().item())

# FlashAttention-style [batch, seqlen, heads, head_dim] tensors: say so with layout=.
q_bshd, k_bshd, v_bshd = (t.transpose(1, 2).contiguous() for t in (q, k, v))
out_bshd = flashcore.attention(q_bshd, k_bshd, v_bshd, causal=True, layout="bshd")
print("bshd layout agrees: %s" % torch.equal(out_bshd.transpose(1, 2), out))

# Errors carry the library's status and message.
try:
    flashcore.attention(q[..., :96], k[..., :96], v[..., :96])
except flashcore.FlashcoreError as e:
    print("%s: status %s, %r" % (type(e).__name__, e.status.name, e.message))
