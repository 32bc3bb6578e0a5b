#!/usr/bin/env python3
"""Runs one Python check for ctest, reporting a missing tool as a skip.

    ctest_run.py pytest [pytest arguments...]   the test suite
    ctest_run.py drift                          _ffi.py against the header

Exit status: that of the check; 77 (ctest's SKIP_RETURN_CODE) with the reason
when pytest, pycparser or a C preprocessor is missing; 1 when pytest collected
no tests (pytest's 5), which must not pass silently. With
FLASHCORE_REQUIRE_TOOLS=1 (CI sets it) a missing tool fails instead of
skipping, as the Rust checks do.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))


def skip(reason):
    if os.environ.get("FLASHCORE_REQUIRE_TOOLS") == "1":
        print("FAILED: %s (FLASHCORE_REQUIRE_TOOLS=1)" % reason)
        return 1
    print("SKIP: %s" % reason)
    # ctest names the test and the log that its closing summary prints
    # (tests/skip_summary.sh), so the reason shows without -V.
    log = os.environ.get("FLASHCORE_TOOL_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write("%s skipped: %s\n" % (os.environ.get("FLASHCORE_CTEST_NAME", "a Python check"), reason))
    return SKIP


def need_module(name, install):
    if importlib.util.find_spec(name) is None:
        return "%s is not installed for %s (%s)" % (name, sys.executable, install)
    return None


def run_pytest(args):
    missing = need_module("pytest", "pip install pytest, or apt install python3-pytest")
    if missing:
        return skip(missing)
    rc = subprocess.call([sys.executable, "-m", "pytest"] + args)
    if rc == 5:
        print("FAIL: pytest collected no tests")
        return 1
    return rc


def run_drift():
    missing = need_module("pycparser", "pip install pycparser, or apt install python3-pycparser")
    if missing:
        return skip(missing)
    if not (os.environ.get("FLASHCORE_CPP") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        return skip("no C preprocessor (cc, gcc or clang) to read the header with")
    return subprocess.call([sys.executable, os.path.join(HERE, "generate_ffi.py"), "--check"])


def main(argv):
    if argv[:1] == ["pytest"]:
        return run_pytest(argv[1:])
    if argv == ["drift"]:
        return run_drift()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
