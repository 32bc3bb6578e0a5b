"""Serving comparisons for bench/compare.py --serving (issue 16's targets), bf16, on one GPU.

Each comparison builds its own inputs (ragged batches, paged caches, long windows do not fit
compare.py's dense [B, H, S, D] presets) and times every backend with compare.py's measure()
(CUDA-graph replays, median):

  varlen  Ragged causal prefill: sequences of 100..8000 tokens (log-uniform, seeded) totalling
          32768, Hq 32 / Hkv 8, head dim 128. flashcore.attention_varlen against FlashAttention 3's
          flash_attn_varlen_func and PyTorch's flash kernel (aten._flash_attention_forward with
          cu_seqlens). TFLOP/s over each sequence's visible (causal) pairs.
  paged   Decode, B 32, one query each, cache lengths 512..16384 (log-uniform, seeded), Hq 32 /
          Hkv 8, head dim 128, over a paged cache (pages of 16 and of 256 keys, shuffled) and over a
          contiguous cache [B, 16384, Hkv, D] with cache_seqlens (and pages of 16 in order, to show
          what the scattered pages' locality costs). flashcore on both; FA3's
          flash_attn_with_kvcache (its wheel has no paged kernels) and PyTorch's flash kernel (seqused_k)
          on the contiguous cache. TB/s = K/V bytes of the used keys / time. flashcore also on the
          same caches quantized to e4m3 (one descale factor per tensor; issue 36), paged and
          contiguous: fp8/bf16 is its time over the bf16 cache's.
  window  Causal prefill of 32768 tokens with a sliding window of 4096 keys, against a plain causal
          prefill of 4096 tokens (B 1, Hq 32 / Hkv 8, head dim 128). Masked key blocks must be
          skipped: the windowed call's time per 128-row query block is set beside the causal 4k call's,
          and both TFLOP/s over visible pairs.
"""

import itertools
import math
import random

from e4m3 import quantize_e4m3

SERVING_KINDS = ("varlen", "paged", "window")
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
VARLEN_TOTAL, VARLEN_MIN, VARLEN_MAX = 32768, 100, 8000
PAGED_BATCH, PAGED_MIN, PAGED_MAX = 32, 512, 16384
PAGE_SIZES = (16, 256)
WINDOW_SEQLEN, WINDOW_LEFT, WINDOW_BASE_SEQLEN = 32768, 4096, 4096
QUERY_BLOCK = 128  # rows per query block of the sm_90a kernel (per-block times)
CHECK_TOLERANCE = 4e-2  # bf16, as compare.py's


def log_uniform_lengths(rng, count, lo, hi):
    return [int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) for _ in range(count)]


def varlen_lengths(seed):
    """Lengths in [VARLEN_MIN, VARLEN_MAX] summing to VARLEN_TOTAL."""
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < VARLEN_TOTAL:
        lengths += log_uniform_lengths(rng, 1, VARLEN_MIN, VARLEN_MAX)
    excess = sum(lengths) - VARLEN_TOTAL
    lengths[-1] -= excess
    if lengths[-1] < VARLEN_MIN:  # fold a short remainder into the shortest other sequence
        short = lengths.pop()
        i = min(range(len(lengths)), key=lengths.__getitem__)
        lengths[i] += short
    return lengths


def causal_pairs(n):
    return n * (n + 1) // 2


class Table:
    """Rows of (label, backend -> (us, rate)) printed as they come."""

    def __init__(self, title, backends, unit):
        self.backends, self.unit = backends, unit
        print(f"\n{title}")
        print(f"{'case':<28} | " + " | ".join(f"{b:>20}" for b in backends))
        print(f"{'':<28} | " + " | ".join(f"{'us':>10} {unit:>9}" for _ in backends))

    def row(self, label, cells):
        """cells: backend -> entry (us and rate) or a plain number (a ratio); missing or None: n/a."""
        text = []
        for b in self.backends:
            cell = cells.get(b)
            if isinstance(cell, float):
                text.append(f"{cell:20.2f}")
            elif cell and cell.get("us"):
                text.append(f"{cell['us']:10.1f} {cell['rate']:9.2f}")
            else:
                text.append(f"{'n/a':>20}")
        print(f"{label:<28} | " + " | ".join(text), flush=True)


