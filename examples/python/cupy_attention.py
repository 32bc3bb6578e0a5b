#!/usr/bin/env python3
"""flashcore from CuPy: attention on CuPy arrays, checked against NumPy.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/cupy_attention.py

Needs a CUDA GPU (sm_80 or newer), cupy and numpy; not torch.
"""

import cupy as cp
import numpy as np

import flashcore

batch, heads, seqlen_q, seqlen_k, head_dim = 2, 8, 200, 300, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((batch, heads, s, head_dim)).astype(np.float16)
           for s in (seqlen_q, seqlen_k, seqlen_k))

stream = cp.cuda.Stream(non_blocking=True)
with stream:  # flashcore queues its work on CuPy's current stream
    out = flashcore.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True)
stream.synchronize()

# NumPy reference in float64; the causal mask is bottom-right aligned:
# query i sees key j iff j <= i + seqlen_k - seqlen_q.
scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(head_dim)
seen = np.arange(seqlen_k)[None, :] <= np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
scores = np.where(seen, scores, -np.inf)
p = np.exp(scores - scores.max(axis=-1, keepdims=True))
expected = np.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), v.astype(np.float64))

print("flashcore %s (library %s)" % (flashcore.__version__, flashcore.library_version()))
print("out: %s %s %s" % (type(out).__name__, out.shape, out.dtype))
print("max |flashcore - numpy| = %.3g" % np.abs(out.get().astype(np.float64) - expected).max())
