#!/usr/bin/env python3
"""Plain calls of one backend on one compare.py case, for a kernel profiler.

compare.py times CUDA-graph replays; a profiler wants a few ordinary calls to
pick one from. This makes the inputs of the first case that compare.py's case
flags select (--preset, --dtype, --mask, --layout, --batch, --heads, ...),
calls one backend --calls times (default 3) and synchronises, and prints
nothing on standard output, so that a profiler's CSV is all there is. The
backends are compare.py's: flashcore (--library as there), flashcore-fp8kv, flashcore-fp8,
fa3, fa3-fp8, fa4, flash, efficient, cudnn (flashcore-fp8 and fa3-fp8 get the inputs cast to
e4m3 before the first call, as in compare.py; no extra attention call).

Nsight Compute, the third call of the attention kernel, the sections that
docs/log/hopper.md quotes (bench/ncu_summary.py turns such files into one
table):

  ncu --clock-control none --kernel-name-base demangled \\
      -k 'regex:flash_fwd_sm90_kernel|FlashAttnFwdSm90|sdpa_sm90_flash_fprop' \\
      --launch-skip 2 --launch-count 1 --csv --page raw \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis \\
      --section SchedulerStats --section WarpStateStats --section LaunchStats \\
      python3 bench/profile_case.py --backend fa3 --preset tput-2k-d128 \\
      --dtype bf16 --mask causal --layout bshd > fa3.csv

--backward (or --train) calls the backend's backward pass (a training step)
as compare.py times it: backends flashcore, flashcore-det, fa4, cudnn, flash,
efficient, fa3 (forward only: refused). --every-case profiles every case the
flags select in one process: each case's last call runs between
cudaProfilerStart and cudaProfilerStop after a marker kernel (torch's
spin_kernel), so that under `ncu --profile-from-start off` the launches of
one call follow each marker; bench/ncu_summary.py --split-at spin_kernel
turns that into a column per case (its longest kernel, or every kernel
with --all-kernels):

  ncu --clock-control none --profile-from-start off --csv --page raw \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats \
      python3 bench/profile_case.py --backend cudnn --backward --every-case \
      --preset hopper-backward --dtype bf16 > cudnn.csv

Exit status: 0 ok, 1 the backend cannot run the case, 2 no GPU, PyTorch or
flashcore package, or a bad command line.
"""

import argparse
import sys

import compare


def main(argv=None):
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--backend", choices=("flashcore", "flashcore-det", compare.FP8_KV_BACKEND,
                                            compare.FP8_FC_BACKEND, "fa3", compare.FP8_FA3_BACKEND, compare.FA4_BACKEND,
                                            "flash", "efficient", "cudnn"))
    own.add_argument("--calls", type=compare.positive_int, default=3)
    own.add_argument("--every-case", action="store_true",
                     help="every selected case, the last call of each in a profiler range after a marker kernel")
    own.add_argument("-h", "--help", action="store_true")
    args, rest = own.parse_known_args(argv)
    if args.help:
        print(__doc__)
        return 0
    if args.backend is None:
        print("profile_case.py: --backend is required (flashcore, flashcore-det, flashcore-fp8kv, flashcore-fp8, "
              "fa3, fa3-fp8, fa4, flash, efficient or cudnn)", file=sys.stderr)
        return 2
    case_args = compare.parse_args(rest)
    cases = compare.build_cases(case_args)
    if not cases:
        print("profile_case.py: the case flags select no case (see compare.py --help)", file=sys.stderr)
        return 2
    if compare.cuda_torch_missing("profile_case.py"):
        return 2
    mode = case_args.mode
    status = 0
    for case in cases if args.every_case else cases[:1]:
        try:
            run = runner(args.backend, case, case_args, mode)
        except Exception as e:  # an import error or an Unsupported case: say which, go on to the next
            print(f"profile_case.py: {args.backend} cannot run {case.label}: {compare.short_error(e)}",
                  file=sys.stderr)
            status = 1
            continue
        for call in range(args.calls):
            profiled = args.every_case and call == args.calls - 1
            if profiled:
                compare.torch.cuda.synchronize()
                compare.torch.cuda.cudart().cudaProfilerStart()
                compare.torch.cuda._sleep(PROFILER_MARKER_CYCLES)
            run()
            if profiled:
                compare.torch.cuda.synchronize()
                compare.torch.cuda.cudart().cudaProfilerStop()
        compare.torch.cuda.synchronize()
        print(f"profile_case.py: {args.calls} calls of {args.backend} ({mode}) on {case.label}", file=sys.stderr)
    return status


# The marker kernel's spin (torch.cuda._sleep's cycles): short, but a launch
# of its own before each profiled call.
PROFILER_MARKER_CYCLES = 1000


def runner(backend, case, case_args, mode):
    """run(): one call of the backend on the case's inputs (its forward, or
    with mode "backward"/"train" what compare.py times for it)."""
    q, k, v = compare.make_inputs(case, 1, case_args.seed)[0]
    if mode in ("backward", "train"):
        fc = compare.import_flashcore(case_args.library) if backend.startswith("flashcore") else None
        fa3 = compare.import_fa3() if backend == "fa3" else None
        fa4 = compare.import_fa4() if backend == compare.FA4_BACKEND else None
        douts = compare.make_douts(case, 1, case_args.seed + 1)
        call = compare.backward_runner(backend, case, fc, fa3, [(q, k, v)], douts, train=mode == "train", fa4=fa4)
        return lambda: call(0)
    fp8_cache = {}
    if backend in compare.FP8_BACKENDS:
        compare.fp8_set(fp8_cache, case, q, k, v)  # the e4m3 cast, before (and not among) the profiled calls
    if backend == "flashcore":
        run = compare.flashcore_backend(compare.import_flashcore(case_args.library), case)
    elif backend == compare.FP8_KV_BACKEND:
        run = compare.flashcore_fp8_kv_backend(compare.import_flashcore(case_args.library), case)
    elif backend == compare.FP8_FC_BACKEND:
        run = compare.flashcore_fp8_backend(compare.import_flashcore(case_args.library), case, fp8_cache)
    elif backend == "fa3":
        run = compare.fa3_backend(compare.import_fa3(), case)
    elif backend == compare.FP8_FA3_BACKEND:
        run = compare.fa3_fp8_backend(compare.import_fa3(), case, fp8_cache)
    elif backend == compare.FA4_BACKEND:
        run = compare.fa4_backend(compare.import_fa4(), case)
    elif backend == "flashcore-det":
        raise compare.Unsupported("flashcore-det is a backward backend (--backward or --train)")
    else:
        run = compare.sdpa_backend(backend, case)
    return lambda: run(q, k, v)


if __name__ == "__main__":
    sys.exit(main())
