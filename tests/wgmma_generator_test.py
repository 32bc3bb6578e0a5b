#!/usr/bin/env python3
"""The wgmma generator (kernels/sm90/gen_wgmma.py), without a GPU:

1. run without options, it writes wgmma.cuh as checked in, byte for byte,
   and with --list, each header checked in beside a list (wgmma_e4m3.cuh);
2. it refuses variants PTX does not have (fp8 transposed, N not a multiple
   of 8 or over 256, mixed 16-bit types, a B-only MAJOR for ss ...);
3. the variant headers it writes for two families' lists (one variant in
   both) compile for sm_90a in one unit with wgmma.cuh, each variant in a
   kernel of its own;
4. each kernel's machine code (cuobjdump -sass) holds one HGMMA or QGMMA of
   the variant's shape and types, reading the operands the variant names
   transposed (.tnspA, .tnspB) and no others.
Without cuobjdump (or the nvdisasm it runs), steps 1-3 run and the test
reports itself skipped for step 4 (tests/report_tool_skip.sh).

wgmma_generator_test.py --source-dir DIR --nvcc NVCC [--ccbin CXX]
    [--cuobjdump CUOBJDUMP] --work-dir DIR
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

# Two families' variants: FORM:TYPES:MAJOR:NS (gen_wgmma.py's docstring).
FAMILY_A = ["ss:f16:mn.mn:64", "ss:bf16:k.mn:64,128", "ss:bf16:mn.k:16", "rs:bf16:k:64", "ss:e4m3:k.k:64,256"]
FAMILY_B = ["ss:f16:mn.mn:64", "rs:f16:mn:32", "rs:e4m3:k:32", "ss:e5m2.e4m3:k.k:8", "ss:f16:k.k:24"]

# Variants PTX has no instruction for, and a word of the reason each must give.
REFUSED = {
    "ss:e4m3:mn.k:64": "transpose",
    "rs:e5m2:mn:64": "transpose",
    "ss:f16:k.k:12": "multiple of 8",
    "ss:bf16:k.k:264": "multiple of 8",
    "ss:f16.bf16:k.k:64": "one type",
    "ss:f16.e4m3:k.k:64": "both 16-bit",
    "ss:f16:k:64": "A.B",
    "rs:f16:k.k:64": "B's",
    "xs:f16:k.k:64": "ss or rs",
    "ss:f32:k.k:64": "TYPES",
}

CXX_TYPES = {"f16": "__half", "bf16": "__nv_bfloat16", "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2"}
MAJORS = {"k": "WgmmaMajor::kK", "mn": "WgmmaMajor::kMN"}


def expand(specs):
    """[(form, a_type, b_type, majors, n)], each once."""
    out = []
    for spec in specs:
        form, types, major, ns = spec.split(":")
        a_type, b_type = (types.split(".") * 2)[:2]
        for n in ns.split(","):
            v = (form, a_type, b_type, tuple(major.split(".")), int(n))
            if v not in out:
                out.append(v)
    return out


def kernel_name(v):
    form, a_type, b_type, majors, n = v
    return "_".join(["wgmma", form, a_type, b_type] + list(majors) + ["n%d" % n])


def kernel_source(variants, headers):
    """One extern "C" kernel per variant, and one calling wgmma.cuh's rs."""
    lines = ['#include "wgmma.cuh"'] + ['#include "%s"' % h for h in headers] + [
        "using namespace flashcore::sm90;",
        "__device__ __forceinline__ void fence() { asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\"); }",
        "__device__ __forceinline__ void commit_and_wait() {",
        "    asm volatile(\"wgmma.commit_group.sync.aligned;\\nwgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\");",
        "}",
        "template <int N>",
        "__device__ __forceinline__ void store(float (&d)[N / 8][4], float *out) {",
        "    for (int j = 0; j < N / 8; ++j)",
        "        for (int e = 0; e < 4; ++e) out[(j * 4 + e) * 128 + threadIdx.x] = d[j][e];",
        "}",
    ]
    calls = []
    for v in variants:
        form, a_type, b_type, majors, n = v
        args = [CXX_TYPES[a_type], CXX_TYPES[b_type], str(n)] + [MAJORS[m] for m in majors]
        wrapper = "Wgmma%s<%s>" % (form.capitalize(), ", ".join(args))
        call = ("%s::mma(d, desc_a, desc_b, 1);" % wrapper if form == "ss" else "%s::mma(d, a, desc_b, 1);" % wrapper)
        calls.append((kernel_name(v), n, call))
    calls.append(("wgmma_default_rs_f16_n64", 64, "Wgmma<__half, 64>::rs(d, a, desc_b, 1);"))
    for name, n, call in calls:
        lines += [
            'extern "C" __global__ void %s(float *out, const uint32_t *in, uint64_t desc_a, uint64_t desc_b) {' % name,
            "    float d[%d][4] = {};" % (n // 8),
            "    const uint32_t a[4] = {in[threadIdx.x], in[threadIdx.x + 128], in[threadIdx.x + 256], "
            "in[threadIdx.x + 384]};",
            "    (void)a;",
            "    (void)desc_a;",
            "    fence();",
            "    " + call,
            "    commit_and_wait();",
            "    store<%d>(d, out);" % n,
            "}",
        ]
    return "\n".join(lines) + "\n"


def expected_sass(v):
    """A regex of the one GMMA instruction variant v's kernel must hold."""
    form, a_type, b_type, majors, n = v
    fp8 = a_type in ("e4m3", "e5m2")
    opcode = "QGMMA" if fp8 else "HGMMA"
    k = 32 if fp8 else 16
    # F16 inputs carry no type suffix; BF16 and fp8 do.
    types = ".%s.%s" % (a_type.upper(), b_type.upper()) if fp8 else (".BF16" if a_type == "bf16" else "")
    trans_a = form == "ss" and majors[0] == "mn"
    trans_b = majors[-1] == "mn"
    a_operand = r"R\d+, " if form == "rs" else ""
    return re.compile(r"\b%s\.64x%dx%d\.F32%s R\d+, %sgdesc\[UR\d+\]%s%s, " % (
        opcode, n, k, re.escape(types), a_operand, r"\.tnspA" if trans_a else "", r"\.tnspB" if trans_b else ""))


class Failures:
    def __init__(self):
        self.items = []

    def add(self, message):
        print("FAIL: " + message)
        self.items.append(message)


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw)


