#!/usr/bin/env python3
"""Compare flashcore with PyTorch's fused attention backends on one GPU.

flashcore is called through its public C API via the project's ctypes package
(bindings/python, ``import flashcore``; the shared library is found through
FLASHCORE_LIBRARY, which --library sets). PyTorch's scaled_dot_product_attention
is pinned to one backend at a time (flash, efficient, cuDNN) with
torch.nn.attention.sdpa_kernel. Every backend sees the same input tensors and is
timed the same way:

  * K calls, rotating over the buffer sets, are captured in one
    torch.cuda.CUDAGraph; the graph is replayed twice to warm up, then R times,
    each replay between two CUDA events; the time per call is the median replay
    time / K. K is chosen so a replay lasts ~5 ms (at most --graph-calls calls,
    rounded up to a whole number of passes over the buffer sets); R so that the
    replays take about --budget-ms.
  * Inputs are rotated over enough buffer sets to exceed twice the L2 cache, so
    small shapes are not timed from L2 only (--buffers 1 times them warm).

FLOPs are 2*B*Hq*(D + Dv)*(visible query/key pairs), D being the head dim of
q and k and Dv that of v and out (--head-dim-v; 2*D for Q*K^T and 2*Dv for P*V
per pair), which is the usual 4*B*Hq*D*pairs when Dv == D. The pairs: Sq*Sk
without a mask; with the causal mask (aligned bottom-right, as in flashcore.h
and FlashAttention >= 2.1) the pairs actually visible, S(S+1)/2 when Sq == Sk.

Causal with Sq != Sk: PyTorch's is_causal aligns the mask top-left, so those
cases call the flash and efficient kernels directly with a bottom-right mask
(aten._scaled_dot_product_flash_attention with is_causal, which flash reads as
bottom-right, and aten._efficient_attention_forward with custom_mask_type 2, as
torch.nn.attention.bias.causal_lower_right does); cuDNN is reported n/a there.

Once per case, flashcore's output (and every other backend's) is compared with
the flash backend's output (max abs diff); when flash cannot run the case (it
needs Dv == D), with the efficient backend's, else with an fp32 reference when
the score matrix is small enough. Backends that refuse a case (e.g. flash with
Dv != D) are reported n/a with PyTorch's reason.

Run ``python3 bench/compare.py --help`` for the options. Exit status: 0 ok, 1 a
flashcore output check failed or flashcore failed a case others ran, 2 no GPU,
PyTorch or flashcore package, or a bad command line.
"""

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import statistics
import sys
import warnings
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as _torch_error:  # reported by main(); --help still works
    torch = None
    _TORCH_IMPORT_ERROR = _torch_error

REPO = Path(__file__).resolve().parent.parent

# (name, batch, heads, seqlen, head_dim, head_dim_v); keep in step with kPresets in flashcore_bench.cpp.
PRESETS = [
    ("mission", 1, 8, 512, 64, 64),
    ("short", 1, 8, 256, 64, 64),
    ("long", 1, 8, 1024, 64, 64),
    ("tput-2k-d64", 16, 16, 2048, 64, 64),
    ("tput-8k-d64", 4, 16, 8192, 64, 64),
    ("tput-16k-d64", 2, 16, 16384, 64, 64),
    ("tput-2k-d128", 16, 16, 2048, 128, 128),
    ("tput-8k-d128", 4, 16, 8192, 128, 128),
    ("tput-16k-d128", 2, 16, 16384, 128, 128),
    # Issue 12's head dims: 96 (also with 32 heads at 4k), DeepSeek-style 192/128, 256 and 32.
    ("tput-2k-d96", 16, 16, 2048, 96, 96),
    ("tput-8k-d96", 4, 16, 8192, 96, 96),
    ("tput-4k-h32-d96", 4, 32, 4096, 96, 96),
    ("tput-2k-d192", 16, 16, 2048, 192, 128),
    ("tput-8k-d192", 4, 16, 8192, 192, 128),
    ("tput-2k-d256", 16, 16, 2048, 256, 256),
    ("tput-8k-d256", 4, 16, 8192, 256, 256),
    ("tput-2k-d32", 16, 16, 2048, 32, 32),
    ("tput-8k-d32", 4, 16, 8192, 32, 32),
]
PRESET_NAMES = [p[0] for p in PRESETS]

