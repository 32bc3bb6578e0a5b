#!/bin/sh
# Compiler launcher of the sm_90a kernels (kernels/CMakeLists.txt): runs the
# compile it is given and fails it where ptxas reports that it had to fence
# wgmma itself:
#   C7519  "warpgroup.arrive is injected ... to allow use of registers in GMMA":
#          registers a wgmma reads or writes are touched where the code has
#          no fence; ptxas adds one, and schedules around it.
#   C7515, C7520  wgmmas serialized: ptxas could not keep them asynchronous
#          (paths that commit different numbers of groups, a warpgroup.arrive
#          in a divergent path).
# ptxas prints both as "info", which --warning-as-error does not turn into
# errors, so the kernels' build would pass with them as it passes with none.
# Every line of the compile's own output is passed on (stderr).
# Usage: fail_on_injected_wgmma_fences.sh COMPILER ARGS...
set -u
log=$(mktemp "${TMPDIR:-/tmp}/flashcore-ptxas.XXXXXX") || exit 1
"$@" 2>"$log"
status=$?
cat "$log" >&2
if [ "$status" -eq 0 ] && grep -Eq '\(C75(15|19|20)\)' "$log"; then
    echo "error: ptxas fenced or serialized wgmma itself (C7515/C7519/C7520 above) in a kernel of this" \
         "unit: fence in the code (sm90/ptx.cuh: wgmma_fence, fence_accumulators) so that ptxas needs" \
         "none; docs/log/hopper.md has the cases met so far" >&2
    status=1
fi
rm -f "$log"
exit "$status"
