#!/usr/bin/env python3
"""A gpt-oss-shaped model whose attention is flashcore's, with learnable
attention sinks, trained for a few AdamW steps beside the same model in
eager float32 PyTorch; the outputs, the losses and the sinks' gradients
must agree within bf16 tolerances.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/gpt_oss_block.py [--no-rope]

(or pip install bindings/python and put libflashcore where the dynamic
loader finds it). Needs a CUDA GPU (sm_80 or newer) and torch; runs in
seconds. Exit status 1 on a mismatch, or without a GPU.

The attention is gpt-oss's (transformers' GptOssAttention) at a small
scale: RMSNorm, q, k and v projections (with biases) to 8 query heads
and 2 key/value heads of 64 (grouped-query attention), rotary embeddings
(--no-rope leaves them out), one learnable sink logit per query head (an
nn.Parameter, in the units of the scaled scores), causal attention over
a sliding window of 128 keys on even layers (each query sees itself and
the 127 keys before it: flashcore's window=(127, 0)) and over every
earlier key on odd ones, the output projection and a residual. The
model: an embedding, two such layers, RMSNorm and a linear head (no MLP:
the point is the attention). The task repeats a random run of 64 tokens
four times, so that predicting the repeats needs attention 64 keys back.

Two copies from the same weights see the same batches: flashcore's under
bf16 autocast with fp32 weights (flashcore.attention with sinks=), and
the reference in float32 without autocast, whose attention is gpt-oss's
reference implementation (reference_attention): the sink logit
concatenated to each row's scores as one more column, the softmax taken,
that column dropped. The sinks get their gradients from flashcore's
backward pass (flashcore_backward's dsinks) in the one, from autograd
through the concatenation in the other.
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import flashcore

VOCAB, WIDTH, LAYERS = 256, 256, 2
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 64
# gpt-oss's sliding_window: the keys a query of a sliding layer sees, itself included.
SLIDING_WINDOW = 128
ROPE_THETA = 10000.0
# The task: a random run of PERIOD tokens, repeated to fill the sequence.
PERIOD = 64

# What bf16 autocast may change against float32. bf16 keeps 8 significant
# bits (a rounding is up to 2**-9 = 0.2% relative); the model rounds each
# projection's output, the attention's inputs and output, and the logits.
# Each bar is a few times what that gives, and far below what a sink left
# out, or counted with the wrong sign or units, does (the sink logits are
# drawn around ln 64: they carry a good share of each row's weight).
OUTPUT_TOLERANCE = 2e-2  # relative (L2) difference of the first step's logits
LOSS_TOLERANCE = 1e-2  # absolute difference of each step's loss, in nats (the loss is about ln(256) = 5.5)
SINK_GRAD_TOLERANCE = 5e-2  # relative (L2) difference of each layer's sink gradients, every step


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="AdamW steps")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256, help="tokens per sequence (more than the window)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-rope", dest="rope", action="store_false", help="leave out the rotary embeddings")
    return parser.parse_args(argv)


def reference_attention(q, k, v, sinks, window_left):
    """gpt-oss's reference attention (its sdpa, as transformers' eager
    GptOss attention computes it): q [B, S, Hq, D], k and v [B, S, Hkv, D],
    sinks [Hq], causal, each query seeing only the window_left keys before
    it (and itself) where window_left is not None. Each row's scaled
    scores get the head's sink logit as one more column; the softmax is
    taken over them all and that column dropped, so the sink takes its
    share of the weight and attends to nothing. In q's dtype."""
    batch, seqlen, heads_q, head_dim = q.shape
    group = heads_q // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    i = torch.arange(seqlen, device=q.device)[:, None]
    j = torch.arange(seqlen, device=q.device)[None, :]
    hidden = j > i
    if window_left is not None:
        hidden = hidden | (j < i - window_left)
    scores = scores.masked_fill(hidden, float("-inf"))
    sink_column = sinks.to(scores.dtype).view(1, heads_q, 1, 1).expand(batch, heads_q, seqlen, 1)
    weights = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)


def flashcore_attention(q, k, v, sinks, window_left):
    """The same through flashcore: [B, S, H, D] in and out (layout "bshd"),
    the sinks a float32 [Hq] parameter whose gradient flashcore's backward
    pass computes."""
    window = None if window_left is None else (window_left, 0)
    return flashcore.attention(q, k, v, layout="bshd", causal=True, window=window, sinks=sinks)


