"""Tests that need no GPU: import, version, library loading, status mapping,
array reading, and validation errors coming back from the library."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

import flashcore
from flashcore import Status, _arrays, _errors, _ffi, _library, _plan
from fc_testing import (LATENT_HEAD_DIMS, FakeCudaArray, FakeDLPackArray, RecordingHandle, covering_pair, fake_paged,
                        fake_ptr, fake_qkv, fake_varlen, need_head_dim, raises_from_library)

# --------------------------------------------------------------------------
# Import and version (no library needed)
# --------------------------------------------------------------------------


def test_version_matches_header():
    header = "%d.%d.%d" % (_ffi.FLASHCORE_VERSION_MAJOR, _ffi.FLASHCORE_VERSION_MINOR, _ffi.FLASHCORE_VERSION_PATCH)
    assert flashcore.__version__ == header
    assert flashcore.HEADER_VERSION_NUMBER == (_ffi.FLASHCORE_VERSION_MAJOR * 10000
                                               + _ffi.FLASHCORE_VERSION_MINOR * 100 + _ffi.FLASHCORE_VERSION_PATCH)


def test_import_needs_no_framework_and_no_library():
    code = ("import os, sys; os.environ['FLASHCORE_LIBRARY'] = '/nonexistent/libflashcore.so'\n"
            "import flashcore\n"
            "assert not {'torch', 'cupy', 'numpy'} & set(sys.modules), sorted(sys.modules)\n"
            "print(flashcore.__version__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashcore.__file__))]
                                                    + sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == flashcore.__version__


def test_public_names_exist():
    for name in flashcore.__all__:
        assert hasattr(flashcore, name), name


# --------------------------------------------------------------------------
# Status mapping
# --------------------------------------------------------------------------


def test_every_failure_status_has_its_own_exception():
    classes = set()
    for status in Status:
        if status == Status.SUCCESS:
            continue
        err = _errors.error_for_status(status, "detail")
        assert type(err) is not flashcore.FlashcoreError, "no subclass for %s" % status.name
        assert isinstance(err, flashcore.FlashcoreError)
        assert err.status is status and err.message == "detail"
        assert str(err) == "%s: detail" % status.name.lower().replace("_", " ")
        classes.add(type(err))
    assert len(classes) == len(Status) - 1


@pytest.mark.parametrize("name,cls", [
    ("INVALID_ARGUMENT", flashcore.InvalidArgumentError),
    ("UNSUPPORTED", flashcore.UnsupportedError),
    ("MISALIGNED", flashcore.MisalignedError),
    ("WORKSPACE_TOO_SMALL", flashcore.WorkspaceTooSmallError),
    ("NO_DEVICE", flashcore.NoDeviceError),
    ("CUDA_ERROR", flashcore.CudaError),
    ("OUT_OF_MEMORY", flashcore.OutOfMemoryError),
    ("INTERNAL", flashcore.InternalError),
])
def test_status_to_class(name, cls):
    err = _errors.error_for_status(int(Status[name]), "m")
    assert type(err) is cls and err.status == Status[name]


def test_unknown_status_gives_base_class():
    err = _errors.error_for_status(999, "from the future")
    assert type(err) is flashcore.FlashcoreError and err.status == 999
    assert "999" in str(err) and "from the future" in str(err)
    with pytest.raises(ValueError):
        _errors.error_for_status(Status.SUCCESS, "")


def test_argument_errors_are_value_errors():
    assert issubclass(flashcore.InvalidArgumentError, ValueError)
    assert issubclass(flashcore.MisalignedError, ValueError)


def test_library_status_strings(lib):
    assert lib.status_string(Status.SUCCESS)
    assert lib.status_string(Status.INVALID_ARGUMENT) == "invalid argument"
    assert lib.status_string(12345) == "unknown status"
    names = {lib.status_string(s) for s in Status}
    assert len(names) == len(Status) and "unknown status" not in names
    assert flashcore.status_string(Status.MISALIGNED) == lib.status_string(Status.MISALIGNED)


def test_check_raises_with_library_message(lib):
    with pytest.raises(flashcore.InvalidArgumentError) as info:
        lib.check(lib.cdll.flashcore_forward_check(None))
    assert info.value.status == Status.INVALID_ARGUMENT
    assert info.value.message and info.value.message == lib.cdll.flashcore_last_error_message().decode()
    assert lib.check(Status.SUCCESS) is None


# --------------------------------------------------------------------------
# Loading the library
# --------------------------------------------------------------------------


def test_library_loaded_matches_header(lib):
    assert lib.version_number == _ffi.FLASHCORE_VERSION_NUMBER
    assert lib.version == flashcore.__version__ == flashcore.library_version()
    assert _library.bind(lib.cdll) == []


def test_environment_variable_comes_after_the_bundled_library(lib, monkeypatch):
    monkeypatch.setattr(_library, "bundled", lambda: [])
    monkeypatch.setenv(_library.ENV_VAR, lib.path)
    monkeypatch.setattr(_library, "candidates", lambda: [("installed", "/nonexistent/libflashcore.so.0")])
    loaded = flashcore.open_library()
    assert loaded.how == "$" + _library.ENV_VAR and loaded.path == lib.path


def test_bundled_library_comes_first(lib, monkeypatch, tmp_path):
    monkeypatch.setattr(_library, "bundled", lambda: [("bundled with the package", lib.path)])
    monkeypatch.setenv(_library.ENV_VAR, str(tmp_path / "libflashcore.so.0"))  # would fail to load
    loaded = flashcore.open_library()
    assert loaded.how == "bundled with the package" and loaded.path == lib.path


def test_unloadable_bundled_library_falls_back(lib, monkeypatch, tmp_path):
    broken = tmp_path / _library.library_names()[0]
    broken.write_bytes(b"not a library")
    monkeypatch.setattr(_library, "bundled", lambda: [("bundled with the package", str(broken))])
    monkeypatch.setenv(_library.ENV_VAR, lib.path)
    assert flashcore.open_library().how == "$" + _library.ENV_VAR


def test_bundled_looks_inside_the_package(monkeypatch, tmp_path):
    # (A FLASHCORE_CUDA_MAJOR of the running environment asks for a flavoured
    # build, which this flat fake package does not have: test_flavours.py.)
    monkeypatch.delenv(_library.CUDA_MAJOR_ENV_VAR, raising=False)
    package = tmp_path / "flashcore"
    (package / "lib").mkdir(parents=True)
    (package / _library.library_names()[0]).write_bytes(b"")
    (package / "lib" / _library.library_names()[-1]).write_bytes(b"")
    monkeypatch.setattr(_library, "__file__", str(package / "_library.py"))
    assert _library.bundled() == [("bundled with the package", str(package / _library.library_names()[0])),
                                  ("bundled with the package", str(package / "lib" / _library.library_names()[-1]))]


def test_bad_environment_variable_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(_library, "bundled", lambda: [])
    missing = str(tmp_path / "libflashcore.so.0")
    monkeypatch.setenv(_library.ENV_VAR, missing)
    with pytest.raises(flashcore.LibraryError) as info:
        flashcore.open_library()
    assert missing in str(info.value) and info.value.status is None


def test_not_found_lists_what_was_tried(monkeypatch):
    monkeypatch.delenv(_library.ENV_VAR, raising=False)
    monkeypatch.setattr(_library, "bundled", lambda: [])
    monkeypatch.setattr(_library, "candidates", lambda: [("somewhere", "/nonexistent/libflashcore.so.0")])
    with pytest.raises(flashcore.LibraryError) as info:
        flashcore.open_library()
    assert "/nonexistent/libflashcore.so.0" in str(info.value) and _library.ENV_VAR in str(info.value)


def test_candidates_order(monkeypatch, tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / _library.library_names()[0]).write_bytes(b"")
    monkeypatch.setattr(_library, "_pkgconfig_libdir", lambda: str(libdir))
    monkeypatch.setattr(_library.ctypes.util, "find_library", lambda name: "libfound.so" if name == "flashcore" else None)
    hows = [how for how, _ in _library.candidates()]
    assert hows.index("pkg-config libdir") < hows.index("ctypes.util.find_library") < \
        hows.index("the dynamic loader's search path")
    assert ("pkg-config libdir", str(libdir / _library.library_names()[0])) in _library.candidates()


def _compile_shared(tmp_path, source):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in library")
    src = tmp_path / "fake.c"
    src.write_text(source)
    out = tmp_path / "libfake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return str(out)


def test_wrong_major_version_is_refused(tmp_path):
    path = _compile_shared(tmp_path, "unsigned flashcore_version_number(void) { return %d; }\n"
                           % ((_ffi.FLASHCORE_VERSION_MAJOR + 1) * 10000))
    with pytest.raises(flashcore.LibraryError, match="needs %d.x" % _ffi.FLASHCORE_VERSION_MAJOR):
        flashcore.open_library(path)


def test_missing_functions_are_named(tmp_path):
    path = _compile_shared(tmp_path, "unsigned flashcore_version_number(void) { return %d; }\n"
                           % _ffi.FLASHCORE_VERSION_NUMBER)
    with pytest.raises(flashcore.LibraryError, match="flashcore_forward_check"):
        flashcore.open_library(path)


def test_not_a_flashcore_library(tmp_path):
    path = _compile_shared(tmp_path, "int something_else(void) { return 0; }\n")
    with pytest.raises(flashcore.LibraryError, match="not libflashcore"):
        flashcore.open_library(path)


# --------------------------------------------------------------------------
# The parameter struct
# --------------------------------------------------------------------------


def test_params_init_by_library(lib):
    # The library writes exactly the size it is given, never past it.
    size = ctypes.sizeof(flashcore.ForwardParams)
    buf = (ctypes.c_ubyte * (size + 16))(*([0xAB] * (size + 16)))
    lib.check(lib.cdll.flashcore_forward_params_init(ctypes.cast(buf, ctypes.POINTER(flashcore.ForwardParams)), size))
    assert ctypes.cast(buf, ctypes.POINTER(ctypes.c_size_t))[0] == size
    assert list(buf[size:]) == [0xAB] * 16
    p = lib.new_params()
    assert p.struct_size == ctypes.sizeof(flashcore.ForwardParams)
    assert p.dtype == flashcore.Dtype.FP16 and p.causal == 0
    assert p.softmax_scale == _ffi.FLASHCORE_SOFTMAX_SCALE_DEFAULT
    assert p.q is None and p.batch_size == 0 and p.out_head_stride == 0


@pytest.mark.parametrize("dv", [64, 128, 32])
def test_set_contiguous_strides_agrees_with_forward_params(lib, dv):
    for layout, shape_q, shape_k in ((flashcore.Layout.BHSD, (2, 8, 100, 64), (2, 2, 120, 64)),
                                     (flashcore.Layout.BSHD, (2, 100, 8, 64), (2, 120, 2, 64))):
        shape_v, shape_out = shape_k[:3] + (dv,), shape_q[:3] + (dv,)
        arrays = [FakeCudaArray(s, index=i) for i, s in enumerate((shape_q, shape_k, shape_v, shape_out))]
        ours = flashcore.forward_params(*arrays, layout=layout.name.lower())
        assert (ours.head_dim, ours.head_dim_v) == (64, dv)
        theirs = lib.new_params()
        for f in ("batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v"):
            setattr(theirs, f, getattr(ours, f))
        lib.check(lib.cdll.flashcore_set_contiguous_strides(ctypes.byref(theirs), layout))
        for name, _ in flashcore.ForwardParams._fields_:
            if name.endswith("_stride"):
                assert getattr(ours, name) == getattr(theirs, name), (layout, name)


# --------------------------------------------------------------------------
# Reading arrays
# --------------------------------------------------------------------------


def test_cai_strides_shape_and_pointer():
    a = _arrays.describe(FakeCudaArray((2, 3, 4, 64), strides=(2 * 4 * 3 * 64 * 2, 64 * 2, 3 * 64 * 2, 2),
                                       ptr=fake_ptr(0, 32)), "q")
    assert a.shape == (2, 3, 4, 64) and a.strides == (1536, 64, 192, 1)
    assert a.ptr == fake_ptr(0, 32) and a.dtype == "float16" and a.framework is None
    c = _arrays.describe(FakeCudaArray((2, 3, 4, 64)), "q")
    assert c.strides == (768, 256, 64, 1)
    assert _arrays.describe(FakeCudaArray((5,), typestr="<f4"), "lse").dtype == "float32"
    with pytest.raises(flashcore.MisalignedError):
        _arrays.describe(FakeCudaArray((4, 64), strides=(129, 2)), "q")


def test_a_shape_of_floats_is_refused_after_its_int_twin_is_cached(queued):
    # Audit item 8 of issue 59: (2, 4, 64.0, 64) compared equal to a cached
    # (2, 4, 64, 64) and was served from its plan; the full path refuses it.
    q, k, v = (FakeCudaArray((2, 4, 64, 64), index=i) for i in range(3))
    for _ in range(2):
        flashcore.attention(q, k, v, out=FakeCudaArray((2, 4, 64, 64), index=3))
    floats = FakeCudaArray((2, 4, 64.0, 64), index=0)
    with pytest.raises((flashcore.InvalidArgumentError, TypeError)):
        flashcore.attention(floats, k, v, out=FakeCudaArray((2, 4, 64, 64), index=3))
    assert len(queued) == 2


def test_cai_stream_is_the_default_stream():
    a = _arrays.describe(FakeCudaArray((1, 1, 8, 64), stream=0xABC0), "q")
    assert _plan.current_stream(a) == 0xABC0
    assert _plan.current_stream(_arrays.describe(FakeCudaArray((1, 1, 8, 64)), "q")) == 0


@pytest.mark.parametrize("code,bits,name", [(2, 16, "float16"), (4, 16, "bfloat16"), (2, 32, "float32")])
def test_dlpack_reading(code, bits, name):
    x = FakeDLPackArray((2, 3, 5, 64), code=code, bits=bits, strides=(3 * 5 * 128, 128, 3 * 128, 1),
                        byte_offset=64, device=(2, 3))
    a = _arrays.describe(x, "q", stream=0x1234)
    assert a.shape == (2, 3, 5, 64) and a.strides == (1920, 128, 384, 1)
    assert a.ptr == fake_ptr(0) + 64 and a.dtype == name and a.device == 3 and a.itemsize == bits // 8
    assert x.streams == [0x1234]
    _arrays.describe(x, "q", stream=0)
    assert x.streams[-1] == 1  # the legacy default stream, as DLPack spells it
    compact = _arrays.describe(FakeDLPackArray((2, 3, 5, 64)), "q")
    assert compact.strides == (960, 320, 64, 1)


def test_dlpack_host_memory_refused():
    with pytest.raises(flashcore.InvalidArgumentError) as info:
        _arrays.describe(FakeDLPackArray((1, 1, 8, 64), device=(1, 0)), "q")
    assert str(info.value).endswith("q is on the CPU (DLPack device type 1); flashcore needs CUDA device memory")
    with pytest.raises(flashcore.InvalidArgumentError, match=r"k is on pinned host memory .*type 3\); flashcore needs"):
        _arrays.describe(FakeDLPackArray((1, 1, 8, 64), device=(3, 0)), "k")


def test_not_an_array():
    with pytest.raises(TypeError, match="CUDA array"):
        _arrays.describe([1, 2, 3], "q")


def test_stream_pointer_forms():
    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 0x5000)

    class TorchLike:
        cuda_stream = 0x6000

    class CupyLike:
        ptr = 0x7000

    assert _plan.stream_pointer(0) == 0 and _plan.stream_pointer(0x1000) == 0x1000
    assert _plan.stream_pointer(ctypes.c_void_p(0x2000)) == 0x2000
    assert _plan.stream_pointer(CudaStreamProtocol()) == 0x5000
    assert _plan.stream_pointer(TorchLike()) == 0x6000
    assert _plan.stream_pointer(CupyLike()) == 0x7000
    for bad in (True, "stream", 1.5):
        with pytest.raises(TypeError):
            _plan.stream_pointer(bad)


# --------------------------------------------------------------------------
# Validation: found by the binding, or by the library (no GPU needed)
# --------------------------------------------------------------------------


def test_valid_parameters_pass_the_library_check(lib):
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out, causal=True, softmax_scale=0.125)
    flashcore.check_params(p)
    assert (p.batch_size, p.num_heads_q, p.num_heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim) == (2, 8, 2, 100, 120, 64)
    assert p.causal == 1 and p.softmax_scale == 0.125 and p.dtype == flashcore.Dtype.FP16
    assert (p.q, p.k, p.v, p.out, p.lse) == (fake_ptr(0), fake_ptr(1), fake_ptr(2), fake_ptr(3), None)
    assert (p.q_batch_stride, p.q_head_stride, p.q_seq_stride) == (8 * 100 * 64, 100 * 64, 64)
    assert (p.k_batch_stride, p.k_head_stride, p.k_seq_stride) == (2 * 120 * 64, 120 * 64, 64)


def test_bshd_storage_read_through_strides(lib):
    need_head_dim(128)
    # [B, S, H, D] storage seen as [B, H, S, D] (a transposed view), and the same
    # storage given as layout="bshd": both describe the same memory.
    b, s, h, d = 2, 50, 4, 128
    bshd = (s * h * d * 2, h * d * 2, d * 2, 2)
    view = [FakeCudaArray((b, h, s, d), strides=(bshd[0], bshd[2], bshd[1], 2), index=i) for i in range(4)]
    plain = [FakeCudaArray((b, s, h, d), index=i) for i in range(4)]
    p1 = flashcore.forward_params(*view)
    p2 = flashcore.forward_params(*plain, layout="bshd")
    flashcore.check_params(p1)
    assert bytes(p1) == bytes(p2)
    assert (p1.q_batch_stride, p1.q_head_stride, p1.q_seq_stride) == (s * h * d, d, h * d)


def test_bf16_and_lse(lib):
    need_head_dim(128)
    q, k, v, out = fake_qkv(d=128)
    p = flashcore.forward_params(q, k, v, out, lse=FakeCudaArray((2, 8, 100), typestr="<f4", index=4))
    assert p.lse == fake_ptr(4)
    flashcore.check_params(p)
    p = flashcore.forward_params(*fake_qkv(d=128, cls=FakeDLPackArray, code=4))
    assert p.dtype == flashcore.Dtype.BF16
    flashcore.check_params(p)


def test_size_one_dimension_strides_are_ignored(lib):
    # One query row: frameworks may give the seq axis any stride, e.g. 1.
    q = FakeCudaArray((1, 8, 1, 64), strides=(8 * 64 * 2, 64 * 2, 2, 2), index=0)
    k, v = FakeCudaArray((1, 8, 33, 64), index=1), FakeCudaArray((1, 8, 33, 64), index=2)
    out = FakeCudaArray((1, 8, 1, 64), index=3)
    flashcore.check_params(flashcore.forward_params(q, k, v, out))


@pytest.mark.parametrize("api", ["attention", "check_params"])
def test_head_counts_that_do_not_divide(lib, api):
    q, k, v, out = fake_qkv(hq=12, hkv=5)
    if api == "attention":
        err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(q, k, v, out=out))
    else:
        err = raises_from_library(lib, flashcore.InvalidArgumentError,
                                   lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out)))
    assert "12" in err.message and "5" in err.message


# --------------------------------------------------------------------------
# Head dims: what the build lists, what it covers, what it refuses
# --------------------------------------------------------------------------


def test_supported_head_dims(lib):
    pairs = flashcore.supported_head_dims()
    assert pairs and pairs == sorted(pairs) and len(set(pairs)) == len(pairs), pairs
    for d, dv in pairs:
        assert type(d) is int and type(dv) is int and d % 8 == 0 and dv % 8 == 0 and 8 <= d and 8 <= dv, pairs
    assert flashcore.supported_head_dims() == pairs == lib.supported_head_dims()
    pairs.append((1, 1))  # a copy: the cached list is not the caller's to change
    assert (1, 1) not in flashcore.supported_head_dims()


def test_supported_head_dims_c_call(lib):
    # Capacity 0 only counts; a short array gets the first pairs and the full count.
    pairs = lib.supported_head_dims()
    count = ctypes.c_size_t(12345)
    lib.check(lib.cdll.flashcore_supported_head_dims(None, None, 0, ctypes.byref(count)))
    assert count.value == len(pairs)
    d, dv = (ctypes.c_int32 * 1)(-1), (ctypes.c_int32 * 1)(-1)
    lib.check(lib.cdll.flashcore_supported_head_dims(d, dv, 1, ctypes.byref(count)))
    assert count.value == len(pairs) and (d[0], dv[0]) == pairs[0]
    with pytest.raises(flashcore.InvalidArgumentError):
        lib.check(lib.cdll.flashcore_supported_head_dims(None, None, 0, None))


def _head_dim_cases(lib):
    """Every listed pair, some dims that round up to a larger kernel, and the
    pairs made of a listed pair's dims crossed with other listed dims."""
    pairs = lib.supported_head_dims()
    cases = set(pairs) | {(d, d) for d in (8, 80, 112, 160)} | {(d, dv) for d, _ in pairs for _, dv in pairs}
    return sorted(cases)


