#!/bin/sh
# The sm_90a kernels' compiler launcher (cmake/fail_on_injected_wgmma_fences.sh)
# fails a compile whose output reports C7515, C7519 or C7520, passes the others with
# their exit status, and passes the output on: run on stand-in compilers.
# Usage: check_wgmma_fence_launcher.sh PROJECT_SOURCE_DIR
set -u
launcher="$1/cmake/fail_on_injected_wgmma_fences.sh"
failures=0
expect() {  # expect STATUS DESCRIPTION COMMAND...
    want=$1 what=$2
    shift 2
    output=$(sh "$launcher" "$@" 2>&1)
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: $what: exit status $got, expected $want; output: $output"
        failures=$((failures + 1))
    fi
}
injected='ptxas info    : (C7519) warpgroup.arrive is injected in around line 1085 by compiler'
serialized='ptxas info    : (C7520) wgmma is serialized'
expect 1 "C7519 fails the compile" sh -c "echo '$injected' >&2"
expect 1 "C7520 fails the compile" sh -c "echo '$serialized' >&2"
expect 1 "C7515 fails the compile" sh -c "echo 'ptxas info    : (C7515) wgmma.mma_async instructions are serialized' >&2"
expect 0 "a clean compile passes" sh -c "echo 'ptxas info    : 0 bytes stack frame' >&2"
expect 3 "a failed compile keeps its status" sh -c "echo '$injected' >&2; exit 3"
output=$(sh "$launcher" sh -c "echo 'ptxas info    : 0 bytes stack frame' >&2" 2>&1)
case "$output" in
*"0 bytes stack frame"*) ;;
*) echo "FAIL: the compiler's output is not passed on: '$output'"; failures=$((failures + 1)) ;;
esac
[ "$failures" -eq 0 ] && echo "the launcher fails C7515/C7519/C7520 and passes the rest"
exit "$failures"
