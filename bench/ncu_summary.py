#!/usr/bin/env python3
"""One table from Nsight Compute CSV files, one column per profiled kernel.

Each FILE is what `ncu --csv --page raw` printed for one kernel launch (see
bench/profile_case.py for the command); lines that are not CSV (ncu's ==PROF==
messages) are skipped. The rows are the counters docs/log/hopper.md
compares: duration, SM clock, launch shape, instructions, issue slots,
warps per scheduler, pipe utilisation and the stall reasons per issued
instruction.

  python3 bench/ncu_summary.py [--label NAME=FILE ...] FILE ...
  python3 bench/ncu_summary.py --grep REGEX FILE ...   every metric matching REGEX

Column names are the file names without .csv unless --label gives one.

A file of many launches (bench/profile_case.py --every-case: each profiled
call after a marker kernel) gives a column per call with --split-at REGEX
(the marker's kernel name): the call's longest kernel, or each of its
kernels with --all-kernels, named FILE#CALL and the kernel's name.
"""

import argparse
import csv
import io
import re
import sys
from pathlib import Path

# (row label, metric-name regex): the first metric that matches fills the row.
ROWS = (
    ("duration", r"^gpu__time_duration\.sum$"),
    ("SM clock", r"^(sm|smsp|gpc)__cycles_elapsed\.avg\.per_second$"),
    ("grid x block", None),
    ("registers per thread", r"^launch__registers_per_thread$"),
    ("shared memory per block", r"^launch__shared_mem_per_block(_dynamic)?$"),
    ("warp instructions executed", r"^(smsp|sm)__inst_executed\.sum$"),
    ("issue slots busy, % of active cycles", r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$"),
    ("warps per scheduler", r"^smsp__warps_active\.avg\.per_cycle_active$"),
    ("eligible warps per scheduler", r"^smsp__warps_eligible\.avg\.per_cycle_active$"),
    # Pipe utilisation as ComputeWorkloadAnalysis charts it.
    ("tensor pipe busy, % of elapsed", r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_elapsed$"),
    ("MUFU (xu) instructions, % of peak", r"^sm__inst_executed_pipe_xu\.avg\.pct_of_peak_sustained_active$"),
    ("ALU pipe busy, % of active", r"^sm__pipe_alu_cycles_active\.avg\.pct_of_peak_sustained_active$"),
    ("FMA pipe busy, % of active", r"^sm__pipe_fma_cycles_active\.avg\.pct_of_peak_sustained_active$"),
    ("DRAM throughput, % of peak", r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$"),
)
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
STALLS_SHOWN = 8


def read_rows(path):
    """[(metric -> value string, metric -> unit)] of every kernel row in an ncu raw CSV file."""
    lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        raise ValueError(f"{path}: no kernel row (did the -k filter match a launch?)")
    header, units = rows[0], rows[1]
    return [(dict(zip(header, values)), dict(zip(header, units))) for values in rows[2:]]


def read_report(path):
    """(metric -> value string, metric -> unit) of the first kernel row in an ncu raw CSV file."""
    return read_rows(path)[0]


def duration(report):
    metrics, _ = report
    return number(metrics.get("gpu__time_duration.sum", "")) or 0.0


def split_calls(path, marker, all_kernels):
    """[(column suffix, report)] of a file of marked calls: per call (the
    launches after each marker kernel) its longest kernel, or every kernel."""
    calls = []
    for report in read_rows(path):
        if re.search(marker, report[0].get("Kernel Name", "")):
            calls.append([])
        elif calls:
            calls[-1].append(report)
    columns = []
    for i, launches in enumerate(calls):
        chosen = launches if all_kernels else sorted(launches, key=duration, reverse=True)[:1]
        for report in chosen:
            name = re.sub(r"^void |[<(].*", "", report[0].get("Kernel Name", "?"))[-40:]
            columns.append((f"#{i} {name}", report))
    if not columns:
        raise ValueError(f"{path}: no launch after a kernel matching {marker!r}")
    return columns


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def fmt(value, unit=""):
    x = number(value)
    if x is None:
        return value
    if unit.lower() == "hz":
        x, unit = x / 1e9, "GHz"
    elif unit in ("ns", "nsecond"):
        x, unit = x / 1e3, "us"
    elif unit in ("usecond",):
        unit = "us"
    text = f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return f"{text} {unit}".strip()


def summarize(reports):
    table = []
    for label, pattern in ROWS:
        cells = []
        for metrics, units in reports:
            if pattern is None:
                cells.append(f"{metrics.get('Grid Size', '?')} x {metrics.get('Block Size', '?')}")
                continue
            name = next((m for m in metrics if re.match(pattern, m)), None)
            cells.append(fmt(metrics[name], units.get(name, "")) if name else "n/a")
        table.append((label, cells))

    # Stall reasons: the largest over all kernels, same rows for each.
    totals = {}
    for metrics, _ in reports:
        for m, v in metrics.items():
            s = STALL.match(m)
            if s and not s.group(1).endswith("_not_issued"):
                totals[s.group(1)] = totals.get(s.group(1), 0.0) + (number(v) or 0.0)
    for reason in sorted(totals, key=totals.get, reverse=True)[:STALLS_SHOWN]:
        metric = f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
        table.append((f"stall: {reason}", [fmt(m.get(metric, "n/a")) for m, _ in reports]))
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--label", action="append", default=[], metavar="NAME=FILE",
                   help="column name for FILE (default: the file name)")
    p.add_argument("--grep", metavar="REGEX", help="print every metric matching REGEX instead of the table")
    p.add_argument("--split-at", metavar="REGEX", help="a column per call, each call after a kernel matching REGEX")
    p.add_argument("--all-kernels", action="store_true", help="with --split-at: every kernel of each call")
    args = p.parse_args(argv)
    names = {}
    for item in args.label:
        name, _, file = item.partition("=")
        names[file] = name
    reports, columns = [], []
    try:
        for f in args.files:
            column = names.get(f, Path(f).stem)
            if args.split_at:
                for suffix, report in split_calls(f, args.split_at, args.all_kernels):
                    reports.append(report)
                    columns.append(column + suffix)
            else:
                reports.append(read_report(f))
                columns.append(column)
    except (OSError, ValueError) as e:
        print(f"ncu_summary.py: {e}", file=sys.stderr)
        return 1
    if args.grep:
        pattern = re.compile(args.grep)
        for column, (metrics, units) in zip(columns, reports):
            for m, v in metrics.items():
                if pattern.search(m):
                    print(f"{column}\t{m}\t{v} {units.get(m, '')}")
        return 0
    print("| counter | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, cells in summarize(reports):
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
