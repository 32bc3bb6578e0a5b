#!/usr/bin/env python3
"""flashcore through JAX (flashcore.jax under jax.jit) against the same call
through the torch binding (CUDA-graph replay, bench/compare.py's timing) and
against jax.nn.dot_product_attention(implementation="cudnn"), on one GPU in
one run (issue 39's targets: within 3% of the torch binding, >= 1.05x
JAX's cuDNN path on the throughput and decode presets).

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 bench/jax_compare.py [--preset NAME[,NAME]] [--dtype bf16]

Every backend gets the same [B, S, H, D] arrays (layout "bshd", which
jax.nn.dot_product_attention takes; GQA native in all three), rotated over
enough buffer sets to exceed twice the L2 as compare.py does. The JAX
backends are timed as one jitted executable of --calls calls (their
outputs all returned, so that XLA keeps every call), median over
--repeats runs of it, per call; the torch binding by compare.py's measure()
(graph replays, median). Decode presets are judged on TB/s of K/V read.

Needs torch and jax with CUDA in one process: JAX's preallocation is turned
off (XLA_PYTHON_CLIENT_PREALLOCATE=false) before it is imported.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (bench/compare.py: presets, cases, torch timing)

DEFAULT_PRESETS = ("tput-2k-d64", "tput-8k-d64", "tput-2k-d128", "tput-8k-d128", "tput-16k-d128",
                   "decode-b8-8k", "decode-b1-32k", "decode-b64-1k", "decode-b4-16k-gqa8")
# Calls in one timed JAX executable, and at most this many bytes of outputs
# kept alive by them.
MAX_OUTPUT_BYTES = 8 << 30


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=",".join(DEFAULT_PRESETS), help="comma-separated compare.py presets")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or both")
    p.add_argument("--mask", default="both", choices=("none", "causal", "both"))
    p.add_argument("--calls", type=int, default=32, help="calls per timed JAX executable (fewer for large outputs)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each JAX executable")
    p.add_argument("--budget-ms", type=float, default=200.0, help="compare.py's replay budget for the torch binding")
    return p.parse_args(argv)


def cases(args):
    dtypes = ("bf16", "fp16") if args.dtype == "both" else tuple(args.dtype.split(","))
    masks = {"none": (False,), "causal": (True,), "both": (False, True)}[args.mask]
    presets = {p.name: p for p in compare.PRESETS}
    for name in args.preset.split(","):
        p = presets[name]
        for dtype in dtypes:
            for causal in masks:
                if p.kind == "decode" and causal:
                    continue  # one query row: causal is the same call
                yield compare.Case(p.name, p.batch, p.heads, p.kv_heads, p.seqlen_q, p.keys, p.head_dim, p.head_dim_v,
                                   dtype, causal, "bshd", p.kind)


def time_jax(jax, fn, sets, calls, repeats):
    """Median µs per call of `calls` calls of fn over the buffer sets, in one
    jitted executable."""
    def many(sets):
        return tuple(fn(*sets[i % len(sets)]) for i in range(calls))

    run = jax.jit(many)
    jax.block_until_ready(run(sets))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(sets))
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(times)


def main(argv=None):
    args = parse_args(argv)
    try:
        import jax
        import jax.numpy as jnp
        import torch

        import flashcore
        import flashcore.jax as fj
        gpu = jax.local_devices(backend="gpu")[0]
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA GPU")
    except (ImportError, RuntimeError) as e:  # as compare.py: 2 for no GPU, torch, jax or flashcore
        print("jax_compare.py needs a CUDA GPU that both jax (jax[cuda13]) and torch see, and flashcore: %s"
              % compare.short_error(e), file=sys.stderr)
        return 2
    print("%s, jax %s, torch %s, flashcore %s" % (gpu.device_kind, jax.__version__, torch.__version__,
                                                 flashcore.__version__))
    print("%-46s | %10s %10s %10s | %8s %8s" % ("case", "fc-jax us", "fc-torch", "cudnn-jax", "jax/torch",
                                                "fc/cudnn"))
    failed = False
    for c in cases(args):
        nsets = compare.buffer_sets(c, argparse.Namespace(buffers=0))
        torch_sets = compare.make_inputs(c, nsets, seed=1)
        jax_sets = [tuple(jax.dlpack.from_dlpack(t) for t in s) for s in torch_sets]
        out_bytes = 2 * c.batch * c.num_heads_q * c.seqlen_q * c.head_dim_v
        calls = max(len(jax_sets), min(args.calls, MAX_OUTPUT_BYTES // max(out_bytes, 1)))

        def ours(q, k, v):
            return fj.attention(q, k, v, causal=c.causal, layout="bshd")

        def theirs(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=c.causal, implementation="cudnn")

        us_jax = time_jax(jax, ours, jax_sets, calls, args.repeats)
        try:
            us_cudnn = time_jax(jax, theirs, jax_sets, calls, args.repeats)
        except Exception as e:  # noqa: BLE001 (cuDNN may refuse a shape: say so, go on)
            print("  cudnn-jax refused %s: %s" % (c.label, compare.short_error(e)))
            us_cudnn = float("nan")
        run = compare.flashcore_backend(flashcore, c)
        us_torch, _, _ = compare.measure(lambda i: run(*torch_sets[i % nsets]), nsets, args.budget_ms, 1000)
        ratio_torch, ratio_cudnn = us_jax / us_torch, us_cudnn / us_jax
        if c.decode:
            rate = lambda us: "%7.2fTB/s" % (c.kv_bytes() / us / 1e6)
        else:
            rate = lambda us: "%7.1fTF/s" % (compare.attention_flops(c) / us / 1e6)
        print("%-46s | %10.1f %10.1f %10.1f | %8.3f %8.2f   (%s, %s)" % (
            c.label, us_jax, us_torch, us_cudnn, ratio_torch, ratio_cudnn, rate(us_jax), rate(us_cudnn)))
        failed |= ratio_torch > 1.03
        del jax_sets, torch_sets
        jnp.zeros(()).block_until_ready()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
