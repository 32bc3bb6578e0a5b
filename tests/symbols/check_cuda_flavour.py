#!/usr/bin/env python3
"""check_cuda_flavour.py [--require-machine-code] BUILD_DIR

What a built libflashcore needs of the NVIDIA driver, checked on the build
(no GPU or driver needed). A CUDA N build links the CUDA N.x runtime
statically and is to run on every driver for CUDA N.0 or newer (CUDA's
minor-version compatibility: 525.60.13+ for CUDA 12, 580.65.06+ for 13),
which holds when:

  runtime        flashcore_cuda_runtime_version() is the toolkit's N.x;
  machine code   every architecture of CMAKE_CUDA_ARCHITECTURES (and sm_90a
                 when the Hopper kernels are built) has machine code in the
                 library, so no driver has to JIT-compile PTX newer than
                 itself; PTX is only the newest architecture's, for GPUs
                 newer than the build (read with the toolkit's cuobjdump;
                 skipped where it has none, unless --require-machine-code);
  runtime calls  every CUDA runtime function the library's own objects call
                 is one CUDA N.0 already had (RUNTIME_FUNCTIONS: a reviewed
                 list; a call not in it fails here until it is added with
                 the release that introduced it);
  driver calls   every driver function the library asks for by name
                 (driver_function("cu..."), kernels/common/driver_function.h)
                 has a form no newer than CUDA 12.0 in the toolkit's
                 cudaTypedefs.h (PFN_<name>_v<version>): those of the
                 sources whose names are in the library;
  no link        no DT_NEEDED on libcuda or libcudart.

Prints what it found and the driver the library needs; exits 1 on any miss.
Run by ctest (symbols.cuda_flavour) and by .ci/run for the CUDA 12 build.
"""

import ctypes
import glob
import os
import re
import subprocess
import sys

# The version (1000 * major + 10 * minor) of the driver API forms the library
# asks for (kernels/common/driver_function.h: kDriverFunctionVersion).
DRIVER_FUNCTION_VERSION = 12000

# CUDA runtime functions the library may call, with the CUDA release that
# introduced each (as the library calls it). The launch stubs nvcc generates
# (__cuda*) are as old as the runtime.
RUNTIME_FUNCTIONS = {
    "cudaDeviceGetAttribute": 5000,
    "cudaDriverGetVersion": 2020,
    "cudaFuncSetAttribute": 9000,
    "cudaGetDevice": 1000,
    "cudaGetDeviceCount": 1000,
    "cudaGetErrorName": 7050,
    "cudaGetErrorString": 1000,
    "cudaGetLastError": 1000,
    "cudaLaunchKernel": 7000,
    "cudaLaunchKernelExC": 11080,
    "cudaSetDevice": 1000,
    # The 4-argument form (flags, query result) is CUDA 12.0's.
    "cudaGetDriverEntryPoint": 12000,
    # Only where the runtime has it (CUDART_VERSION >= 12050: the CUDA 13
    # build, which needs a CUDA 13 driver anyway).
    "cudaGetDriverEntryPointByVersion": 12050,
    "__cudaPopCallConfiguration": 1000,
    "__cudaPushCallConfiguration": 1000,
    "__cudaRegisterFatBinary": 1000,
    "__cudaRegisterFatBinaryEnd": 1000,
    "__cudaRegisterFunction": 1000,
    "__cudaRegisterVar": 1000,
    "__cudaUnregisterFatBinary": 1000,
    # nvcc 13's launch stubs (not in the CUDA 12 build's objects); dated 13.0,
    # the release that first emitted them into this library.
    "__cudaGetKernel": 13000,
    "__cudaLaunchKernel": 13000,
}


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"%s:[A-Z]+=(.*)$" % re.escape(name), line.rstrip("\n"))
            if m:
                return m.group(1)
    return None