def test_every_covered_head_dim_passes_the_check(lib):
    pairs = lib.supported_head_dims()
    covered = 0
    for d, dv in _head_dim_cases(lib):
        q, k, v, out = fake_qkv(d=d, dv=dv)
        p = flashcore.forward_params(q, k, v, out)
        assert (p.head_dim, p.head_dim_v) == (d, dv)
        assert (p.v_seq_stride, p.out_seq_stride, p.q_seq_stride) == (dv, dv, d)
        if covering_pair(pairs, d, dv) is None:
            with pytest.raises(flashcore.UnsupportedError, match="head_dim"):
                flashcore.check_params(p)
        elif covering_pair(pairs, d, dv) in LATENT_HEAD_DIMS:
            # The latent-cache kernel takes v only as k's view: refused with a v of its own.
            with pytest.raises(flashcore.UnsupportedError, match="pass v = k"):
                flashcore.check_params(p)
            covered += 1
        else:
            flashcore.check_params(p)
            covered += 1
    assert covered >= len(pairs)


@pytest.mark.parametrize("which", ["head_dim", "head_dim_v"])
def test_head_dim_no_kernel_covers(lib, which):
    # One step of 8 past the largest listed dim: no kernel of this build covers it.
    pairs = lib.supported_head_dims()
    d = max(p[0] for p in pairs) + 8 if which == "head_dim" else 64
    dv = max(p[1] for p in pairs) + 8 if which == "head_dim_v" else 64
    q, k, v, out = fake_qkv(d=d, dv=dv)
    err = raises_from_library(lib, flashcore.UnsupportedError, lambda: flashcore.attention(q, k, v, out=out))
    assert which in err.message


def _padded(shape, index):
    """A fake fp16 [B, H, S, D] array whose rows are padded to a multiple of 8
    elements, so only D itself can be wrong."""
    b, h, s, d = shape
    row = -(-d // 8) * 8
    return FakeCudaArray(shape, strides=(h * s * row * 2, s * row * 2, row * 2, 2), index=index)


@pytest.mark.parametrize("d,dv", [(100, 100), (64, 100), (100, 64)])
def test_head_dim_not_a_multiple_of_8(lib, d, dv):
    q, k = _padded((2, 8, 100, d), 0), _padded((2, 2, 120, d), 1)
    v, out = _padded((2, 2, 120, dv), 2), _padded((2, 8, 100, dv), 3)
    err = raises_from_library(lib, flashcore.UnsupportedError, lambda: flashcore.attention(q, k, v, out=out))
    assert "multiple of 8" in err.message


def test_misaligned_pointer(lib):
    q, k, v, out = fake_qkv()
    q = FakeCudaArray((2, 8, 100, 64), ptr=fake_ptr(0, 2))
    raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.attention(q, k, v, out=out))


