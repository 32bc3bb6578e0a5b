#!/bin/sh
# Builds the GPU test binary (tests/gpu) and the cudarc adapter example here,
# where cargo is, and copies them to bindings/rust/device/ (git-ignored) as
# flashcore_gpu_test and cudarc_adapter, for a GPU machine that has no cargo.
# Link against any build of libflashcore.so.0 (FLASHCORE_LIB_DIR or
# pkg-config): only its SONAME and symbols matter; the machine running them
# supplies its own through LD_LIBRARY_PATH.
#
# On the GPU machine, from the repository root:
#     LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/flashcore_gpu_test
#     LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/cudarc_adapter
set -eu
. "$(dirname "$0")/common.sh"
require_cargo
require_tool readelf "apt-get install binutils"

# executable CARGO-ARGS...: the path of the last executable cargo built.
executable() {
    path=$("$CARGO" "$@" --offline --locked -p flashcore --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
    [ -n "$path" ] || { echo "FAILED: cargo $* printed no executable" >&2; exit 1; }
    echo "$path"
}

# install_for_device SOURCE NAME: copies SOURCE to device/NAME after checking that it
# links libflashcore.so.0 and not libcuda (opened at run time, if there).
install_for_device() {
    cp "$1" "device/$2"
    needed=$(readelf -d "device/$2" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    case " $needed" in
        *" libcuda"*) echo "FAILED: $2 links libcuda at load time ($needed)" >&2; exit 1 ;;
        *" libflashcore.so.0 "*) ;;
        *) echo "FAILED: $2 does not link libflashcore.so.0 ($needed)" >&2; exit 1 ;;
    esac
    glibc=$(readelf -V "device/$2" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
    echo "OK: $RUST_DIR/device/$2"
    echo "    needs: $needed(symbols up to $glibc); libcuda.so.1 is opened at run time"
}

cd "$RUST_DIR"
mkdir -p device
install_for_device "$(executable test --test gpu --no-run)" flashcore_gpu_test
install_for_device "$(executable build --example cudarc_adapter)" cudarc_adapter
echo "run: LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/flashcore_gpu_test"
echo "     LD_LIBRARY_PATH=<folder of libflashcore.so.0> bindings/rust/device/cudarc_adapter"