SDPA_BACKENDS = ("flash", "efficient", "cudnn")
ALL_BACKENDS = ("flashcore",) + SDPA_BACKENDS
# The output every backend is checked against: the first of these that runs the case, else fp32.
REFERENCES = ("flash", "efficient")
# Loose: a sanity check against gross errors, not an accuracy test.
TOLERANCE = {"fp16": 2e-2, "bf16": 4e-2}
MAX_FP32_REFERENCE_BYTES = 2 << 30


class Unsupported(Exception):
    """A backend that cannot run a case."""


@dataclasses.dataclass
class Case:
    name: str
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    head_dim_v: int
    dtype: str
    causal: bool
    layout: str

    @property
    def label(self):
        heads = f"{self.num_heads_q}"
        if self.num_heads_kv != self.num_heads_q:
            heads += f"/{self.num_heads_kv}"
        seq = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}/{self.seqlen_k}"
        mask = "causal" if self.causal else "full"
        dims = f"{self.head_dim}" if self.head_dim_v == self.head_dim else f"{self.head_dim}/{self.head_dim_v}"
        return f"{self.name} B{self.batch} H{heads} S{seq} D{dims} {self.dtype} {mask}"

    @property
    def torch_dtype(self):
        return torch.float16 if self.dtype == "fp16" else torch.bfloat16

    def set_bytes(self):
        """q, k, v and out of one buffer set, in bytes."""
        rows_q = self.batch * self.num_heads_q * self.seqlen_q
        rows_kv = self.batch * self.num_heads_kv * self.seqlen_k
        return 2 * (rows_q + rows_kv) * (self.head_dim + self.head_dim_v)


def visible_pairs(sq, sk, causal):
    """Query/key pairs the mask lets through for one head (bottom-right causal)."""
    if not causal:
        return sq * sk
    if sk >= sq:
        return sq * sk - sq * (sq - 1) // 2
    return sk * (sk + 1) // 2  # the first Sq - Sk rows see no key


