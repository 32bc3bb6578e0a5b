#!/bin/sh
# report_tool_skip.sh TEST REASON: for a check that cannot run because a tool
# is missing: prints "SKIPPED: REASON", appends "TEST skipped: REASON" to
# $FLASHCORE_TOOL_SKIP_LOG (when set: ctest sets it, and skip_summary.sh
# prints the log after the run) and exits 77, ctest's SKIP_RETURN_CODE.
echo "SKIPPED: $2"
if [ -n "${FLASHCORE_TOOL_SKIP_LOG:-}" ]; then
    echo "$1 skipped: $2" >>"$FLASHCORE_TOOL_SKIP_LOG"
fi
exit 77
