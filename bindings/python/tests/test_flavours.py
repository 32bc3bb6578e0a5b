"""Picking the bundled CUDA 12 or CUDA 13 build for the installed driver, and
saying which and why. Needs no GPU and no driver: the driver's version is a
parameter, and the fake package folders hold empty files that are never
loaded (only the tests marked with the lib fixture load the real library)."""

import os
import shutil
import subprocess
import sys

import pytest

import flashcore
from flashcore import _library
from flashcore import __main__ as cli

LIBRARY_NAME = _library.library_names()[0]
NEEDS_13 = "needs 13.0, driver 580.65.06 or newer"
NO_DRIVER_NEWEST = "no NVIDIA driver was found, so the newest; creating a handle reports the missing driver"
NO_DRIVER_OLDER = "no NVIDIA driver was found; an older build, tried as the newer one did not load"


@pytest.fixture(autouse=True)
def no_request(monkeypatch):
    """No test sees a FLASHCORE_CUDA_MAJOR of the environment running it."""
    monkeypatch.delenv(_library.CUDA_MAJOR_ENV_VAR, raising=False)


def fake_package(tmp_path, monkeypatch, majors=(), flat=False, driver_version=None):
    """A package folder with (empty) builds at cudaMAJOR/ and, with flat, the
    older layout's library; bundled() looks there and sees driver_version."""
    package = tmp_path / "flashcore"
    package.mkdir()
    for major in majors:
        (package / ("cuda%d" % major)).mkdir()
        (package / ("cuda%d" % major) / LIBRARY_NAME).write_bytes(b"")
    if flat:
        (package / LIBRARY_NAME).write_bytes(b"")
    monkeypatch.setattr(_library, "__file__", str(package / "_library.py"))
    monkeypatch.setattr(_library, "driver_cuda_version", lambda: driver_version)
    return package


# --------------------------------------------------------------------------
# choose_flavour
# --------------------------------------------------------------------------


# (bundled majors, cuDriverGetVersion, [(major, reason), ...] in the order tried)
CHOICES = [
    # A CUDA 12 driver runs the CUDA 12 build and not the CUDA 13 one.
    ([12, 13], 12080, [(12, "the NVIDIA driver supports CUDA 12.8, which runs the CUDA 12 build and not the "
                            "CUDA 13 one (%s)" % NEEDS_13)]),
    ([12, 13], 12000, [(12, "the NVIDIA driver supports CUDA 12.0, which runs the CUDA 12 build and not the "
                            "CUDA 13 one (%s)" % NEEDS_13)]),
    ([13, 12], 12090, [(12, "the NVIDIA driver supports CUDA 12.9, which runs the CUDA 12 build and not the "
                            "CUDA 13 one (%s)" % NEEDS_13)]),
    # A CUDA 13 driver runs both: the newest first, the older one if it fails to load.
    ([12, 13], 13000, [(13, "the NVIDIA driver supports CUDA 13.0: the newest build it runs"),
                       (12, "the NVIDIA driver supports CUDA 13.0, which runs this build too: tried as a newer one "
                            "did not load")]),
    ([12, 13], 13020, [(13, "the NVIDIA driver supports CUDA 13.2: the newest build it runs"),
                       (12, "the NVIDIA driver supports CUDA 13.2, which runs this build too: tried as a newer one "
                            "did not load")]),
    # One build bundled.
    ([12], 13000, [(12, "the NVIDIA driver supports CUDA 13.0: the newest build it runs")]),
    ([13], 13000, [(13, "the NVIDIA driver supports CUDA 13.0: the newest build it runs")]),
    ([12], 12040, [(12, "the NVIDIA driver supports CUDA 12.4: the newest build it runs")]),
    # A driver older than every build: the oldest, which says so on first use.
    ([12, 13], 11080, [(12, "the NVIDIA driver supports CUDA 11.8, too old for every bundled build (the oldest, "
                            "CUDA 12, needs 12.0, driver 525.60.13 or newer): creating a handle fails with "
                            "NO_DEVICE and the library's message")]),
    ([13], 12080, [(13, "the NVIDIA driver supports CUDA 12.8, too old for every bundled build (the oldest, "
                        "CUDA 13, %s): creating a handle fails with NO_DEVICE and the library's message"
                        % NEEDS_13)]),
    # No driver: the newest, then the older as a fallback.
    ([12, 13], None, [(13, NO_DRIVER_NEWEST), (12, NO_DRIVER_OLDER)]),
    ([12], None, [(12, NO_DRIVER_NEWEST)]),
    # Nothing bundled: nothing to try.
    ([], None, []),
    ([], 13000, []),
]


@pytest.mark.parametrize("available, driver_version, expected", CHOICES)
def test_choose_flavour(available, driver_version, expected):
    assert _library.choose_flavour(available, driver_version, None) == expected