def test_misaligned_dlpack_byte_offset(lib):
    q, k, v, out = fake_qkv(cls=FakeDLPackArray)
    q = FakeDLPackArray((2, 8, 100, 64), byte_offset=6)
    raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.attention(q, k, v, out=out))
    assert q.streams == [1]


def test_stride_not_a_multiple_of_the_alignment(lib):
    # head_dim 64 padded to 65 elements: the seq stride breaks 16-byte alignment.
    q, k, v, out = fake_qkv()
    q = FakeCudaArray((2, 8, 100, 64), strides=(8 * 100 * 65 * 2, 100 * 65 * 2, 65 * 2, 2))
    raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.attention(q, k, v, out=out))


def test_padded_views_are_accepted(lib):
    q, k, v, out = fake_qkv()
    q = FakeCudaArray((2, 8, 100, 64), strides=(8 * 100 * 72 * 2, 100 * 72 * 2, 72 * 2, 2))
    flashcore.check_params(flashcore.forward_params(q, k, v, out))


def test_overlapping_out(lib):
    q, k, v, _ = fake_qkv()
    out = FakeCudaArray((2, 8, 100, 64), strides=(100 * 64 * 2, 0, 64 * 2, 2), index=3)
    raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(q, k, v, out=out))


def test_bad_softmax_scale(lib):
    q, k, v, out = fake_qkv()
    for bad in (-1.0, float("nan"), float("inf")):
        raises_from_library(lib, flashcore.InvalidArgumentError,
                             lambda: flashcore.attention(q, k, v, out=out, softmax_scale=bad))
    with pytest.raises(flashcore.InvalidArgumentError, match="None"):
        flashcore.attention(q, k, v, out=out, softmax_scale=0.0)


@pytest.mark.parametrize("case,cls,match", [
    ("3d", flashcore.InvalidArgumentError, "4-D"),
    ("float32", flashcore.UnsupportedError, "float32"),
    ("mixed dtypes", flashcore.InvalidArgumentError, "dtype"),
    ("k v shapes", flashcore.InvalidArgumentError, "same shape"),
    ("batch", flashcore.InvalidArgumentError, "batch size"),
    ("out shape", flashcore.InvalidArgumentError, "out must have"),
    ("out head_dim_v", flashcore.InvalidArgumentError, "out must have"),
    ("v seqlen", flashcore.InvalidArgumentError, "same shape"),
    ("k head_dim", flashcore.InvalidArgumentError, "head_dim"),
    ("out readonly", flashcore.InvalidArgumentError, "read-only"),
    ("head_dim stride", flashcore.InvalidArgumentError, "contiguous"),
    ("lse shape", flashcore.InvalidArgumentError, "lse must be"),
    ("lse strides", flashcore.InvalidArgumentError, "lse must be contiguous"),
    ("layout", flashcore.InvalidArgumentError, "layout"),
])
def test_binding_side_validation(lib, case, cls, match):
    q, k, v, out = fake_qkv()
    kwargs = {}
    if case == "3d":
        q = FakeCudaArray((2, 100, 64))
    elif case == "float32":
        q, k, v, out = fake_qkv(typestr="<f4")
    elif case == "mixed dtypes":
        v = FakeCudaArray((2, 2, 120, 64), typestr="<f4", index=2)
    elif case == "k v shapes":
        v = FakeCudaArray((2, 2, 121, 64), index=2)
    elif case == "batch":
        k, v = FakeCudaArray((3, 2, 120, 64), index=1), FakeCudaArray((3, 2, 120, 64), index=2)
    elif case == "out shape":
        out = FakeCudaArray((2, 8, 101, 64), index=3)
    elif case == "out head_dim_v":
        q, k, v, _ = fake_qkv(d=192, dv=128)
        out = FakeCudaArray((2, 8, 100, 192), index=3)  # q's shape, but v's last dimension is 128
    elif case == "v seqlen":
        q, k, v, out = fake_qkv(d=192, dv=128)
        v = FakeCudaArray((2, 2, 121, 128), index=2)
    elif case == "k head_dim":
        k = FakeCudaArray((2, 2, 120, 128), index=1)
    elif case == "out readonly":
        out = FakeCudaArray((2, 8, 100, 64), index=3, readonly=True)
    elif case == "head_dim stride":
        k = FakeCudaArray((2, 2, 120, 64), strides=(2 * 120 * 64 * 2, 120 * 64 * 2, 2, 120 * 2), index=1)
    elif case == "lse shape":
        kwargs["lse"] = FakeCudaArray((2, 100, 8), typestr="<f4", index=4)
    elif case == "lse strides":
        kwargs["lse"] = FakeCudaArray((2, 8, 100), typestr="<f4", strides=(8 * 128 * 4, 128 * 4, 4), index=4)
    elif case == "layout":
        kwargs["layout"] = "sbhd"
    with pytest.raises(cls, match=match) as info:
        flashcore.attention(q, k, v, out=out, **kwargs)
    assert info.value.status == cls.status_code


def test_generic_arrays_need_out(lib):
    q, k, v, _ = fake_qkv()
    with pytest.raises(TypeError, match="out="):
        flashcore.attention(q, k, v)
    q, k, v, out = fake_qkv()
    with pytest.raises(TypeError, match="lse="):
        flashcore.attention(q, k, v, out=out, return_lse=True)


def test_valid_call_without_gpu_reports_no_device(lib, gpu_present):
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.NoDeviceError) as info:
        flashcore.attention(q, k, v, out=out)
    assert info.value.status == Status.NO_DEVICE and info.value.message
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.get_handle(0)


def test_handles_are_per_thread(lib, gpu_present):
    if not gpu_present:
        pytest.skip("no GPU: handles cannot be created")
    main = flashcore.get_handle(0)
    assert flashcore.get_handle(0) is main and main.device == 0 and main.value
    other = []
    t = threading.Thread(target=lambda: other.append(flashcore.get_handle(0)))
    t.start()
    t.join()
    assert other[0] is not main and other[0].device == 0
    with flashcore.Handle(0) as h:
        assert h.value and h.value != main.value
    assert h.value == 0
    with pytest.raises(flashcore.FlashcoreError, match="closed"):
        h.workspace_size(lib.new_params())


def test_torch_cpu_tensor_rejected(lib):
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match="CUDA"):
        flashcore.attention(q, q, q)


# --------------------------------------------------------------------------
# Split-KV (num_splits) and merging partial results (no GPU needed)
# --------------------------------------------------------------------------


def test_num_splits_defaults_to_the_heuristic(lib):
    assert lib.new_params().num_splits == 0
    q, k, v, out = fake_qkv()
    assert flashcore.forward_params(q, k, v, out).num_splits == 0
    assert flashcore.forward_params(q, k, v, out, num_splits=None).num_splits == 0


@pytest.mark.parametrize("n", [1, 2, 3, 7, flashcore.MAX_NUM_SPLITS])
def test_num_splits_reaches_the_params(lib, n):
    q, k, v, out = fake_qkv(b=1, hq=32, hkv=8, sq=4, sk=1000)
    p = flashcore.forward_params(q, k, v, out, num_splits=n)
    assert p.num_splits == n
    flashcore.check_params(p)


@pytest.mark.parametrize("n", [-1, flashcore.MAX_NUM_SPLITS + 1])
def test_num_splits_out_of_range_is_refused_by_the_library(lib, n):
    q, k, v, out = fake_qkv()
    raises_from_library(lib, flashcore.InvalidArgumentError,
                         lambda: flashcore.check_params(flashcore.forward_params(q, k, v, out, num_splits=n)))
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: flashcore.attention(q, k, v, out=out, num_splits=n))
    assert "num_splits" in err.message


def test_num_splits_binding_side(lib):
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError, match="None") as info:
        flashcore.attention(q, k, v, out=out, num_splits=0)  # 0 is the C spelling of None
    assert info.value.status == Status.INVALID_ARGUMENT
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="num_splits"):
            flashcore.attention(q, k, v, out=out, num_splits=bad)
    with pytest.raises(flashcore.InvalidArgumentError, match="int32"):
        flashcore.forward_params(q, k, v, out, num_splits=2**31)


def test_forward_refuses_float32(lib):
    # FP32 is a merge dtype only: the library's check says so, as forward would.
    p = flashcore.forward_params(*fake_qkv())
    p.dtype = flashcore.Dtype.FP32
    raises_from_library(lib, flashcore.UnsupportedError, lambda: flashcore.check_params(p))


def test_merge_params_init_by_library(lib):
    size = ctypes.sizeof(flashcore.MergeParams)
    buf = (ctypes.c_ubyte * (size + 16))(*([0xAB] * (size + 16)))
    lib.check(lib.cdll.flashcore_merge_params_init(ctypes.cast(buf, ctypes.POINTER(flashcore.MergeParams)), size))
    assert list(buf[size:]) == [0xAB] * 16, "wrote past struct_size"
    p = flashcore.MergeParams.from_buffer_copy(bytes(buf[:size]))
    assert p.struct_size == size
    assert p.partial_dtype == p.out_dtype == flashcore.Dtype.FP16
    rest = [name for name, _ in flashcore.MergeParams._fields_ if name not in ("struct_size", "partial_dtype", "out_dtype")]
    assert all(not getattr(p, name) for name in rest), {name: getattr(p, name) for name in rest}
    assert bytes(lib.new_merge_params()) == bytes(p)
    with pytest.raises(flashcore.InvalidArgumentError):
        lib.check(lib.cdll.flashcore_merge_params_init(None, size))


def test_merge_states_null_arguments(lib):
    # A NULL handle or params is an invalid argument, whatever the GPU.
    with pytest.raises(flashcore.InvalidArgumentError):
        lib.check(lib.cdll.flashcore_merge_states(None, None, None))
    p = lib.new_merge_params()
    with pytest.raises(flashcore.InvalidArgumentError):
        lib.check(lib.cdll.flashcore_merge_states(None, ctypes.byref(p), None))


def fake_states(k=3, b=2, h=8, s=100, d=64, typestr="<f2", layout="bhsd", lse_strides=None, out_typestr=None):
    """Fake partial_out [K, B, H, S, D] (or [K, B, S, H, D]), partial_lse
    [K, B, H, S], out and lse, contiguous unless lse_strides is given."""
    rows = (b, h, s) if layout == "bhsd" else (b, s, h)
    partial = FakeCudaArray((k,) + rows + (d,), typestr=typestr, index=0)
    plse = FakeCudaArray((k, b, h, s), typestr="<f4", index=1,
                         strides=None if lse_strides is None else tuple(4 * x for x in lse_strides))
    out = FakeCudaArray(rows + (d,), typestr=out_typestr or typestr, index=2)
    lse = FakeCudaArray((b, h, s), typestr="<f4", index=3)
    return partial, plse, out, lse


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_merge_params_from_arrays(lib, layout):
    k, b, h, s, d = 3, 2, 8, 100, 64
    # partial_lse as a [K, B, H, S] view of [B, H, S, K] storage: any strides go.
    partial, plse, out, lse = fake_states(k, b, h, s, d, layout=layout, lse_strides=(1, h * s * k, s * k, k))
    p = flashcore.merge_params(partial, plse, out, lse=lse, layout=layout)
    assert p.struct_size == ctypes.sizeof(flashcore.MergeParams)
    assert (p.partial_dtype, p.out_dtype) == (flashcore.Dtype.FP16, flashcore.Dtype.FP16)
    assert (p.num_states, p.batch_size, p.num_heads, p.seqlen, p.head_dim) == (k, b, h, s, d)
    assert (p.partial_out, p.partial_lse, p.out, p.lse) == (fake_ptr(0), fake_ptr(1), fake_ptr(2), fake_ptr(3))
    if layout == "bhsd":
        assert (p.partial_batch_stride, p.partial_head_stride, p.partial_seq_stride) == (h * s * d, s * d, d)
        assert (p.out_batch_stride, p.out_head_stride, p.out_seq_stride) == (h * s * d, s * d, d)
    else:
        assert (p.partial_batch_stride, p.partial_head_stride, p.partial_seq_stride) == (s * h * d, d, h * d)
        assert (p.out_batch_stride, p.out_head_stride, p.out_seq_stride) == (s * h * d, d, h * d)
    assert p.partial_state_stride == b * h * s * d
    assert (p.lse_state_stride, p.lse_batch_stride, p.lse_head_stride, p.lse_seq_stride) == (1, h * s * k, s * k, k)
    no_lse = flashcore.merge_params(partial, plse, out, layout=layout)
    assert no_lse.lse is None
    with pytest.raises(TypeError, match="out"):
        flashcore.merge_params(partial, plse, None, layout=layout)