def rms_norm(x, weight, eps=1e-5):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def rope_tables(seqlen, device):
    """cos and sin [S, 1, D/2] of the rotary angles (position * frequency)."""
    frequencies = ROPE_THETA ** (-torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM)
    angles = torch.arange(seqlen, device=device, dtype=torch.float32)[:, None] * frequencies[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rotate(x, cos, sin):
    """Rotary embeddings of x [B, S, H, D] (its two halves as the pairs, as
    transformers' rotate_half), computed in float32, in x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(torch.nn.Module):
    def __init__(self, layer, attend):
        super().__init__()
        self.attend = attend
        # Even layers slide (gpt-oss's layer_types alternate, sliding first).
        self.window_left = SLIDING_WINDOW - 1 if layer % 2 == 0 else None
        self.norm = torch.nn.Parameter(torch.ones(WIDTH))
        self.q = torch.nn.Linear(WIDTH, HEADS_Q * HEAD_DIM)
        self.k = torch.nn.Linear(WIDTH, HEADS_KV * HEAD_DIM)
        self.v = torch.nn.Linear(WIDTH, HEADS_KV * HEAD_DIM)
        self.o = torch.nn.Linear(HEADS_Q * HEAD_DIM, WIDTH)
        # Drawn around ln 64, so that each sink takes a good share of its
        # rows' weight (scores of about N(0, 1) over 128 keys sum to about
        # 200 in exp): an error in them shows in the outputs too.
        self.sinks = torch.nn.Parameter(torch.randn(HEADS_Q) + math.log(PERIOD))

    def forward(self, x, rope):
        batch, seqlen, _ = x.shape
        h = rms_norm(x, self.norm)
        q = self.q(h).view(batch, seqlen, HEADS_Q, HEAD_DIM)
        k = self.k(h).view(batch, seqlen, HEADS_KV, HEAD_DIM)
        v = self.v(h).view(batch, seqlen, HEADS_KV, HEAD_DIM)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        a = self.attend(q, k, v, self.sinks, self.window_left)
        return x + self.o(a.reshape(batch, seqlen, HEADS_Q * HEAD_DIM))


class Model(torch.nn.Module):
    def __init__(self, attend, use_rope):
        super().__init__()
        self.use_rope = use_rope
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList(Attention(i, attend) for i in range(LAYERS))
        self.norm = torch.nn.Parameter(torch.ones(WIDTH))
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        rope = rope_tables(tokens.shape[1], tokens.device) if self.use_rope else None
        for layer in self.layers:
            x = layer(x, rope)
        return self.head(rms_norm(x, self.norm))


def batches(args, device):
    """[steps, batch, seqlen + 1] tokens: each sequence a random run of
    PERIOD tokens repeated, from the seed."""
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    runs = torch.randint(VOCAB, (args.steps, args.batch, PERIOD), generator=g)
    repeats = -(-(args.seqlen + 1) // PERIOD)
    return runs.repeat(1, 1, repeats)[..., :args.seqlen + 1].to(device)


def train(args, data, attend, autocast):
    """One run from the seed's weights: (losses, each step's sink gradients
    per layer, the first step's logits in float32)."""
    torch.manual_seed(args.seed)
    model = Model(attend, args.rope).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, sink_grads, first_logits = [], [], None
    for tokens in data:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sink_grads.append([layer.sinks.grad.detach().clone() for layer in model.layers])
        if first_logits is None:
            first_logits = logits.detach().float()
        optimizer.step()
        losses.append(loss.item())
    return losses, sink_grads, first_logits


def relative(a, b):
    """The relative (L2) difference of a from b."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        # (Before anything touches CUDA, whose own message is torch's "CUDA driver version is insufficient".)
        raise SystemExit("needs a CUDA GPU")
    if torch.cuda.get_device_capability()[0] < 8:
        raise SystemExit("needs an sm_80 or newer GPU (flashcore's oldest)")
    if args.seqlen <= SLIDING_WINDOW:
        raise SystemExit("--seqlen must exceed the sliding window (%d) for the window to matter" % SLIDING_WINDOW)
    print("flashcore %s (library %s), torch %s, %s" % (flashcore.__version__, flashcore.library_version(),
                                                      torch.__version__, torch.cuda.get_device_name()))
    print("%d layers: %d query / %d key-value heads of %d, sinks per query head, sliding window %d on even layers, "
          "%s; batch %d of %d tokens, %d AdamW steps (lr %g)"
          % (LAYERS, HEADS_Q, HEADS_KV, HEAD_DIM, SLIDING_WINDOW, "RoPE" if args.rope else "no RoPE", args.batch,
             args.seqlen, args.steps, args.lr))
    data = batches(args, "cuda")
    ours = train(args, data, flashcore_attention, autocast=True)
    theirs = train(args, data, reference_attention, autocast=False)

    output_error = relative(ours[2], theirs[2])
    print("\nfirst step's logits: relative difference %.2e (tolerance %.0e)" % (output_error, OUTPUT_TOLERANCE))
    layer_names = ["L%d %s" % (i, "sliding" if i % 2 == 0 else "full") for i in range(LAYERS)]
    print("\n%4s  %14s  %14s  %9s  %s" % ("step", "loss flashcore", "loss reference", "|d loss|",
                                          "  ".join("dsinks %s" % n for n in layer_names)))
    ok = math.isfinite(output_error) and output_error <= OUTPUT_TOLERANCE
    for step in range(args.steps):
        loss_ours, loss_theirs = ours[0][step], theirs[0][step]
        loss_error = abs(loss_ours - loss_theirs)
        grad_errors = [relative(a, b) for a, b in zip(ours[1][step], theirs[1][step])]
        ok = ok and loss_error <= LOSS_TOLERANCE and all(e <= SINK_GRAD_TOLERANCE for e in grad_errors)
        print("%4d  %14.5f  %14.5f  %9.2e  %s" % (step, loss_ours, loss_theirs, loss_error,
                                                  "  ".join("%*.2e" % (len("dsinks " + n), e)
                                                            for n, e in zip(layer_names, grad_errors))))
    print("(tolerances: |d loss| %.0e, dsinks relative difference %.0e)" % (LOSS_TOLERANCE, SINK_GRAD_TOLERANCE))
    norms = ["%.3g" % g.norm().item() for g in theirs[1][0]]
    print("the reference's first sink gradients have norms %s (per layer)" % ", ".join(norms))
    print("PASS: flashcore's block with sinks trains as the float32 reference does" if ok
          else "FAIL: flashcore's block differs from the float32 reference beyond bf16's tolerances")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