def timed(entry, fn, measure, budget_ms, graph_calls, work):
    """Times fn() into entry: us, and rate = work / time (work in units per second * 1e-12)."""
    us, calls, replays = measure(lambda _i: fn(), 1, budget_ms, graph_calls)
    entry.update(us=us, rate=work / (us * 1e6), calls_per_graph=calls, replays=replays)


def run_backends(backends, measure, args, work, reference=None):
    """{name: entry} for (name, fn) pairs: one eager call (checked against reference()), then timed."""
    import torch
    results, ref = {}, None
    if reference is not None:
        try:
            ref = reference().float()
        except Exception as e:  # no reference: no check, still timed
            print(f"  reference failed, outputs not checked: {type(e).__name__}: {e}".splitlines()[0][:240])
    for name, fn in backends:
        entry = {"us": None, "rate": None, "error": None, "max_abs_diff": None}
        results[name] = entry
        if fn is None:
            entry["error"] = "not applicable"
            continue
        try:
            out = fn()
            torch.cuda.synchronize()
            if ref is not None:
                entry["max_abs_diff"] = (out.float() - ref).abs().max().item()
            del out
            timed(entry, fn, measure, args.budget_ms, args.graph_calls, work)
        except Exception as e:  # one backend failing must not stop the others
            entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:240]
            torch.cuda.synchronize()
    return results


