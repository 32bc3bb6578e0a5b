#!/usr/bin/env python3
"""The reference docs against the tree they describe (issue 60's "docs
that are true"): README.md and the reference pages of docs/ (not the dated
logs of docs/log/) name the project's version as CMakeLists.txt states it,
every source file or folder they name in backticks exists, every link to a
docs/ page (a Markdown link, or a docs/....md path in the text) names a page
that exists and, with #anchor, a heading of it, and their lines outside code
blocks and tables are at most 120 characters.

    python3 tests/docs/check_docs.py [repo root]

A named path is looked for from the root, then from the folders the docs
name paths relative to (kernels/, src/, bindings/python/, tests/,
examples/). Not checked: installed or built files (lib/, build/, dist/,
share/, /usr/...), placeholders (<...>, *, $...), and names without a
folder or a source extension. Exits 1 listing what does not match."""

import os
import re
import sys

DOCS = ("README.md", "docs/kernels.md", "docs/reference.md", "docs/context-parallelism.md", "docs/log/README.md")
MAX_LINE = 120
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


def prose_lines(text):
    """(line number, line) of the lines outside fenced or indented code blocks, tables and link definitions."""
    fenced = False
    previous_blank = True
    in_indented = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        blank = not line.strip()
        # An indented code block starts after a blank line or an HTML comment (or continues one).
        if line.startswith("    ") and (previous_blank or in_indented) and not line.lstrip().startswith(("- ", "* ")):
            in_indented = True
        elif not blank:
            in_indented = False
        previous_blank = blank or line.strip().startswith("<!--") and line.strip().endswith("-->")
        # Tables, and link definitions ("[name]: target"), whose anchors cannot be wrapped.
        if in_indented or line.lstrip().startswith("|") or re.match(r" {0,3}\[[^\]]+\]: ", line):
            continue
        yield number, line


def long_line_problems(text, name):
    return ["%s:%d: %d characters, more than %d outside code blocks and tables" % (name, number, len(line), MAX_LINE)
            for number, line in prose_lines(text) if len(line) > MAX_LINE]


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    with open(path) as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    found, seen = set(), {}
    for match in re.finditer(r"^#{1,6} (.*)$", text, re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else "%s-%d" % (base, count))
    return found


def link_problems(text, name, root):
    """Links to docs/ pages: Markdown links, inline and reference-style (relative to the page), and docs/....md paths
    in the text (from the root)."""
    problems = []
    targets = []
    for match in re.finditer(r"\]\(([^)\s]+)\)|^ {0,3}\[[^\]]+\]:[ \t]*(\S+)", text, re.M):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        page, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(root, os.path.dirname(name), page)) if page else os.path.join(root, name)
        targets.append((match.start(), target, path, anchor))
    for match in re.finditer(r"(?<![\w/.(-])(docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md)(#[A-Za-z0-9_-]+)?", text):
        targets.append((match.start(), match.group(0), os.path.join(root, match.group(1)),
                        (match.group(2) or "#")[1:]))
    for start, target, path, anchor in targets:
        line = text.count("\n", 0, start) + 1
        if not os.path.exists(path):
            problems.append("%s:%d: link %s: no such page" % (name, line, target))
        elif anchor and path.endswith(".md") and anchor not in anchors(path):
            problems.append("%s:%d: link %s: no heading with that anchor" % (name, line, target))
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
        problems += link_problems(text, name, root)
        problems += long_line_problems(text, name)
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print("%s: version %s, every named file and linked page agree with the tree; lines within %d characters"
          % (", ".join(DOCS), ".".join(version), MAX_LINE))


if __name__ == "__main__":
    main()
