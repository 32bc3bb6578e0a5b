#!/usr/bin/env python3
"""Training steps through flashcore beside the peers (issue 58): the host
time an eager training step's attention costs, and what that does to a
small model's tokens/s.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 bench/train_step.py [--mode shapes,model,jax,stub]

Modes (comma-separated; default shapes,model):

  shapes  one attention layer's step, torch.autograd.grad(attention(q, k,
          v), (q, k, v), dout), eager, on [B, S, H, D] bf16 tensors, causal:
          the wall time per step over --steps steps with one
          synchronisation at the end (median of --repeats runs, the
          backends' runs taken in turn), so a step costs the larger of its
          host time and its GPU time. Backends:
          flashcore.attention(layout="bshd"), SDPA's flash (FA2) and cuDNN
          backends (on [B, H, S, D] transposed views, as a model calling
          them does), FlashAttention 4 (flash_attn.cute.flash_attn_func)
          where importable. "GPU" is the same step captured into a CUDA
          graph and replayed (CUDA events, median): the GPU's own time,
          which the wall time approaches when the host keeps up.
  kernels each backend's GPU kernels in one step of each shape
          (torch.profiler), with the step's attention TFLOP/s.
  model   a small decoder (--layers layers of d_model 2048, 16 query heads
          of 128 over 4 KV heads, a SwiGLU MLP, RMSNorm; bf16), a full
          training step (forward, loss, backward, no optimizer) per
          attention backend, eager and under torch.compile, at sequence
          lengths --seqlens with --tokens tokens per step: tokens/s and
          milliseconds per step (median of --repeats runs of --model-steps
          steps). FlashAttention 4 runs eagerly inside the compiled model
          (torch.compile breaks the graph around it).
  jax     the shapes' step through flashcore.jax under jax.jit (jax.grad of
          sum(out * dout)) beside jax.nn.dot_product_attention(
          implementation="cudnn"): wall time per step as above.
  stub    bench/python_overhead.py --mode stub's training rows: the
          binding's host time of one eager forward+backward with the C
          calls stubbed (no GPU needed).

Every row prints the backend, the shape and its numbers; ratios are
flashcore's against the best peer in the same run. Needs torch with a GPU
(but for --mode stub); jax for --mode jax.
"""

import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import flashcore
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
    import flashcore

# The three layer shapes: (B, S, H, D), causal, bf16.
SHAPES = ((1, 256, 8, 64), (2, 1024, 8, 64), (3, 3000, 12, 128))
# The model (the small decoder).
D_MODEL, HEADS_Q, HEADS_KV, HEAD_DIM, MLP_HIDDEN = 2048, 16, 4, 128, 5632


# ---------------------------------------------------------------------------
# attention backends on [B, S, H, D] tensors
# ---------------------------------------------------------------------------

def backends(torch, want_fa4=True):
    """name -> attention(q, k, v) on [B, S, H, D] tensors (GQA: fewer K/V
    heads), causal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def flashcore_attention(q, k, v):
        return flashcore.attention(q, k, v, causal=True, layout="bshd")

    def sdpa_with(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                gqa = q.shape[2] != k.shape[2]
                return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                            enable_gqa=gqa).transpose(1, 2)
        return run

    found = {"flashcore": flashcore_attention, "SDPA flash (FA2)": sdpa_with(SDPBackend.FLASH_ATTENTION),
             "SDPA cuDNN": sdpa_with(SDPBackend.CUDNN_ATTENTION)}
    if want_fa4:
        try:
            from flash_attn.cute import flash_attn_func

            def fa4(q, k, v):
                out = flash_attn_func(q, k, v, causal=True)
                return out[0] if isinstance(out, tuple) else out
            found["FlashAttention 4"] = fa4
        except Exception as e:  # noqa: BLE001 - any reason it cannot run is reported
            print("FlashAttention 4 not importable (%s: %s): left out" % (type(e).__name__, e))
    return found


def layer_inputs(torch, shape, seed):
    b, s, h, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, dout = (torch.randn((b, s, h, d), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    return [x.requires_grad_(True) for x in (q, k, v)], dout


def wall_per_step_us(torch, step, steps, repeats):
    """Median over repeats of the wall time of `steps` steps (one
    synchronisation at the end), per step, in microseconds."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(times)


def interleaved_walls(torch, steps, count, repeats, label):
    """{name: median us per step}: wall_per_step_us's runs taken in turn
    across the backends (one run of each per round, --repeats rounds), so
    that every backend meets the host in the same states (a shared host's
    load and clocks drift over seconds); a backend that fails is left out."""
    runs = {}
    for name, step in steps.items():
        try:
            wall_per_step_us(torch, step, count, 1)  # warm-up (FlashAttention 4 compiles its kernels)
            runs[name] = []
        except Exception as e:  # noqa: BLE001
            print("  %s failed at %s: %s: %s" % (name, label, type(e).__name__, str(e).split("\n")[0][:160]))
    for _ in range(repeats):
        for name in runs:
            runs[name].append(wall_per_step_us(torch, steps[name], count, 1))
    return {name: statistics.median(times) for name, times in runs.items()}