def attention_flops(c):
    """2*D flops per visible pair for Q*K^T and 2*Dv for P*V (4*D when Dv == D)."""
    return 2.0 * c.batch * c.num_heads_q * (c.head_dim + c.head_dim_v) * visible_pairs(c.seqlen_q, c.seqlen_k,
                                                                                           c.causal)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time flashcore against PyTorch SDPA's flash, efficient and cuDNN backends "
        "(CUDA-graph replay, same inputs) and print one table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets (BxHxSxD[/Dv]): " + ", ".join(f"{n} ({b}x{h}x{s}x{d}{'' if dv == d else f'/{dv}'})"
                                                      for n, b, h, s, d, dv in PRESETS),
    )
    sel = p.add_argument_group("cases (default: every preset, fp16 and bf16, causal and not)")
    sel.add_argument("--preset", action="append", metavar="NAME[,NAME]", help="presets to run (repeatable)")
    sel.add_argument("--dtype", default="fp16,bf16", help="fp16, bf16 or both, comma separated")
    sel.add_argument("--mask", default="both", choices=("none", "causal", "both"))
    sel.add_argument("--layout", default="bhsd", choices=("bhsd", "bshd"),
                     help="storage of the inputs; SDPA gets [B,H,S,D] views of the same memory")
    for flag, what in (("batch", "batch size"), ("heads", "query heads (and key/value heads unless --heads-kv)"),
                       ("heads-kv", "key/value heads (GQA)"), ("seqlen", "query and key length"),
                       ("seqlen-q", "query length"), ("seqlen-k", "key length"),
                       ("head-dim", "head dimension of q and k (and of v and out unless --head-dim-v)"),
                       ("head-dim-v", "head dimension of v and out (default: --head-dim if given, else the "
                        "preset's)")):
        sel.add_argument("--" + flag, type=positive_int, metavar="N",
                         help=what + "; overrides that field of every selected preset")
    run = p.add_argument_group("timing")
    run.add_argument("--backends", default=",".join(ALL_BACKENDS),
                     help="comma list from " + ", ".join(ALL_BACKENDS) + " (default: all)")
    run.add_argument("--budget-ms", type=float, default=200.0,
                     help="GPU time of the timed replays, per backend and case (default 200)")
    run.add_argument("--graph-calls", type=positive_int, default=20, help="calls per graph, at most (before rounding)")
    run.add_argument("--buffers", type=positive_int, help="buffer sets to rotate (default: > 2x L2)")
    run.add_argument("--seed", type=int, default=1234)
    run.add_argument("--no-check", action="store_true", help="skip the output comparison")
    out = p.add_argument_group("output and setup")
    out.add_argument("--json", metavar="PATH", help="write all results as JSON")
    out.add_argument("--plot", metavar="PATH", help="write a PNG of TFLOP/s against sequence length (needs matplotlib)")
    out.add_argument("--library", metavar="PATH", help="libflashcore.so to load (sets FLASHCORE_LIBRARY)")
    out.add_argument("--extra", action="append", default=[], metavar="NAME=MODULE:FUNC",
                     help="hook for another kernel: FUNC(q, k, v, causal, softmax_scale) on [B,H,S,D] tensors "
                     "(v: [B,H,S,Dv]), bottom-right causal mask, returning [B,H,S,Dv]; timed like the others "
                     "(repeatable)")
    args = p.parse_args(argv)

    args.dtypes = split_choices(p, "--dtype", args.dtype, ("fp16", "bf16"))
    args.backend_list = split_choices(p, "--backends", args.backends, ALL_BACKENDS)
    names = [n for item in (args.preset or [",".join(PRESET_NAMES)]) for n in item.split(",") if n]
    for n in names:
        if n not in PRESET_NAMES:
            p.error(f"unknown preset {n!r}; choose from {', '.join(PRESET_NAMES)}")
    args.preset_names = names
    args.extras = []
    for spec in args.extra:
        name, sep, target = spec.partition("=")
        if not sep or ":" not in target or not name:
            p.error(f"--extra {spec!r}: expected NAME=MODULE:FUNC")
        args.extras.append((name, target))
    if args.budget_ms <= 0:
        p.error("--budget-ms must be > 0")
    return args


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def split_choices(parser, flag, text, allowed):
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        parser.error(f"{flag}: expected a comma list from {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(items))


def build_cases(args):
    masks = {"none": [False], "causal": [True], "both": [False, True]}[args.mask]
    cases = []
    for name, b, h, s, d, dv in PRESETS:
        if name not in args.preset_names:
            continue
        hq = args.heads or h
        fields = dict(name=name, batch=args.batch or b, num_heads_q=hq, num_heads_kv=args.heads_kv or hq,
                      seqlen_q=args.seqlen_q or args.seqlen or s, seqlen_k=args.seqlen_k or args.seqlen or s,
                      head_dim=args.head_dim or d, head_dim_v=args.head_dim_v or args.head_dim or dv,
                      layout=args.layout)
        for dtype in args.dtypes:
            for causal in masks:
                cases.append(Case(dtype=dtype, causal=causal, **fields))
    return cases


# ---------------------------------------------------------------------------
# Backends: each is fn(q, k, v) -> out on tensors stored in the case's layout
# ---------------------------------------------------------------------------


def import_flashcore(library):
    """The project's ctypes package, from bindings/python when not installed."""
    if library:
        os.environ["FLASHCORE_LIBRARY"] = str(Path(library).resolve())
    elif "FLASHCORE_LIBRARY" not in os.environ:
        built = REPO / "build" / "src" / "libflashcore.so"
        if built.exists():
            os.environ["FLASHCORE_LIBRARY"] = str(built)
    try:
        return importlib.import_module("flashcore")
    except ImportError:
        for extra in (REPO / "bindings" / "python", REPO / "bindings" / "python" / "src"):
            if extra.is_dir() and str(extra) not in sys.path:
                sys.path.insert(0, str(extra))
        return importlib.import_module("flashcore")


def to_bhsd(t, layout):
    return t.transpose(1, 2) if layout == "bshd" else t


def sdpa_backend(name, c):
    """fn(q, k, v) for PyTorch SDPA pinned to one backend, bottom-right causal."""
    pinned = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    gqa = {"enable_gqa": True} if c.num_heads_q != c.num_heads_kv else {}

    if c.causal and c.seqlen_q != c.seqlen_k:
        # is_causal would align the mask top-left: call the kernels with a bottom-right mask.
        if name == "flash":
            def run(q, k, v):
                qb, kb, vb = (to_bhsd(t, c.layout) for t in (q, k, v))
                return torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, True)[0]
            return run
        if name == "efficient" and not gqa:
            def run(q, k, v):
                qs, ks, vs = (to_bhsd(t, c.layout).transpose(1, 2) for t in (q, k, v))  # [B,S,H,D] views
                out = torch.ops.aten._efficient_attention_forward(
                    qs, ks, vs, None, None, None, None, None, 0.0, 2)[0]  # 2: causal from bottom right
                return out.transpose(1, 2)
            return run
        raise Unsupported(f"{name}: no bottom-right causal mask for seqlen_q != seqlen_k"
                          + (" with GQA" if gqa else ""))

    def run(q, k, v):
        with sdpa_kernel([pinned]):
            return F.scaled_dot_product_attention(to_bhsd(q, c.layout), to_bhsd(k, c.layout),
                                                  to_bhsd(v, c.layout), is_causal=c.causal, **gqa)
    return run


