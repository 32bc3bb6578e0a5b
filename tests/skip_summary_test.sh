#!/bin/sh
# skip_summary_test.sh: skip_summary.sh on made-up logs sums up the GPU
# skips by reason and names each test that skipped for a missing tool, with
# its reason; with empty logs it prints nothing. Then report_tool_skip.sh,
# which the checks call to skip, writes such a line and exits 77.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%s\n' "no CUDA device: no driver" "no CUDA device: no driver" "no sm_90 GPU" >"$work/gpu.log"
printf '%s\n' "rust_bindgen_drift skipped: bindgen not found on PATH" \
    "python_pytest skipped: pytest is not installed (pip install pytest)" >"$work/tools.log"
sh "$here/skip_summary.sh" "$work/gpu.log" "$work/tools.log" >"$work/got"
cat >"$work/expected" <<'EXPECTED'
2 GPU tests skipped: no CUDA device: no driver
1 GPU test skipped: no sm_90 GPU
python_pytest skipped: pytest is not installed (pip install pytest)
rust_bindgen_drift skipped: bindgen not found on PATH
EXPECTED
diff -u "$work/expected" "$work/got" || { echo "skip_summary.sh printed the lines marked +, expected -" >&2; exit 1; }

: >"$work/empty"
sh "$here/skip_summary.sh" "$work/empty" "$work/missing-log" >"$work/got"
[ ! -s "$work/got" ] || { echo "skip_summary.sh printed for empty logs:" >&2; cat "$work/got" >&2; exit 1; }

rc=0
FLASHCORE_TOOL_SKIP_LOG="$work/written.log" sh "$here/report_tool_skip.sh" consumer.pkgconfig "pkg-config not found" \
    >"$work/said" || rc=$?
[ "$rc" -eq 77 ] || { echo "report_tool_skip.sh exited $rc, expected 77" >&2; exit 1; }
grep -qx "SKIPPED: pkg-config not found" "$work/said" || { echo "report_tool_skip.sh said:" >&2; cat "$work/said" >&2; exit 1; }
grep -qx "consumer.pkgconfig skipped: pkg-config not found" "$work/written.log" ||
    { echo "report_tool_skip.sh wrote:" >&2; cat "$work/written.log" >&2; exit 1; }
echo "skip_summary.sh and report_tool_skip.sh: as expected"
