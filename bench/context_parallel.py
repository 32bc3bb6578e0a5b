#!/usr/bin/env python3
"""Context parallelism across the GPUs of one host (flashcore.distributed):
correctness against a single-GPU call, and scaling. Run with torchrun:

  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 bench/context_parallel.py --check
  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=4 bench/context_parallel.py --bench --seqlen 131072
  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 bench/context_parallel.py --train

--check: every rank builds the same full-sequence q, k, v (one seed), runs
ring_attention and all_gather_attention on its shard, and compares with its
rows of one flashcore.attention call over the whole sequence on its own GPU
(max abs difference, relative L2), causal and not, GQA, an odd chunk length.
--bench: the 128k causal prefill of the issue (bf16, Hq 32 / Hkv 8, d128 by
default): the single-GPU call's time on rank 0, the ring's time (the slowest
rank, median of --repeats) for each --sm-margins value (0: transfers after
each step's attention; more: beside it), the speedup, the ring's forward
and backward together against one GPU's, and rank 0's per-step timeline
(attention time, and how long the step then waited for the next K/V slice)
at each margin.
--train: one training step (forward, backward, gradient all-reduce, AdamW)
of a small decoder (--layers layers of RMSNorm, attention with rotary
positions, SwiGLU MLP; a tied vocabulary of --vocab) on one sequence of
--train-seqlen tokens: on one GPU with flashcore.attention, and over the
ranks with sequence parallelism, each rank holding its zig-zag shard of the
tokens (their global positions for the rotary) and attending through
ring_attention; the weights' gradients are summed over the ranks. Both
start from the same weights: the losses of the first step must agree.
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
    margins = [int(m) for m in args.sm_margins.split(",")]
    results = []
    for margin in margins:
        ring_call = lambda: fd.ring_attention(ql, kl, vl, causal=True, sm_margin=margin)
        for _ in range(2):
            ring_call()
        results.append(statistics.median(timed(ring_call, args.repeats)))
    gathered = timed(lambda: fd.all_gather_attention(ql, kl, vl, causal=True), args.repeats)
    slowest = torch.tensor(results + [statistics.median(gathered)], device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    timelines = []
    for margin in margins:
        for _ in range(2):  # the second run's timeline
            timeline = []
            dist.barrier()
            fd._ring(ql, kl, vl, None, True, None, "bhsd", False, timeline, margin)
            torch.cuda.synchronize()
        timelines.append(timeline)
    train_ms = training_pass_ms(rank, world, args) if args.backward else None
    if rank == 0:
        print("GPU: %s x %d; causal prefill B1 S%d Hq%d/Hkv%d d%d bf16 (%.1f TFLOP)" % (
            torch.cuda.get_device_name(), world, s, args.heads, args.heads_kv, args.head_dim, flops / 1e12))
        print("single GPU: %.2f ms, %.0f TFLOP/s" % (single_ms, flops / single_ms / 1e9))
        rows = [("ring, sm_margin %d" % m, ms) for m, ms in zip(margins, slowest[:-1].tolist())]
        for name, ms in rows + [("all-gather", slowest[-1].item())]:
            print("%-20s x%d: %.2f ms (slowest rank, median of %d), %.0f TFLOP/s, speedup %.2fx" % (
                name, world, ms, args.repeats, flops / ms / 1e9, single_ms / ms))
        for margin, timeline in zip(margins, timelines):
            print("rank 0's ring steps at sm_margin %d: attention ms / then waited for the next K/V ms" % margin)
            for i, (a, b, c) in enumerate(timeline):
                print("  step %d: %.3f / %.3f" % (i, a.elapsed_time(b), b.elapsed_time(c)))
    if train_ms is not None and rank == 0:
        single, ring = train_ms
        print("forward + backward (the ring's default sm_margin %d): single GPU %.2f ms, ring x%d %.2f ms, "
              "speedup %.2fx" % (fd.RING_SM_MARGIN, single, world, ring, single / ring))


def training_pass_ms(rank, world, args):
    """(one GPU's, the ring's) forward + backward of the --bench call, in ms
    (slowest rank, median of --repeats); rank 0 times the single GPU."""
    s = args.seqlen
    q, k, v = full_inputs(1, args.heads, args.heads_kv, s, args.head_dim, torch.bfloat16, seed=5)
    dout = full_inputs(1, args.heads, args.heads, s, args.head_dim, torch.bfloat16, seed=6)[0]
    single_ms = 0.0
    if rank == 0:
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        step = lambda: flashcore.attention(qg, kg, vg, causal=True).backward(dout)
        step()
        single_ms = statistics.median(timed(step, args.repeats, together=False))
        del qg, kg, vg
    mine = lambda t: fd.shard(t, rank, world, causal=True)
    ql, kl, vl = (mine(t).requires_grad_() for t in (q, k, v))
    dl = mine(dout)
    del q, k, v, dout
    step = lambda: fd.ring_attention(ql, kl, vl, causal=True).backward(dl)
    step()
    ring = torch.tensor([statistics.median(timed(step, args.repeats))], device="cuda")
    dist.all_reduce(ring, op=dist.ReduceOp.MAX)
    return single_ms, ring.item()


# ---------------------------------------------------------------------------
# --train: a small decoder's training step, on one GPU and over the ranks
# ---------------------------------------------------------------------------

class Decoder(torch.nn.Module):
    """A small decoder: embedding, `layers` blocks (RMSNorm, GQA attention
    with rotary positions, RMSNorm, SwiGLU MLP), a final RMSNorm and the
    tied vocabulary projection. attend(q, k, v) ([B, S, H, D]) is the
    attention: flashcore.attention over the whole sequence, or
    ring_attention over this rank's shard."""

    def __init__(self, vocab, dim, heads, heads_kv, head_dim, hidden, layers):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, head_dim
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.Module()
            block.norm1 = torch.nn.RMSNorm(dim)
            block.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * head_dim, bias=False)
            block.proj = torch.nn.Linear(heads * head_dim, dim, bias=False)
            block.norm2 = torch.nn.RMSNorm(dim)
            block.up = torch.nn.Linear(dim, 2 * hidden, bias=False)
            block.down = torch.nn.Linear(hidden, dim, bias=False)
            self.blocks.append(block)
        self.norm = torch.nn.RMSNorm(dim)

    def rotation(self, positions):
        """The rotary embedding's (cos, sin) of the tokens' global positions,
        [1, S, 1, head_dim / 2]: once a step, for every layer's q and k."""
        half = self.head_dim // 2
        freqs = 10000.0 ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
        angles = positions.float()[:, None] * freqs[None, :]  # [S, half]
        return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]

    @staticmethod
    def rotary(x, rotation):
        cos, sin = rotation
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

    def forward(self, tokens, positions, attend):
        x = self.embed(tokens)
        b, s, _ = x.shape
        rotation = self.rotation(positions)
        for block in self.blocks:
            h = block.norm1(x)
            q, k, v = block.qkv(h).split([self.heads * self.head_dim, self.heads_kv * self.head_dim,
                                          self.heads_kv * self.head_dim], dim=-1)
            q = self.rotary(q.view(b, s, self.heads, self.head_dim), rotation)
            k = self.rotary(k.view(b, s, self.heads_kv, self.head_dim), rotation)
            v = v.view(b, s, self.heads_kv, self.head_dim)
            x = x + block.proj(attend(q, k, v).reshape(b, s, -1))
            gate, up = block.up(block.norm2(x)).chunk(2, dim=-1)
            x = x + block.down(torch.nn.functional.silu(gate) * up)
        return self.norm(x) @ self.embed.weight.t()