def check_default(gen, header, failures):
    r = run([sys.executable, gen])
    with open(header) as f:
        checked_in = f.read()
    if r.returncode != 0:
        failures.add("gen_wgmma.py without options failed: " + r.stderr)
    elif r.stdout != checked_in:
        failures.add("gen_wgmma.py without options does not reproduce %s byte for byte" % header)
    else:
        print("ok: gen_wgmma.py without options writes wgmma.cuh byte for byte (%d bytes)" % len(checked_in))


def check_checked_in_lists(gen, sm90_dir, failures):
    """Every wrapper header checked in beside a list of its variants
    (kernels/sm90/<name>.list -> <name>.cuh) is that list's, byte for byte."""
    for name in sorted(os.listdir(sm90_dir)):
        if not name.endswith(".list"):
            continue
        header = os.path.join(sm90_dir, name[:-len(".list")] + ".cuh")
        r = run([sys.executable, gen, "--list", os.path.join(sm90_dir, name)])
        if r.returncode != 0:
            failures.add("gen_wgmma.py --list %s failed: %s" % (name, r.stderr))
            continue
        try:
            with open(header) as f:
                checked_in = f.read()
        except OSError:
            failures.add("%s has no header %s beside it" % (name, os.path.basename(header)))
            continue
        if r.stdout != checked_in:
            failures.add("gen_wgmma.py --list %s does not reproduce %s byte for byte" % (name, header))
        else:
            print("ok: gen_wgmma.py --list %s writes %s byte for byte" % (name, os.path.basename(header)))


def check_refused(gen, failures):
    refused = 0
    for spec, reason in REFUSED.items():
        r = run([sys.executable, gen, "--variant", spec])
        if r.returncode == 0 or reason not in r.stderr:
            failures.add("gen_wgmma.py --variant %s: exit %d, %r (want a refusal naming %r)" % (
                spec, r.returncode, r.stderr.strip()[-200:], reason))
        else:
            refused += 1
    print("ok: %d of %d variants PTX does not have are refused" % (refused, len(REFUSED)))