@pytest.mark.parametrize("typestr,out_typestr,codes", [
    ("<f4", "<f2", (flashcore.Dtype.FP32, flashcore.Dtype.FP16)),
    ("<f2", "<f4", (flashcore.Dtype.FP16, flashcore.Dtype.FP32)),
])
def test_merge_params_dtypes(lib, typestr, out_typestr, codes):
    partial, plse, out, _ = fake_states(typestr=typestr, out_typestr=out_typestr)
    p = flashcore.merge_params(partial, plse, out)
    assert (p.partial_dtype, p.out_dtype) == codes
    bf16 = FakeDLPackArray((3, 2, 8, 100, 64), code=4, index=0)
    assert flashcore.merge_params(bf16, plse, out).partial_dtype == flashcore.Dtype.BF16


@pytest.mark.parametrize("case,cls,match", [
    ("4d partial_out", flashcore.InvalidArgumentError, "5-D"),
    ("float64 partial_out", flashcore.UnsupportedError, "float64"),
    ("partial_lse shape", flashcore.InvalidArgumentError, "partial_lse must be"),
    ("partial_lse dtype", flashcore.InvalidArgumentError, "partial_lse must be"),
    ("out shape", flashcore.InvalidArgumentError, "out must have"),
    ("out dtype", flashcore.InvalidArgumentError, "out_dtype"),
    ("out_dtype name", flashcore.UnsupportedError, "out_dtype"),
    ("out readonly", flashcore.InvalidArgumentError, "read-only"),
    ("head_dim stride", flashcore.InvalidArgumentError, "contiguous"),
    ("lse shape", flashcore.InvalidArgumentError, "lse must be"),
    ("lse strides", flashcore.InvalidArgumentError, "lse must be contiguous"),
    ("layout", flashcore.InvalidArgumentError, "layout"),
])
def test_merge_binding_side_validation(lib, case, cls, match):
    partial, plse, out, lse = fake_states()
    kwargs = {}
    if case == "4d partial_out":
        partial = FakeCudaArray((2, 8, 100, 64), index=0)
    elif case == "float64 partial_out":
        partial = FakeCudaArray((3, 2, 8, 100, 64), typestr="<f8", index=0)
    elif case == "partial_lse shape":
        plse = FakeCudaArray((3, 2, 100, 8), typestr="<f4", index=1)
    elif case == "partial_lse dtype":
        plse = FakeCudaArray((3, 2, 8, 100), typestr="<f2", index=1)
    elif case == "out shape":
        out = FakeCudaArray((2, 8, 100, 72), index=2)
    elif case == "out dtype":
        kwargs["out_dtype"] = "float32"  # out is float16
    elif case == "out_dtype name":
        kwargs["out_dtype"] = "int8"
    elif case == "out readonly":
        out = FakeCudaArray((2, 8, 100, 64), index=2, readonly=True)
    elif case == "head_dim stride":
        out = FakeCudaArray((2, 8, 100, 64), strides=(8 * 100 * 64 * 2, 100 * 64 * 2, 2, 100 * 2), index=2)
    elif case == "lse shape":
        lse = FakeCudaArray((2, 100, 8), typestr="<f4", index=3)
    elif case == "lse strides":
        lse = FakeCudaArray((2, 8, 100), typestr="<f4", strides=(8 * 128 * 4, 128 * 4, 4), index=3)
    elif case == "layout":
        kwargs["layout"] = "sbhd"
    with pytest.raises(cls, match=match) as info:
        flashcore.merge_states(partial, plse, out=out, lse=lse, **kwargs)
    assert info.value.status == cls.status_code


def test_merge_states_runs_the_librarys_check_first(lib):
    # Audit item 8 of issue 59: merge_states queued an empty merge without
    # flashcore_merge_check (an invalid one passed silently) and asked for a
    # handle before it (an argument error surfaced as NoDeviceError on a
    # machine without a GPU).
    partial, plse, out, lse = fake_states(s=0, d=12)  # empty (seqlen 0), head_dim 12
    with pytest.raises(flashcore.UnsupportedError, match="head_dim 12 is not a multiple of 8"):
        flashcore.merge_states(partial, plse, out=out, lse=lse)
    partial, plse, out, lse = fake_states()
    shifted = FakeCudaArray(partial.__cuda_array_interface__["shape"], ptr=fake_ptr(0) + 2)
    with pytest.raises(flashcore.MisalignedError, match="partial_out"):
        flashcore.merge_states(shifted, plse, out=out, lse=lse)


def test_merge_out_dtype_spellings():
    from flashcore import _merge
    for spelling in ("float32", flashcore.Dtype.FP32, "torch.float32"):
        assert _merge._dtype_name(spelling) == "float32"
    assert _merge._dtype_name(flashcore.Dtype.BF16) == "bfloat16"
    with pytest.raises(flashcore.UnsupportedError):
        _merge._dtype_name("float64")


def test_merge_generic_arrays_need_out(lib):
    partial, plse, out, _ = fake_states()
    with pytest.raises(TypeError, match="out="):
        flashcore.merge_states(partial, plse)
    with pytest.raises(TypeError, match="lse="):
        flashcore.merge_states(partial, plse, out=out)


def test_merge_without_gpu_reports_no_device(lib, gpu_present):
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    partial, plse, out, lse = fake_states()
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.merge_states(partial, plse, out=out, lse=lse)
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.merge_states(partial, plse, out=out, return_lse=False)


# --------------------------------------------------------------------------
# Sliding window and softcap (0.4; no GPU needed)
# --------------------------------------------------------------------------

WINDOW_APIS = ["attention", "forward_params"]


def _call(api, q, k, v, out, **kwargs):
    """attention or forward_params (then check_params) on fake arrays."""
    if api == "attention":
        return flashcore.attention(q, k, v, out=out, **kwargs)
    return flashcore.check_params(flashcore.forward_params(q, k, v, out, **kwargs))


def test_window_and_softcap_default_off(lib):
    p = lib.new_params()
    assert (p.use_window, p.window_left, p.window_right, p.softcap) == (0, 0, 0, 0.0)
    q, k, v, out = fake_qkv()
    for kwargs in ({}, {"window": None, "softcap": 0.0}, {"softcap": 0}):
        p = flashcore.forward_params(q, k, v, out, **kwargs)
        assert (p.use_window, p.window_left, p.window_right, p.softcap) == (0, 0, 0, 0.0), kwargs
    # Spelled out, the defaults give the same struct.
    assert bytes(flashcore.forward_params(q, k, v, out, window=None, softcap=0.0)) == \
        bytes(flashcore.forward_params(q, k, v, out))


@pytest.mark.parametrize("window,causal", [
    ((0, 0), False),  # the diagonal key only
    ((1, -1), False),
    ((-1, 5), False),
    ((63, 0), True),  # causal with a window of 63 keys back
    ((63, -1), True),  # right -1 with causal: causal's own bound 0
    ((17, 9), False),
    ((-1, -1), False),  # unbounded both sides: no window in effect
    ((10**6, 10**6), False),  # wider than the sequences
    ([3, 0], True),  # a list works as the pair
])
def test_window_reaches_the_params(lib, window, causal):
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out, causal=causal, window=window)
    assert (p.use_window, p.window_left, p.window_right) == (1, window[0], window[1])
    assert p.causal == int(causal) and p.softcap == 0.0
    flashcore.check_params(p)


@pytest.mark.parametrize("softcap", [30.0, 50, 0.5, 1e-3, 1e30])
def test_softcap_reaches_the_params(lib, softcap):
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out, softcap=softcap, window=(8, 0), causal=True)
    assert p.softcap == ctypes.c_float(softcap).value and p.softcap > 0
    assert (p.use_window, p.window_left, p.window_right, p.causal) == (1, 8, 0, 1)
    flashcore.check_params(p)


def test_window_and_softcap_with_the_other_options(lib):
    need_head_dim(128)
    # GQA, bshd, lse and num_splits alongside: each field where it belongs.
    b, s, hq, hkv, d = 2, 50, 8, 2, 128
    q, out = FakeCudaArray((b, s, hq, d), index=0), FakeCudaArray((b, s, hq, d), index=3)
    k, v = FakeCudaArray((b, 70, hkv, d), index=1), FakeCudaArray((b, 70, hkv, d), index=2)
    lse = FakeCudaArray((b, hq, s), typestr="<f4", index=4)
    p = flashcore.forward_params(q, k, v, out, lse=lse, layout="bshd", num_splits=3, softmax_scale=0.5,
                                 window=(20, 4), softcap=15.0)
    assert (p.num_heads_q, p.num_heads_kv, p.seqlen_q, p.seqlen_k, p.num_splits) == (hq, hkv, s, 70, 3)
    assert (p.use_window, p.window_left, p.window_right, p.softcap, p.softmax_scale) == (1, 20, 4, 15.0, 0.5)
    assert p.lse == fake_ptr(4)
    flashcore.check_params(p)


@pytest.mark.parametrize("api", WINDOW_APIS)
@pytest.mark.parametrize("kwargs,cls,match", [
    ({"window": 5}, TypeError, "window must be None or a pair"),
    ({"window": (1, 2, 3)}, TypeError, "window must be None or a pair"),
    ({"window": (4,)}, TypeError, "window must be None or a pair"),
    ({"window": "ab"}, TypeError, "window must be None or a pair"),
    ({"window": {0: 1, 1: 2}}, TypeError, "window must be None or a pair"),
    ({"window": (1.0, 0)}, TypeError, "window's left bound must be an int"),
    ({"window": (True, 0)}, TypeError, "window's left bound must be an int, not a bool"),
    ({"window": (0, None)}, TypeError, "window's right bound must be an int"),
    ({"window": (-2, 0)}, flashcore.InvalidArgumentError, r"window's left bound \(-2\) must be -1"),
    ({"window": (0, -7)}, flashcore.InvalidArgumentError, r"window's right bound \(-7\) must be -1"),
    ({"window": (0, 2**31)}, flashcore.InvalidArgumentError, "window's right bound .* int32"),
    ({"window": (-2**31 - 1, 0)}, flashcore.InvalidArgumentError, "window's left bound .* int32"),
    ({"softcap": True}, TypeError, "softcap must be a real number"),
    ({"softcap": "30"}, TypeError, "softcap must be a real number"),
    ({"softcap": None}, TypeError, "softcap must be a real number"),
    ({"softcap": 3j}, TypeError, "softcap must be a real number"),
    ({"softcap": -1.0}, flashcore.InvalidArgumentError, "softcap must be finite and >= 0"),
    ({"softcap": float("nan")}, flashcore.InvalidArgumentError, "softcap must be finite and >= 0"),
    ({"softcap": float("inf")}, flashcore.InvalidArgumentError, "softcap must be finite and >= 0"),
    ({"softcap": 10**400}, flashcore.InvalidArgumentError, "softcap must be finite and >= 0"),
    ({"softcap": 1e39}, flashcore.InvalidArgumentError, "softcap .* does not fit a float32"),
    ({"softcap": 1e-50}, flashcore.InvalidArgumentError, "softcap .* is 0 as a float32"),
])
def test_window_and_softcap_binding_side(lib, api, kwargs, cls, match):
    q, k, v, out = fake_qkv()
    with pytest.raises(cls, match=match) as info:
        _call(api, q, k, v, out, **kwargs)
    if issubclass(cls, flashcore.FlashcoreError):
        assert info.value.status == cls.status_code
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("api", WINDOW_APIS)
def test_causal_window_reaching_right_is_refused_by_the_library(lib, api):
    # causal is window_right 0: a window reaching past the diagonal contradicts it.
    q, k, v, out = fake_qkv()
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: _call(api, q, k, v, out, causal=True, window=(8, 1)))
    assert "window_right (1)" in err.message and "causal" in err.message


