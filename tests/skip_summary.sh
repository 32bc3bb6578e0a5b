#!/bin/sh
# skip_summary.sh GPU_LOG [TOOL_LOG]: after a ctest run (CTEST_CUSTOM_POST_TEST,
# written by tests/CMakeLists.txt), says what did not run and why, so that
# "100% tests passed" never hides a skip:
#   - one line per reason the GPU tests were skipped for, e.g.
#     "5602 GPU tests skipped: no CUDA device: no NVIDIA driver found (...)";
#     GPU_LOG holds one reason per skipped test (tests/gpu_main.cpp);
#   - the lines of TOOL_LOG, one per other test that skipped because a tool
#     is missing, e.g. "python_pytest skipped: pytest is not installed for
#     ... (pip install pytest)", each written by the test as it skipped
#     (FLASHCORE_TOOL_SKIP_LOG: the binding and consumer checks).
# ctest empties both logs before a run. Nothing is printed for what ran.
# Always exits 0: a summary, not a test.
log=$1
tool_log=${2:-}
if [ -s "$log" ]; then
    sort "$log" | uniq -c | sort -rn |
        sed -e 's/^ *1 /1 GPU test skipped: /' -e t -e 's/^ *\([0-9][0-9]*\) /\1 GPU tests skipped: /'
fi
if [ -n "$tool_log" ] && [ -s "$tool_log" ]; then
    sort "$tool_log"
fi
exit 0
