#!/usr/bin/env bash
# check_debian_packages.sh BUILD_DIR
#
# The Debian packages end to end, on a Debian machine with nothing of
# flashcore installed (needs root or sudo, dpkg-dev, lintian, pkg-config, cc,
# cmake):
#   1. cpack -G DEB and -G TGZ from BUILD_DIR (a configured and built tree),
#      into BUILD_DIR/packages; the runtime package is the build's flavour:
#      libflashcore0 (CUDA 13) or libflashcore0-cuda12 (CUDA 12), which
#      provides, conflicts with and replaces libflashcore0; each suggests the
#      driver it needs;
#   2. lintian on both .deb: any error fails, warnings are listed;
#   3. dpkg -i both; a C program built with `cc $(pkg-config --cflags --libs
#      flashcore)` and a CMake project using find_package(flashcore) are
#      built against /usr and run with no LD_LIBRARY_PATH (tests/consumers/);
#      without a driver they must report the no-device status with the
#      "no NVIDIA driver found" message; the installed library's CUDA
#      runtime is the flavour's (flashcore_cuda_runtime_version);
#   4. dpkg -r both, and what is named *flashcore* under /usr must be what was
#      there before (e.g. a pip-installed Python package), nothing more.
# The packages are removed again however the script ends.
set -euo pipefail
# No "producer | grep -q" below: grep -q exits at its first match, and a
# producer still writing (dpkg-deb -f writes a field a line at a time: 17
# writes for the Description) then dies of SIGPIPE, which pipefail turns into
# a failed check (a CI run failed so, at random, on the CUDA 12 package's
# description). grep reads a here-string of the producer's whole output.

if [ $# -ne 1 ]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
consumers="${source_dir}/tests/consumers"
work="${build}/packages"
soname_package=libflashcore0
dev_package=libflashcore-dev

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

flashcore_under_usr() {
    find /usr -name '*flashcore*' 2>/dev/null | sort || true
}

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "${build}/CMakeCache.txt")
if [ -z "${version}" ]; then
    echo "${build} is not a configured flashcore build folder" >&2
    exit 2
fi
# The flavour's runtime package and what it needs (cmake/FlashcorePackaging.cmake).
cpack_value() {
    sed -n "s/^set($1 \"\(.*\)\")\$/\1/p" "${build}/CPackConfig.cmake"
}
runtime_package=$(cpack_value CPACK_DEBIAN_RUNTIME_PACKAGE_NAME)
cuda_major=$(cpack_value CPACK_FLASHCORE_CUDA_MAJOR)
min_driver=$(cpack_value CPACK_FLASHCORE_MIN_DRIVER)
if [ -z "${runtime_package}" ] || [ -z "${cuda_major}" ] || [ -z "${min_driver}" ]; then
    echo "${build}/CPackConfig.cmake lacks the runtime package's name or flavour" >&2
    exit 2
