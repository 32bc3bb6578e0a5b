#!/bin/sh
# `cargo test` of both crates, offline: unit tests, doctests and the GPU test
# (which prints SKIPPED and passes on a machine without a GPU). Extra
# arguments go to cargo, e.g. `-- --nocapture`.
#
# Links the library in FLASHCORE_LIB_DIR when set (and puts that folder on
# LD_LIBRARY_PATH so the tests can load it), else the one pkg-config finds.
set -eu
. "$(dirname "$0")/common.sh"
require_cargo

if [ -n "${FLASHCORE_LIB_DIR:-}" ]; then
    LD_LIBRARY_PATH=$FLASHCORE_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
cd "$RUST_DIR"
exec "$CARGO" test --offline --locked --workspace "$@"
