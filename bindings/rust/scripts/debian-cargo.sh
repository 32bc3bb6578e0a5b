#!/bin/sh
# Runs another script of this folder with Debian 12's own cargo and rustc
# (/usr/bin, `apt-get install cargo`: rustc 1.63, the crates' rust-version)
# instead of rustup's, e.g.
#
#     scripts/debian-cargo.sh cargo-test.sh        (ctest: rust_cargo_test_debian)
#     scripts/debian-cargo.sh check-build-time.sh
#
# FLASHCORE_DEBIAN_CARGO names another cargo to use the same way.
set -eu
. "$(dirname "$0")/common.sh"

[ "$#" -ge 1 ] || { echo "usage: $0 SCRIPT [ARGS...]" >&2; exit 2; }
debian_cargo=${FLASHCORE_DEBIAN_CARGO:-/usr/bin/cargo}
[ -x "$debian_cargo" ] || skip "Debian's cargo not found at $debian_cargo; install it with: apt-get install cargo"
bin=$(dirname "$debian_cargo")
# Debian's cargo runs the first `rustc` on PATH, which may be rustup's (and
# would then test nothing): name its own rustc and rustdoc, and put them first.
CARGO=$debian_cargo RUSTC=$bin/rustc RUSTDOC=$bin/rustdoc PATH=$bin:$PATH
# A target folder of its own: sharing one with another cargo would rebuild
# everything at each switch.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$RUST_DIR/target}/debian-cargo
export CARGO RUSTC RUSTDOC PATH CARGO_TARGET_DIR
echo "$("$CARGO" --version), $("$RUSTC" --version)"

script=$1
shift
exec sh "$RUST_DIR/scripts/$script" "$@"