@pytest.mark.parametrize("softcap,words", [
    (1e-40, "softmax_scale / softcap"),  # a float32 subnormal: the scale / softcap quotient overflows
    (3e38, "log2(e)"),  # fits a float32, softcap * log2(e) does not
])
@pytest.mark.parametrize("api", WINDOW_APIS)
def test_softcap_limits_are_the_library_s(lib, api, softcap, words):
    q, k, v, out = fake_qkv()
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: _call(api, q, k, v, out, softcap=softcap))
    assert "softcap" in err.message and words in err.message


def test_window_fields_set_by_hand_reach_the_library(lib):
    # The struct as the C API reads it: bounds below -1 are refused there
    # too, and without use_window the bounds are not looked at.
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out)
    p.window_left, p.window_right = -5, -9
    flashcore.check_params(p)
    p.use_window = 1
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_params(p))
    assert "window_left (-5)" in err.message
    p.window_left = 3
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_params(p))
    assert "window_right (-9)" in err.message
    p.window_right = -1
    flashcore.check_params(p)
    p.softcap = -1.0
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.check_params(p))
    assert "softcap (-1)" in err.message


def test_window_call_without_gpu_reports_no_device(lib, gpu_present):
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.attention(q, k, v, out=out, causal=True, window=(16, 0), softcap=30.0)


# --------------------------------------------------------------------------
# Issue 15 (hardening): integers ctypes would wrap, malformed array
# descriptions, argument types, empty inputs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["pointer", "stride", "lse pointer"])
def test_integers_that_do_not_fit_are_refused(lib, case):
    # ctypes alone stores 2**64 + a as a, and a stride of 2**64 + 8 as 8.
    q, k, v, out = fake_qkv()
    lse = None
    if case == "pointer":
        q = FakeCudaArray((2, 8, 100, 64), ptr=2**64 + fake_ptr(0))
    elif case == "stride":
        k = FakeCudaArray((2, 2, 120, 64), strides=(2**64 + 8, 120 * 64 * 2, 64 * 2, 2), index=1)
    else:
        lse = FakeCudaArray((2, 8, 100), typestr="<f4", ptr=2**64 + fake_ptr(4))
    with pytest.raises(flashcore.InvalidArgumentError, match="does not fit|within the address space"):
        flashcore.forward_params(q, k, v, out, lse=lse)


def test_handle_arguments_that_do_not_fit_are_refused(lib):
    with pytest.raises(flashcore.InvalidArgumentError, match="device .* does not fit the C API's int32_t"):
        flashcore.Handle(device=2**32)
    with pytest.raises(TypeError, match="device must be an int"):
        flashcore.Handle(device=0.5)


def _cai(**overrides):
    cai = {"shape": (2, 8, 100, 64), "typestr": "<f2", "data": (fake_ptr(0), False), "strides": None,
           "version": 3, "stream": None}
    for key, value in overrides.items():
        if value is KeyError:
            del cai[key]
        else:
            cai[key] = value
    return cai


class _RawCai:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize("overrides,key", [
    ({"shape": KeyError}, "'shape'"),
    ({"shape": (2, 8, 100, 64.5)}, "['shape']"),
    ({"shape": (2, 8, 100.0, 64)}, "['shape']"),
    ({"shape": (2, 8, True, 64)}, "['shape']"),
    ({"shape": (2, 8, -1, 64)}, "['shape']"),
    ({"shape": "2x8"}, "['shape']"),
    ({"typestr": KeyError}, "'typestr'"),
    ({"typestr": "f2"}, "['typestr']"),
    ({"typestr": "<f"}, "['typestr']"),
    ({"typestr": 2}, "['typestr']"),
    ({"data": KeyError}, "'data'"),
    ({"data": (fake_ptr(0),)}, "['data']"),
    ({"data": ("0x1000", False)}, "['data']"),
    ({"data": (2**64, False)}, "['data']"),
    ({"data": (-16, False)}, "['data']"),
    ({"strides": (1, 2, 3)}, "['strides']"),
    ({"strides": (8 * 100 * 128, 100 * 128, 128, 2, 2)}, "['strides']"),
    ({"strides": (8 * 100 * 128, 100 * 128, 128.0, 2)}, "['strides']"),
    ({"version": "3"}, "['version']"),
    ({"stream": 1.5}, "['stream']"),
])
def test_malformed_cuda_array_interface_names_the_key(overrides, key):
    with pytest.raises(flashcore.InvalidArgumentError) as info:
        _arrays.describe(_RawCai(_cai(**overrides)), "q")
    assert str(info.value).count("q: __cuda_array_interface__") == 1 and key in str(info.value), str(info.value)


def test_cuda_array_interface_must_be_a_dict():
    with pytest.raises(TypeError, match="q: __cuda_array_interface__ must be a dict"):
        _arrays.describe(_RawCai([("shape", (1,))]), "q")
    _arrays.describe(_RawCai(_cai()), "q")  # the well-formed one is read


def test_malformed_dlpack_is_refused():
    x = FakeDLPackArray((2, 8, 100, 64))
    x._managed.dl_tensor.ndim = 1000
    with pytest.raises(flashcore.InvalidArgumentError, match="DLPack ndim"):
        _arrays.describe(x, "q")
    x = FakeDLPackArray((2, 8, -3, 64))
    with pytest.raises(flashcore.InvalidArgumentError, match="DLPack shape entry 2"):
        _arrays.describe(x, "q")
    x = FakeDLPackArray((2, 8, 100, 64), bits=12)
    with pytest.raises(flashcore.InvalidArgumentError, match="whole number of bytes"):
        _arrays.describe(x, "q")


@pytest.mark.parametrize("kwargs,cls,match", [
    ({"softmax_scale": True}, TypeError, "softmax_scale"),
    ({"softmax_scale": "0.5"}, TypeError, "softmax_scale"),
    ({"softmax_scale": 1e39}, flashcore.InvalidArgumentError, "float32"),
    ({"layout": 1.0}, TypeError, "layout"),
    ({"layout": True}, TypeError, "layout"),
    ({"layout": 2}, flashcore.InvalidArgumentError, "layout"),
    ({"num_splits": 2.0}, TypeError, "num_splits"),
])
def test_argument_types_are_checked(lib, kwargs, cls, match):
    q, k, v, out = fake_qkv()
    with pytest.raises(cls, match=match):
        flashcore.attention(q, k, v, out=out, **kwargs)
    # The integer spelling of a layout still works.
    flashcore.check_params(flashcore.forward_params(q, k, v, out, layout=0))


@pytest.mark.parametrize("shape", [(0, 8, 100, 64), (2, 8, 0, 64), (2, 0, 100, 64)])
def test_empty_inputs_give_an_empty_result(lib, shape):
    # As PyTorch: an empty output, nothing launched, no GPU needed; the
    # pointers of empty arrays (often NULL) are not looked at.
    b, h, s, d = shape
    q = FakeCudaArray(shape, ptr=0)
    k = FakeCudaArray((b, 2 if h else 0, 120, d), ptr=0)
    v = FakeCudaArray((b, 2 if h else 0, 120, d), ptr=0)
    out = FakeCudaArray(shape, ptr=0)
    assert flashcore.attention(q, k, v, out=out) is out
    lse = FakeCudaArray(shape[:3], typestr="<f4", ptr=0)
    assert flashcore.attention(q, k, v, out=out, lse=lse, return_lse=True) == (out, lse)
    flashcore.check_params(flashcore.forward_params(q, k, v, out))


def test_empty_merge_gives_an_empty_result(lib):
    partial = FakeCudaArray((3, 0, 8, 10, 64), ptr=0)
    partial_lse = FakeCudaArray((3, 0, 8, 10), typestr="<f4", ptr=0)
    out = FakeCudaArray((0, 8, 10, 64), ptr=0)
    assert flashcore.merge_states(partial, partial_lse, out=out, return_lse=False) is out


def test_keys_missing_where_rows_need_them_are_refused(lib):
    q, _, _, out = fake_qkv()
    k, v = FakeCudaArray((2, 2, 0, 64), index=1), FakeCudaArray((2, 2, 0, 64), index=2)
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(q, k, v, out=out))
    assert "seqlen_k (0)" in err.message


def test_aliased_output_is_refused_by_the_library(lib):
    q, k, v, _ = fake_qkv()
    out = FakeCudaArray((2, 8, 100, 64), index=1)  # k's memory
    err = raises_from_library(lib, flashcore.InvalidArgumentError, lambda: flashcore.attention(q, k, v, out=out))
    assert err.message.startswith("out (bytes 0x") and "overlaps k" in err.message
    # q, k and v may share memory.
    shared = FakeCudaArray((2, 8, 100, 64), index=0)
    flashcore.check_params(flashcore.forward_params(shared, shared, shared, FakeCudaArray((2, 8, 100, 64), index=3)))


def test_pointers_unknown_to_the_driver_are_refused(lib, monkeypatch):
    # A driver that knows no pointer: arrays without a framework are checked
    # with it before anything is queued.
    class NoPointers:
        @staticmethod
        def cuPointerGetAttribute(*args):
            return 1  # CUDA_ERROR_INVALID_VALUE

    monkeypatch.setattr(_arrays, "_cuda_driver", [NoPointers()])
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError, match=r"q \(0x[0-9a-f]+\) is not device memory the CUDA driver"):
        flashcore.attention(q, k, v, out=out)


# --------------------------------------------------------------------------
# seqused_k and attention_with_kvcache (0.5; no GPU needed)
# --------------------------------------------------------------------------


def test_seqused_k_default_null(lib):
    assert lib.new_params().seqused_k is None
    q, k, v, out = fake_qkv()
    assert flashcore.forward_params(q, k, v, out).seqused_k is None


@pytest.mark.parametrize("api", WINDOW_APIS)
def test_seqused_k_reaches_the_params(lib, api):
    q, k, v, out = fake_qkv(b=3)
    used = FakeCudaArray((3,), typestr="<i4", index=5)
    if api == "forward_params":
        p = flashcore.forward_params(q, k, v, out, seqused_k=used)
        assert p.seqused_k == fake_ptr(5)
    flashcore.check_params(flashcore.forward_params(q, k, v, out, seqused_k=used))


