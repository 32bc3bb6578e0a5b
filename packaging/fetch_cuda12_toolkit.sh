#!/usr/bin/env bash
# fetch_cuda12_toolkit.sh PREFIX
#
# The CUDA 12 compiler for libflashcore's CUDA 12 build, unpacked into
# PREFIX with the usual toolkit layout (bin/nvcc, include/, lib64/,
# nvvm/libdevice/), on a Debian 12 (or newer) machine: nvcc, cicc, the
# headers and the static runtime of CUDA 12.4 from Debian trixie's non-free
# packages, CCCL 2.8's headers and CUDA 12.9's ptxas from NVIDIA's wheels
# on PyPI (CCCL_WHEEL, PTXAS_WHEEL below say why). Nothing is installed on
# the system: apt reads its own sources list and package lists under
# PREFIX.download/ (the machine keeps its own suite), `apt-get download`
# fetches the .deb files there, and only the files the build needs are
# unpacked from them (about 190 MB of the 2.7 GB the packages hold). Needs
# apt-get, dpkg-deb, python3 with pip, and network access to
# deb.debian.org and PyPI; no root.
#
#   packaging/fetch_cuda12_toolkit.sh ~/.cache/flashcore/cuda-12.4
#   cmake -S . -B build-cuda12 -DCMAKE_CUDA_COMPILER=~/.cache/flashcore/cuda-12.4/bin/nvcc
#
# The toolkit's own binaries need only glibc 2.7; the host compiler is the
# machine's g++ (Debian 12: g++-12; CUDA 12.4 accepts g++ up to 13).
# Run again with the same PREFIX, it does nothing when PREFIX/bin/nvcc is
# already CUDA 12.4 with the ptxas asked for (so CI fetches it once per
# run, and a kept PREFIX once).
# Prints the path of nvcc last.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
prefix=$1
# The toolkit release the CUDA 12 build is made with (flashcore's oldest
# supported toolkit, CMakeLists.txt) and the Debian suite that carries it.
CUDA_RELEASE=12.4
SUITE=trixie
MIRROR=${FLASHCORE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# nvidia-cuda-toolkit: nvcc, cicc, ptxas, fatbinary, nvlink, cudafe++ and
# libdevice; nvidia-cuda-dev: the headers and the static runtime (the 930 MB
# package of every CUDA library, of which two files and the headers are
# used); libcudart12: the shared runtime, which the tests, the benchmark and
# the demo link (the library itself links the static one).
PACKAGES=(nvidia-cuda-toolkit nvidia-cuda-dev libcudart12)
# CCCL (libcu++, CUB, Thrust: headers only). Debian's libcu++-dev beside
# CUDA 12.4 is CCCL 2.3, whose cuda::ptx lacks the TMA and mbarrier
# wrappers the sm_90a kernels use (kernels/sm90/ptx.cuh); NVIDIA's own
# wheel of CCCL 2.8 for CUDA 12 has them and supports every CUDA 12 compiler.
CCCL_WHEEL=nvidia-cuda-cccl-cu12==12.9.27
# ptxas, which turns the PTX into machine code, from CUDA 12.9 (NVIDIA's
# wheel; it holds no nvcc, so the rest stays 12.4). 12.4's orders the
# sm_90a kernels' softmax worse: they ran up to 26% slower than the CUDA 13
# build on an H100, 12.9's match it (docs/log/perf.md, issue 32). Its
# machine code loads on every CUDA 12 driver as 12.4's does (minor-version
# compatibility covers cubins of any 12.x; only PTX newer than the driver
# could not be loaded, and the PTX stays cicc 12.4's). The toolkit keeps
# 12.4's as bin/ptxas-12.4; FLASHCORE_CUDA12_PTXAS=12.4 makes it the one used.
PTXAS_WHEEL=nvidia-cuda-nvcc-cu12==12.9.86
PTXAS_RELEASE=12.9
PTXAS_CHOICE=${FLASHCORE_CUDA12_PTXAS:-${PTXAS_RELEASE}}

nvcc_release() {
    "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p'
}

if [ -x "${prefix}/bin/nvcc" ] && [ "$(nvcc_release "${prefix}/bin/nvcc")" = "${CUDA_RELEASE}" ] &&
    [ "$(nvcc_release "${prefix}/bin/ptxas")" = "${PTXAS_CHOICE}" ]; then
    echo "CUDA ${CUDA_RELEASE} (ptxas ${PTXAS_CHOICE}) already in ${prefix}" >&2
    echo "${prefix}/bin/nvcc"
    exit 0
fi

download=${prefix}.download
mkdir -p "${download}/lists/partial" "${download}/cache/archives/partial" "${download}/debs"
echo "deb ${MIRROR} ${SUITE} main non-free" >"${download}/sources.list"
: >"${download}/status"
apt_options=(
    -o "Dir::Etc::SourceList=${download}/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=${download}/lists"
    -o "Dir::State::status=${download}/status"
    -o "Dir::Cache=${download}/cache"
    -o "APT::Architecture=amd64"
    # Downloads as the caller (root's default would hand them to _apt, which
    # cannot write into a caller's folder).
    -o "APT::Sandbox::User=$(id -un)"
)
echo "--- apt-get update (${SUITE} non-free, lists in ${download})" >&2
apt-get "${apt_options[@]}" update -qq >&2
echo "--- apt-get download ${PACKAGES[*]}" >&2
(cd "${download}/debs" && rm -f ./*.deb && apt-get "${apt_options[@]}" download -qq "${PACKAGES[@]}" >&2)

echo "--- pip download ${CCCL_WHEEL} ${PTXAS_WHEEL}" >&2
rm -f "${download}"/debs/*.whl
python3 -m pip download -q --no-deps --disable-pip-version-check -d "${download}/debs" "${CCCL_WHEEL}" "${PTXAS_WHEEL}" >&2

staging=${download}/root
rm -rf "${staging}" "${prefix}"
mkdir -p "${staging}"
# Only what nvcc and the library's build use (tar wildcards over each .deb's
# ./usr tree); the rest (cuBLAS, cuFFT, NPP, ... in nvidia-cuda-dev) stays packed.
wanted=(
    './usr/bin/ptxas' './usr/bin/fatbinary' './usr/bin/nvlink' './usr/bin/cudafe++'
    './usr/bin/bin2c' './usr/bin/cuobjdump' './usr/bin/nvprune' './usr/bin/cu++filt'
    './usr/lib/nvidia-cuda-toolkit/bin/nvcc' './usr/lib/nvidia-cuda-toolkit/bin/cicc'
    './usr/lib/nvidia-cuda-toolkit/bin/crt/*' './usr/lib/nvidia-cuda-toolkit/libdevice/*'
    './usr/include/*'
    './usr/lib/x86_64-linux-gnu/libcudart_static.a' './usr/lib/x86_64-linux-gnu/libcudadevrt.a'
    './usr/lib/x86_64-linux-gnu/libculibos.a' './usr/lib/x86_64-linux-gnu/stubs/libcuda.so'
    './usr/lib/x86_64-linux-gnu/libcudart.so.12*'
)
for deb in "${download}"/debs/*.deb; do
    echo "--- unpacking $(basename "${deb}")" >&2
    dpkg-deb --fsys-tarfile "${deb}" | tar -x -C "${staging}" --wildcards "${wanted[@]}" 2>/dev/null || true
done

# The usual layout, which CMake's FindCUDAToolkit and nvcc's own profile expect.
toolkit_bin=${staging}/usr/lib/nvidia-cuda-toolkit/bin
mkdir -p "${prefix}/bin" "${prefix}/nvvm/bin" "${prefix}/nvvm/libdevice" "${prefix}/lib64/stubs"
# Debian's /usr/bin/nvcc is a wrapper script; the compiler driver is the one beside cicc.
mv "${toolkit_bin}/nvcc" "${toolkit_bin}/crt" "${prefix}/bin/"
mv "${toolkit_bin}/cicc" "${prefix}/nvvm/bin/"
mv "${staging}"/usr/lib/nvidia-cuda-toolkit/libdevice/* "${prefix}/nvvm/libdevice/"
for tool in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvprune cu++filt; do
    mv "${staging}/usr/bin/${tool}" "${prefix}/bin/"
done
mv "${staging}/usr/include" "${prefix}/include"
python3 - "${download}"/debs/nvidia_cuda_cccl_cu12-*.whl "${download}"/debs/nvidia_cuda_nvcc_cu12-*.whl \
    "${prefix}" <<'PY'
import os, sys, zipfile
cccl_wheel, ptxas_wheel, prefix = sys.argv[1:4]
root = "nvidia/cuda_cccl/include/"
with zipfile.ZipFile(cccl_wheel) as z:
    for name in z.namelist():
        if name.startswith(root) and not name.endswith("/") and not name.endswith(".py"):
            z.extract(name, os.path.join(prefix, "include", ".cccl"))
with zipfile.ZipFile(ptxas_wheel) as z, open(os.path.join(prefix, "bin", "ptxas-12.9"), "wb") as out:
    out.write(z.read("nvidia/cuda_nvcc/bin/ptxas"))
os.chmod(os.path.join(prefix, "bin", "ptxas-12.9"), 0o755)
PY
mv "${prefix}"/include/.cccl/nvidia/cuda_cccl/include/* "${prefix}/include/"
rm -rf "${prefix}/include/.cccl"
mv "${prefix}/bin/ptxas" "${prefix}/bin/ptxas-12.4"
case "${PTXAS_CHOICE}" in
    12.4 | "${PTXAS_RELEASE}") ln -s "ptxas-${PTXAS_CHOICE}" "${prefix}/bin/ptxas" ;;
    *) echo "FLASHCORE_CUDA12_PTXAS=${PTXAS_CHOICE}: 12.4 or ${PTXAS_RELEASE}" >&2; exit 2 ;;
esac
for lib in libcudart_static.a libcudadevrt.a libculibos.a; do
    mv "${staging}/usr/lib/x86_64-linux-gnu/${lib}" "${prefix}/lib64/"
done
mv "${staging}/usr/lib/x86_64-linux-gnu/stubs/libcuda.so" "${staging}"/usr/lib/x86_64-linux-gnu/libcudart.so.12* \
    "${prefix}/lib64/"
mv "${prefix}/lib64/libcuda.so" "${prefix}/lib64/stubs/"
ln -s libcudart.so.12 "${prefix}/lib64/libcudart.so"
# nvcc reads nvcc.profile beside itself ($(_HERE_)); Debian's points at /etc.
cat >"${prefix}/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
{
    echo "CUDA ${CUDA_RELEASE} for libflashcore's CUDA 12 build, unpacked by packaging/fetch_cuda12_toolkit.sh from"
    (cd "${download}/debs" && ls ./*.deb ./*.whl | sed 's|^\./|  |')
} >"${prefix}/SOURCES.txt"
# The packages (1 GB) are not needed again: a second run finds nvcc and stops.
rm -rf "${staging}" "${download}/debs"

release=$(nvcc_release "${prefix}/bin/nvcc")
if [ "${release}" != "${CUDA_RELEASE}" ]; then
    echo "${prefix}/bin/nvcc reports release '${release}', not ${CUDA_RELEASE}" >&2
    exit 1
fi
if [ "$(nvcc_release "${prefix}/bin/ptxas")" != "${PTXAS_CHOICE}" ]; then
    echo "${prefix}/bin/ptxas reports release '$(nvcc_release "${prefix}/bin/ptxas")', not ${PTXAS_CHOICE}" >&2
    exit 1
fi
echo "--- $("${prefix}/bin/nvcc" --version | tail -n 2 | head -n 1), ptxas ${PTXAS_CHOICE}, in ${prefix} ($(du -sh "${prefix}" | cut -f1))" >&2
echo "${prefix}/bin/nvcc"
