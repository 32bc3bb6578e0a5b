"""check_wheel_gpu.py: on a machine with a GPU and PyTorch, run by a Python
into which the flashcore-attention wheel was installed with pip.

Checks that the library bundled in the wheel is the one loaded, then runs
flashcore.attention on torch tensors (fp16 and bf16; plain, causal with
Sq < Sk, GQA, [B, S, H, D] layout, LSE) against a float64 reference and
against PyTorch SDPA's own error on the same inputs: flashcore's largest
error must be within 2x of SDPA's (or below 1e-3). Exits non-zero on any
failure; prints one line per case.

    python3 -m venv --system-site-packages /tmp/venv
    /tmp/venv/bin/pip install --no-deps flashcore_attention-*.whl
    /tmp/venv/bin/python tests/packages/check_wheel_gpu.py
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

import flashcore

ERROR_FLOOR = 1e-3
SDPA_ERROR_FACTOR = 2.0

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, layout)
CASES = [
    (2, 8, 8, 512, 512, 64, False, "bhsd"),
    (1, 8, 8, 333, 1000, 128, True, "bhsd"),
    (2, 32, 8, 1, 4097, 128, False, "bhsd"),
    (1, 16, 4, 77, 259, 64, True, "bshd"),
]


def reference(q, k, v, causal, scale):
    """float64 softmax(scale q k^T + bottom-right causal mask) v and its LSE on [B, H, S, D]."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        row = torch.arange(sq, device=q.device)[:, None]
        col = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(col > row + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v), lse


def sdpa(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    mask = None
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def main():
    assert "FLASHCORE_LIBRARY" not in os.environ, "run without FLASHCORE_LIBRARY"
    lib = flashcore.library()
    print("flashcore %s, library %s, %s: %s (%s)" % (flashcore.__version__, lib.version, lib.cuda_runtime(),
                                                      lib.path, lib.how))
    assert lib.how.startswith("bundled with the package"), lib.how
    print("torch %s on %s" % (torch.__version__, torch.cuda.get_device_name()))
    gen = torch.Generator(device="cuda").manual_seed(7)
    failures = 0
    for dtype in (torch.float16, torch.bfloat16):
        for b, hq, hkv, sq, sk, d, causal, layout in CASES:
            shape = lambda h, s: (b, h, s, d)
            q, k, v = (torch.randn(*shape(h, s), generator=gen, device="cuda", dtype=dtype)
                       for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
            ref, ref_lse = reference(q, k, v, causal, 1.0 / math.sqrt(d))
            if layout == "bshd":
                args = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
            else:
                args = [q, k, v]
            out, lse = flashcore.attention(*args, causal=causal, return_lse=True, layout=layout)
            torch.cuda.synchronize()
            if layout == "bshd":
                out = out.transpose(1, 2)
            err = (out.double() - ref).abs().max().item()
            lse_err = (lse.double() - ref_lse).abs().max().item()
            sdpa_err = (sdpa(q, k, v, causal).double() - ref).abs().max().item()
            bound = max(SDPA_ERROR_FACTOR * sdpa_err, ERROR_FLOOR)
            ok = math.isfinite(err) and err <= bound and lse_err <= 1e-3
            failures += not ok
            print("%s %-5s B%d H%d/%d Sq%d Sk%d d%d causal=%d %s: max|out-ref| %.2e (SDPA %.2e, bound %.2e), "
                  "max|lse-ref| %.2e" % ("ok  " if ok else "FAIL", str(dtype).split(".")[1], b, hq, hkv, sq, sk,
                                          d, causal, layout, err, sdpa_err, bound, lse_err))
    if failures:
        print("%d case(s) failed" % failures)
        return 1
    print("OK: the flashcore-attention wheel runs flashcore.attention on torch tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