def graph_us(torch, step, replays=50):
    """The step captured into a CUDA graph: median replay time in
    microseconds (CUDA events), or None where capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    except Exception as e:  # noqa: BLE001
        print("    (CUDA graph capture failed: %s: %s)" % (type(e).__name__, str(e).split("\n")[0][:120]))
        return None
    times = []
    for _ in range(5):
        graph.replay()
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def run_shapes(torch, args):
    print("\n== one layer's eager training step: torch.autograd.grad(attention(q, k, v), (q, k, v), dout), bf16, "
          "causal, [B, S, H, D]; us per step (wall: %d steps, one sync; median of %d)" % (args.steps, args.repeats))
    found = backends(torch)
    names = list(found)
    print("%-22s" % "shape" + "".join("%22s" % n for n in names) + "%14s%16s" % ("fc GPU", "fc/best peer"))
    for shape in SHAPES:
        (q, k, v), dout = layer_inputs(torch, shape, 1)
        steps = {name: (lambda attend: lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), dout))(found[name])
                 for name in names}
        walls = interleaved_walls(torch, steps, args.steps, args.repeats, shape)
        gpu = graph_us(torch, lambda: torch.autograd.grad(found["flashcore"](q, k, v), (q, k, v), dout))
        peers = [w for n, w in walls.items() if n != "flashcore"]
        ratio = min(peers) / walls["flashcore"] if peers and "flashcore" in walls else float("nan")
        label = "B%d S%d H%d D%d" % shape
        print("%-22s" % label + "".join("%22s" % ("%.0f" % walls[n] if n in walls else "-") for n in names)
              + "%14s%16s" % ("-" if gpu is None else "%.0f" % gpu, "%.2fx" % ratio))


def run_kernels(torch, args):
    """Each backend's GPU kernels in one step of each shape (CUPTI's records
    through torch.profiler): microseconds per kernel name, and the step's
    attention TFLOP/s (forward 4*B*H*S*S*D/2 causal, backward 2.5x that)."""
    print("\n== GPU kernels of one eager step per backend (torch.profiler; us, the step's attention kernels only)")
    found = backends(torch)
    for shape in SHAPES:
        b, s, h, d = shape
        flops = 4 * b * h * s * s * d / 2 * 3.5
        (q, k, v), dout = layer_inputs(torch, shape, 1)
        for name, attend in found.items():
            def step():
                return torch.autograd.grad(attend(q, k, v), (q, k, v), dout)
            try:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        step()
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print("  %s failed: %s" % (name, e))
                continue
            per_kernel = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / 5
            total = sum(per_kernel.values())
            print("B%d S%d H%d D%d  %-18s total %7.1f us  (%.0f TFLOP/s fwd+bwd)" % (shape + (name, total,
                                                                                     flops / total / 1e6)))
            for kernel, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:5]:
                print("      %8.1f  %s" % (us, kernel[:110]))


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------

def make_model(torch, layers, attend):
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(D_MODEL), RMSNorm(D_MODEL)
            self.qkv = nn.Linear(D_MODEL, (HEADS_Q + 2 * HEADS_KV) * HEAD_DIM, bias=False)
            self.proj = nn.Linear(HEADS_Q * HEAD_DIM, D_MODEL, bias=False)
            self.up = nn.Linear(D_MODEL, 2 * MLP_HIDDEN, bias=False)
            self.down = nn.Linear(MLP_HIDDEN, D_MODEL, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.qkv(self.norm1(x))
            q, k, v = qkv.split([HEADS_Q * HEAD_DIM, HEADS_KV * HEAD_DIM, HEADS_KV * HEAD_DIM], dim=-1)
            y = attend(q.view(b, s, HEADS_Q, HEAD_DIM), k.view(b, s, HEADS_KV, HEAD_DIM),
                       v.view(b, s, HEADS_KV, HEAD_DIM))
            x = x + self.proj(y.reshape(b, s, HEADS_Q * HEAD_DIM))
            gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
            return x + self.down(torch.nn.functional.silu(gate) * up)

    return nn.ModuleList([Block() for _ in range(layers)]).cuda().to(torch.bfloat16)


def run_model(torch, args):
    seqlens = [int(s) for s in args.seqlens.split(",")]
    print("\n== %d-layer decoder (d_model %d, %d q heads x %d over %d KV heads, SwiGLU %d), bf16, causal: a training "
          "step (forward, loss, backward) of %d tokens; tokens/s (ms/step), median of %d runs of %d steps"
          % (args.layers, D_MODEL, HEADS_Q, HEAD_DIM, HEADS_KV, MLP_HIDDEN, args.tokens, args.repeats,
             args.model_steps))
    found = backends(torch)
    names = list(found)
    modes = [m for m in args.model_modes.split(",") if m]
    print("%-16s" % "mode, S" + "".join("%24s" % n for n in names) + "%16s" % "fc/best peer")
    for mode in modes:
        for seqlen in seqlens:
            batch = max(args.tokens // seqlen, 1)
            results = {}
            for name in names:
                # Each backend and length compiles afresh (not past Dynamo's recompile limit, which would run
                # the rest eagerly).
                torch._dynamo.reset()
                torch.manual_seed(0)
                blocks = make_model(torch, args.layers, found[name])
                run_block = [torch.compile(b) for b in blocks] if mode == "compiled" else list(blocks)
                x = torch.randn(batch, seqlen, D_MODEL, device="cuda", dtype=torch.bfloat16, requires_grad=True)

                def step():
                    h = x
                    for block in run_block:
                        h = block(h)
                    h.float().square().mean().backward()
                try:
                    us = wall_per_step_us(torch, step, args.model_steps, args.repeats)
                    results[name] = us
                except Exception as e:  # noqa: BLE001
                    print("  %s (%s, S=%d) failed: %s: %s" % (name, mode, seqlen, type(e).__name__,
                                                              str(e).split("\n")[0][:160]))
                del blocks, run_block
                torch.cuda.empty_cache()
            tokens = batch * seqlen
            peers = [us for n, us in results.items() if n != "flashcore"]
            ratio = min(peers) / results["flashcore"] if peers and "flashcore" in results else float("nan")
            print("%-16s" % ("%s, %d" % (mode, seqlen)) + "".join(
                "%24s" % ("%.0fk (%.2f)" % (tokens / results[n] * 1e3, results[n] / 1e3) if n in results else "-")
                for n in names)
                + "%16s" % ("%.3fx" % ratio))


# ---------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------

def run_jax(args):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import flashcore.jax as fcj
    print("\n== the same step under jax.jit: jax.grad of sum(attention(q, k, v) * dout) w.r.t. q, k, v; us per step "
          "(wall: %d steps, one block_until_ready; median of %d)" % (args.steps, args.repeats))

    def make(attend):
        def loss(q, k, v, dout):
            return jnp.sum(attend(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    steps = {"flashcore.jax": make(lambda q, k, v: fcj.attention(q, k, v, causal=True, layout="bshd")),
             "jax cuDNN": make(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                           implementation="cudnn"))}
    print("%-22s" % "shape" + "".join("%18s" % n for n in steps) + "%16s" % "fc/cuDNN")
    for shape in SHAPES:
        key = jax.random.PRNGKey(0)
        q, k, v, dout = (jax.random.normal(jax.random.fold_in(key, i), shape, dtype=jnp.bfloat16) for i in range(4))
        walls = {}
        for name, fn in steps.items():
            try:
                for _ in range(3):
                    jax.block_until_ready(fn(q, k, v, dout))
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        out = fn(q, k, v, dout)
                    jax.block_until_ready(out)
                    times.append((time.perf_counter() - start) / args.steps * 1e6)
                walls[name] = statistics.median(times)
            except Exception as e:  # noqa: BLE001
                print("  %s failed at %s: %s: %s" % (name, shape, type(e).__name__, str(e).split("\n")[0][:160]))
        ratio = walls.get("jax cuDNN", math.nan) / walls.get("flashcore.jax", math.nan)
        print("%-22s" % ("B%d S%d H%d D%d" % shape) + "".join("%18s" % ("%.0f" % walls[n] if n in walls else "-")
                                                              for n in steps) + "%16s" % ("%.2fx" % ratio))


def run_stub(args):
    """python_overhead.py --mode stub in a process of its own (it stands
    stubs in for the library's calls and a fake handle for the GPU's)."""
    import subprocess
    print("\n== host time of the binding (stub C calls, no GPU work): python_overhead.py --mode stub --causal",
          flush=True)
    subprocess.run([sys.executable, os.path.join(HERE, "python_overhead.py"), "--mode", "stub", "--causal",
                    "--calls", str(args.stub_calls), "--repeats", str(args.repeats)], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="shapes,model")
    p.add_argument("--steps", type=int, default=100, help="steps per timed run (shapes, jax)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per model step")
    p.add_argument("--seqlens", default="1024,2048,4096")
    p.add_argument("--model-modes", default="eager,compiled")
    p.add_argument("--model-steps", type=int, default=10)
    p.add_argument("--stub-calls", type=int, default=3000)
    args = p.parse_args()
    modes = args.mode.split(",")
    print("flashcore %s at %s; libflashcore %s" % (flashcore.__version__, os.path.dirname(flashcore.__file__),
                                                   flashcore.library().path))
    if "shapes" in modes or "model" in modes or "kernels" in modes:
        import torch
        print("torch %s on %s" % (torch.__version__, torch.cuda.get_device_name()))
        if "shapes" in modes:
            run_shapes(torch, args)
        if "model" in modes:
            run_model(torch, args)
        if "kernels" in modes:
            run_kernels(torch, args)
    if "jax" in modes:
        run_jax(args)
    if "stub" in modes:
        run_stub(args)


if __name__ == "__main__":
    main()
