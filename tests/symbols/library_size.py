#!/usr/bin/env python3
"""library_size.py [--budget | --max-bytes N] [--units] BUILD_DIR

Where the bytes of a built libflashcore go, and whether it keeps its budget.
Nearly all of the library is device code: one fat binary per kernel
translation unit (kernels/kernels.list: one per line and input type), each
holding machine code for every real architecture of the build and PTX for
the newest, compressed or not (FLASHCORE_FATBIN_COMPRESSION). It prints:

  library        the file's bytes, its device code (.nv_fatbin) and the rest;
  architecture   per image kind the library holds (sm_80, sm_90, sm_90a
                 machine code, PTX): images, bytes stored, bytes unpacked;
  tile           per family, path and tile of kernels/kernels.list (and the
                 merge kernel): bytes stored, per architecture;
  units          with --units, every translation unit, largest first.

The library's images are read from its own .nv_fatbin section; the tiles
from the kernel objects in BUILD_DIR (each a unit of known name), whose
total must match the library's (else the report says what it could not
place). cuobjdump, where found, names the architectures the library holds
and is checked against the section's own.

--max-bytes N: exit 1 when the library file is larger than N bytes.
--budget: the same with the build's FLASHCORE_LIBRARY_BUDGET_BYTES (CMakeLists.txt),
where the build has the default architectures and every head dim (the
library the budget is for); other builds are reported, not checked. ctest
symbols.library_size runs it so; .ci/run also on the CUDA 12 build.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
# kind, version, header size, padded payload size, 4 words, sm, 2 words, flags, 2 quads
# (the last: the unpacked size of a compressed image, else 0).
FATBIN_ENTRY = struct.Struct("<HHIIIIIIIIIQQQ")
ENTRY_KIND_PTX = 1
ENTRY_KIND_ELF = 2
# Entry flag of architecture-specific code (sm_90a).
ENTRY_FLAG_ARCH_SPECIFIC = 0x100000
# A generated unit's object: <family>_<path>_<dtype>[_kv<kv>][_to_<out>]_hdim<D>x<DV>_<tile>.cu.o
UNIT_NAME = re.compile(r"^(?P<family>[a-z0-9]+)_(?P<path>sm\d+)_(?P<types>.+)_hdim(?P<dims>\d+x\d+)_(?P<tile>[a-z0-9]+)\.cu\.o$")


def section_bytes(path, name):
    """The contents of ELF64 section `name` of the file at `path` (b"" if none)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit("%s: not a 64-bit ELF file" % path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    names = header(shstrndx)
    for i in range(shnum):
        h = header(i)
        end = data.index(b"\0", names[4] + h[0])
        if data[names[4] + h[0]:end].decode() == name:
            return data[h[4]:h[4] + h[5]]
    return b""


def fatbin_images(blob):
    """Every image of the fat binaries in a .nv_fatbin section, in order:
    (architecture name, stored bytes, unpacked bytes)."""
    images = []
    off = 0
    while off + FATBIN_HEADER.size <= len(blob):
        magic, _, header_size, payload = FATBIN_HEADER.unpack_from(blob, off)
        if magic != FATBIN_MAGIC:
            off += 8  # fat binaries are 8-byte aligned, padded with zeros
            continue
        entry = off + header_size
        end = entry + payload
        while entry < end:
            f = FATBIN_ENTRY.unpack_from(blob, entry)
            kind, entry_header, padded, sm, flags, unpacked = f[0], f[2], f[3], f[8], f[11], f[13]
            arch = "sm_%d%s" % (sm, "a" if flags & ENTRY_FLAG_ARCH_SPECIFIC else "")
            name = arch if kind == ENTRY_KIND_ELF else "compute_%d (PTX)" % sm
            stored = entry_header + padded
            images.append((name, stored, unpacked if unpacked else padded))
            entry += entry_header + padded
        off = end
    return images


def library_file(build):
    candidates = [p for p in glob.glob(os.path.join(build, "src", "libflashcore.so*"))
                  if os.path.isfile(p) and not os.path.islink(p)]
    if not candidates:
        raise SystemExit("no libflashcore.so in %s/src: build the library first" % build)
    return max(candidates, key=os.path.getsize)


def unit_objects(build):
    return sorted(glob.glob(os.path.join(build, "kernels", "CMakeFiles", "*", "generated", "*.cu.o")) +
                  glob.glob(os.path.join(build, "kernels", "CMakeFiles", "*", "merge", "*.cu.o")))


def cuobjdump_architectures(library):
    """The architectures cuobjdump lists in the library, or None without it."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    listed = collections.Counter()
    for flag, pattern, fmt in (("--list-elf", r"\.(sm_\d+a?)\.cubin", "%s"),
                               ("--list-ptx", r"\.sm_(\d+)a?\.ptx", "compute_%s (PTX)")):
        out = subprocess.run([tool, flag, library], capture_output=True, text=True).stdout
        for arch in re.findall(pattern, out):
            listed[fmt % arch] += 1
    return listed


def cache_values(build):
    """The build's CMakeCache.txt entries, as strings."""
    values = {}
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                values[m.group(1)] = m.group(2)
    return values


def budget_of(build):
    """(bytes, None) for a build the budget is for, else (None, why not)."""
    cache = cache_values(build)
    budget = cache.get("FLASHCORE_LIBRARY_BUDGET_BYTES")
    if not budget:
        return None, "the build has no FLASHCORE_LIBRARY_BUDGET_BYTES"
    if cache.get("FLASHCORE_CUDA_ARCHITECTURES") != cache.get("FLASHCORE_DEFAULT_CUDA_ARCHITECTURES"):
        return None, "its architectures (%s) are not the default ones (%s)" % (
            cache.get("FLASHCORE_CUDA_ARCHITECTURES"), cache.get("FLASHCORE_DEFAULT_CUDA_ARCHITECTURES"))
    if cache.get("FLASHCORE_HEAD_DIMS"):
        return None, "it has only head dims %s" % cache["FLASHCORE_HEAD_DIMS"]
    return int(budget), None


def mb(n):
    return "%.2f" % (n / 1e6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("build", help="the CMake build folder")
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument("--max-bytes", type=int, default=None, help="fail when the library is larger")
    limit.add_argument("--budget", action="store_true",
                       help="fail when a default build's library is larger than its budget")
    parser.add_argument("--units", action="store_true", help="list every translation unit")
    args = parser.parse_args()

    library = library_file(args.build)
    size = os.path.getsize(library)
    images = fatbin_images(section_bytes(library, ".nv_fatbin"))
    device = sum(stored for _, stored, _ in images)
    print("library %s: %s MB (%d bytes): device code %s MB, the rest (host code, data) %s MB"
          % (os.path.basename(library), mb(size), size, mb(device), mb(size - device)))

    by_arch = collections.OrderedDict()
    for arch, stored, unpacked in sorted(images):
        n, s, u = by_arch.get(arch, (0, 0, 0))
        by_arch[arch] = (n + 1, s + stored, u + unpacked)
    print("\n%-18s %7s %11s %13s" % ("architecture", "images", "stored MB", "unpacked MB"))
    for arch, (n, s, u) in by_arch.items():
        print("%-18s %7d %11s %13s" % (arch, n, mb(s), mb(u)))
    listed = cuobjdump_architectures(library)
    if listed is not None:
        found = collections.Counter({arch: n for arch, (n, _, _) in by_arch.items()})
        # An older cuobjdump names sm_90a code sm_90: compare without the suffix then.
        if listed != found and collections.Counter(a.rstrip("a") for a in listed.elements()) != \
                collections.Counter(a.rstrip("a") for a in found.elements()):
            print("cuobjdump lists other images: %s" % dict(listed))
            return 1

    units = []
    for obj in unit_objects(args.build):
        name = os.path.basename(obj)
        m = UNIT_NAME.match(name)
        key = (m.group("family"), m.group("path"), m.group("tile")) if m else ("merge", "sm80", "-")
        unit_images = fatbin_images(section_bytes(obj, ".nv_fatbin"))
        units.append((name, key, unit_images))
    placed = sum(stored for _, _, imgs in units for _, stored, _ in imgs)
    archs = list(by_arch)
    tiles = collections.OrderedDict()
    for _, key, imgs in sorted(units, key=lambda u: u[1]):
        row = tiles.setdefault(key, collections.Counter())
        for arch, stored, _ in imgs:
            row[arch] += stored
    header = "%-6s %-5s %-11s %9s" % ("family", "path", "tile", "MB") + "".join(" %14s" % a.split(" ")[0] for a in archs)
    print("\n" + header)
    for (family, path, tile), row in tiles.items():
        print("%-6s %-5s %-11s %9s" % (family, path, tile, mb(sum(row.values()))) +
              "".join(" %14s" % (mb(row[a]) if row[a] else "-") for a in archs))
    if placed != device:
        print("%s MB of the library's device code is in no kernel object of %s (a unit built elsewhere, or the "
              "objects are older than the library)" % (mb(device - placed), args.build))
    if args.units:
        print("\n%-60s %9s" % ("unit", "MB"))
        for name, _, imgs in sorted(units, key=lambda u: -sum(s for _, s, _ in u[2])):
            print("%-60s %9s" % (name, mb(sum(s for _, s, _ in imgs))))

    if args.budget:
        args.max_bytes, why_not = budget_of(args.build)
        if why_not:
            print("\nbudget not checked: %s" % why_not)
    if args.max_bytes is not None:
        if size > args.max_bytes:
            print("\nFAILED: the library is %d bytes, over its budget of %d (%s MB)" % (size, args.max_bytes,
                                                                                      mb(args.max_bytes)))
            return 1
        print("\nwithin the budget: %d of %d bytes (%s MB left)" % (size, args.max_bytes, mb(args.max_bytes - size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