def flash_varlen(torch, q, k, v, cu_q, cu_k, max_q, max_k, causal, seqused_k=None):
    """PyTorch's flash kernel (FlashAttention 2) on packed rows."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False,
                                                    seqused_k=seqused_k)[0]


def serving_varlen(fc, fa3, measure, args):
    """The ragged causal prefill at each of --varlen-head-dims (a row each)."""
    return [varlen_case(fc, fa3, measure, args, head_dim) for head_dim in args.varlen_head_dims]


def varlen_case(fc, fa3, measure, args, head_dim):
    import torch
    import torch.nn.functional as F
    lengths = varlen_lengths(args.seed)
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    total = sum(lengths)
    q = torch.randn(total, HEADS_Q, head_dim, device=dev, dtype=dt, generator=gen)
    k = torch.randn(total, HEADS_KV, head_dim, device=dev, dtype=dt, generator=gen)
    v = torch.randn(total, HEADS_KV, head_dim, device=dev, dtype=dt, generator=gen)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), device=dev, dtype=torch.int32)
    longest = max(lengths)
    flops = 4.0 * HEADS_Q * head_dim * sum(causal_pairs(n) for n in lengths)

    def reference():  # per sequence, PyTorch SDPA (bottom-right causal is top-left when Sq == Sk)
        outs = []
        for b, n in enumerate(lengths):
            s = slice(int(cu[b]), int(cu[b + 1]))
            outs.append(F.scaled_dot_product_attention(q[s].transpose(0, 1)[None], k[s].transpose(0, 1)[None],
                                                       v[s].transpose(0, 1)[None], is_causal=True,
                                                       enable_gqa=True)[0].transpose(0, 1))
        return torch.cat(outs)

    backends = [
        ("flashcore", lambda: fc.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)),
        ("fa3", None if fa3 is None else
         lambda: fa3_first(fa3.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True))),
        ("flash", lambda: flash_varlen(torch, q, k, v, cu, cu, longest, longest, True)),
    ]
    label = f"varlen d{head_dim} {len(lengths)} seqs {min(lengths)}..{longest}"
    table = Table(f"Ragged causal prefill, bf16, Hq {HEADS_Q} / Hkv {HEADS_KV}, D {head_dim}, {total} tokens "
                  f"(lengths {lengths})", [b for b, _ in backends] + ["fc/fa3"], "TFLOP/s")
    res = run_backends(backends, measure, args, flops, reference)
    row = dict(res)
    ratio = ratio_of(res, "flashcore", "fa3")
    row["fc/fa3"] = ratio
    table.row(label, row)
    report_errors(res)
    return {"kind": "varlen", "label": label, "head_dim": head_dim, "lengths": lengths, "flops": flops,
            "backends": res, "fc_over_fa3": ratio}


def fa3_first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def ratio_of(res, fast, slow):
    """How many times faster `fast` ran than `slow` (None if either has no time)."""
    a, b = res.get(fast, {}).get("us"), res.get(slow, {}).get("us")
    return b / a if a and b else None


def report_errors(res):
    for name, e in res.items():
        if e.get("error") and e["error"] != "not applicable":
            print(f"  n/a  {name}: {e['error']}")
        if e.get("max_abs_diff") is not None and not e["max_abs_diff"] <= CHECK_TOLERANCE:
            print(f"  !    {name}: output differs from the reference by {e['max_abs_diff']:.2e}")


def paged_cache(torch, k_cache, v_cache, lengths, page_size, shuffled=True):
    """The contiguous caches' used keys copied into a pool of pages (in shuffled order, as a server's
    allocator hands them out after a while, or in order), and its block table. e4m3 caches are copied
    as bytes (PyTorch's indexing has no float8 kernels)."""
    if k_cache.dtype == torch.float8_e4m3fn:
        k_pool, v_pool, table = paged_cache(torch, k_cache.view(torch.uint8), v_cache.view(torch.uint8), lengths,
                                            page_size, shuffled)
        return k_pool.view(k_cache.dtype), v_pool.view(v_cache.dtype), table
    pages_per_seq = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_seq)
    order = (torch.randperm(num_pages, generator=torch.Generator().manual_seed(7)) if shuffled
             else torch.arange(num_pages))
    max_pages = max(pages_per_seq)
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    k_pool = torch.empty(num_pages, page_size, *k_cache.shape[2:], device=k_cache.device, dtype=k_cache.dtype)
    v_pool = torch.empty(num_pages, page_size, *v_cache.shape[2:], device=v_cache.device, dtype=v_cache.dtype)
    next_page = 0
    for b, pages in enumerate(pages_per_seq):
        ids = order[next_page:next_page + pages]
        next_page += pages
        table[b, :pages] = ids.to(torch.int32)
        rows = pages * page_size
        k_src = torch.zeros(rows, *k_cache.shape[2:], device=k_cache.device, dtype=k_cache.dtype)
        v_src = torch.zeros_like(k_src)
        k_src[:lengths[b]] = k_cache[b, :lengths[b]]
        v_src[:lengths[b]] = v_cache[b, :lengths[b]]
        k_pool[ids.to(k_cache.device)] = k_src.view(pages, page_size, *k_cache.shape[2:])
        v_pool[ids.to(k_cache.device)] = v_src.view(pages, page_size, *v_cache.shape[2:])
    return k_pool, v_pool, table.to(k_cache.device)


