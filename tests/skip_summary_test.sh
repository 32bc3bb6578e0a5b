#!/bin/sh
# skip_summary_test.sh: skip_summary.sh on a made-up ctest log names each
# test that skipped for a missing tool, with its reason, sums up the GPU
# skips, and says nothing of what ran.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%s\n' "no CUDA device: no driver" "no CUDA device: no driver" >"$work/gpu.log"
cat >"$work/LastTest.log" <<'LOG'
Start testing: Nov 25 12:49 UTC
----------------------------------------------------------
1/5 Testing: api.Version.RuntimeMatchesHeader
1/5 Test: api.Version.RuntimeMatchesHeader
Output:
----------------------------------------------------------
[  PASSED  ] 1 test.
<end of output>
Test time =   0.01 sec
----------------------------------------------------------
2/5 Testing: python_pytest
2/5 Test: python_pytest
Output:
----------------------------------------------------------
SKIP: pytest is not installed for /usr/bin/python3 (pip install pytest, or apt install python3-pytest)
<end of output>
Test time =   0.20 sec
----------------------------------------------------------
3/5 Testing: rust_bindgen_drift
3/5 Test: rust_bindgen_drift
Output:
----------------------------------------------------------
SKIPPED: bindgen not found on PATH; install it with: apt-get install bindgen libclang-dev
<end of output>
----------------------------------------------------------
4/5 Testing: consumer.pkgconfig
4/5 Test: consumer.pkgconfig
Output:
----------------------------------------------------------
-- SKIP: pkg-config was not found when the project was configured
<end of output>
----------------------------------------------------------
5/5 Testing: gpu.Shapes/FwdTest.Matches/0
5/5 Test: gpu.Shapes/FwdTest.Matches/0
Output:
----------------------------------------------------------
GPU test skipped: no CUDA device: no driver
SKIP: a GPU test's own line, summed up from the GPU log instead
<end of output>
End testing: Nov 25 12:49 UTC
LOG

sh "$here/skip_summary.sh" "$work/gpu.log" "$work" >"$work/got"
cat >"$work/expected" <<'EXPECTED'
2 GPU tests skipped: no CUDA device: no driver
python_pytest skipped: pytest is not installed for /usr/bin/python3 (pip install pytest, or apt install python3-pytest)
rust_bindgen_drift skipped: bindgen not found on PATH; install it with: apt-get install bindgen libclang-dev
consumer.pkgconfig skipped: pkg-config was not found when the project was configured
EXPECTED
if ! diff -u "$work/expected" "$work/got"; then
    echo "skip_summary.sh printed the lines marked +, expected those marked -" >&2
    exit 1
fi
echo "skip_summary.sh: 4 lines as expected"
