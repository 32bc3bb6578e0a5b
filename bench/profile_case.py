#!/usr/bin/env python3
"""Plain calls of one backend on one compare.py case, for a kernel profiler.

compare.py times CUDA-graph replays; a profiler wants a few ordinary calls to
pick one from. This makes the inputs of the first case that compare.py's case
flags select (--preset, --dtype, --mask, --layout, --batch, --heads, ...),
calls one backend --calls times (default 3) and synchronises, and prints
nothing on standard output, so that a profiler's CSV is all there is. The
backends are compare.py's: flashcore (--library as there), flashcore-fp8kv, flashcore-fp8,
fa3, fa3-fp8, flash, efficient, cudnn (flashcore-fp8 and fa3-fp8 get the inputs cast to
e4m3 before the first call, as in compare.py; no extra attention call).

Nsight Compute, the third call of the attention kernel, the sections that
docs/hopper-notes.md quotes (bench/ncu_summary.py turns such files into one
table):

  ncu --clock-control none --kernel-name-base demangled \\
      -k 'regex:flash_fwd_sm90_kernel|FlashAttnFwdSm90|sdpa_sm90_flash_fprop' \\
      --launch-skip 2 --launch-count 1 --csv --page raw \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis \\
      --section SchedulerStats --section WarpStateStats --section LaunchStats \\
      python3 bench/profile_case.py --backend fa3 --preset tput-2k-d128 \\
      --dtype bf16 --mask causal --layout bshd > fa3.csv

Exit status: 0 ok, 1 the backend cannot run the case, 2 no GPU, PyTorch or
flashcore package, or a bad command line.
"""

import argparse
import sys

import compare


def main(argv=None):
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--backend", choices=("flashcore", compare.FP8_KV_BACKEND, compare.FP8_FC_BACKEND, "fa3",
                                            compare.FP8_FA3_BACKEND, "flash", "efficient", "cudnn"))
    own.add_argument("--calls", type=compare.positive_int, default=3)
    own.add_argument("-h", "--help", action="store_true")
    args, rest = own.parse_known_args(argv)
    if args.help:
        print(__doc__)
        return 0
    if args.backend is None:
        print("profile_case.py: --backend is required (flashcore, flashcore-fp8kv, flashcore-fp8, fa3, fa3-fp8, "
              "flash, efficient or cudnn)", file=sys.stderr)
        return 2
    case_args = compare.parse_args(rest)
    cases = compare.build_cases(case_args)
    if not cases:
        print("profile_case.py: the case flags select no case (see compare.py --help)", file=sys.stderr)
        return 2
    case = cases[0]
    if compare.cuda_torch_missing("profile_case.py"):
        return 2

    q, k, v = compare.make_inputs(case, 1, case_args.seed)[0]
    fp8_cache = {}
    if args.backend in compare.FP8_BACKENDS:
        compare.fp8_set(fp8_cache, case, q, k, v)  # the e4m3 cast, before (and not among) the profiled calls
    try:
        if args.backend == "flashcore":
            run = compare.flashcore_backend(compare.import_flashcore(case_args.library), case)
        elif args.backend == compare.FP8_KV_BACKEND:
            run = compare.flashcore_fp8_kv_backend(compare.import_flashcore(case_args.library), case)
        elif args.backend == compare.FP8_FC_BACKEND:
            run = compare.flashcore_fp8_backend(compare.import_flashcore(case_args.library), case, fp8_cache)
        elif args.backend == "fa3":
            run = compare.fa3_backend(compare.import_fa3(), case)
        elif args.backend == compare.FP8_FA3_BACKEND:
            run = compare.fa3_fp8_backend(compare.import_fa3(), case, fp8_cache)
        else:
            run = compare.sdpa_backend(args.backend, case)
    except Exception as e:  # an import error or an Unsupported case: say which and stop
        print(f"profile_case.py: {args.backend} cannot run {case.label}: {compare.short_error(e)}", file=sys.stderr)
        return 1
    for _ in range(args.calls):
        run(q, k, v)
    compare.torch.cuda.synchronize()
    print(f"profile_case.py: {args.calls} calls of {args.backend} on {case.label}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
