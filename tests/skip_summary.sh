#!/bin/sh
# skip_summary.sh LOG: after a ctest run (CTEST_CUSTOM_POST_TEST, written by
# tests/CMakeLists.txt), one line per reason the GPU tests were skipped for,
# e.g. "5602 GPU tests skipped: no CUDA device: no NVIDIA driver found (...)".
# LOG holds one reason per skipped test (tests/gpu_main.cpp); nothing is
# printed when no GPU test was skipped. Always exits 0: a summary, not a test.
log=$1
if [ -s "$log" ]; then
    sort "$log" | uniq -c | sort -rn |
        sed -e 's/^ *1 /1 GPU test skipped: /' -e t -e 's/^ *\([0-9][0-9]*\) /\1 GPU tests skipped: /'
fi
exit 0