def test_a_build_of_an_unlisted_major_is_chosen_by_the_same_rule():
    """A future cuda14/ needs no table entry to be picked; its driver is only
    described without a version number."""
    assert [m for m, _ in _library.choose_flavour([12, 13, 14], 14000, None)] == [14, 13, 12]
    assert _library.choose_flavour([12, 13, 14], 13010, None)[0] == (
        13, "the NVIDIA driver supports CUDA 13.1, which runs the CUDA 13 build and not the CUDA 14 one (needs 14.0)")


@pytest.mark.parametrize("available, driver_version", [([12, 13], None), ([12, 13], 11080), ([12, 13], 12080),
                                                        ([12, 13], 13000), ([12], 13000)])
@pytest.mark.parametrize("requested", ["12", " 12 "])
def test_request_picks_that_build_whatever_the_driver(available, driver_version, requested):
    assert _library.choose_flavour(available, driver_version, requested) == [
        (12, "%s=%s" % (_library.CUDA_MAJOR_ENV_VAR, requested))]


@pytest.mark.parametrize("available, requested, bundles", [
    ([12, 13], "11", "the CUDA 13 and CUDA 12 builds"),
    ([12, 13], "14", "the CUDA 13 and CUDA 12 builds"),
    ([12, 13], "12.4", "the CUDA 13 and CUDA 12 builds"),
    ([12, 13], "cuda12", "the CUDA 13 and CUDA 12 builds"),
    ([12, 13], "", "the CUDA 13 and CUDA 12 builds"),
    ([13], "12", "the CUDA 13 build"),
    ([], "12", "no CUDA-specific build"),
])
def test_request_for_a_build_not_bundled_names_those_that_are(available, requested, bundles):
    with pytest.raises(flashcore.LibraryError) as info:
        _library.choose_flavour(available, 13000, requested)
    assert str(info.value) == ("%s=%s: no such build is bundled with this package, which has %s"
                               % (_library.CUDA_MAJOR_ENV_VAR, requested, bundles))


@pytest.mark.parametrize("major, text", [
    (12, "an NVIDIA driver for CUDA 12.0 or newer (525.60.13+)"),
    (13, "an NVIDIA driver for CUDA 13.0 or newer (580.65.06+)"),
    (14, "an NVIDIA driver for CUDA 14.0 or newer"),
])
def test_driver_requirement(major, text):
    assert _library.driver_requirement(major) == text


@pytest.mark.parametrize("version, text", [(12040, "12.4"), (13000, "13.0"), (12080, "12.8"), (11080, "11.8")])
def test_cuda_version_string(version, text):
    assert _library.cuda_version_string(version) == text


def test_driver_version_is_an_int_or_none():
    """No driver (CI) gives None, not an exception."""
    version = _library.driver_cuda_version()
    assert version is None or (isinstance(version, int) and version > 0)


# --------------------------------------------------------------------------
# bundled(): the package's layout
# --------------------------------------------------------------------------


def test_bundled_follows_the_choice(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, majors=(12, 13), driver_version=12080)
    how, path = _library.bundled()[0]
    assert len(_library.bundled()) == 1 and path == str(package / "cuda12" / LIBRARY_NAME)
    assert how == ("bundled with the package: the CUDA 12 build (the NVIDIA driver supports CUDA 12.8, which runs "
                   "the CUDA 12 build and not the CUDA 13 one (%s))" % NEEDS_13)


def test_bundled_without_a_driver_tries_the_newest_first(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, majors=(12, 13))
    assert _library.bundled() == [
        ("bundled with the package: the CUDA 13 build (%s)" % NO_DRIVER_NEWEST, str(package / "cuda13" / LIBRARY_NAME)),
        ("bundled with the package: the CUDA 12 build (%s)" % NO_DRIVER_OLDER, str(package / "cuda12" / LIBRARY_NAME))]


def test_bundled_honours_the_request(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, majors=(12, 13), driver_version=13000)
    monkeypatch.setenv(_library.CUDA_MAJOR_ENV_VAR, "12")
    assert _library.bundled() == [("bundled with the package: the CUDA 12 build (FLASHCORE_CUDA_MAJOR=12)",
                                   str(package / "cuda12" / LIBRARY_NAME))]


def test_bundled_ignores_folders_without_a_library(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, majors=(12,), driver_version=13000)
    (package / "cuda13").mkdir()  # empty: not a build
    (package / "cudart").mkdir()  # not cudaMAJOR
    (package / "cudart" / LIBRARY_NAME).write_bytes(b"")
    assert [path for _, path in _library.bundled()] == [str(package / "cuda12" / LIBRARY_NAME)]


def test_flat_layout_is_an_unknown_flavour(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, flat=True, driver_version=12080)
    assert _library.bundled() == [("bundled with the package", str(package / LIBRARY_NAME))]


