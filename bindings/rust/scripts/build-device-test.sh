#!/bin/sh
# Builds the GPU test binary (tests/gpu) here, where cargo is, and copies it
# to bindings/rust/device/flashcore_gpu_test (git-ignored) for a GPU machine
# that has no cargo. Link against any build of libflashcore.so.0
# (FLASHCORE_LIB_DIR or pkg-config): only its SONAME and symbols matter; the
# machine running the test supplies its own through LD_LIBRARY_PATH.
#
# On the GPU machine, from the repository root:
#     LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/flashcore_gpu_test --nocapture
set -eu
. "$(dirname "$0")/common.sh"
require_cargo
require_tool readelf "apt-get install binutils"

cd "$RUST_DIR"
executable=$("$CARGO" test --offline --locked -p flashcore --test gpu --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -n "$executable" ] || { echo "FAILED: cargo printed no test executable" >&2; exit 1; }
mkdir -p device
cp "$executable" device/flashcore_gpu_test

needed=$(readelf -d device/flashcore_gpu_test | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
case " $needed" in
    *" libcuda"*) echo "FAILED: the test binary links libcuda at load time ($needed)" >&2; exit 1 ;;
    *" libflashcore.so.0 "*) ;;
    *) echo "FAILED: the test binary does not link libflashcore.so.0 ($needed)" >&2; exit 1 ;;
esac
glibc=$(readelf -V device/flashcore_gpu_test | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
echo "OK: $RUST_DIR/device/flashcore_gpu_test"
echo "    needs: $needed(symbols up to $glibc); libcuda.so.1 is opened at run time"
echo "    run:   LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/flashcore_gpu_test --nocapture"
