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
backends run as jitted executables of --calls calls (each call's softmax
scale a few ulps apart, so that XLA merges none; every output returned, so
that it drops none), the torch binding as a CUDA graph of the same calls.
Each one's GPU time per call is the median span of its kernels over
executions replayed back to back for about --budget-ms after as many for
warm-up, from CUPTI's kernel records (torch.profiler): one instrument, the
same clocks under load; the targets are judged on these. The wall columns
time JAX's executables on the host (2x --calls calls minus --calls calls,
per call), which also counts XLA's runtime per call on the host; "torch
evt" is compare.py's measure() (CUDA events over graph replays). Decode
presets are judged on TB/s of K/V read.

Needs torch and jax with CUDA in one process: JAX's preallocation is turned
off (XLA_PYTHON_CLIENT_PREALLOCATE=false) before it is imported.
"""

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (bench/compare.py: presets, cases, torch timing)

# torch.profiler's device type of a kernel record (set in main, after torch's import).
DEVICE_CUDA = None

# The throughput presets and compare.py's decode group.
DEFAULT_PRESETS = ("tput-2k-d64", "tput-8k-d64", "tput-16k-d64", "tput-2k-d128", "tput-8k-d128", "tput-16k-d128",
                   "decode")
# Calls in the shorter timed JAX executable (the longer has twice as many)
# keep at most this many bytes of outputs alive.
MAX_OUTPUT_BYTES = 4 << 30
# Profiled executions of each JAX executable for its GPU span: enough for
# --budget-ms, within these bounds.
MIN_SPAN_EXECUTIONS, MAX_SPAN_EXECUTIONS = 5, 200


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=",".join(DEFAULT_PRESETS),
                   help="comma-separated compare.py presets or preset groups")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or both")
    p.add_argument("--mask", default="both", choices=("none", "causal", "both"))
    p.add_argument("--calls", type=int, default=32, help="calls per timed JAX executable (fewer for large outputs)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each JAX executable")
    p.add_argument("--budget-ms", type=float, default=200.0,
                   help="about how long each backend runs for its timing (compare.py's replay budget)")
    return p.parse_args(argv)


def cases(args):
    dtypes = ("bf16", "fp16") if args.dtype == "both" else tuple(args.dtype.split(","))
    masks = {"none": (False,), "causal": (True,), "both": (False, True)}[args.mask]
    presets = {p.name: p for p in compare.PRESETS}
    names = [n for name in args.preset.split(",") for n in compare.PRESET_GROUPS.get(name, [name])]
    for name in names:
        p = presets[name]
        for dtype in dtypes:
            for causal in masks:
                if p.kind == "decode" and causal:
                    continue  # one query row: causal is the same call
                yield compare.Case(p.name, p.batch, p.heads, p.kv_heads, p.seqlen_q, p.keys, p.head_dim, p.head_dim_v,
                                   dtype, causal, "bshd", p.kind)


def span_executions(budget_ms, calls, us_per_call):
    """Executions of `calls` calls that take about budget_ms, within bounds."""
    wanted = math.ceil(budget_ms * 1e3 / (calls * max(us_per_call, 1.0)))
    return min(max(wanted, MIN_SPAN_EXECUTIONS), MAX_SPAN_EXECUTIONS)


def gpu_span_us(execute, executions):
    """Median GPU span of execute() (one execution, waited for): from its
    first kernel's start to its last one's end, in CUPTI's kernel records
    (through torch.profiler). The executions run back to back after as many
    for warm-up, so that every backend is timed at the clocks it holds
    under load, by one instrument."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(executions):
        execute()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(executions):
            execute()
    ranges = sorted((e.time_range for e in prof.events() if e.device_type == DEVICE_CUDA), key=lambda r: r.start)
    per_execution = len(ranges) // executions
    if per_execution == 0 or len(ranges) % executions:
        raise RuntimeError("the profiler saw %d kernels over %d executions" % (len(ranges), executions))
    spans = []
    for i in range(executions):
        one = ranges[i * per_execution:(i + 1) * per_execution]
        spans.append(max(r.end for r in one) - one[0].start)
    return statistics.median(spans)


def time_jax(jax, fn, sets, calls, repeats, budget_ms):
    """(GPU µs, wall µs, executions) per call of fn over the buffer sets.
    fn(i, q, k, v) must differ by i (a softmax scale a few ulps apart): XLA
    merges calls it sees as the same, and every output is returned so that
    none is dropped.

    GPU: gpu_span_us of an executable of `calls` calls, divided by `calls`.
    Wall: executables of `calls` and of 2 * `calls` calls timed on the host
    (median over repeats), the difference divided by `calls`; it also counts
    whatever XLA's runtime spends on the host per call beyond the GPU's time
    (buffer allocation, thunk dispatch), which the GPU column does not.
    executions: how many gpu_span_us ran (about budget_ms)."""
    def executable(n):
        run = jax.jit(lambda sets: tuple(fn(i, *sets[i % len(sets)]) for i in range(n)))
        jax.block_until_ready(run(sets))  # compile and warm up
        return run

    def median_seconds(run):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(run(sets))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    short, long = executable(calls), executable(2 * calls)
    wall = (median_seconds(long) - median_seconds(short)) * 1e6 / calls
    executions = span_executions(budget_ms, calls, wall)
    return gpu_span_us(lambda: jax.block_until_ready(short(sets)), executions) / calls, wall, executions


