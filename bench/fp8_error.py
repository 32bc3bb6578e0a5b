#!/usr/bin/env python3
"""fp8 (e4m3) prefill accuracy: flashcore's error beside FlashAttention 3's on the same inputs (issue 36).

For every case (shape x mask x descale granularity) it makes fresh random q, k
and v (torch.randn, float32, seeded per case), casts them to float8_e4m3fn with
descale factors amax / 448 (one per tensor, or one per (batch, K/V head): the
[B, Hkv] arrays of flashcore.h's q_descale/k_descale/v_descale, q's amax taken
over the query heads of each K/V head) and gives both kernels the same e4m3
tensors and factors ([B, S, H, D], layout="bshd" for flashcore):

  flashcore: flashcore.attention(q8, k8, v8, causal=, layout="bshd",
             q_descale=, k_descale=, v_descale=, return_lse=True)
             (per-tensor factors as one-element tensors, per-head ones as
             [B, Hkv]);
  fa3:       fa3_fwd_interface.flash_attn_func(q8, k8, v8, causal=,
             q_descale=, k_descale=, v_descale=, return_attn_probs=True)
             (the factors always as contiguous float32 [B, Hkv], the shape it
             checks).

Both are compared with a float64 reference computed on the dequantized inputs
(q8 * q_descale, ...; the default softmax scale 1/sqrt(D), causal aligned
bottom-right): rel L2 = ||out - ref||_2 / ||ref||_2 and max abs = max |out -
ref| over the whole output, and the ratio flashcore / FA3 of each. Issue 36's
bar: flashcore's error within 2x of FA3's, i.e. both ratios <= 2 (--bar). The
lse (natural log of the row sums, as both define it) is compared too, max abs
over the rows, for information only.

    python3 bench/fp8_error.py                 # the default cases (d64, d128, d256; causal and not)
    python3 bench/fp8_error.py --list          # the cases, no GPU needed
    python3 bench/fp8_error.py --descale tensor --mask causal --json fp8_error.json

flashcore comes from bindings/python as in compare.py (--library or
FLASHCORE_LIBRARY for libflashcore.so; build/src/libflashcore.so by default),
FA3 from the fa3-fwd wheel (see bench/README.md). Where one of the two cannot
be imported, the other's errors are still printed (the numbers a fixed bar can
be set from), then the exit status is 2.

Exit status: 0 every ratio within the bar; 1 a ratio above it, or flashcore
failing (or giving non-finite values) on a case FA3 ran; 2 no GPU, PyTorch,
flashcore package or FA3 wheel, or a bad command line.
"""

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import compare
from e4m3 import descale_for, quantize_e4m3

torch = compare.torch

# (B, Hq, Hkv, Sq, Sk, D): issue 36's head dims 64, 128 and 256, with GQA, a length that is no multiple of a tile
# and a chunk of queries against more keys (Sq < Sk: the causal mask bottom-right). Small enough for a float64
# reference (the largest score matrix, 1 x 16 x 2048 x 2048, is 512 MiB).
SHAPES = (
    (2, 8, 8, 512, 512, 64),
    (1, 8, 2, 1024, 1024, 64),
    (1, 8, 8, 300, 300, 64),
    (2, 8, 8, 1024, 1024, 128),
    (1, 16, 4, 2048, 2048, 128),
    (1, 8, 8, 256, 1024, 128),
    (2, 4, 4, 1024, 1024, 256),
    (1, 8, 2, 333, 333, 256),
)
GRANULARITIES = ("tensor", "head")
# Where the inputs, the reference and the kernels run (a CPU check of the script's own arithmetic may set "cpu"
# with stand-ins for the two kernels).
DEVICE = "cuda"
DEFAULT_BAR = 2.0