def serving_paged(fc, fa3, measure, args):
    import torch
    rng = random.Random(args.seed)
    lengths = log_uniform_lengths(rng, PAGED_BATCH, PAGED_MIN, PAGED_MAX)
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    q = torch.randn(PAGED_BATCH, 1, HEADS_Q, HEAD_DIM, device=dev, dtype=dt, generator=gen)
    k_cache = torch.randn(PAGED_BATCH, PAGED_MAX, HEADS_KV, HEAD_DIM, device=dev, dtype=dt, generator=gen)
    v_cache = torch.randn(PAGED_BATCH, PAGED_MAX, HEADS_KV, HEAD_DIM, device=dev, dtype=dt, generator=gen)
    seqlens = torch.tensor(lengths, device=dev, dtype=torch.int32)
    kv_bytes = 2.0 * sum(lengths) * HEADS_KV * (HEAD_DIM + HEAD_DIM)
    # PyTorch's flash kernel on the contiguous cache: packed rows of one query each, keys by seqused_k.
    cu_q = torch.arange(PAGED_BATCH + 1, device=dev, dtype=torch.int32)
    cu_k = cu_q * PAGED_MAX
    q_rows = q.view(PAGED_BATCH, HEADS_Q, HEAD_DIM)
    k_rows = k_cache.view(-1, HEADS_KV, HEAD_DIM)
    v_rows = v_cache.view(-1, HEADS_KV, HEAD_DIM)

    def contiguous():
        return fc.attention_with_kvcache(q, k_cache, v_cache, seqlens)

    # The same caches in e4m3, one descale factor per tensor (as vLLM's k_scale and v_scale).
    (k_fp8, k_descale), (v_fp8, v_descale) = quantize_e4m3(k_cache), quantize_e4m3(v_cache)

    def contiguous_fp8():
        return fc.attention_with_kvcache(q, k_fp8, v_fp8, seqlens, k_descale=k_descale, v_descale=v_descale)

    def flash():
        return flash_varlen(torch, q_rows, k_rows, v_rows, cu_q, cu_k, 1, PAGED_MAX, False,
                            seqused_k=seqlens).view(PAGED_BATCH, 1, HEADS_Q, HEAD_DIM)

    rows = []
    # Shuffled pages, and pages of 16 in order: how much of a gap is the scattered pages' locality.
    layouts = [(size, True) for size in PAGE_SIZES] + [(PAGE_SIZES[0], False)]
    names = ["flashcore paged"] + ["flashcore", "fa3", "flash", "paged/contig", "fc/fa3", "fp8 paged", "fp8",
                                   "fp8 paged/contig", "fp8/bf16"]
    table = Table(f"Paged decode, bf16, B {PAGED_BATCH}, Hq {HEADS_Q} / Hkv {HEADS_KV}, D {HEAD_DIM}, cache lengths "
                  f"{min(lengths)}..{max(lengths)} (sum {sum(lengths)}); contiguous cache [B, {PAGED_MAX}, Hkv, D] "
                  "for flashcore, fa3 and flash", names, "TB/s")
    for size, shuffled in layouts:
        k_pool, v_pool, block_table = paged_cache(torch, k_cache, v_cache, lengths, size, shuffled)
        backends = [
            ("flashcore paged", lambda: fc.attention_with_kvcache(q, k_pool, v_pool, seqlens, block_table=block_table)),
            ("flashcore", contiguous),
            ("fa3", None if fa3 is None else
             lambda: fa3_first(fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=0))),
            ("flash", flash),
        ]
        res = run_backends(backends, measure, args, kv_bytes, flash)
        k_pool8, v_pool8, block_table8 = paged_cache(torch, k_fp8, v_fp8, lengths, size, shuffled)
        fp8_backends = [
            ("fp8 paged", lambda: fc.attention_with_kvcache(q, k_pool8, v_pool8, seqlens, block_table=block_table8,
                                                            k_descale=k_descale, v_descale=v_descale)),
            ("fp8", contiguous_fp8),
        ]
        res.update(run_backends(fp8_backends, measure, args, kv_bytes / 2, flash))  # one-byte K/V
        row = dict(res)
        paged_over_contig = ratio_of(res, "flashcore", "flashcore paged")  # paged time / contiguous time
        fc_fa3 = ratio_of(res, "flashcore", "fa3")
        row["paged/contig"] = paged_over_contig
        row["fc/fa3"] = fc_fa3
        row["fp8 paged/contig"] = ratio_of(res, "fp8", "fp8 paged")
        row["fp8/bf16"] = ratio_of(res, "flashcore", "fp8")
        label = f"decode B{PAGED_BATCH} page {size}" + ("" if shuffled else " in order")
        table.row(label, row)
        report_errors(res)
        del k_pool, v_pool, k_pool8, v_pool8
        rows.append({"kind": "paged", "label": label, "page_size": size, "shuffled": shuffled, "lengths": lengths,
                     "kv_bytes": kv_bytes,
                     "backends": res, "paged_time_over_contiguous": paged_over_contig, "fc_over_fa3": fc_fa3,
                     "fp8_paged_time_over_contiguous": row["fp8 paged/contig"], "fp8_time_over_bf16": row["fp8/bf16"]})
    print("  paged/contig: time of the paged call / time of the same call on the contiguous cache (target <= 1.03); "
          "fc/fa3: FA3 time / flashcore time on the contiguous cache (target >= 1.05); fp8: the same caches in "
          "e4m3 (TB/s of their bytes); fp8/bf16: the e4m3 contiguous call's time / the bf16 one's (target <= 0.55)")
    return rows


