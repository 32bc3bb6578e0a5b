#!/usr/bin/env python3
"""Trains a small decoder with flashcore's attention and with PyTorch's
SDPA from the same seed, and checks that the loss curves agree within the
spread of SDPA itself.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/train_tiny_transformer.py [--compile]

(or pip install bindings/python and put libflashcore where the dynamic
loader finds it). Needs a CUDA GPU (sm_80 or newer) and torch.

The task: next-token prediction on sequences drawn from a random
second-order Markov chain (each pair of tokens is followed by one of a few
tokens, with random probabilities), which the model learns by attending to
the two previous positions; its loss falls smoothly from ln(vocab) toward
the chain's entropy. Every run starts from the same weights and sees the
same batches in the same order, under bf16 autocast with fp32 weights.

What "the spread of SDPA itself" is here: the same training run with
PyTorch's SDPA on two of its own backends (flash, FlashAttention 2, the
reference; and the memory-efficient one, else cuDNN, else math), which
compute the same attention with other tilings and roundings, and the flash
run repeated (its backward adds dQ with atomics, so a rerun may round
differently). Each curve is the mean loss over windows of --window steps;
the spread is the largest difference between those SDPA curves. The run
fails (exit status 1) when flashcore's curve differs from the flash one by
more than MARGIN times that spread plus ABSOLUTE_SLACK: a clear margin
over what changing the kernel's rounding alone does to training.
With --compile every run is torch.compile(fullgraph=True)'d, forward and
backward, and the graph breaks are counted (any fails the run).
"""

import argparse
import contextlib
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore

# flashcore's curve may differ from SDPA-flash's by this many times the
# SDPA spread ...
MARGIN = 2.0
# ... plus this much loss (nats), so that curves that agree to within noise
# pass even where SDPA's backends happen to agree more closely still.
ABSOLUTE_SLACK = 0.01
# Candidate next tokens per context of the Markov chain (their
# probabilities uniform on the simplex).
CHOICES_PER_CONTEXT = 4
# SDPA backends that may stand beside flash as the spread's second run, in
# order of preference (all compute in the inputs' precision or better).
SECOND_BACKENDS = (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--window", type=int, default=10, help="steps per point of the compared curves")
    parser.add_argument("--print-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) every run")
    return parser.parse_args()


def markov_batches(args, device):
    """[steps, batch, seqlen + 1] int64 token sequences from a random
    second-order Markov chain, drawn once from the seed: every run sees the
    same batches in the same order."""
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    vocab, contexts = args.vocab, args.vocab * args.vocab
    nexts = torch.randint(vocab, (contexts, CHOICES_PER_CONTEXT), generator=g, device=device)
    # Normalised exponentials: uniform on the simplex (Dirichlet(1, ..., 1)), from the seeded generator.
    weights = -torch.log1p(-torch.rand(contexts, CHOICES_PER_CONTEXT, generator=g, device=device))
    weights /= weights.sum(-1, keepdim=True)
    count = args.steps * args.batch
    tokens = torch.empty(count, args.seqlen + 1, dtype=torch.int64, device=device)
    tokens[:, :2] = torch.randint(vocab, (count, 2), generator=g, device=device)
    for t in range(2, args.seqlen + 1):
        context = tokens[:, t - 2] * vocab + tokens[:, t - 1]
        pick = torch.multinomial(weights[context], 1, generator=g).squeeze(1)
        tokens[:, t] = nexts[context, pick]
    return tokens.view(args.steps, args.batch, args.seqlen + 1)


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)  # [B, S, H, Dh]
        x = x + self.proj(self.attention(q, k, v).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class Decoder(torch.nn.Module):
    def __init__(self, args, attention):
        super().__init__()
        self.embed = torch.nn.Embedding(args.vocab, args.d_model)
        self.position = torch.nn.Parameter(torch.randn(args.seqlen, args.d_model) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(args.d_model, args.heads, attention) for _ in range(args.layers))
        self.norm = torch.nn.LayerNorm(args.d_model)
        self.head = torch.nn.Linear(args.d_model, args.vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def flashcore_attention(q, k, v):
    """[B, S, H, Dh] in and out, causal: flashcore, differentiable."""
    return flashcore.attention(q, k, v, causal=True, layout="bshd")


def sdpa_attention(q, k, v):
    """The same through torch's SDPA (the backend chosen around the run)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def train(args, batches, attention, backend, name):
    """One run: the loss of every step (floats), from the seed's weights."""
    torch.manual_seed(args.seed)
    model = Decoder(args, attention).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(args.steps // 10, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))

    def loss_of(tokens):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))

    if args.compile:
        torch._dynamo.reset()
        loss_of = torch.compile(loss_of, fullgraph=True)
    losses = []
    start = time.perf_counter()
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        for step in range(args.steps):
            loss = loss_of(batches[step])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.detach())
    losses = torch.stack(losses).tolist()
    print("  %-22s %6.1f s, final loss %.4f" % (name, time.perf_counter() - start, losses[-1]))
    return losses


