#!/bin/sh
# Drift check: regenerates the raw bindings into a temporary file and fails if
# they differ from the committed flashcore-sys/src/bindings.rs, i.e. if
# include/flashcore.h changed without scripts/regenerate-bindings.sh being run.
set -eu
. "$(dirname "$0")/common.sh"

committed=$RUST_DIR/flashcore-sys/src/bindings.rs
fresh_dir=$(mktemp -d)
trap 'rm -rf "$fresh_dir"' EXIT
# A skip (77) or failure of the generator is passed on as it is.
status=0
"$RUST_DIR/scripts/regenerate-bindings.sh" "$fresh_dir/bindings.rs" || status=$?
[ "$status" = 0 ] || exit "$status"

if diff -u "$committed" "$fresh_dir/bindings.rs"; then
    echo "OK: flashcore-sys/src/bindings.rs matches include/flashcore.h"
else
    echo "FAILED: flashcore-sys/src/bindings.rs is stale; run bindings/rust/scripts/regenerate-bindings.sh and commit the result" >&2
    exit 1
fi