@pytest.mark.parametrize("api", WINDOW_APIS)
@pytest.mark.parametrize("bad,message", [
    (dict(shape=(3,), typestr="<i8"), "seqused_k must be int32 of shape [B] = [2]"),
    (dict(shape=(2,), typestr="<u4"), "seqused_k must be int32 of shape [B] = [2]"),
    (dict(shape=(3,), typestr="<i4"), "seqused_k must be int32 of shape [B] = [2]"),
    (dict(shape=(2, 1), typestr="<i4"), "seqused_k must be int32 of shape [B] = [2]"),
    (dict(shape=(2,), typestr="<i4", strides=(8,)), "seqused_k must be contiguous, got stride 2"),
])
def test_seqused_k_is_checked(lib, api, bad, message):
    q, k, v, out = fake_qkv(b=2)
    used = FakeCudaArray(index=5, **bad)
    with pytest.raises(flashcore.InvalidArgumentError) as e:
        _call(api, q, k, v, out, seqused_k=used)
    assert message in str(e.value)


def test_seqused_k_misaligned_or_overlapping_out_is_refused(lib):
    q, k, v, out = fake_qkv(b=2)
    with pytest.raises(flashcore.MisalignedError) as e:
        _call("forward_params", q, k, v, out, seqused_k=FakeCudaArray((2,), typestr="<i4", ptr=fake_ptr(5, 2)))
    assert "seqused_k" in str(e.value)
    with pytest.raises(flashcore.InvalidArgumentError) as e:
        _call("forward_params", q, k, v, out, seqused_k=FakeCudaArray((2,), typestr="<i4", ptr=fake_ptr(3)))
    assert "seqused_k" in str(e.value) and "overlaps out" in str(e.value)


def test_attention_with_kvcache_int_lengths_need_a_framework(lib):
    q, k, v, out = fake_qkv(b=2, hq=4, hkv=2, sq=1, sk=64)
    with pytest.raises(TypeError, match="an int cache_seqlens needs torch or cupy"):
        flashcore.attention_with_kvcache(q, k, v, 10, out=out)
    with pytest.raises(TypeError, match="cache_seqlens must be None, an int"):
        flashcore.attention_with_kvcache(q, k, v, 1.5, out=out)
    with pytest.raises(TypeError, match="cache_seqlens must be None, an int"):
        flashcore.attention_with_kvcache(q, k, v, True, out=out)


# --------------------------------------------------------------------------
# Variable-length batches (attention_varlen) and paged KV caches
# (attention_with_kvcache's block_table), 0.6; no GPU needed. The calls run
# up to the launch against a stand-in handle that keeps the params it is
# given (conftest.py's queued), so what they would queue is compared field
# by field.
# --------------------------------------------------------------------------

VARLEN_FIELDS = ("cu_seqlens_q", "cu_seqlens_k", "total_seqlen_q", "total_seqlen_k", "block_table",
                 "block_table_batch_stride", "page_size", "num_pages")


def test_varlen_and_paged_fields_default_off(lib):
    p = lib.new_params()
    assert all(not getattr(p, f) for f in VARLEN_FIELDS), {f: getattr(p, f) for f in VARLEN_FIELDS}
    q, k, v, out = fake_qkv()
    p = flashcore.forward_params(q, k, v, out)
    assert all(not getattr(p, f) for f in VARLEN_FIELDS)


def test_attention_varlen_queues_packed_params(queued):
    q, k, v, out, cu_q, cu_k = fake_varlen(b=3, hq=8, hkv=2, total_q=100, total_k=120, d=64)
    lse = FakeCudaArray((8, 100), typestr="<f4", index=4)
    used = FakeCudaArray((3,), typestr="<i4", index=8)
    options = dict(causal=True, window=(16, 0), softcap=30.0, num_splits=2, softmax_scale=0.25, seqused_k=used)
    result = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 50, 70, out=out, lse=lse, return_lse=True, **options)
    assert result == (out, lse)
    (p,) = queued
    assert (p.batch_size, p.seqlen_q, p.seqlen_k, p.total_seqlen_q, p.total_seqlen_k) == (3, 50, 70, 100, 120)
    assert (p.num_heads_q, p.num_heads_kv, p.head_dim, p.head_dim_v) == (8, 2, 64, 64)
    assert (p.q, p.k, p.v, p.out, p.lse) == tuple(fake_ptr(i) for i in range(5))
    assert (p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k) == (fake_ptr(5), fake_ptr(6), fake_ptr(8))
    # Rows of [total, H, D]: the batch strides are ignored, left 0.
    assert (p.q_batch_stride, p.q_seq_stride, p.q_head_stride) == (0, 8 * 64, 64)
    assert (p.k_batch_stride, p.k_seq_stride, p.k_head_stride) == (0, 2 * 64, 64)
    assert (p.out_batch_stride, p.out_seq_stride, p.out_head_stride) == (0, 8 * 64, 64)
    assert (p.causal, p.use_window, p.window_left, p.window_right, p.softcap, p.num_splits) == (1, 1, 16, 0, 30.0, 2)
    assert (p.block_table, p.page_size, p.num_pages, p.block_table_batch_stride) == (None, 0, 0, 0)
    flashcore.check_params(p)
    # forward_params builds the same struct from the same arguments.
    same = flashcore.forward_params(q, k, v, out, lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=50,
                                    max_seqlen_k=70, **options)
    assert bytes(same) == bytes(p)


def test_attention_varlen_strided_rows(queued):
    need_head_dim(128)
    # Packed rows padded to 72 elements, v with its own head_dim_v.
    q = FakeCudaArray((100, 8, 64), strides=(8 * 72 * 2, 72 * 2, 2), index=0)
    _, k, v, out, cu_q, cu_k = fake_varlen(total_q=100, d=192, dv=128)
    k = FakeCudaArray((120, 2, 64), index=1)
    v, out = FakeCudaArray((120, 2, 128), index=2), FakeCudaArray((100, 8, 128), index=3)
    flashcore.attention_varlen(q, k, v, cu_q, cu_k, 40, 40, out=out)
    (p,) = queued
    assert (p.q_seq_stride, p.q_head_stride, p.head_dim, p.head_dim_v) == (8 * 72, 72, 64, 128)
    assert (p.v_seq_stride, p.out_seq_stride) == (2 * 128, 8 * 128)
    flashcore.check_params(p)


@pytest.mark.parametrize("case,cls,match", [
    ("cu_seqlens_q int64", flashcore.InvalidArgumentError, r"cu_seqlens_q must be int32 of shape \[B \+ 1\]"),
    ("cu_seqlens_q 2-D", flashcore.InvalidArgumentError, r"cu_seqlens_q must be int32 of shape \[B \+ 1\]"),
    ("cu_seqlens_q empty", flashcore.InvalidArgumentError, r"cu_seqlens_q must be int32 of shape \[B \+ 1\]"),
    ("cu_seqlens_q strided", flashcore.InvalidArgumentError, "cu_seqlens_q must be contiguous, got stride 2"),
    ("cu_seqlens_k length", flashcore.InvalidArgumentError, r"cu_seqlens_k must be int32 of shape \[B \+ 1\] = \[4\] "
                                                            r"\(B = 3, from cu_seqlens_q"),
    ("cu_seqlens_k uint32", flashcore.InvalidArgumentError, r"cu_seqlens_k must be int32 .* got uint32 \[4\]"),
    ("cu_seqlens_k strided", flashcore.InvalidArgumentError, "cu_seqlens_k must be contiguous, got stride 4"),
    ("q 4-D", flashcore.InvalidArgumentError, r"q must be 3-D, \[total, H, D\]"),
    ("k 4-D", flashcore.InvalidArgumentError, r"k must be 3-D, \[total, H, D\]"),
    ("k v rows", flashcore.InvalidArgumentError, "k and v must have the same shape"),
    ("head_dim", flashcore.InvalidArgumentError, "same head_dim"),
    ("out rows", flashcore.InvalidArgumentError, r"out must have q's shape .* \[100, 8, 64\], got \[99, 8, 64\]"),
    ("float32", flashcore.UnsupportedError, "float32"),
    ("lse shape", flashcore.InvalidArgumentError, r"lse must be float32 of shape \[Hq, total_q\] = \[8, 100\]"),
    ("seqused_k", flashcore.InvalidArgumentError, r"seqused_k must be int32 of shape \[B\] = \[3\]"),
    ("max_seqlen_q < 0", flashcore.InvalidArgumentError, r"max_seqlen_q \(-1\) must be >= 0"),
    ("max_seqlen_k int32", flashcore.InvalidArgumentError, "max_seqlen_k .* does not fit the C API's int32_t"),
    ("max_seqlen_q float", TypeError, "max_seqlen_q must be an int"),
    ("max_seqlen_k None", TypeError, "cu_seqlens_k needs max_seqlen_k"),
    ("cu_seqlens_q list", TypeError, "cu_seqlens_q must be a CUDA array"),
    ("cu_seqlens_k host DLPack", flashcore.InvalidArgumentError, r"cu_seqlens_k is on the CPU \(DLPack device type 1\); flashcore needs CUDA device memory"),
])
def test_attention_varlen_binding_side_validation(lib, case, cls, match):
    q, k, v, out, cu_q, cu_k = fake_varlen()
    lengths = [50, 70]
    kwargs = {}
    if case == "cu_seqlens_q int64":
        cu_q = FakeCudaArray((4,), typestr="<i8", index=5)
    elif case == "cu_seqlens_q 2-D":
        cu_q = FakeCudaArray((4, 1), typestr="<i4", index=5)
    elif case == "cu_seqlens_q empty":
        cu_q = FakeCudaArray((0,), typestr="<i4", index=5)
    elif case == "cu_seqlens_q strided":
        cu_q = FakeCudaArray((4,), typestr="<i4", strides=(8,), index=5)
    elif case == "cu_seqlens_k length":
        cu_k = FakeCudaArray((5,), typestr="<i4", index=6)
    elif case == "cu_seqlens_k uint32":
        cu_k = FakeCudaArray((4,), typestr="<u4", index=6)
    elif case == "cu_seqlens_k strided":
        cu_k = FakeCudaArray((4,), typestr="<i4", strides=(16,), index=6)
    elif case == "q 4-D":
        q = FakeCudaArray((1, 100, 8, 64), index=0)
    elif case == "k 4-D":
        k = FakeCudaArray((1, 120, 2, 64), index=1)
    elif case == "k v rows":
        v = FakeCudaArray((121, 2, 64), index=2)
    elif case == "head_dim":
        k, v = FakeCudaArray((120, 2, 128), index=1), FakeCudaArray((120, 2, 128), index=2)
    elif case == "out rows":
        out = FakeCudaArray((99, 8, 64), index=3)
    elif case == "float32":
        q, k, v, out = (FakeCudaArray(a.__cuda_array_interface__["shape"], typestr="<f4", index=i)
                        for i, a in enumerate((q, k, v, out)))
    elif case == "lse shape":
        kwargs["lse"] = FakeCudaArray((3, 8, 50), typestr="<f4", index=4)
    elif case == "seqused_k":
        kwargs["seqused_k"] = FakeCudaArray((4,), typestr="<i4", index=8)
    elif case == "max_seqlen_q < 0":
        lengths[0] = -1
    elif case == "max_seqlen_k int32":
        lengths[1] = 2**31
    elif case == "max_seqlen_q float":
        lengths[0] = 50.0
    elif case == "max_seqlen_k None":
        lengths[1] = None
    elif case == "cu_seqlens_q list":
        cu_q = [0, 30, 60, 100]
    elif case == "cu_seqlens_k host DLPack":
        cu_k = FakeDLPackArray((4,), code=0, bits=32, device=(1, 0), index=6)
    with pytest.raises(cls, match=match) as info:
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, *lengths, out=out, **kwargs)
    if issubclass(cls, flashcore.FlashcoreError):
        assert info.value.status == cls.status_code


def test_attention_varlen_cpu_tensor_rejected(lib):
    torch = pytest.importorskip("torch")
    q, k, v, out, _, cu_k = fake_varlen()
    with pytest.raises(flashcore.InvalidArgumentError, match="cu_seqlens_q is on the CPU; flashcore needs CUDA device memory"):
        flashcore.attention_varlen(q, k, v, torch.tensor([0, 30, 60, 100], dtype=torch.int32), cu_k, 50, 70, out=out)


