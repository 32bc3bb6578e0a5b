#!/bin/sh
# Regenerates flashcore-sys/src/bindings.rs from include/flashcore.h.
#
#     scripts/regenerate-bindings.sh [OUTPUT]     (default: the committed file)
#
# Uses Debian's `bindgen` command (apt-get install bindgen libclang-dev) at the
# pinned version below, so the output is byte-for-byte reproducible and
# check-bindings.sh can compare it with the committed file. The flags:
#   --allowlist-*         only the flashcore_ / FLASHCORE_ API, nothing from libc
#   consts enums and --no-prepend-enum-name: statuses are plain u32 constants
#                         such as FLASHCORE_STATUS_NO_DEVICE; a Rust enum would be
#                         undefined behaviour the day the library returns a status
#                         added after these bindings were made
#   --size_t-is-usize     size_t is usize
#   --no-layout-tests     bindgen's tests hard-code this host's sizes; the sys
#                         crate checks the layout against the library instead
#   (no --use-core/--ctypes-prefix) C types as bindgen's default ::std::os::raw:
#                         core::ffi's c_int and friends need Rust 1.64, and the
#                         crates build with Debian 12's rustc 1.63 (rust-version)
#   -fparse-all-comments  the header's /* */ comments become rustdoc
# rustfmt formats the file with the workspace's rustfmt.toml (and no other config).
set -eu
. "$(dirname "$0")/common.sh"

BINDGEN_VERSION=0.60.1
header=$REPO_DIR/include/flashcore.h
out=${1:-$RUST_DIR/flashcore-sys/src/bindings.rs}

require_tool bindgen "apt-get install bindgen libclang-dev"
require_tool rustfmt "rustup component add rustfmt"
found=$(bindgen --version | sed -n 's/^bindgen //p')
if [ "$found" != "$BINDGEN_VERSION" ]; then
    skip "bindgen $found found, but the committed bindings are pinned to bindgen $BINDGEN_VERSION (Debian 12); other versions format differently"
fi

tmp_dir=$(mktemp -d)
trap 'rm -rf "$tmp_dir"' EXIT
bindgen "$header" \
    --allowlist-function 'flashcore_.*' \
    --allowlist-type 'flashcore_.*' \
    --allowlist-var 'FLASHCORE_.*' \
    --no-prepend-enum-name \
    --size_t-is-usize \
    --no-layout-tests \
    --no-rustfmt-bindings \
    --raw-line '// Generated from include/flashcore.h by bindings/rust/scripts/regenerate-bindings.sh; do not edit.' \
    --output "$tmp_dir/bindings.rs" \
    -- -fparse-all-comments
rustfmt --edition 2021 --config-path "$RUST_DIR/rustfmt.toml" "$tmp_dir/bindings.rs"
cp "$tmp_dir/bindings.rs" "$out"