def test_flat_layout_comes_after_the_flavoured_builds(monkeypatch, tmp_path):
    package = fake_package(tmp_path, monkeypatch, majors=(13,), flat=True, driver_version=13000)
    assert [path for _, path in _library.bundled()] == [str(package / "cuda13" / LIBRARY_NAME),
                                                         str(package / LIBRARY_NAME)]


def test_request_cannot_be_met_by_the_flat_layout(monkeypatch, tmp_path):
    """The flat library's CUDA major is unknown before loading it: a request
    is refused rather than answered with a library of another flavour."""
    fake_package(tmp_path, monkeypatch, flat=True)
    monkeypatch.setenv(_library.CUDA_MAJOR_ENV_VAR, "12")
    with pytest.raises(flashcore.LibraryError, match="no CUDA-specific build"):
        _library.bundled()
    with pytest.raises(flashcore.LibraryError, match="no CUDA-specific build"):
        flashcore.open_library()


def test_no_driver_is_asked_without_a_choice(monkeypatch, tmp_path):
    fake_package(tmp_path, monkeypatch, flat=True)

    def must_not_be_called():
        raise AssertionError("the driver was asked with nothing to choose from")

    monkeypatch.setattr(_library, "driver_cuda_version", must_not_be_called)
    assert len(_library.bundled()) == 1


# --------------------------------------------------------------------------
# The loaded library
# --------------------------------------------------------------------------


def test_library_reports_its_runtime(lib):
    assert lib.cuda_runtime_version == lib.cdll.flashcore_cuda_runtime_version()
    assert lib.cuda_major == lib.cuda_runtime_version // _library.CUDA_VERSION_PER_MAJOR
    assert lib.cuda_major in _library.MINIMUM_DRIVER_FOR_CUDA_MAJOR
    assert lib.cuda_runtime() == "CUDA %s runtime" % _library.cuda_version_string(lib.cuda_runtime_version)
    assert lib.driver_requirement() == _library.driver_requirement(lib.cuda_major)


def test_bundled_build_is_loaded_with_its_reason(lib, monkeypatch, tmp_path):
    """The real library placed as the bundled build of its own CUDA major."""
    package = tmp_path / "flashcore"
    (package / ("cuda%d" % lib.cuda_major)).mkdir(parents=True)
    shutil.copy(lib.path, package / ("cuda%d" % lib.cuda_major) / LIBRARY_NAME)
    monkeypatch.setattr(_library, "__file__", str(package / "_library.py"))
    monkeypatch.setattr(_library, "driver_cuda_version", lambda: None)
    monkeypatch.setenv(_library.ENV_VAR, "/nonexistent/libflashcore.so.0")  # would fail: the bundled one comes first
    loaded = flashcore.open_library()
    assert loaded.path == str(package / ("cuda%d" % lib.cuda_major) / LIBRARY_NAME)
    assert loaded.how == "bundled with the package: the CUDA %d build (%s)" % (lib.cuda_major, NO_DRIVER_NEWEST)
    assert loaded.cuda_major == lib.cuda_major


class FakeLibrary:
    def __init__(self, cuda_major):
        self.cuda_major = cuda_major

    def driver_requirement(self):
        return _library.driver_requirement(self.cuda_major)


@pytest.mark.parametrize("cuda_major, driver_version, majors, advice", [
    (13, None, (), None),
    (13, 13000, (), None),
    (12, 12000, (), None),
    (13, 12080, (12, 13), "the bundled CUDA 12 build runs on it (FLASHCORE_CUDA_MAJOR=12)"),
    (13, 12080, (), "a CUDA 12 build would run on it, or upgrade the driver"),
    (12, 11080, (12, 13), "upgrade the driver"),
    (13, 11080, (), "upgrade the driver"),
])
def test_cli_warns_of_a_driver_too_old(monkeypatch, tmp_path, cuda_major, driver_version, majors, advice):
    fake_package(tmp_path, monkeypatch, majors=majors)
    line = cli.driver_too_old(FakeLibrary(cuda_major), driver_version)
    if advice is None:
        assert line is None
    else:
        assert line == ("the NVIDIA driver supports CUDA %s, too old for this library, which needs %s: %s"
                        % (_library.cuda_version_string(driver_version), _library.driver_requirement(cuda_major),
                           advice))


def test_cli_prints_runtime_driver_and_reason(lib):
    env = dict(os.environ, FLASHCORE_LIBRARY=lib.path,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashcore.__file__))] + sys.path))
    if lib.how.startswith("bundled with the package: the CUDA"):
        # An installed wheel: the bundled build comes before FLASHCORE_LIBRARY,
        # so ask for the flavour this session loaded (the autouse fixture
        # took FLASHCORE_CUDA_MAJOR out of this test's environment).
        env[_library.CUDA_MAJOR_ENV_VAR] = str(lib.cuda_major)
    proc = subprocess.run([sys.executable, "-m", "flashcore"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "%s, needs %s" % (lib.cuda_runtime(), lib.driver_requirement()) in proc.stdout
    assert "found: " in proc.stdout