@dataclasses.dataclass
class ErrorCase:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    descale: str  # "tensor" (one factor per tensor) or "head" (one per batch and K/V head)

    @property
    def label(self):
        heads = f"{self.heads_q}" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv}"
        seq = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}/{self.seqlen_k}"
        return (f"B{self.batch} H{heads} S{seq} D{self.head_dim} {'causal' if self.causal else 'full'} "
                f"per-{self.descale}")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="fp8 (e4m3) prefill error of flashcore and of FlashAttention 3 against a float64 reference on "
        "the dequantized inputs, and flashcore's over FA3's (issue 36: at most 2).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="default shapes (B, Hq, Hkv, Sq, Sk, D): " + ", ".join(str(s) for s in SHAPES))
    p.add_argument("--head-dim", metavar="D[,D]", help="only the default shapes of these head dims (64, 128, 256)")
    p.add_argument("--shape", action="append", default=[], metavar="B,HQ,HKV,SQ,SK,D",
                   help="a shape instead of the defaults (repeatable); Hq a multiple of Hkv, Sq <= Sk")
    p.add_argument("--mask", default="both", choices=("none", "causal", "both"))
    p.add_argument("--descale", default="tensor,head",
                   help="descale granularity: tensor (one factor per tensor), head (one per batch and K/V head, "
                   "[B, Hkv]) or both, comma separated (default: both)")
    p.add_argument("--bar", type=float, default=DEFAULT_BAR,
                   help=f"largest flashcore/FA3 error ratio accepted, rel L2 and max abs (default {DEFAULT_BAR:g})")
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--library", metavar="PATH", help="libflashcore.so to load (sets FLASHCORE_LIBRARY)")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("--list", action="store_true", help="print the cases and exit; needs no GPU")
    args = p.parse_args(argv)
    masks = {"none": [False], "causal": [True], "both": [False, True]}[args.mask]
    granularities = compare.split_choices(p, "--descale", args.descale, GRANULARITIES)
    shapes = []
    for text in args.shape:
        try:
            shape = tuple(int(x) for x in text.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 6 or min(shape) <= 0:
            p.error(f"--shape {text!r}: expected six positive integers B,HQ,HKV,SQ,SK,D")
        b, hq, hkv, sq, sk, d = shape
        if hq % hkv or sq > sk or d % 16:
            p.error(f"--shape {text!r}: needs Hq a multiple of Hkv, Sq <= Sk (every row sees a key) and D a "
                    "multiple of 16 (e4m3 rows of whole 16-byte vectors)")
        shapes.append(shape)
    if not shapes:
        shapes = list(SHAPES)
        if args.head_dim:
            dims = compare.split_choices(p, "--head-dim", args.head_dim, ("64", "128", "256"))
            shapes = [s for s in shapes if str(s[-1]) in dims]
    elif args.head_dim:
        p.error("--head-dim selects among the default shapes; not taken with --shape")
    if not args.bar > 0:
        p.error("--bar must be > 0")
    args.cases = [ErrorCase(b, hq, hkv, sq, sk, d, causal, g)
                  for (b, hq, hkv, sq, sk, d) in shapes for causal in masks for g in granularities]
    return args


# ---------------------------------------------------------------------------
# Inputs and reference
# ---------------------------------------------------------------------------


def quantize(t, heads_kv, per_head):
    """(e4m3 tensor, descale [B, Hkv] float32, descale as the kernel under test gets it) for t [B, S, H, D]:
    per_head, one factor per (batch, K/V head) over that head's elements (for q, the query heads of its group);
    else one factor for the tensor, amax / 448 as e4m3.quantize_e4m3 (returned as a one-element tensor for
    flashcore, expanded to [B, Hkv] for FA3)."""
    b, s, h, d = t.shape
    if not per_head:
        t8, descale = quantize_e4m3(t)
        return t8, descale.expand(b, heads_kv).contiguous(), descale
    grouped = t.float().view(b, s, heads_kv, h // heads_kv, d)
    descale = descale_for(grouped.abs().amax(dim=(1, 3, 4)))
    t8 = (grouped / descale[:, None, :, None, None]).view(b, s, h, d).to(torch.float8_e4m3fn)
    return t8, descale.contiguous(), descale.contiguous()


def dequantize(t8, descale_bh):
    """float64 [B, S, H, D] values e4m3 * descale (exact in float64), descale_bh [B, Hkv]."""
    b, s, h, d = t8.shape
    hkv = descale_bh.shape[1]
    x = t8.double().view(b, s, hkv, h // hkv, d) * descale_bh.double()[:, None, :, None, None]
    return x.view(b, s, h, d)


def reference(c, q, k, v):
    """(out [B, Sq, Hq, D], lse [B, Hq, Sq]) in float64 from float64 [B, S, H, D] inputs, one batch at a time."""
    group = c.heads_q // c.heads_kv
    scale = 1.0 / math.sqrt(c.head_dim)
    outs, lses = [], []
    keep = None
    if c.causal:
        keep = torch.ones(c.seqlen_q, c.seqlen_k, dtype=torch.bool, device=q.device).tril(c.seqlen_k - c.seqlen_q)
    for i in range(c.batch):
        qb = q[i].transpose(0, 1)  # [Hq, Sq, D]
        kb = k[i].transpose(0, 1).repeat_interleave(group, dim=0)
        vb = v[i].transpose(0, 1).repeat_interleave(group, dim=0)
        scores = (qb @ kb.transpose(-1, -2)) * scale
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [Hq, Sq]
        probs = torch.exp(scores - lse[..., None])
        del scores
        outs.append((probs @ vb).transpose(0, 1))  # [Sq, Hq, D]
        lses.append(lse)
        del probs
    return torch.stack(outs), torch.stack(lses)


# ---------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------


def run_flashcore(fc, c, q8, k8, v8, descales):
    out, lse = fc.attention(q8, k8, v8, causal=c.causal, layout="bshd", q_descale=descales[0],
                            k_descale=descales[1], v_descale=descales[2], return_lse=True)
    return out, lse


def run_fa3(fa3, c, q8, k8, v8, descales_bh):
    result = fa3.flash_attn_func(q8, k8, v8, causal=c.causal, q_descale=descales_bh[0], k_descale=descales_bh[1],
                                 v_descale=descales_bh[2], return_attn_probs=True)
    if isinstance(result, (tuple, list)):
        return result[0], (result[1] if len(result) > 1 else None)
    return result, None


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def errors(out, lse, ref_out, ref_lse):
    """rel L2, max abs of out (inf where out is not finite) and max abs of lse (None without one)."""
    if not torch.isfinite(out).all():
        rel = mx = math.inf
    else:
        diff = out.double() - ref_out
        rel = (diff.norm() / ref_out.norm()).item()
        mx = diff.abs().max().item()
    lse_err = None
    if lse is not None and tuple(lse.shape) == tuple(ref_lse.shape):
        lse_err = (lse.double() - ref_lse).abs().max().item()
    return {"rel_l2": rel, "max_abs": mx, "lse_max_abs": lse_err, "out_dtype": str(out.dtype).split(".")[-1]}


def measure_case(c, index, fc, fa3, seed):
    """Every number of one case: a dict ready for JSON."""
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed + index)
    shapes = ((c.batch, c.seqlen_q, c.heads_q, c.head_dim), (c.batch, c.seqlen_k, c.heads_kv, c.head_dim),
              (c.batch, c.seqlen_k, c.heads_kv, c.head_dim))
    q, k, v = (torch.randn(s, device=DEVICE, dtype=torch.float32, generator=gen) for s in shapes)
    per_head = c.descale == "head"
    (q8, qd_bh, qd), (k8, kd_bh, kd), (v8, vd_bh, vd) = (quantize(t, c.heads_kv, per_head) for t in (q, k, v))
    del q, k, v
    ref_out, ref_lse = reference(c, dequantize(q8, qd_bh), dequantize(k8, kd_bh), dequantize(v8, vd_bh))
    result = dataclasses.asdict(c)
    result.update(label=c.label, flashcore=None, fa3=None, flashcore_error=None, fa3_error=None)
    for name, module, call, descales in (("fa3", fa3, run_fa3, (qd_bh, kd_bh, vd_bh)),
                                         ("flashcore", fc, run_flashcore, (qd, kd, vd))):
        if module is None:
            result[name + "_error"] = "not imported"
            continue
        try:
            out, lse = call(module, c, q8, k8, v8, descales)
            synchronize()
            if tuple(out.shape) != tuple(ref_out.shape):
                raise ValueError(f"output of shape {list(out.shape)}, expected {list(ref_out.shape)}")
            result[name] = errors(out, lse, ref_out, ref_lse)
        except Exception as e:  # one kernel failing must not stop the other
            result[name + "_error"] = compare.short_error(e)
            synchronize()
    fc_e, fa_e = result["flashcore"], result["fa3"]
    for metric in ("rel_l2", "max_abs"):
        ratio = None
        if fc_e and fa_e:
            ratio = fc_e[metric] / fa_e[metric] if fa_e[metric] > 0 else (1.0 if fc_e[metric] == 0 else math.inf)
        result[metric + "_ratio"] = ratio
    return result


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt(x, spec=".3e"):
    return "n/a" if x is None else format(x, spec)


def print_table(results, bar):
    width = max(len(r["label"]) for r in results)
    print(f"{'case':<{width}} | {'rel L2':>9} {'rel L2':>9} {'fc/fa3':>7} | {'max abs':>9} {'max abs':>9} "
          f"{'fc/fa3':>7} | {'lse err':>9} {'lse err':>9} | within")
    print(f"{'':<{width}} | {'fa3':>9} {'flashcore':>9} {'':>7} | {'fa3':>9} {'flashcore':>9} {'':>7} | "
          f"{'fa3':>9} {'flashcore':>9} | {bar:g}x")
    for r in results:
        fa, fc = r["fa3"] or {}, r["flashcore"] or {}
        verdict = r["verdict"]
        print(f"{r['label']:<{width}} | {fmt(fa.get('rel_l2')):>9} {fmt(fc.get('rel_l2')):>9} "
              f"{fmt(r['rel_l2_ratio'], '.2f'):>7} | {fmt(fa.get('max_abs')):>9} {fmt(fc.get('max_abs')):>9} "
              f"{fmt(r['max_abs_ratio'], '.2f'):>7} | {fmt(fa.get('lse_max_abs')):>9} "
              f"{fmt(fc.get('lse_max_abs')):>9} | {verdict}", flush=True)


def verdict(r, bar):
    """'yes', 'NO' (a ratio above the bar, or flashcore failed a case FA3 ran) or 'n/a'."""
    ratios = [r["rel_l2_ratio"], r["max_abs_ratio"]]
    if r["fa3"] and not r["flashcore"] and r["flashcore_error"] != "not imported":
        return "NO"
    if None in ratios:
        return "n/a"
    return "yes" if all(x <= bar for x in ratios) else "NO"


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        for c in args.cases:
            print(c.label)
        print(f"{len(args.cases)} case(s); bar: flashcore's rel L2 and max abs error <= {args.bar:g}x FA3's")
        return 0
    if compare.cuda_torch_missing("fp8_error.py"):
        return 2
    fc = fa3 = None
    try:
        fc = compare.import_flashcore(args.library)
    except Exception as e:
        print(f"fp8_error.py: cannot import the flashcore package ({compare.short_error(e)}); build the library and "
              "point FLASHCORE_LIBRARY (or --library) at libflashcore.so", file=sys.stderr)
    try:
        fa3 = compare.import_fa3()
    except Exception as e:
        print(f"fp8_error.py: cannot import FlashAttention 3 from the {compare.FA3_DISTRIBUTION} wheel "
              f"({compare.short_error(e)}); install it with python3 -m pip install --no-deps .deps/wheels/*.whl",
              file=sys.stderr)
    if fc is None and fa3 is None:
        return 2
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"{props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}; e4m3 q, k, v from randn with "
          "descale = amax / 448 (per tensor or per batch and K/V head); errors against float64 attention on the "
          f"dequantized inputs; fc/fa3: flashcore's error over FA3's (bar: <= {args.bar:g})")
    results = []
    for i, c in enumerate(args.cases):
        r = measure_case(c, i, fc, fa3, args.seed)
        r["verdict"] = verdict(r, args.bar)
        results.append(r)
    print_table(results, args.bar)
    seen = set()
    for r in results:
        for name in ("fa3", "flashcore"):
            text = r[name + "_error"]
            if text and text != "not imported" and (name, text) not in seen:
                seen.add((name, text))
                print(f"  n/a  {name}: {text}  [first: {r['label']}]")
        for name in ("fa3", "flashcore"):
            e = r[name]
            if e and e["out_dtype"] != "bfloat16":
                print(f"  note {name}: output dtype {e['out_dtype']} (bf16 expected): {r['label']}")
    judged = [r for r in results if r["rel_l2_ratio"] is not None]
    for metric in ("rel_l2", "max_abs"):
        if judged:
            worst = max(judged, key=lambda r: r[metric + "_ratio"])
            print(f"  worst {metric} ratio {worst[metric + '_ratio']:.2f}: {worst['label']}")
    for name in ("fa3", "flashcore"):
        got = [r[name] for r in results if r[name]]
        if got:
            print(f"  {name}: worst rel L2 {max(e['rel_l2'] for e in got):.3e}, worst max abs "
                  f"{max(e['max_abs'] for e in got):.3e} over {len(got)} case(s)")
    failed = [r["label"] for r in results if r["verdict"] == "NO"]
    if args.json:
        doc = {"tool": "bench/fp8_error.py", "device": props.name, "torch": torch.__version__,
               "fa3": None if fa3 is None else f"{compare.FA3_DISTRIBUTION} {fa3.version or '(version unknown)'}",
               "settings": {"bar": args.bar, "seed": args.seed,
                            "reference": "float64 attention on the dequantized e4m3 inputs, softmax scale "
                                         "1/sqrt(D), causal bottom-right",
                            "rel_l2": "||out - ref||_2 / ||ref||_2", "max_abs": "max |out - ref|",
                            "ratio": "flashcore's error / FA3's"},
               "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"JSON written to {args.json}")
    for label in failed:
        print(f"fp8_error.py: flashcore's error beyond {args.bar:g}x FA3's (or flashcore failed): {label}",
              file=sys.stderr)
    if fc is None or fa3 is None:
        print(f"fp8_error.py: no ratio without {'flashcore' if fc is None else 'FA3'}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
