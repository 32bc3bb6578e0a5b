#!/usr/bin/env python3
"""Where a paged decode call's time goes: compare.py --serving paged's decode case (B 32, cache
lengths 525..14586, Hq 32 / Hkv 8, head dim 128, bf16 queries) on the same keys laid out seven
ways, each over a bf16 cache and the same cache in e4m3 (one descale factor per tensor):

  contiguous             [B, 16384, Hkv, D] with cache_seqlens (the reference layout)
  one page per sequence  the contiguous cache as a pool of B pages of 16384 keys: the paged code
                         path over the contiguous layout (what the look-ups cost by themselves)
  varlen                 the used keys packed, cu_seqlens_k: ragged tiles without pages
  page 16 / 64 / 256     pools of pages of that many keys, shuffled (compare.py's page_cache)
  page 16 in order       pages of 16 in allocation order (what the scattered pages' locality costs)

Times are compare.py's measure() (CUDA-graph replays, median); every layout's output is checked
against the contiguous call's. --num-splits pins the split count (default: the library's choice).

  FLASHCORE_LIBRARY=build/src/libflashcore.so python3 bench/paged_layouts.py [--num-splits N] [--json F]

For a kernel profiler, --profile LAYOUT --cache bf16|e4m3 makes a few plain calls of that layout only
(nothing timed), e.g. the L2 and DRAM traffic of shuffled pages beside pages in order:

  ncu --section MemoryWorkloadAnalysis --section SpeedOfLight -k regex:fwd python3 bench/paged_layouts.py \
      --profile "page 16" --cache bf16
"""

import argparse
import itertools
import json
import random
import sys

import compare
from e4m3 import quantize_e4m3
import serving_cases as serving

# Plain calls of --profile: the first warms caches and the library's plan; ncu's -c picks among the rest.
PROFILE_CALLS = 3


def layouts(torch, fc, q, k, v, lengths, seqlens, kv_kwargs, num_splits):
    """(name, call) for each layout of one cache (k, v: [B, PAGED_MAX, Hkv, D])."""
    batch = len(lengths)
    one_page = torch.arange(batch, device=q.device, dtype=torch.int32).view(batch, 1)
    cu_q = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lengths)), device=q.device, dtype=torch.int32)
    # Packed as bytes: PyTorch's cat has no float8 kernels.
    k_packed = torch.cat([k.view(torch.uint8)[b, :n] for b, n in enumerate(lengths)]).view(k.dtype)
    v_packed = torch.cat([v.view(torch.uint8)[b, :n] for b, n in enumerate(lengths)]).view(v.dtype)
    rows = q.view(batch, serving.HEADS_Q, serving.HEAD_DIM)
    out = [("contiguous", lambda: fc.attention_with_kvcache(q, k, v, seqlens, num_splits=num_splits, **kv_kwargs)),
           ("one page per sequence", lambda: fc.attention_with_kvcache(q, k, v, seqlens, block_table=one_page,
                                                                       num_splits=num_splits, **kv_kwargs)),
           ("varlen", lambda: fc.attention_varlen(rows, k_packed, v_packed, cu_q, cu_k, 1, max(lengths),
                                                   num_splits=num_splits, **kv_kwargs).view(q.shape))]
    for page, shuffled in ((16, True), (16, False), (64, True), (256, True)):
        k_pool, v_pool, table = serving.paged_cache(torch, k, v, lengths, page, shuffled)
        name = f"page {page}" + ("" if shuffled else " in order")
        out.append((name, lambda k_pool=k_pool, v_pool=v_pool, table=table: fc.attention_with_kvcache(
            q, k_pool, v_pool, seqlens, block_table=table, num_splits=num_splits, **kv_kwargs)))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-splits", type=compare.num_splits_arg, default=None,
                        help="pin flashcore's split count (default or 0: the library's choice)")
    parser.add_argument("--library", help="libflashcore.so to load (default: FLASHCORE_LIBRARY or build/)")
    parser.add_argument("--budget-ms", type=float, default=300.0, help="replay time per measurement")
    parser.add_argument("--seed", type=int, default=1234, help="as compare.py's (the case's lengths)")
    parser.add_argument("--json", help="write the times here")
    parser.add_argument("--profile", metavar="LAYOUT", help="only make PROFILE_CALLS plain calls of this layout "
                        "(a name of the table, e.g. 'page 16'), for a profiler; nothing is timed")
    parser.add_argument("--cache", choices=("bf16", "e4m3"), default="bf16", help="the cache --profile reads")
    args = parser.parse_args(argv)
    import torch
    fc = compare.import_flashcore(args.library)
    lengths = serving.log_uniform_lengths(random.Random(args.seed), serving.PAGED_BATCH, serving.PAGED_MIN,
                                          serving.PAGED_MAX)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    shape = (serving.PAGED_BATCH, serving.PAGED_MAX, serving.HEADS_KV, serving.HEAD_DIM)
    q = torch.randn(serving.PAGED_BATCH, 1, serving.HEADS_Q, serving.HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    (k_fp8, k_descale), (v_fp8, v_descale) = quantize_e4m3(k), quantize_e4m3(v)
    caches = {"bf16": (k, v, {}), "e4m3": (k_fp8, v_fp8, {"k_descale": k_descale, "v_descale": v_descale})}
    print(f"paged decode layouts: B {serving.PAGED_BATCH}, lengths {min(lengths)}..{max(lengths)} (sum {sum(lengths)}),"
          f" Hq {serving.HEADS_Q} / Hkv {serving.HEADS_KV}, D {serving.HEAD_DIM}, bf16 queries, num_splits "
          f"{args.num_splits or 'the library chooses'}; {torch.cuda.get_device_name()}")
    if args.profile:
        kc, vc, kv_kwargs = caches[args.cache]
        calls = dict(layouts(torch, fc, q, kc, vc, lengths, seqlens, kv_kwargs, args.num_splits or None))
        if args.profile not in calls:
            parser.error(f"--profile: no layout {args.profile!r}; the layouts are {', '.join(map(repr, calls))}")
        for _ in range(PROFILE_CALLS):
            calls[args.profile]()
        torch.cuda.synchronize()
        return 0
    results = {}
    for cache, (kc, vc, kv_kwargs) in caches.items():
        calls = layouts(torch, fc, q, kc, vc, lengths, seqlens, kv_kwargs, args.num_splits or None)
        reference = calls[0][1]().float()
        for name, call in calls:
            diff = (call().float() - reference).abs().max().item()
            us = compare.measure(lambda _i, call=call: call(), 1, args.budget_ms, 64)[0]
            results.setdefault(name, {})[cache] = {"us": us, "max_abs_diff_vs_contiguous": diff}
    print(f"{'layout':24s} | {'bf16 us':>8s} | {'/contig':>7s} | {'e4m3 us':>8s} | {'/contig':>7s} | max |diff|")
    for name, row in results.items():
        cells = [f"{row[c]['us']:8.1f} | {row[c]['us'] / results['contiguous'][c]['us']:7.3f}" for c in caches]
        worst = max(row[c]["max_abs_diff_vs_contiguous"] for c in caches)
        print(f"{name:24s} | " + " | ".join(cells) + f" | {worst:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"lengths": lengths, "num_splits": args.num_splits, "device": torch.cuda.get_device_name(),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
