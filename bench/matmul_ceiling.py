#!/usr/bin/env python3
"""The dense-matmul ceiling attention kernels are judged against, on the GPU at hand.

torch.matmul (cuBLAS) on square fp16 and bf16 matrices, fp32 accumulation as
attention kernels use: --calls products captured in one CUDA graph, replayed
--replays times between CUDA events after two warm-up replays; the median
replay gives TFLOP/s (2*n^3 per product). docs/log/hopper.md quotes each
attention case as a fraction of this figure, measured in the same session,
since the power limit and the clock it allows differ from GPU to GPU.

  python3 bench/matmul_ceiling.py [--n 8192] [--calls 10] [--replays 15] [--json PATH]

Exit status: 0 ok, 2 no PyTorch or no CUDA device.
"""

import argparse
import json
import statistics
import sys

import compare


def measure(torch, dtype, n, calls, replays):
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    torch.matmul(a, b, out=c)  # cuBLAS picks and loads its kernel outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                torch.matmul(a, b, out=c)
    times = []
    for i in range(replays + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) / calls)
    ms = statistics.median(times)
    return {"dtype": str(dtype).replace("torch.", ""), "n": n, "us": ms * 1e3, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--replays", type=int, default=15)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if compare.cuda_torch_missing("matmul_ceiling.py"):
        return 2
    torch = compare.torch
    results = [measure(torch, dt, args.n, args.calls, args.replays) for dt in (torch.float16, torch.bfloat16)]
    name = torch.cuda.get_device_name()
    for r in results:
        print(f"{name}: torch.matmul {r['dtype']} {r['n']}^3: {r['us']:.0f} us, {r['tflops']:.0f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