fi
echo "--- flavour: CUDA ${cuda_major} build, runtime package ${runtime_package}, driver ${min_driver}+"
before=$(flashcore_under_usr)
if grep -q 'install ok installed' <<<"$(dpkg-query -W -f='${Status}\n' "${soname_package}" \
    "${soname_package}-cuda12" "${dev_package}" 2>/dev/null)" ||
    ls /usr/lib/libflashcore* /usr/lib/*/libflashcore* /usr/include/flashcore.h >/dev/null 2>&1; then
    echo "libflashcore is already installed under /usr; this check installs and removes its packages" >&2
    exit 1
fi

echo "--- cpack (DEB, TGZ) into ${work}"
rm -rf "${work}"
(cd "${build}" && cpack -G "DEB;TGZ" -B "${work}" >/dev/null)
rm -rf "${work}/_CPack_Packages"
runtime_deb=$(ls "${work}/${runtime_package}_${version}"-*.deb)
dev_deb=$(ls "${work}/${dev_package}_${version}"-*.deb)
ls -l "${work}"
for deb in "${runtime_deb}" "${dev_deb}"; do
    echo "$(basename "${deb}"):"
    dpkg-deb -f "${deb}" Package Version Architecture Section Depends Suggests Provides Conflicts Replaces |
        sed 's/^/  /'
done
runtime_version=$(dpkg-deb -f "${runtime_deb}" Version)
if [ "$(dpkg-deb -f "${dev_deb}" Depends)" != \
    "${soname_package} (= ${runtime_version}) | ${soname_package}-cuda12 (= ${runtime_version})" ]; then
    echo "${dev_package} must depend on exactly its own version of ${soname_package} or ${soname_package}-cuda12" >&2
    exit 1
fi
[ "$(dpkg-deb -f "${runtime_deb}" Suggests)" = "libcuda1 (>= ${min_driver})" ] ||
    { echo "${runtime_package} must suggest libcuda1 (>= ${min_driver}), the driver it needs" >&2; exit 1; }
grep -q "CUDA ${cuda_major}.0 or newer (driver ${min_driver} or newer)" <<<"$(dpkg-deb -f "${runtime_deb}" Description)" ||
    { echo "${runtime_package}'s description does not say which driver it needs" >&2; exit 1; }
if [ "${runtime_package}" != "${soname_package}" ]; then
    for field in Conflicts Replaces; do
        [ "$(dpkg-deb -f "${runtime_deb}" "${field}")" = "${soname_package}" ] ||
            { echo "${runtime_package}: ${field} must be ${soname_package}" >&2; exit 1; }
    done
    [ "$(dpkg-deb -f "${runtime_deb}" Provides)" = "${soname_package} (= ${runtime_version})" ] ||
        { echo "${runtime_package} must provide ${soname_package} (= ${runtime_version})" >&2; exit 1; }
fi
grep -q 'libc6 (>= ' <<<"$(dpkg-deb -f "${runtime_deb}" Depends)" ||
    { echo "${runtime_package} has no libc6 dependency: was dpkg-shlibdeps run?" >&2; exit 1; }

echo "--- lintian"
# lintian exits non-zero on errors; warnings are printed and allowed.
lintian --tag-display-limit 0 "${runtime_deb}" "${dev_deb}" 2>&1 | grep -v 'running with root privileges' || true
lintian --fail-on error "${runtime_deb}" "${dev_deb}" >/dev/null 2>&1 ||
    { echo "lintian reports errors (above)" >&2; exit 1; }

remove_packages() {
    as_root dpkg -r "${dev_package}" "${runtime_package}" >/dev/null 2>&1 || true
}
trap remove_packages EXIT

echo "--- dpkg -i"
as_root dpkg -i "${runtime_deb}" "${dev_deb}"

# A program built against /usr, run as it is (no LD_LIBRARY_PATH): passes its
# checks, loads the library from the package, and, without a driver, says so.
run_consumer() {
    local program=$1
    local deps output loaded
    deps=$(env -u LD_LIBRARY_PATH ldd "${program}")
    echo "${deps}" | grep 'libflashcore' | sed 's/^\s*/  ldd: /'
    # (Debian's /lib is /usr/lib: compare the real paths.)
    loaded=$(echo "${deps}" | sed -n 's/^\s*libflashcore\.so\.0 => \([^ ]*\) .*/\1/p')
    [ -n "${loaded}" ] && [ "$(readlink -f "${loaded}")" = "$(readlink -f "/usr/lib/libflashcore.so.0")" ] ||
        { echo "${program} does not load /usr's libflashcore.so.0 (${loaded:-not found})" >&2; exit 1; }
    output=$(env -u LD_LIBRARY_PATH "${program}") || { echo "${output}"; echo "${program} failed" >&2; exit 1; }
    echo "${output}" | grep -E 'flashcore_create|check\(s\) failed' | sed 's/^/  /'
    if ! ldconfig -p | grep 'libcuda\.so\.1 ' >/dev/null; then
        grep -q 'flashcore_create: no CUDA device or driver (no NVIDIA driver found' <<<"${output}" ||
            { echo "${program}: no 'no NVIDIA driver found' message without a driver" >&2; exit 1; }
    fi
}

echo "--- the installed library's CUDA runtime"
runtime=$(python3 -c 'import ctypes; print(ctypes.CDLL("libflashcore.so.0").flashcore_cuda_runtime_version())')
echo "  flashcore_cuda_runtime_version() = ${runtime}"
[ "$((runtime / 1000))" = "${cuda_major}" ] ||
    { echo "${runtime_package} holds a CUDA ${runtime} library, not a CUDA ${cuda_major} one" >&2; exit 1; }

echo "--- C consumer through pkg-config"
flags=$(env -u PKG_CONFIG_PATH pkg-config --cflags --libs flashcore)
echo "  pkg-config --cflags --libs flashcore: ${flags}"
[ "$(env -u PKG_CONFIG_PATH pkg-config --modversion flashcore)" = "${version}" ]
# shellcheck disable=SC2086 # the flags are words
cc -std=c99 -Wall -Wextra -Werror -I"${source_dir}/tests/header" "${consumers}/consumer.c" ${flags} \
    -o "${work}/consumer_pkgconfig"
run_consumer "${work}/consumer_pkgconfig"

echo "--- CMake consumer through find_package(flashcore)"
cmake -S "${consumers}/cmake_project" -B "${work}/cmake_consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DFLASHCORE_EXPECTED_PREFIX=/usr \
    -DFLASHCORE_EXPECTED_VERSION="${version}" >/dev/null
cmake --build "${work}/cmake_consumer" >/dev/null
run_consumer "${work}/cmake_consumer/bin/flashcore_cmake_consumer"

echo "--- dpkg -r"
trap - EXIT
as_root dpkg -r "${dev_package}" "${runtime_package}"
left=$(comm -13 <(echo "${before}") <(flashcore_under_usr))
if [ -n "${left}" ]; then
    echo "left under /usr after dpkg -r:" >&2
    echo "${left}" >&2
    exit 1
fi
if grep -q 'install ok installed' <<<"$(dpkg-query -W -f='${Status}\n' "${runtime_package}" "${dev_package}" 2>/dev/null)"; then
    echo "dpkg still lists a flashcore package as installed" >&2
    exit 1
fi
echo "packages built, installed, used, removed: nothing of flashcore left under /usr"
