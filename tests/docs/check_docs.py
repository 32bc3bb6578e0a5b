#!/usr/bin/env python3
"""The reference docs against the tree they describe (issue 60's "docs
that are true"): README.md and docs/kernels.md name the project's version
as CMakeLists.txt states it, and every source file or folder they name in
backticks exists.

    python3 tests/docs/check_docs.py [repo root]

A named path is looked for from the root, then from the folders the docs
name paths relative to (kernels/, src/, bindings/python/, tests/,
examples/). Not checked: installed or built files (lib/, build/, dist/,
share/, /usr/...), placeholders (<...>, *, $...), and names without a
folder or a source extension. Exits 1 listing what does not match."""

import os
import re
import sys

DOCS = ("README.md", "docs/kernels.md")
SOURCE_EXTENSIONS = (".h", ".cuh", ".cu", ".cpp", ".c", ".py", ".cmake", ".sh", ".list", ".def", ".toml", ".rs",
                     ".in", ".map")
SEARCH_FROM = ("", "kernels", "kernels/fwd", "kernels/bwd", "src", "bindings/python", "bindings/python/flashcore",
               "tests", "examples", "bindings/rust")
# Installed, built or packaged places (the wheel's flashcore/cudaN/), and
# extensions named on their own (`.cpp` files).
NOT_IN_TREE = ("lib/", "build", "dist/", "share/", "/", "~", "libflashcore", "flashcore/cuda", "prefix/", ".")


def project_version(root):
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        match = re.search(r"project\(flashcore VERSION (\d+)\.(\d+)\.(\d+)", f.read())
    return tuple(match.groups())


def version_problems(text, name, version):
    full, short = ".".join(version), ".".join(version[:2])
    rules = [
        (r"find_package\(flashcore (\d+\.\d+)", short),
        (r"libflashcore[0-9a-z-]*_(\d+\.\d+\.\d+)-\d", full),
        (r"flashcore-(\d+\.\d+\.\d+)-", full),
        (r"libflashcore\.so\.(\d+\.\d+\.\d+)", full),
        (r"features \((\d+\.\d+)\)", short),
        (r"flashcore_attention-(\d+\.\d+\.\d+)", full),
    ]
    problems = []
    for pattern, wanted in rules:
        for match in re.finditer(pattern, text):
            if match.group(1) != wanted:
                line = text.count("\n", 0, match.start()) + 1
                problems.append("%s:%d: %r names version %s, the project is %s" % (name, line, match.group(0),
                                                                                  match.group(1), wanted))
    return problems


def path_problems(text, name, root):
    problems = []
    for match in re.finditer(r"`([A-Za-z0-9_./-]+)`", text):
        token = match.group(1)
        if token.startswith(NOT_IN_TREE) or "/" not in token and not token.endswith(SOURCE_EXTENSIONS):
            continue
        if not (token.endswith(SOURCE_EXTENSIONS) or token.endswith("/")):
            continue
        if any(os.path.exists(os.path.join(root, base, token)) for base in SEARCH_FROM):
            continue
        if "/" not in token and _found_anywhere(root, token):
            continue  # a bare file name the text places in a folder it names nearby
        line = text.count("\n", 0, match.start()) + 1
        problems.append("%s:%d: `%s` names no file or folder of the tree" % (name, line, token))
    return problems


_files = []


def _found_anywhere(root, file_name):
    if not _files:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "build" and not d.startswith("build-")]
            _files.extend(files)
    return file_name in _files


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    version = project_version(root)
    problems = []
    for name in DOCS:
        with open(os.path.join(root, name)) as f:
            text = f.read()
        problems += version_problems(text, name, version)
        problems += path_problems(text, name, root)
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print("%s: version %s and every named file agree with the tree" % (", ".join(DOCS), ".".join(version)))


if __name__ == "__main__":
    main()