def test_attention_varlen_checks_of_the_library(lib):
    q, k, v, out, cu_q, cu_k = fake_varlen()
    # out's memory is cu_seqlens_q's: written over what the kernels read.
    overlapping = FakeCudaArray((4,), typestr="<i4", ptr=fake_ptr(3, 64))
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: flashcore.attention_varlen(q, k, v, overlapping, cu_k, 50, 70, out=out))
    assert "cu_seqlens_q" in err.message and "out" in err.message
    misaligned = FakeCudaArray((4,), typestr="<i4", ptr=fake_ptr(6, 2))
    err = raises_from_library(lib, flashcore.MisalignedError,
                               lambda: flashcore.attention_varlen(q, k, v, cu_q, misaligned, 50, 70, out=out))
    assert "cu_seqlens_k" in err.message
    # No key rows at all while queries need some.
    k0, v0 = FakeCudaArray((0, 2, 64), index=1), FakeCudaArray((0, 2, 64), index=2)
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: flashcore.attention_varlen(q, k0, v0, cu_q, cu_k, 50, 0, out=out))
    assert "seqlen_k (0)" in err.message


@pytest.mark.parametrize("batch,total_q", [(0, 100), (3, 0)])
def test_attention_varlen_empty(lib, queued, batch, total_q):
    # No sequence, or no query row: an empty result, nothing queued.
    q, k, v, out, cu_q, cu_k = fake_varlen(b=batch, total_q=total_q)
    lse = FakeCudaArray((8, total_q), typestr="<f4", index=4)
    assert flashcore.attention_varlen(q, k, v, cu_q, cu_k, 0 if total_q == 0 else 50, 70, out=out, lse=lse,
                                      return_lse=True) == (out, lse)
    assert queued == []


def test_attention_varlen_generic_arrays_need_out(lib):
    q, k, v, out, cu_q, cu_k = fake_varlen()
    with pytest.raises(TypeError, match="out="):
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 50, 70)
    with pytest.raises(TypeError, match="lse="):
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 50, 70, out=out, return_lse=True)


def test_attention_varlen_without_gpu_reports_no_device(lib, gpu_present):
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    q, k, v, out, cu_q, cu_k = fake_varlen()
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 50, 70, out=out, causal=True)


def test_forward_params_packs_each_side_alone(lib):
    # Packed queries over dense [B, S, H, D] keys, and the other way round.
    q, _, _, out, cu_q, cu_k = fake_varlen(b=3)
    k, v = FakeCudaArray((3, 70, 2, 64), index=1), FakeCudaArray((3, 70, 2, 64), index=2)
    p = flashcore.forward_params(q, k, v, out, layout="bshd", cu_seqlens_q=cu_q, max_seqlen_q=50)
    assert (p.batch_size, p.seqlen_q, p.total_seqlen_q, p.seqlen_k, p.total_seqlen_k) == (3, 50, 100, 70, 0)
    assert (p.k_batch_stride, p.cu_seqlens_k) == (70 * 2 * 64, None)
    flashcore.check_params(p)
    dense_q, dense_out = FakeCudaArray((3, 8, 50, 64), index=0), FakeCudaArray((3, 8, 50, 64), index=3)
    _, k, v, _, _, cu_k = fake_varlen(b=3)
    p = flashcore.forward_params(dense_q, k, v, dense_out, cu_seqlens_k=cu_k, max_seqlen_k=70)
    assert (p.batch_size, p.seqlen_q, p.total_seqlen_q, p.seqlen_k, p.total_seqlen_k) == (3, 50, 0, 70, 120)
    flashcore.check_params(p)
    k2, v2 = FakeCudaArray((2, 70, 2, 64), index=1), FakeCudaArray((2, 70, 2, 64), index=2)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"k \[2, 70, 2, 64\] must have batch size B = 3 "
                                                             r"\(from cu_seqlens_q"):
        flashcore.forward_params(q, k2, v2, out, layout="bshd", cu_seqlens_q=cu_q, max_seqlen_q=50)


def test_forward_params_max_seqlen_needs_its_cu_seqlens(lib):
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError, match="max_seqlen_q is given without cu_seqlens_q"):
        flashcore.forward_params(q, k, v, out, max_seqlen_q=100)
    q, k, v, out, cu_q, cu_k = fake_varlen()
    with pytest.raises(TypeError, match="cu_seqlens_q needs max_seqlen_q"):
        flashcore.forward_params(q, k, v, out, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_k=70)


@pytest.mark.parametrize("with_lengths", [True, False])
def test_paged_kvcache_queues_paged_params(queued, with_lengths):
    need_head_dim(128)
    q, k, v, out, _ = fake_paged(b=3, sq=4, num_pages=40, page_size=16, hkv=2, d=128)
    # A [:, :10] view of a [3, 12] table: the row stride is 12.
    table = FakeCudaArray((3, 10), typestr="<i4", strides=(12 * 4, 4), index=7)
    lengths = FakeCudaArray((3,), typestr="<i4", index=8) if with_lengths else None
    assert flashcore.attention_with_kvcache(q, k, v, lengths, block_table=table, out=out, causal=True) is out
    (p,) = queued
    assert (p.batch_size, p.seqlen_q, p.num_heads_q, p.num_heads_kv, p.head_dim) == (3, 4, 8, 2, 128)
    # seqlen_k is the capacity of a row of the table; lengths from cache_seqlens.
    assert (p.seqlen_k, p.page_size, p.num_pages, p.block_table_batch_stride) == (160, 16, 40, 12)
    assert (p.block_table, p.seqused_k) == (fake_ptr(7), fake_ptr(8) if with_lengths else None)
    # The pool's batch strides are its page strides.
    assert (p.k_batch_stride, p.k_seq_stride, p.k_head_stride) == (16 * 2 * 128, 2 * 128, 128)
    assert (p.v_batch_stride, p.q_batch_stride, p.q_seq_stride) == (16 * 2 * 128, 4 * 8 * 128, 8 * 128)
    assert (p.cu_seqlens_q, p.cu_seqlens_k, p.total_seqlen_q, p.total_seqlen_k, p.causal) == (None, None, 0, 0, 1)
    flashcore.check_params(p)
    same = flashcore.forward_params(q, k, v, out, layout="bshd", block_table=table, seqused_k=lengths, causal=True)
    assert bytes(same) == bytes(p)


def test_paged_kvcache_one_sequence_table_stride(queued):
    need_head_dim(128)
    # A one-row table's stride is never stepped along: whatever the
    # framework says, the call passes the row's length.
    q, k, v, out, _ = fake_paged(b=1, page_size=256, num_pages=3)
    table = FakeCudaArray((1, 5), typestr="<i4", strides=(4, 4), index=7)
    flashcore.attention_with_kvcache(q, k, v, block_table=table, out=out)
    (p,) = queued
    assert (p.block_table_batch_stride, p.seqlen_k, p.page_size) == (5, 5 * 256, 256)
    flashcore.check_params(p)


def test_paged_kvcache_with_packed_queries(queued):
    need_head_dim(128)
    # Chunked prefill on a paged cache: cu_seqlens_q with a block_table.
    _, k, v, _, table = fake_paged(b=3, num_pages=40, page_size=16, max_pages=10)
    q, out = FakeCudaArray((20, 8, 128), index=0), FakeCudaArray((20, 8, 128), index=3)
    cu_q = FakeCudaArray((4,), typestr="<i4", index=5)
    lengths = FakeCudaArray((3,), typestr="<i4", index=8)
    lse = FakeCudaArray((8, 20), typestr="<f4", index=4)
    flashcore.attention_with_kvcache(q, k, v, lengths, block_table=table, cu_seqlens_q=cu_q, max_seqlen_q=9,
                                     causal=True, out=out, lse=lse)
    (p,) = queued
    assert (p.batch_size, p.seqlen_q, p.total_seqlen_q, p.seqlen_k, p.q_batch_stride) == (3, 9, 20, 160, 0)
    assert (p.cu_seqlens_q, p.block_table, p.seqused_k, p.lse) == (fake_ptr(5), fake_ptr(7), fake_ptr(8), fake_ptr(4))
    flashcore.check_params(p)


@pytest.mark.parametrize("case,cls,match", [
    ("table int64", flashcore.InvalidArgumentError,
     r"block_table must be int32 of shape \[B, max_pages\] with B = 3 \(q's batch size\), got int64 \[3, 10\]"),
    ("table 1-D", flashcore.InvalidArgumentError, r"block_table must be int32 of shape \[B, max_pages\]"),
    ("table rows", flashcore.InvalidArgumentError, r"with B = 3 \(q's batch size\), got int32 \[2, 10\]"),
    ("table rows with cu_seqlens_q", flashcore.InvalidArgumentError, r"with B = 2 \(from cu_seqlens_q\)"),
    ("table columns strided", flashcore.InvalidArgumentError,
     r"block_table's rows must be contiguous \(stride 1 along max_pages\), got stride 2"),
    ("k 3-D", flashcore.InvalidArgumentError, r"k must be 4-D, \[num_pages, page_size, H, D\] \(a page pool\)"),
    ("v pages", flashcore.InvalidArgumentError, "k and v must have the same shape"),
    ("cache_seqlens", flashcore.InvalidArgumentError, r"cache_seqlens must be int32 of shape \[B\] = \[3\]"),
    ("table list", TypeError, "block_table must be a CUDA array"),
    ("table host DLPack", flashcore.InvalidArgumentError, r"block_table is on the CPU \(DLPack device type 1\); flashcore needs CUDA"),
])
def test_paged_kvcache_binding_side_validation(lib, case, cls, match):
    q, k, v, out, table = fake_paged()
    lengths, kwargs = None, {}
    if case == "table int64":
        table = FakeCudaArray((3, 10), typestr="<i8", index=7)
    elif case == "table 1-D":
        table = FakeCudaArray((30,), typestr="<i4", index=7)
    elif case == "table rows":
        table = FakeCudaArray((2, 10), typestr="<i4", index=7)
    elif case == "table rows with cu_seqlens_q":
        q, out = FakeCudaArray((20, 8, 128), index=0), FakeCudaArray((20, 8, 128), index=3)
        kwargs = dict(cu_seqlens_q=FakeCudaArray((3,), typestr="<i4", index=5), max_seqlen_q=10)
    elif case == "table columns strided":
        table = FakeCudaArray((3, 10), typestr="<i4", strides=(80, 8), index=7)
    elif case == "k 3-D":
        k = FakeCudaArray((40 * 16, 2, 128), index=1)
    elif case == "v pages":
        v = FakeCudaArray((41, 16, 2, 128), index=2)
    elif case == "cache_seqlens":
        lengths = FakeCudaArray((2,), typestr="<i4", index=8)
    elif case == "table list":
        table = [[0, 1], [2, 3], [4, 5]]
    elif case == "table host DLPack":
        table = FakeDLPackArray((3, 10), code=0, bits=32, device=(1, 0), index=7)
    with pytest.raises(cls, match=match) as info:
        flashcore.attention_with_kvcache(q, k, v, lengths, block_table=table, out=out, **kwargs)
    if issubclass(cls, flashcore.FlashcoreError):
        assert info.value.status == cls.status_code


@pytest.mark.parametrize("page_size", [8, 24])
def test_paged_kvcache_page_size_is_the_library_s_check(lib, page_size):
    need_head_dim(128)
    q, k, v, out, table = fake_paged(page_size=page_size)
    err = raises_from_library(lib, flashcore.UnsupportedError,
                               lambda: flashcore.attention_with_kvcache(q, k, v, block_table=table, out=out))
    assert "page_size (%d)" % page_size in err.message and "multiple of 16" in err.message


