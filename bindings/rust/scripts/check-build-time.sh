#!/bin/sh
# Build time is a feature: `cargo build` of both crates from a clean target
# folder must finish within FLASHCORE_RUST_BUILD_LIMIT_S seconds (default 30).
# Nothing is linked, so no library is needed.
set -eu
. "$(dirname "$0")/common.sh"
require_cargo

limit=${FLASHCORE_RUST_BUILD_LIMIT_S:-30}
target=${CARGO_TARGET_DIR:-$RUST_DIR/target}/clean-build-timing
rm -rf "$target"
cd "$RUST_DIR"
start=$(date +%s%N)
CARGO_TARGET_DIR=$target "$CARGO" build --offline --locked --workspace
end=$(date +%s%N)
rm -rf "$target"

ms=$(( (end - start) / 1000000 ))
seconds=$(( ms / 1000 )).$(( ms % 1000 / 100 ))
if [ "$ms" -gt $(( limit * 1000 )) ]; then
    echo "FAILED: cargo build of flashcore-sys and flashcore from clean took ${seconds} s, over the ${limit} s limit" >&2
    exit 1
fi
echo "OK: cargo build of flashcore-sys and flashcore from clean took ${seconds} s (limit ${limit} s, $(nproc) cores)"
