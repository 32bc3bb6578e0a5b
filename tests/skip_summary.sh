#!/bin/sh
# skip_summary.sh GPU_LOG [TEST_LOG_DIR]: after a ctest run (CTEST_CUSTOM_POST_TEST,
# written by tests/CMakeLists.txt), says what did not run and why, so that
# "100% tests passed" never hides a skip:
#   - one line per reason the GPU tests were skipped for, e.g.
#     "5602 GPU tests skipped: no CUDA device: no NVIDIA driver found (...)".
#     GPU_LOG holds one reason per skipped test (tests/gpu_main.cpp);
#   - one line per other test that skipped because a tool is missing, e.g.
#     "python_pytest skipped: pytest is not installed for ... (pip install pytest)",
#     read from ctest's own log of the run (LastTest*.log in TEST_LOG_DIR):
#     the test's output line that says why, as the binding and consumer
#     checks print it ("SKIP: ", "SKIPPED: ", "-- SKIP: ",
#     "flashcore-python-skip: ").
# Nothing is printed for what ran. Always exits 0: a summary, not a test.
log=$1
test_log_dir=$2
if [ -s "$log" ]; then
    sort "$log" | uniq -c | sort -rn |
        sed -e 's/^ *1 /1 GPU test skipped: /' -e t -e 's/^ *\([0-9][0-9]*\) /\1 GPU tests skipped: /'
fi
if [ -n "$test_log_dir" ]; then
    # The newest log: LastTest.log, or LastTest_<time>.log in dashboard mode.
    test_log=$(ls -t "$test_log_dir"/LastTest*.log 2>/dev/null | head -n 1)
    if [ -n "$test_log" ]; then
        # Each test's block starts "<n>/<total> Testing: <name>" and its output
        # lies between "Output:" and "<end of output>"; the GPU tests are
        # summed up above.
        awk '
            /^[0-9]+\/[0-9]+ Testing: / { name = $3; in_output = 0; said = 0; next }
            /^Output:$/ { in_output = 1; next }
            /^<end of output>$/ { in_output = 0; next }
            in_output && !said && name !~ /^gpu\./ &&
                match($0, /^(-- )?(SKIP|SKIPPED|flashcore-python-skip): /) {
                print name " skipped: " substr($0, RLENGTH + 1)
                said = 1
            }
        ' "$test_log"
    fi
fi
exit 0