def test_paged_kvcache_checks_of_the_library(lib):
    need_head_dim(128)
    q, k, v, out, _ = fake_paged()
    misaligned = FakeCudaArray((3, 10), typestr="<i4", ptr=fake_ptr(7, 2))
    err = raises_from_library(lib, flashcore.MisalignedError,
                               lambda: flashcore.attention_with_kvcache(q, k, v, block_table=misaligned, out=out))
    assert "block_table" in err.message
    in_out = FakeCudaArray((3, 10), typestr="<i4", ptr=fake_ptr(3, 256))  # inside out's bytes
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: flashcore.attention_with_kvcache(q, k, v, block_table=in_out, out=out))
    assert "block_table" in err.message and "out" in err.message


def test_paged_and_packed_keys_cannot_be_combined(lib):
    q, k, v, out, cu_q, cu_k = fake_varlen()
    table = FakeCudaArray((3, 10), typestr="<i4", index=7)
    with pytest.raises(flashcore.InvalidArgumentError, match="cu_seqlens_k and block_table cannot be combined"):
        flashcore.forward_params(q, k, v, out, cu_seqlens_q=cu_q, max_seqlen_q=50, cu_seqlens_k=cu_k,
                                 max_seqlen_k=70, block_table=table)


def test_paged_kvcache_without_gpu_reports_no_device(lib, gpu_present):
    need_head_dim(128)
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    q, k, v, out, table = fake_paged()
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.attention_with_kvcache(q, k, v, FakeCudaArray((3,), typestr="<i4", index=8), block_table=table,
                                         out=out, causal=True)


# --------------------------------------------------------------------------
# The call cache (issue 18; no GPU needed): a call whose arrays have the
# shapes, strides, dtypes and devices of an earlier one, with the same
# options, reuses that call's params with its own addresses.
# --------------------------------------------------------------------------


def _without_addresses(p):
    """p's bytes with its array addresses zeroed."""
    p = type(p).from_buffer_copy(p)
    for field in _plan.POINTER_FIELDS:
        setattr(p, field, None)
    return bytes(p)


def _moved(array, offset):
    """A copy of a FakeCudaArray's interface at another address."""
    cai = dict(array.__cuda_array_interface__)
    cai["data"] = (cai["data"][0] + offset, cai["data"][1])
    moved = FakeCudaArray(cai["shape"])
    moved.__cuda_array_interface__ = cai
    return moved


def test_repeated_call_reuses_the_params_with_new_addresses(queued):
    q, k, v, out = fake_qkv(b=1, hq=4, hkv=2, sq=33, sk=65)
    flashcore.attention(q, k, v, out=out, causal=True, window=(8, 0))
    plans = len(_plan._plans)
    moved = [_moved(a, 4096 * (i + 1)) for i, a in enumerate((q, k, v, out))]
    flashcore.attention(*moved[:3], out=moved[3], causal=True, window=(8, 0))
    assert len(_plan._plans) == plans, "the second call made a plan of its own"
    first, second = queued
    assert _without_addresses(first) == _without_addresses(second)
    assert (second.q, second.k, second.v, second.out) == tuple(fake_ptr(i, 4096 * (i + 1)) for i in range(4))
    flashcore.check_params(second)


@pytest.mark.parametrize("change", ["strides", "dtype", "readonly out", "option", "return_lse"])
def test_what_the_key_holds_gives_a_new_plan(queued, change):
    q, k, v, out = fake_qkv(b=1, hq=4, hkv=4, sq=40, sk=40)
    flashcore.attention(q, k, v, out=out)
    kwargs = {}
    if change == "strides":  # the same shape, rows padded to 72 elements
        q = FakeCudaArray((1, 4, 40, 64), strides=(4 * 40 * 72 * 2, 40 * 72 * 2, 72 * 2, 2))
    elif change == "dtype":
        q, k, v, out = fake_qkv(b=1, hq=4, hkv=4, sq=40, sk=40, typestr="<f4")
    elif change == "readonly out":
        out = FakeCudaArray((1, 4, 40, 64), index=3, readonly=True)
    elif change == "option":
        kwargs["softmax_scale"] = 0.5
    else:
        kwargs.update(return_lse=True, lse=FakeCudaArray((1, 4, 40), typestr="<f4", index=4))
    plans = len(_plan._plans)
    try:
        flashcore.attention(q, k, v, out=out, **kwargs)
    except flashcore.FlashcoreError as e:  # float32, read-only out: refused as on the first call
        assert change in ("dtype", "readonly out"), e
    else:
        assert len(_plan._plans) == plans + 1
        assert queued[-1].q_seq_stride == (72 if change == "strides" else 64)
        assert queued[-1].softmax_scale == (0.5 if change == "option" else 0.0)


def test_values_equal_to_cached_ones_are_still_checked(queued):
    # True == 1 and 1.0: a bool is no softmax_scale and no num_splits,
    # whatever the cache holds for 1.
    q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=20, sk=20)
    flashcore.attention(q, k, v, out=out, softmax_scale=1.0, num_splits=1)
    with pytest.raises(TypeError, match="softmax_scale"):
        flashcore.attention(q, k, v, out=out, softmax_scale=True, num_splits=1)
    with pytest.raises(TypeError, match="num_splits"):
        flashcore.attention(q, k, v, out=out, softmax_scale=1.0, num_splits=True)
    with pytest.raises(TypeError, match="window"):
        flashcore.attention(q, k, v, out=out, window=(True, 0))


def test_cached_call_still_checks_the_addresses(lib, gpu_present):
    if gpu_present:
        pytest.skip("a GPU is present: the fake pointers of this test must not reach it")
    q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=24, sk=24)
    with pytest.raises(flashcore.NoDeviceError):
        flashcore.attention(q, k, v, out=out)  # valid: cached, then no device
    raises_from_library(lib, flashcore.MisalignedError, lambda: flashcore.attention(_moved(q, 2), k, v, out=out))
    err = raises_from_library(lib, flashcore.InvalidArgumentError,
                               lambda: flashcore.attention(q, k, v, out=_moved(out, fake_ptr(1) - fake_ptr(3))))
    assert "overlaps k" in err.message


def test_cached_call_still_asks_the_driver(lib, monkeypatch):
    q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=28, sk=28)
    handle = RecordingHandle()
    monkeypatch.setattr(_plan, "get_handle", lambda device=None: handle)
    monkeypatch.setattr(_arrays, "_cuda_driver", [None])  # no driver: nothing to ask
    flashcore.attention(q, k, v, out=out)
    flashcore.attention(q, k, v, out=out)
    assert len(handle.queued) == 2

    class KnowsNoPointer:
        @staticmethod
        def cuPointerGetAttribute(*args):
            return 1  # CUDA_ERROR_INVALID_VALUE

    monkeypatch.setattr(_arrays, "_cuda_driver", [KnowsNoPointer()])
    with pytest.raises(flashcore.InvalidArgumentError, match=r"q \(0x[0-9a-f]+\) is not device memory the CUDA driver"):
        flashcore.attention(q, k, v, out=out)
    assert len(handle.queued) == 2


def test_varlen_and_paged_calls_are_cached(queued):
    need_head_dim(128)
    q, k, v, out, cu_q, cu_k = fake_varlen(b=2, total_q=50, total_k=60)
    for _ in range(2):
        flashcore.attention_varlen(q, k, v, cu_q, cu_k, 30, 40, out=out, causal=True)
    q, k, v, out, table = fake_paged(b=2, sq=1)
    used = FakeCudaArray((2,), typestr="<i4", index=8)
    plans = len(_plan._plans)
    for _ in range(2):
        flashcore.attention_with_kvcache(q, k, v, used, block_table=table, out=out)
    assert len(_plan._plans) == plans + 1
    assert bytes(queued[0]) == bytes(queued[1]) and bytes(queued[2]) == bytes(queued[3])
    assert queued[2].block_table == fake_ptr(7) and queued[2].seqused_k == fake_ptr(8)


def test_the_cache_is_bounded(queued, monkeypatch):
    monkeypatch.setattr(_plan, "MAX_PLANS", 3)
    for sq in range(1, 9):
        q, k, v, out = fake_qkv(b=1, hq=2, hkv=2, sq=sq, sk=16)
        flashcore.attention(q, k, v, out=out)
        assert len(_plan._plans) <= 3
    assert len(queued) == 8


# --------------------------------------------------------------------------
# Messages for common mistakes (issue 18)
# --------------------------------------------------------------------------


def test_bshd_arrays_given_as_bhsd_get_a_hint(lib):
    # [B, S, H, D] = [2, 100, 8, 64] and [2, 120, 2, 64] read as [B, H, S, D]:
    # 100 query heads for 120 key heads.
    q, k, v = (FakeCudaArray(s, index=i) for i, s in enumerate([(2, 100, 8, 64), (2, 120, 2, 64), (2, 120, 2, 64)]))
    out = FakeCudaArray((2, 100, 8, 64), index=3)
    with pytest.raises(flashcore.InvalidArgumentError, match="num_heads") as info:
        flashcore.attention(q, k, v, out=out)
    assert "pass layout='bshd'" in str(info.value)
    # Where the head counts fit as given, the error is something else: no hint.
    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError) as info:
        flashcore.attention(q, k, v, out=FakeCudaArray((2, 8, 100, 64), index=1))  # out overlaps k
    assert "layout" not in str(info.value)


def test_host_arrays_are_named_as_such(lib):
    class HostArray:
        __array_interface__ = {"shape": (1, 1, 8, 64), "typestr": "<f2", "data": (4096, False), "version": 3}

    q, k, v, out = fake_qkv()
    with pytest.raises(flashcore.InvalidArgumentError,
                       match="q is a host array .*on the CPU.*; flashcore needs CUDA device memory"):
        flashcore.attention(HostArray(), k, v, out=out)
    with pytest.raises(flashcore.InvalidArgumentError,
                       match=r"^invalid argument: v is on the CPU \(DLPack device type 1\); flashcore needs CUDA"):
        flashcore.attention(q, k, FakeDLPackArray((2, 2, 120, 64), device=(1, 0)), out=out)


def test_torch_cpu_tensors_are_named_as_such(lib):
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(flashcore.InvalidArgumentError, match="^invalid argument: q is on the CPU; flashcore needs CUDA "
                                                             "device memory"):
        flashcore.attention(q, q, q)


# --------------------------------------------------------------------------
# python -m flashcore (issue 18)
# --------------------------------------------------------------------------


def test_python_m_flashcore_reports_library_and_gpus(lib, gpu_present):
    env = dict(os.environ, FLASHCORE_LIBRARY=lib.path,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashcore.__file__))] + sys.path))
    proc = subprocess.run([sys.executable, "-m", "flashcore"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("flashcore (Python package) %s" % flashcore.__version__)
    assert "libflashcore %s at %s" % (lib.version, lib.path) in proc.stdout
    pairs = ", ".join("(%d, %d)" % pair for pair in lib.supported_head_dims())
    assert "kernels for (head_dim, head_dim_v): %s;" % pairs in proc.stdout
    if gpu_present:
        assert re.search(r"^GPU 0: .*compute capability \d+\.\d+, \d+ SMs", proc.stdout, re.M), proc.stdout
    else:
        assert re.search(r"^GPUs: none \(", proc.stdout, re.M), proc.stdout


def test_python_m_flashcore_without_a_library(tmp_path):
    env = dict(os.environ, FLASHCORE_LIBRARY=str(tmp_path / "missing.so"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashcore.__file__))] + sys.path))
    proc = subprocess.run([sys.executable, "-m", "flashcore"], capture_output=True, text=True, env=env, timeout=120)
    if flashcore._library.bundled():
        pytest.skip("this package bundles a library, which comes before FLASHCORE_LIBRARY")
    assert proc.returncode == 1 and "libflashcore: not loaded" in proc.stdout and "missing.so" in proc.stdout