def time_torch_graph(torch, run, sets, calls, executions):
    """GPU µs per call of the torch binding: a CUDA graph of `calls` calls
    over the buffer sets, replayed as gpu_span_us times the JAX executable."""
    for i in range(len(sets)):
        run(*sets[i])  # warm up outside the capture
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=stream):
        outs = [run(*sets[i % len(sets)]) for i in range(calls)]  # noqa: F841 (kept alive with the graph)

    def execute():
        graph.replay()
        torch.cuda.synchronize()
    return gpu_span_us(execute, executions) / calls


def distinct_scale(head_dim, i):
    """The default softmax scale, i float32 ulps-worth (2^-20 relative)
    apart per call: no two timed calls are the same to XLA."""
    return (1.0 + i * 2.0 ** -20) / head_dim ** 0.5


def main(argv=None):
    args = parse_args(argv)
    try:
        import jax
        import jax.numpy as jnp
        import torch

        import flashcore
        import flashcore.jax as fj
        global DEVICE_CUDA
        DEVICE_CUDA = torch.autograd.DeviceType.CUDA
        gpu = jax.local_devices(backend="gpu")[0]
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA GPU")
    except (ImportError, RuntimeError) as e:  # as compare.py: 2 for no GPU, torch, jax or flashcore
        print("jax_compare.py needs a CUDA GPU that both jax (jax[cuda13]) and torch see, and flashcore: %s"
              % compare.short_error(e), file=sys.stderr)
        return 2
    print("%s, jax %s, torch %s, flashcore %s" % (gpu.device_kind, jax.__version__, torch.__version__,
                                                 flashcore.__version__))
    print("GPU µs per call: the kernel span of a jitted executable (JAX) or of a CUDA graph's replay (torch) of the "
          "same calls, CUPTI; wall: JAX's host-timed µs per call; events: compare.py's graph replays timed by CUDA "
          "events")
    print("%-50s | %9s %9s %9s | %9s %8s | %9s %9s %9s" % ("case", "fc-jax", "fc-torch", "cudnn-jax", "jax/torch",
                                                           "fc/cudnn", "fc wall", "cudnn wall", "torch evt"))
    failed = False
    for c in cases(args):
        nsets = compare.buffer_sets(c, argparse.Namespace(buffers=0))
        torch_sets = compare.make_inputs(c, nsets, seed=1)
        jax_sets = [tuple(jax.dlpack.from_dlpack(t) for t in s) for s in torch_sets]
        out_bytes = 2 * c.batch * c.num_heads_q * c.seqlen_q * c.head_dim_v
        calls = max(len(jax_sets), min(args.calls, MAX_OUTPUT_BYTES // max(out_bytes, 1)))

        def ours(i, q, k, v):
            return fj.attention(q, k, v, causal=c.causal, layout="bshd", softmax_scale=distinct_scale(c.head_dim, i))

        def theirs(i, q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=c.causal, scale=distinct_scale(c.head_dim, i),
                                                implementation="cudnn")

        us_jax, wall_jax, executions = time_jax(jax, ours, jax_sets, calls, args.repeats, args.budget_ms)
        run = compare.flashcore_backend(flashcore, c)
        us_torch = time_torch_graph(torch, run, torch_sets, calls, executions)
        us_events, _, _ = compare.measure(lambda i: run(*torch_sets[i % nsets]), nsets, args.budget_ms, 1000)
        try:
            us_cudnn, wall_cudnn, _ = time_jax(jax, theirs, jax_sets, calls, args.repeats, args.budget_ms)
        except Exception as e:  # noqa: BLE001 (cuDNN may refuse a shape: say so, go on)
            print("  cudnn-jax refused %s: %s" % (c.label, compare.short_error(e)))
            us_cudnn = wall_cudnn = float("nan")
        ratio_torch, ratio_cudnn = us_jax / us_torch, us_cudnn / us_jax
        if c.decode:
            rate = lambda us: "%7.2fTB/s" % (c.kv_bytes() / us / 1e6)
        else:
            rate = lambda us: "%7.1fTF/s" % (compare.attention_flops(c) / us / 1e6)
        print("%-50s | %9.1f %9.1f %9.1f | %9.3f %8.2f | %9.1f %9.1f %9.1f   (%s, %s)" % (
            c.label, us_jax, us_torch, us_cudnn, ratio_torch, ratio_cudnn, wall_jax, wall_cudnn, us_events,
            rate(us_jax), rate(us_cudnn)))
        failed |= ratio_torch > 1.03
        del jax_sets, torch_sets
        jnp.zeros(()).block_until_ready()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