def write_headers(gen, work, failures):
    """Family A's header from --variant options, family B's from a --list
    file; --output leaves an unchanged header alone."""
    a_path = os.path.join(work, "wgmma_family_a.cuh")
    b_path = os.path.join(work, "wgmma_family_b.cuh")
    list_path = os.path.join(work, "family_b.list")
    with open(list_path, "w") as f:
        f.write("# family B's wgmma variants\n" + "\n".join("%s  # one" % s for s in FAMILY_B) + "\n")
    for cmd in ([sys.executable, gen, "--output", a_path] + [x for s in FAMILY_A for x in ("--variant", s)],
                [sys.executable, gen, "--list", list_path, "--output", b_path]):
        r = run(cmd)
        if r.returncode != 0:
            failures.add("%s: %s" % (" ".join(cmd), r.stderr))
            return None
    before = os.stat(a_path).st_mtime_ns
    os.utime(a_path, ns=(before - 10**9, before - 10**9))
    r = run([sys.executable, gen, "--output", a_path] + [x for s in reversed(FAMILY_A) for x in ("--variant", s)])
    if r.returncode != 0 or os.stat(a_path).st_mtime_ns != before - 10**9:
        failures.add("--output rewrote a header whose text did not change (the same variants, in another order)")
    with open(a_path) as f:
        a_text = f.read()
    if "cuda_fp8.h" not in a_text:
        failures.add("family A's header, with fp8 variants, does not include cuda_fp8.h")
    return [os.path.basename(a_path), os.path.basename(b_path)]


def compile_kernels(args, work, headers, variants, failures):
    source = os.path.join(work, "wgmma_variants.cu")
    cubin = os.path.join(work, "wgmma_variants.cubin")
    with open(source, "w") as f:
        f.write(kernel_source(variants, headers))
    cmd = [args.nvcc, "-std=c++17", "-arch=sm_90a", "-cubin", "-o", cubin,
           "-I", os.path.join(args.source_dir, "kernels", "sm90"), "-I", work, source]
    if args.ccbin:
        cmd[1:1] = ["-ccbin", args.ccbin]
    r = run(cmd)
    if r.returncode != 0:
        failures.add("nvcc -arch=sm_90a failed on the variant headers:\n" + r.stdout + r.stderr)
        return None
    print("ok: %d variants (%s) compile for sm_90a with wgmma.cuh" % (len(variants), ", ".join(headers)))
    return cubin


def check_sass(cuobjdump, cubin, variants, failures):
    r = run([cuobjdump, "-sass", cubin])
    if r.returncode != 0:
        failures.add("cuobjdump -sass failed: " + r.stderr)
        return
    functions = {}
    for chunk in re.split(r"\n\s*Function : ", r.stdout)[1:]:
        name, _, body = chunk.partition("\n")
        functions[name.strip()] = [l for l in body.splitlines() if "GMMA" in l]
    expected = [(kernel_name(v), expected_sass(v)) for v in variants]
    expected.append(("wgmma_default_rs_f16_n64", expected_sass(("rs", "f16", "f16", ("mn",), 64))))
    for name, pattern in expected:
        gmma = functions.get(name)
        if gmma is None:
            failures.add("no function %s in the cubin" % name)
        elif len(gmma) != 1 or not pattern.search(gmma[0]):
            failures.add("%s: want one instruction matching %s, have %s" % (name, pattern.pattern, gmma))
        else:
            print("ok: %s: %s" % (name, re.sub(r"\s+", " ", gmma[0].split(";")[0].split("*/", 1)[-1]).strip()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--nvcc", required=True)
    parser.add_argument("--ccbin", default="")
    parser.add_argument("--cuobjdump", default="")
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    gen = os.path.join(args.source_dir, "kernels", "sm90", "gen_wgmma.py")
    header = os.path.join(args.source_dir, "kernels", "sm90", "wgmma.cuh")
    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = Failures()

    check_default(gen, header, failures)
    check_checked_in_lists(gen, os.path.dirname(gen), failures)
    check_refused(gen, failures)
    headers = write_headers(gen, work, failures)
    variants = expand(FAMILY_A + FAMILY_B)
    cubin = compile_kernels(args, work, headers, variants, failures) if headers else None

    cuobjdump = args.cuobjdump if args.cuobjdump and os.access(args.cuobjdump, os.X_OK) else shutil.which("cuobjdump")
    missing = None if cuobjdump else "cuobjdump not found (set FLASHCORE_CUOBJDUMP)"
    # cuobjdump -sass runs nvdisasm, which it looks for beside itself and on PATH.
    if cuobjdump and not (shutil.which("nvdisasm") or os.environ.get("NVDISASM_PATH")
                          or os.access(os.path.join(os.path.dirname(cuobjdump), "nvdisasm"), os.X_OK)):
        missing = "nvdisasm, which cuobjdump -sass runs, not found beside %s or on PATH" % cuobjdump
    if cubin and not missing:
        check_sass(cuobjdump, cubin, variants, failures)
    if failures.items:
        print("%d failures" % len(failures.items))
        return 1
    if cubin and missing:
        skip = os.path.join(args.source_dir, "tests", "report_tool_skip.sh")
        return subprocess.call(["sh", skip, os.environ.get("FLASHCORE_CTEST_NAME", "host.wgmma_generator"),
                                missing + ": the variants compile, their SASS is not checked"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