def windowed(losses, window):
    """The mean loss of each window of `window` steps."""
    return [sum(losses[i:i + window]) / len(losses[i:i + window]) for i in range(0, len(losses), window)]


def largest_difference(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def second_backend(args):
    """The first of SECOND_BACKENDS that runs this model's attention, forward
    and backward."""
    dh = args.d_model // args.heads
    q = torch.randn(1, args.heads, 64, dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for backend in SECOND_BACKENDS:
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            return backend
        except RuntimeError:
            continue
    raise SystemExit("no SDPA backend besides flash runs this model")


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    print("flashcore %s (library %s), torch %s, %s" % (flashcore.__version__, flashcore.library_version(),
                                                      torch.__version__, torch.cuda.get_device_name()))
    print("decoder: %d layers, d_model %d, %d heads of %d, seqlen %d, batch %d, %d steps, vocab %d%s"
          % (args.layers, args.d_model, args.heads, args.d_model // args.heads, args.seqlen, args.batch, args.steps,
             args.vocab, ", torch.compile(fullgraph=True)" if args.compile else ", eager"))
    batches = markov_batches(args, "cuda")
    other = second_backend(args)
    other_name = "sdpa %s" % other.name.lower()
    torch._dynamo.utils.counters.clear()
    runs = {}
    runs["flashcore"] = train(args, batches, flashcore_attention, None, "flashcore")
    runs["sdpa flash"] = train(args, batches, sdpa_attention, SDPBackend.FLASH_ATTENTION, "sdpa flash")
    runs[other_name] = train(args, batches, sdpa_attention, other, other_name)
    runs["sdpa flash rerun"] = train(args, batches, sdpa_attention, SDPBackend.FLASH_ATTENTION, "sdpa flash rerun")
    graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())

    names = list(runs)
    print("\nloss (each step's batch)\n  %5s " % "step" + " ".join("%18s" % n for n in names))
    for step in sorted(set(range(0, args.steps, args.print_every)) | {args.steps - 1}):
        print("  %5d " % step + " ".join("%18.4f" % runs[n][step] for n in names))

    curves = {n: windowed(losses, args.window) for n, losses in runs.items()}
    reference = curves["sdpa flash"]
    deviation = largest_difference(curves["flashcore"], reference)
    spread_backends = largest_difference(curves[other_name], reference)
    spread_rerun = largest_difference(curves["sdpa flash rerun"], reference)
    spread = max(spread_backends, spread_rerun)
    allowed = MARGIN * spread + ABSOLUTE_SLACK
    raw = max(abs(a - b) for a, b in zip(runs["flashcore"], runs["sdpa flash"]))
    print("\nlargest difference of the %d-step mean loss from sdpa flash's:" % args.window)
    print("  flashcore            %.4f   (of single steps: %.4f)" % (deviation, raw))
    print("  %-20s %.4f" % (other_name, spread_backends))
    print("  sdpa flash rerun     %.4f" % spread_rerun)
    print("  allowed              %.4f   (%.1f x SDPA's spread %.4f + %.2f)" % (allowed, MARGIN, spread,
                                                                                 ABSOLUTE_SLACK))
    ok = all(math.isfinite(x) for losses in runs.values() for x in losses) and deviation <= allowed
    if args.compile:
        print("graph breaks: %d" % graph_breaks)
        ok = ok and graph_breaks == 0
    print("PASS: flashcore trains as SDPA does" if ok else "FAIL: flashcore's loss curve is outside SDPA's spread")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