def cpack_value(build, name):
    """A CPACK_* value the build wrote into CPackConfig.cmake: the flavour and
    its oldest driver (cmake/FlashcorePackaging.cmake, from CMakeLists.txt)."""
    with open(os.path.join(build, "CPackConfig.cmake")) as f:
        m = re.search(r'^set\(%s "(.*)"\)$' % re.escape(name), f.read(), re.MULTILINE)
    return m.group(1) if m else None


def run(*command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def version_text(version):
    return "%d.%d" % (version // 1000, version % 1000 // 10)


def check_machine_code(cuobjdump, library, architectures, sm90, check):
    """Machine code for every real architecture of the build (and sm_90a
    with the Hopper kernels); PTX only for the newest virtual one."""
    elves = set(re.findall(r"\.(sm_\d+a?)\.cubin", run(cuobjdump, "--list-elf", library)))
    ptx = set(re.findall(r"\.(sm_\d+a?)\.ptx", run(cuobjdump, "--list-ptx", library)))
    wanted_elves = set()
    wanted_ptx = set()
    for arch in architectures:
        m = re.match(r"^(\d+a?)(?:-(real|virtual))?$", arch)
        if not m:
            check(False, "CMAKE_CUDA_ARCHITECTURES entry %r is one this check reads" % arch)
            continue
        if m.group(2) in (None, "real"):
            wanted_elves.add("sm_" + m.group(1))
        if m.group(2) in (None, "virtual"):
            wanted_ptx.add("sm_" + m.group(1))
    if sm90:
        wanted_elves.add("sm_90a")
    check(wanted_elves <= elves, "machine code for %s (found: %s)" % (" ".join(sorted(wanted_elves)),
                                                                       " ".join(sorted(elves))))
    newest_ptx = max((int(re.sub(r"\D", "", a)) for a in wanted_ptx), default=None)
    check(all(int(re.sub(r"\D", "", a)) == newest_ptx for a in ptx) if ptx else not wanted_ptx,
          "PTX only for the newest architecture (found: %s)" % (" ".join(sorted(ptx)) or "none"))



def main():
    args = sys.argv[1:]
    require_machine_code = "--require-machine-code" in args
    args = [a for a in args if a != "--require-machine-code"]
    if len(args) != 1:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    build = os.path.abspath(args[0])
    failures = []

    def check(ok, message):
        print("  %s %s" % ("ok  " if ok else "FAIL", message))
        if not ok:
            failures.append(message)

    nvcc = cache_value(build, "CMAKE_CUDA_COMPILER")
    source = cache_value(build, "CMAKE_HOME_DIRECTORY")
    # (CMakeLists.txt records the list in effect, the default included.)
    architectures = (cache_value(build, "FLASHCORE_CUDA_ARCHITECTURES") or "").split(";")
    sm90 = (cache_value(build, "FLASHCORE_ENABLE_SM90") or "OFF").upper() in ("ON", "1", "TRUE", "YES")
    if not nvcc or not source:
        print("%s is not a configured flashcore build folder" % build, file=sys.stderr)
        return 2
    toolkit = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    libraries = sorted(glob.glob(os.path.join(build, "src", "libflashcore.so.*.*.*")))
    if not libraries:
        print("no libflashcore.so.MAJOR.MINOR.PATCH in %s/src: build it first" % build, file=sys.stderr)
        return 2
    library = libraries[0]
    print("library: %s" % library)

    # --- runtime
    runtime = ctypes.CDLL(library).flashcore_cuda_runtime_version()
    release = re.search(r"release (\d+)\.(\d+)", run(nvcc, "--version"))
    toolkit_version = int(release.group(1)) * 1000 + int(release.group(2)) * 10
    major = runtime // 1000
    check(runtime == toolkit_version, "CUDA runtime %s, the toolkit's (%s, %s)"
          % (version_text(runtime), version_text(toolkit_version), nvcc))
    flavour = cpack_value(build, "CPACK_FLASHCORE_CUDA_MAJOR")
    min_driver = cpack_value(build, "CPACK_FLASHCORE_MIN_DRIVER")
    check(flavour == str(major) and min_driver is not None,
          "the build's flavour is the runtime's: CUDA %s, driver %s+ (CPackConfig.cmake)" % (flavour, min_driver))

    # --- machine code and PTX
    # The toolkit's own cuobjdump: an older one names sm_90a code sm_90.
    cuobjdump = os.path.join(os.path.dirname(nvcc), "cuobjdump")
    if not os.access(cuobjdump, os.X_OK):
        print("  skip machine code and PTX: no cuobjdump beside %s (this toolkit has none)" % nvcc)
        if require_machine_code:
            check(False, "machine code checked (--require-machine-code)")
    else:
        check_machine_code(cuobjdump, library, architectures, sm90, check)
    # --- runtime functions the library's own objects call
    objects = [o for pattern in ("src/CMakeFiles/flashcore.dir/**/*.o", "kernels/CMakeFiles/**/*.o")
               for o in glob.glob(os.path.join(build, pattern), recursive=True)]
    called = set()
    for chunk in range(0, len(objects), 200):
        for line in run("nm", "-u", *objects[chunk:chunk + 200]).splitlines():
            name = line.split()[-1] if line.strip() else ""
            if re.match(r"^_*cuda[A-Z_]", name):
                called.add(name)
    unknown = sorted(n for n in called if n not in RUNTIME_FUNCTIONS)
    check(not unknown, "every CUDA runtime function called is in this script's reviewed list%s"
          % (": add %s with the release that introduced it" % ", ".join(unknown) if unknown else ""))
    newest_call = max((RUNTIME_FUNCTIONS.get(n, 0) for n in called), default=0)
    newer = sorted(n for n in called if RUNTIME_FUNCTIONS.get(n, 0) > major * 1000)
    check(not newer, "runtime calls (%d, from %d objects) are all in CUDA %d.0: %s"
          % (len(called), len(objects), major, ", ".join(sorted(called))))

    # --- driver functions asked for by name
    names = set()
    for pattern in ("src/**/*.cpp", "src/**/*.h", "kernels/**/*.cuh", "kernels/**/*.cu", "kernels/**/*.h"):
        for path in glob.glob(os.path.join(source, pattern), recursive=True):
            with open(path, encoding="utf-8") as f:
                names.update(re.findall(r"driver_function(?:<[^>]*>)?\(\"(cu[A-Za-z0-9_]+)\"\)", f.read()))
    check(bool(names), "driver functions asked for by name found in the sources")
    with open(os.path.join(toolkit, "include", "cudaTypedefs.h")) as f:
        typedefs = f.read()
    with open(library, "rb") as f:
        binary = f.read()
    asked = sorted(n for n in names if n.encode() + b"\0" in binary)
    check(bool(asked), "driver functions asked for by name are in the library (%s; not in this build: %s)"
          % (", ".join(asked), ", ".join(sorted(names - set(asked))) or "none"))
    for name in asked:
        forms = sorted({int(v) for v in re.findall(r"\bPFN_%s_v(\d+)\b" % re.escape(name), typedefs)})
        check(bool(forms) and forms[0] <= DRIVER_FUNCTION_VERSION,
              "driver function %s: forms %s in cudaTypedefs.h, asked for as of CUDA %s"
              % (name, forms or "none", version_text(DRIVER_FUNCTION_VERSION)))

    # --- no link-time dependency on the driver or the shared runtime
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", run("readelf", "-d", library))
    check(not [n for n in needed if n.startswith(("libcuda.", "libcudart."))],
          "no DT_NEEDED on libcuda or libcudart (needs: %s)" % ", ".join(needed))

    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("-- CUDA %s build: needs an NVIDIA driver for CUDA %d.0 or newer (%s+); newest runtime call from CUDA %s"
          % (version_text(runtime), major, min_driver, version_text(newest_call)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
