# Sourced by the scripts in this folder; POSIX sh.
#
# Every script exits 0 on success, 1 on failure and 77 (ctest's
# SKIP_RETURN_CODE) when a tool it needs is missing, after printing
# "SKIPPED: <why>". With FLASHCORE_REQUIRE_TOOLS=1 (CI sets it) a missing tool
# is a failure instead, so a broken CI image cannot turn the checks into skips.

RUST_DIR=$(cd "$(dirname "$0")/.." && pwd)
REPO_DIR=$(cd "$RUST_DIR/../.." && pwd)
CARGO=${CARGO:-cargo}

# skip WHY: reports why the check cannot run and exits (77, or 1 when tools are required).
skip() {
    if [ "${FLASHCORE_REQUIRE_TOOLS:-0}" = 1 ]; then
        echo "FAILED: $1 (FLASHCORE_REQUIRE_TOOLS=1)" >&2
        exit 1
    fi
    # Prints "SKIPPED: why" and adds the line ctest's closing summary prints
    # (tests/skip_summary.sh), so the reason shows without -V.
    sh "$REPO_DIR/tests/report_tool_skip.sh" "${FLASHCORE_CTEST_NAME:-$(basename "$0")}" "$1"
    exit 77
}

# require_tool COMMAND HOW-TO-INSTALL
require_tool() {
    command -v "$1" >/dev/null 2>&1 || skip "$1 not found on PATH; install it with: $2"
}

require_cargo() {
    require_tool "$CARGO" "rustup (https://rustup.rs) or apt-get install cargo"
}
