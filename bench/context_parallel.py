#!/usr/bin/env python3
"""Context parallelism across the GPUs of one host (flashcore.distributed):
correctness against a single-GPU call, and scaling. Run with torchrun:

  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 bench/context_parallel.py --check
  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=4 bench/context_parallel.py --bench --seqlen 131072

--check: every rank builds the same full-sequence q, k, v (one seed), runs
ring_attention and all_gather_attention on its shard, and compares with its
rows of one flashcore.attention call over the whole sequence on its own GPU
(max abs difference, relative L2), causal and not, GQA, an odd chunk length.
--bench: the 128k causal prefill of the issue (bf16, Hq 32 / Hkv 8, d128 by
default): the single-GPU call's time on rank 0, the ring's time (the slowest
rank, median of --repeats), the speedup, and rank 0's per-step timeline
(attention time, and how long the step then waited for the next K/V slice).
Prints on rank 0 only."""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import flashcore  # noqa: E402
from flashcore import distributed as fd  # noqa: E402


def full_inputs(b, hq, hkv, s, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn((b, h, s, d), device="cuda", dtype=dtype, generator=g)
    return mk(hq), mk(hkv), mk(hkv)


def check(rank, world):
    failures = 0
    for causal in (False, True):
        for (b, hq, hkv, chunk, d) in ((1, 8, 2, 384, 128), (2, 4, 4, 75, 64)):
            s = 2 * world * chunk
            q, k, v = full_inputs(b, hq, hkv, s, d, torch.bfloat16, seed=1234 + s)
            single, single_lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
            mine = lambda t: fd.shard(t, rank, world, causal=causal)
            for name, fn in (("ring", fd.ring_attention), ("all_gather", fd.all_gather_attention)):
                out, lse = fn(mine(q), mine(k), mine(v), causal=causal, return_lse=True)
                ref = mine(single)
                ref_lse = fd.shard(single_lse.unsqueeze(-1), rank, world, causal=causal).squeeze(-1)
                diff = (out.float() - ref.float()).abs().max().item()
                rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
                lse_diff = (lse - ref_lse).abs().max().item()
                ok = rel < 1e-2 and lse_diff < 1e-3
                failures += not ok
                stats = torch.tensor([diff, rel, lse_diff, float(not ok)], device="cuda")
                dist.all_reduce(stats, op=dist.ReduceOp.MAX)
                if rank == 0:
                    print("%-10s causal=%-5s b%d hq%d hkv%d s%d d%d: max|diff| %.3g, rel-L2 %.3g, lse %.3g  %s" % (
                        name, causal, b, hq, hkv, s, d, stats[0], stats[1], stats[2],
                        "FAIL" if stats[3] else "ok"))
    # Gradients: ring_attention's backward against one call's, on the
    # rank's rows (dq) and on its slice of keys (dk, dv).
    for causal in (False, True):
        b, hq, hkv, chunk, d = 1, 8, 2, 384, 128
        s = 2 * world * chunk
        q, k, v = full_inputs(b, hq, hkv, s, d, torch.bfloat16, seed=99 + s)
        dout = full_inputs(b, hq, hq, s, d, torch.bfloat16, seed=7 + s)[0]
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        flashcore.attention(qg, kg, vg, causal=causal).backward(dout)
        mine = lambda t: fd.shard(t.detach(), rank, world, causal=causal)
        ql, kl, vl = (mine(t).requires_grad_() for t in (q, k, v))
        fd.ring_attention(ql, kl, vl, causal=causal).backward(mine(dout))
        rels = [((a.grad.double() - mine(ref.grad).double()).norm() / mine(ref.grad).double().norm()).item()
                for a, ref in ((ql, qg), (kl, kg), (vl, vg))]
        ok = max(rels) < 2e-2
        failures += not ok
        stats = torch.tensor(rels + [float(not ok)], device="cuda")
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            print("ring backward causal=%-5s b%d hq%d hkv%d s%d d%d: rel-L2 dq %.3g, dk %.3g, dv %.3g  %s" % (
                causal, b, hq, hkv, s, d, stats[0], stats[1], stats[2], "FAIL" if stats[3] else "ok"))
    total = torch.tensor([float(failures)], device="cuda")
    dist.all_reduce(total)
    return int(total.item())


def timed(fn, repeats, together=True):
    """Each of `repeats` calls' ms; together: every rank starts each call at
    once (a barrier first)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if together:
            dist.barrier()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def bench(rank, world, args):
    s = args.seqlen
    q, k, v = full_inputs(1, args.heads, args.heads_kv, s, args.head_dim, torch.bfloat16, seed=5)
    flops = 4 * args.heads * s * s * args.head_dim / 2  # causal
    single_ms = None
    if rank == 0:
        for _ in range(2):
            flashcore.attention(q, k, v, causal=True)
        single_ms = statistics.median(timed(lambda: flashcore.attention(q, k, v, causal=True), args.repeats,
                                            together=False))
    mine = lambda t: fd.shard(t, rank, world, causal=True)
    ql, kl, vl = mine(q), mine(k), mine(v)
    del q, k, v
    for _ in range(2):
        fd.ring_attention(ql, kl, vl, causal=True)
    ring = timed(lambda: fd.ring_attention(ql, kl, vl, causal=True), args.repeats)
    gathered = timed(lambda: fd.all_gather_attention(ql, kl, vl, causal=True), args.repeats)
    slowest = torch.tensor([statistics.median(ring), statistics.median(gathered)], device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    for _ in range(2):  # the second run's timeline
        timeline = []
        dist.barrier()
        fd._ring(ql, kl, vl, None, True, None, "bhsd", False, timeline)
        torch.cuda.synchronize()
    if rank == 0:
        print("GPU: %s x %d; causal prefill B1 S%d Hq%d/Hkv%d d%d bf16 (%.1f TFLOP)" % (
            torch.cuda.get_device_name(), world, s, args.heads, args.heads_kv, args.head_dim, flops / 1e12))
        print("single GPU: %.2f ms, %.0f TFLOP/s" % (single_ms, flops / single_ms / 1e9))
        for name, ms in (("ring", slowest[0].item()), ("all-gather", slowest[1].item())):
            print("%-10s x%d: %.2f ms (slowest rank, median of %d), %.0f TFLOP/s, speedup %.2fx" % (
                name, world, ms, args.repeats, flops / ms / 1e9, single_ms / ms))
        print("rank 0's ring steps: attention ms / then waited for the next K/V ms")
        for i, (a, b, c) in enumerate(timeline):
            print("  step %d: %.3f / %.3f" % (i, a.elapsed_time(b), b.elapsed_time(c)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = 0
    if args.check:
        failures = check(rank, world)
    if args.bench:
        bench(rank, world, args)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and args.check:
        print("check: %s" % ("all ok" if failures == 0 else "%d failures" % failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
