#!/usr/bin/env python3
"""The seam between families (issue 60's "one house for every family"):
adding a family touches only kernels/kernels.list, its folders
(kernels/<family>/, src/<family>/) and include/flashcore.h. So:

- the shared build and host files (kernels/CMakeLists.txt,
  src/CMakeLists.txt, src/*.{h,cpp,c}) hold no code that names a family of
  the list (an include of its folder, or an identifier such as fwd_kernels
  or read_bwd_settings): they reach the families through the generated
  tables (<family>_kernels.inc, families.inc) and the folders' sources;
- the kernels' shared folders (common/, sm80/, sm90/, merge/) include no
  family's folder, and no family's kernels include another family's.

(The parameter block every family reads, common/params.h, still carries
the forward's names: FwdKernelParams, fwd_q_offset and the like. Renaming
them is not a move, so it is not checked here yet.)

Comments may name families (they say why). The host folder src/bwd/ reads
the forward's checks (src/fwd/), by design: the backward is the gradient of
a forward call and validates that call.

    python3 tests/structure/check_family_seam.py [repo root]

Exits 1 listing each place that names a family where it must not."""

import os
import re
import sys

SHARED_KERNEL_FOLDERS = ("kernels/common", "kernels/sm80", "kernels/sm90", "kernels/merge")
SHARED_FILES = ("kernels/CMakeLists.txt", "src/CMakeLists.txt")
SOURCE_EXTENSIONS = (".h", ".cuh", ".cu", ".cpp", ".c", ".py", ".in", ".txt", ".cmake")


def list_families(root):
    families = []
    with open(os.path.join(root, "kernels", "kernels.list")) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields and fields[0] not in families:
                families.append(fields[0])
    return families


def code_lines(path):
    """(number, text) of each line with its comments removed."""
    text = open(path, encoding="utf-8").read()
    if path.endswith((".txt", ".cmake", ".py")):
        text = re.sub(r"#(?!include).*", "", text)
    else:
        text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        text = re.sub(r"//.*", "", text)
    return enumerate(text.split("\n"), 1)


def files_under(root, folder):
    for base, _, names in os.walk(os.path.join(root, folder)):
        for name in sorted(names):
            if name.endswith(SOURCE_EXTENSIONS):
                yield os.path.join(base, name)


def shared_host_files(root):
    src = os.path.join(root, "src")
    for name in sorted(os.listdir(src)):
        if name.endswith((".h", ".cpp", ".c")):
            yield os.path.join(src, name)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    families = list_families(root)
    names_family = {f: re.compile(r'(?<![A-Za-z0-9])%s(?=[_/"]|\b)|_%s\b' % (f, f)) for f in families}
    problems = []
    for path in (p for folder in SHARED_KERNEL_FOLDERS for p in files_under(root, folder)):
        for number, line in code_lines(path):
            match = re.match(r'\s*#\s*include\s+"([^/"]+)/', line)
            if match and match.group(1) in families:
                problems.append("%s:%d: a shared part includes the %s family's folder: %s" % (
                    os.path.relpath(path, root), number, match.group(1), line.strip()))
    shared = [os.path.join(root, p) for p in SHARED_FILES] + list(shared_host_files(root))
    for path in shared:
        for number, line in code_lines(path):
            for family, pattern in names_family.items():
                if pattern.search(line):
                    problems.append("%s:%d names the family %s: %s" % (os.path.relpath(path, root), number, family,
                                                                       line.strip()))
    for family in families:
        others = [f for f in families if f != family]
        for path in files_under(root, os.path.join("kernels", family)):
            for number, line in code_lines(path):
                match = re.match(r'\s*#\s*include\s+"([^/"]+)/', line)
                if match and match.group(1) in others:
                    problems.append("%s:%d: the %s family includes the %s family's folder: %s" % (
                        os.path.relpath(path, root), number, family, match.group(1), line.strip()))
    if problems:
        print("\n".join(problems))
        return 1
    print("families %s: the shared build and host files name none of them, no shared kernel part includes one, "
          "and no family's kernels include another's"
          % ", ".join(families))
    return 0


if __name__ == "__main__":
    sys.exit(main())