def serving_window(fc, fa3, measure, args):
    import torch
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    out = []

    def inputs(seqlen):
        return (torch.randn(1, seqlen, HEADS_Q, HEAD_DIM, device=dev, dtype=dt, generator=gen),
                torch.randn(1, seqlen, HEADS_KV, HEAD_DIM, device=dev, dtype=dt, generator=gen),
                torch.randn(1, seqlen, HEADS_KV, HEAD_DIM, device=dev, dtype=dt, generator=gen))

    table = Table(f"Sliding window, bf16, B 1, Hq {HEADS_Q} / Hkv {HEADS_KV}, D {HEAD_DIM}, causal; TFLOP/s over "
                  "visible pairs; us/block = time per 128-row query block", ["flashcore", "fa3", "us/block"],
                  "TFLOP/s")
    for seqlen, window in ((WINDOW_BASE_SEQLEN, None), (WINDOW_SEQLEN, WINDOW_LEFT)):
        q, k, v = inputs(seqlen)
        visible = sum(min(i + 1, WINDOW_LEFT + 1) if window else i + 1 for i in range(seqlen))
        flops = 4.0 * HEADS_Q * HEAD_DIM * visible
        fa3_window = (window, 0) if window else (-1, -1)
        backends = [
            ("flashcore", lambda: fc.attention(q, k, v, causal=True, layout="bshd",
                                               window=None if window is None else (window, 0))),
            ("fa3", None if fa3 is None else
             lambda: fa3_first(fa3.flash_attn_func(q, k, v, causal=True, window_size=fa3_window))),
        ]
        res = run_backends(backends, measure, args, flops)
        blocks = seqlen // QUERY_BLOCK
        per_block = res["flashcore"]["us"] / blocks if res["flashcore"]["us"] else None
        row = dict(res)
        row["us/block"] = per_block
        label = f"S{seqlen} " + (f"window {window}" if window else "plain causal")
        table.row(label, row)
        report_errors(res)
        out.append({"kind": "window", "label": label, "seqlen": seqlen, "window_left": window, "flops": flops,
                    "backends": res, "us_per_query_block": per_block})
    base, windowed = out[0]["us_per_query_block"], out[1]["us_per_query_block"]
    if base and windowed:
        keys_base = WINDOW_BASE_SEQLEN / 2 + QUERY_BLOCK / 2  # mean keys per block of the causal 4k call
        keys_window = WINDOW_LEFT + QUERY_BLOCK / 2
        print(f"  windowed / plain time per query block: {windowed / base:.2f} (a windowed block sees ~{keys_window:.0f} "
              f"keys, a causal-4k block ~{keys_base:.0f} on average); per key visited: "
              f"{(windowed / keys_window) / (base / keys_base):.2f} (target <= 1.1: masked blocks skipped)")
        out[1]["per_block_ratio"] = windowed / base
        out[1]["per_key_ratio"] = (windowed / keys_window) / (base / keys_base)
    return out


def run_serving(kinds, fc, fa3, measure, args):
    """The selected comparisons; a list of result dicts for compare.py's JSON."""
    runners = {"varlen": serving_varlen, "paged": serving_paged, "window": serving_window}
    results = []
    for kind in kinds:
        got = runners[kind](fc, fa3, measure, args)
        results += got if isinstance(got, list) else [got]
    return results