def flashcore_backend(fc, c):
    def run(q, k, v):
        return to_bhsd(fc.attention(q, k, v, causal=c.causal, layout=c.layout), c.layout)
    return run


def extra_backend(target, c):
    module, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module), attr)

    def run(q, k, v):
        return fn(to_bhsd(q, c.layout), to_bhsd(k, c.layout), to_bhsd(v, c.layout), c.causal, None)
    return run


def reference_fp32(c, q, k, v):
    """Plain fp32 attention, for when the flash backend cannot run a case."""
    qb, kb, vb = (to_bhsd(t, c.layout).float() for t in (q, k, v))
    group = c.num_heads_q // c.num_heads_kv
    if group > 1:
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
    scores = (qb @ kb.transpose(-1, -2)) / math.sqrt(c.head_dim)  # head_dim of q and k, as SDPA
    if c.causal:
        keep = torch.ones(c.seqlen_q, c.seqlen_k, dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(~keep.tril(c.seqlen_k - c.seqlen_q), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key give 0, as flashcore does
    return probs @ vb


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def clamp_count(x, lo, hi):
    if not x >= lo:  # also NaN
        return lo
    return hi if x >= hi else int(round(x))


def timed_calls(call, n, start):
    """Mean ms of n back-to-back calls on the current stream."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for i in range(n):
        call(start + i)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / n


def measure(call, nsets, budget_ms, max_graph_calls):
    """Median µs per call from CUDA-graph replays; call(i) runs on buffer set i % nsets."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture wants
        t_ms = timed_calls(call, 3, 0)
        t_ms = timed_calls(call, clamp_count(50.0 / t_ms, 3, 1000), 3)
    torch.cuda.current_stream().wait_stream(side)

    calls = min(max_graph_calls, clamp_count(math.ceil(5.0 / t_ms), 1, 1 << 20))
    calls = -(-calls // nsets) * nsets

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    replay_ms = timed_calls(lambda _: graph.replay(), 2, 0)  # warm-up, sizes the timed run
    replays = clamp_count(budget_ms / replay_ms, 5, 200)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    events[0].record()
    for i in range(replays):
        graph.replay()
        events[i + 1].record()
    events[-1].synchronize()
    per_call_us = [1000.0 * events[i].elapsed_time(events[i + 1]) / calls for i in range(replays)]
    del graph
    return statistics.median(per_call_us), calls, replays


def buffer_sets(c, args):
    if args.buffers:
        return args.buffers
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0) or 60 * 10**6
    free, _ = torch.cuda.mem_get_info()
    want = math.ceil(2 * l2 / c.set_bytes())
    fit = int(0.5 * free // c.set_bytes())
    return max(1, min(want, fit, 64))


def make_inputs(c, nsets, seed):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    def shape(heads, seqlen, width):
        return (c.batch, heads, seqlen, width) if c.layout == "bhsd" else (c.batch, seqlen, heads, width)

    shapes = (shape(c.num_heads_q, c.seqlen_q, c.head_dim), shape(c.num_heads_kv, c.seqlen_k, c.head_dim),
              shape(c.num_heads_kv, c.seqlen_k, c.head_dim_v))
    return [tuple(torch.randn(shape, device="cuda", dtype=c.torch_dtype, generator=gen) for shape in shapes)
            for _ in range(nsets)]


def short_error(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def probe(fn, inputs):
    """One eager call on set 0: the output, or Unsupported with the reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(*inputs[0])
            torch.cuda.synchronize()
            return out
        except Exception as e:  # any failure means: this backend cannot run this case
            raise Unsupported(short_error(e) + dispatch_reason(caught)) from e


def dispatch_reason(caught):
    """PyTorch's warnings that say why the pinned backend declined, if any."""
    texts = [str(w.message).split("(Triggered internally")[0].strip() for w in caught]
    texts = [t.splitlines()[0] for t in texts if t and "has been runtime disabled" not in t]
    return f" ({' '.join(texts)[:240]})" if texts else ""


def run_case(c, backends, fc, args):
    """Time every backend on one case; a dict ready for JSON."""
    nsets = buffer_sets(c, args)
    inputs = make_inputs(c, nsets, args.seed)
    result = dataclasses.asdict(c)
    result.update(flops=attention_flops(c), buffer_sets=nsets, backends={}, reference=None)

    reference = None
    if not args.no_check:
        for name in REFERENCES:
            try:
                reference = probe(sdpa_backend(name, c), inputs).float()
                result["reference"] = name
                break
            except Unsupported:
                continue
        if reference is None and c.batch * c.num_heads_q * c.seqlen_q * c.seqlen_k * 4 <= MAX_FP32_REFERENCE_BYTES:
            reference = reference_fp32(c, *inputs[0])
            result["reference"] = "fp32"

    for name in backends:
        entry = {"us": None, "tflops": None, "max_abs_diff": None, "error": None}
        result["backends"][name] = entry
        try:
            if name == "flashcore":
                if fc is None:
                    raise Unsupported("flashcore package not loaded")
                fn = flashcore_backend(fc, c)
            elif name in SDPA_BACKENDS:
                fn = sdpa_backend(name, c)
            else:
                fn = extra_backend(dict(args.extras)[name], c)
            out = probe(fn, inputs)
            if reference is not None:
                entry["max_abs_diff"] = (out.float() - reference).abs().max().item()
            del out
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                us, calls, replays = measure(lambda i: fn(*inputs[i % nsets]), nsets, args.budget_ms,
                                             args.graph_calls)
            entry.update(us=us, tflops=result["flops"] / (us * 1e6), calls_per_graph=calls, replays=replays)
        except Exception as e:  # one backend failing must not stop the others
            entry["error"] = str(e) if isinstance(e, Unsupported) else short_error(e)
            torch.cuda.synchronize()
    del inputs, reference
    torch.cuda.empty_cache()

    others = {n: e["tflops"] for n, e in result["backends"].items() if n != "flashcore" and e["tflops"]}
    fc_tflops = result["backends"].get("flashcore", {}).get("tflops")
    result["best_other"] = max(others, key=others.get) if others else None
    result["ratio_to_best"] = fc_tflops / others[result["best_other"]] if fc_tflops and others else None
    diff = result["backends"].get("flashcore", {}).get("max_abs_diff")
    result["check_ok"] = None if diff is None else bool(diff <= TOLERANCE[c.dtype])
    return result


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt_cell(entry, width):
    if entry["tflops"] is None:
        return "n/a".center(width)
    return f"{entry['us']:9.1f} {entry['tflops']:6.1f}".rjust(width)


def print_header(backends, label_width, cell):
    names = " | ".join(n.center(cell) for n in backends)
    units = " | ".join("us   TFLOP/s".rjust(cell) for _ in backends)
    print(f"{'case':<{label_width}} | {names} | {'fc/best':>8} | {'maxdiff':>9} | ref")
    print(f"{'':<{label_width}} | {units} | {'':>8} | {'vs ref':>9} |")


def print_row(r, backends, label_width, cell):
    cells = " | ".join(fmt_cell(r["backends"][n], cell) for n in backends)
    ratio = f"{r['ratio_to_best']:.2f}x" if r["ratio_to_best"] else "n/a"
    diff = r["backends"].get("flashcore", {}).get("max_abs_diff")
    check = "n/a" if diff is None else f"{diff:.2e}" + ("" if r["check_ok"] else " !")
    print(f"{r['label']:<{label_width}} | {cells} | {ratio:>8} | {check:>9} | {r['reference'] or '-'}", flush=True)


def print_notes(results, backends):
    """Each backend's reasons for n/a, once per reason (shapes in the text ignored)."""
    seen = set()
    for r in results:
        for n in backends:
            err = r["backends"][n]["error"]
            key = (n, re.sub(r"\d+", "#", err or ""))
            if err and key not in seen:
                seen.add(key)
                print(f"  n/a  {n}: {err}  [first: {r['label']}]")


def write_plot(results, backends, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"compare.py: matplotlib not available, no plot written to {path}", file=sys.stderr)
        return
    head_dims = sorted({(r["head_dim"], r["head_dim_v"]) for r in results})
    variants = sorted({(r["dtype"], r["causal"]) for r in results})
    fig, axes = plt.subplots(len(variants), len(head_dims), squeeze=False,
                             figsize=(6.0 * len(head_dims), 3.8 * len(variants)))
    for row, (dtype, causal) in enumerate(variants):
        for col, hd in enumerate(head_dims):
            ax = axes[row][col]
            rows = sorted((r for r in results if (r["head_dim"], r["head_dim_v"]) == hd and r["dtype"] == dtype
                           and r["causal"] == causal), key=lambda r: (r["seqlen_k"], r["seqlen_q"]))
            for name in backends:
                pts = [(r["seqlen_k"], r["backends"][name]["tflops"]) for r in rows
                       if r["backends"][name]["tflops"]]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", label=name, linewidth=2.0 if name == "flashcore" else 1.2)
            ax.set_xscale("log", base=2)
            dims = f"{hd[0]}" if hd[0] == hd[1] else f"{hd[0]}, head_dim_v {hd[1]}"
            ax.set_title(f"head_dim {dims}, {dtype}, {'causal' if causal else 'no mask'}", fontsize=10)
            ax.set_xlabel("sequence length (keys)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def environment(fc):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    fc_version, fc_head_dims = None, None
    if fc is not None:  # the loaded library's version, else the package's
        library_version = getattr(fc, "library_version", None)
        fc_version = library_version() if callable(library_version) else getattr(fc, "__version__", None)
        supported = getattr(fc, "supported_head_dims", None)  # flashcore >= 0.2
        fc_head_dims = [list(pair) for pair in supported()] if callable(supported) else None
    return {
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "flashcore": None if fc_version is None else str(fc_version),
        "flashcore_head_dims": fc_head_dims,
        "flashcore_library": os.environ.get("FLASHCORE_LIBRARY"),
    }


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        print(f"compare.py: PyTorch is needed: {_TORCH_IMPORT_ERROR}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compare.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2

    fc = None
    if "flashcore" in args.backend_list:
        try:
            fc = import_flashcore(args.library)
        except Exception as e:
            print(f"compare.py: cannot import the flashcore package ({short_error(e)}); build the library and "
                  "point FLASHCORE_LIBRARY (or --library) at libflashcore.so, or leave flashcore out of --backends",
                  file=sys.stderr)
            return 2
    backends = list(args.backend_list) + [name for name, _ in args.extras]

    env = environment(fc)
    print(f"{env['device']} (sm_{env['compute_capability'].replace('.', '')}, {env['multiprocessors']} SMs), "
          f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, flashcore {env['flashcore']}")
    if env["flashcore_head_dims"]:
        print("flashcore kernels for (head_dim, head_dim_v): "
              + ", ".join(f"{d}" if d == dv else f"{d}/{dv}" for d, dv in env["flashcore_head_dims"]))
    print("us per call: median over CUDA-graph replays; TFLOP/s = 2*B*Hq*(D+Dv)*visible pairs; "
          "fc/best = flashcore TFLOP/s / best other backend's (>1: flashcore faster); maxdiff: flashcore's output "
          "against the ref(erence) backend's")

    cases = build_cases(args)
    label_width = max(len(c.label) for c in cases)
    cell = 16
    print_header(backends, label_width, cell)
    results = []
    for c in cases:
        r = run_case(c, backends, fc, args)
        r["label"] = c.label
        results.append(r)
        print_row(r, backends, label_width, cell)
    print_notes(results, backends)

    if args.json:
        doc = {"tool": "bench/compare.py", "environment": env,
               "settings": {"budget_ms": args.budget_ms, "max_graph_calls": args.graph_calls, "seed": args.seed,
                            "tolerance": TOLERANCE,
                            "flops": "2*B*Hq*(D+Dv)*visible_pairs (4*B*Hq*D*visible_pairs when Dv == D); causal: "
                                     "bottom-right mask, S(S+1)/2 pairs if Sq == Sk"},
               "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"JSON written to {args.json}")
    if args.plot:
        write_plot(results, backends, args.plot, f"{env['device']}: flashcore vs PyTorch SDPA backends")

    bad_check = [r["label"] for r in results if r["check_ok"] is False]
    fc_failed = [r["label"] for r in results if "flashcore" in r["backends"]
                 and r["backends"]["flashcore"]["error"] and r["best_other"]]
    for label in bad_check:
        print(f"compare.py: flashcore output differs from the reference beyond tolerance: {label}", file=sys.stderr)
    for label in fc_failed:
        print(f"compare.py: flashcore failed a case other backends ran: {label}", file=sys.stderr)
    return 1 if bad_check or fc_failed else 0


if __name__ == "__main__":
    sys.exit(main())