def train(rank, world, args):
    s = args.train_seqlen
    torch.manual_seed(11)  # every rank makes the same weights and tokens
    make = lambda: Decoder(args.vocab, args.model_dim, args.heads, args.heads_kv, args.head_dim, args.hidden,
                           args.layers).cuda().to(torch.bfloat16)
    tokens = torch.randint(0, args.vocab, (1, s + 1), device="cuda")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(s, device="cuda")
    flops = args.layers * 3 * 4 * args.heads * s * s * args.head_dim / 2  # causal attention, fwd + bwd (2.5x)
    torch.manual_seed(12)
    model = make()
    state = {name: t.clone() for name, t in model.state_dict().items()}

    def step_on(model, optimizer, inputs, targets, positions, attend, tokens_total, reduce):
        logits = model(inputs, positions, attend)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1),
                                                 reduction="sum") / tokens_total
        loss.backward()
        if reduce:
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    single_ms, single_loss = None, None
    if rank == 0:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        attend = lambda q, k, v: flashcore.attention(q, k, v, causal=True, layout="bshd")
        run = lambda: step_on(model, optimizer, inputs, targets, positions, attend, s, False)
        single_loss = run().item()
        run()
        single_ms = statistics.median(timed(run, args.repeats, together=False))
        del optimizer
    # The same weights over the ranks, each with its shard of the tokens.
    model.load_state_dict(state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mine = lambda t: fd.shard(t.view(1, -1, 1, 1), rank, world, causal=True, layout="bshd").view(1, -1)
    local_inputs, local_targets = mine(inputs), mine(targets)
    local_positions = mine(positions.view(1, -1)).view(-1)
    attend = lambda q, k, v: fd.ring_attention(q, k, v, causal=True, layout="bshd", sm_margin=args.sm_margin)
    run = lambda: step_on(model, optimizer, local_inputs, local_targets, local_positions, attend, s, True)
    first = run()
    dist.all_reduce(first)
    run()
    ring = torch.tensor([statistics.median(timed(run, args.repeats))], device="cuda")
    dist.all_reduce(ring, op=dist.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("GPU: %s x %d; training step of a %d-layer decoder (%.0fM parameters, bf16, d_model %d, Hq%d/Hkv%d "
              "d%d, MLP %d, vocab %d) on %d tokens, causal" % (
                  torch.cuda.get_device_name(), world, args.layers, params / 1e6, args.model_dim, args.heads,
                  args.heads_kv, args.head_dim, args.hidden, args.vocab, s))
        print("first step's loss: single GPU %.6f, ring %.6f" % (single_loss, first.item()))
        print("single GPU: %.2f ms (attention %.1f TFLOP of it)" % (single_ms, flops / 1e12))
        print("ring x%d (sm_margin %d): %.2f ms (slowest rank, median of %d), speedup %.2fx" % (
            world, args.sm_margin, ring.item(), args.repeats, single_ms / ring.item()))
    return abs(single_loss - first.item()) > 2e-2 * abs(single_loss) if rank == 0 else False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sm-margins", default="0,%d" % fd.RING_SM_MARGIN,
                   help="--bench: the ring's sm_margin values to time (comma-separated)")
    p.add_argument("--backward", action="store_true", help="--bench: forward + backward too")
    p.add_argument("--train", action="store_true")
    p.add_argument("--train-seqlen", type=int, default=65536)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--model-dim", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--sm-margin", type=int, default=fd.RING_SM_MARGIN, help="--train: the ring's sm_margin")
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
    if args.train:
        failures += int(train(rank, world, args))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and args.check:
        print("check: %s" % ("all ok" if failures == 0 else "%d failures" % failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
