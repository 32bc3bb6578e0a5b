"""The generated module: up to date with the header, faithful to the C ABI,
and produced by a generator that refuses what it cannot bind."""

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess

import pytest

from flashcore import _ffi
from fc_testing import PACKAGE_ROOT, REPO_ROOT

GENERATOR = os.path.join(PACKAGE_ROOT, "tools", "generate_ffi.py")
COMMITTED = os.path.join(PACKAGE_ROOT, "flashcore", "_ffi.py")
HEADER = os.path.join(REPO_ROOT, "include", "flashcore.h")


def _generator():
    pytest.importorskip("pycparser", reason="pycparser is needed to run the generator")
    spec = importlib.util.spec_from_file_location("generate_ffi", GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    try:
        gen.find_cpp()
    except gen.GeneratorError as e:
        pytest.skip(str(e))
    return gen


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def test_generated_module_is_up_to_date():
    gen = _generator()
    with open(COMMITTED, encoding="utf-8") as f:
        committed = f.read()
    assert gen.generate(HEADER) == committed, \
        "flashcore/_ffi.py is stale: run python3 bindings/python/tools/generate_ffi.py"


def test_imported_module_was_generated_from_this_header():
    if not os.path.isfile(HEADER):
        pytest.skip("not in the source tree: %s is missing" % HEADER)
    with open(HEADER, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == _ffi.HEADER_SHA256, \
            "the imported flashcore._ffi was generated from another flashcore.h"


def test_abi_matches_a_c_compiler(tmp_path):
    """sizeof/offsetof/alignment of every struct and field, the size of every
    typedef, and the value of every enum constant and macro, as a C compiler
    sees the header, against the generated ctypes declarations."""
    cc = _cc()
    body, expected = [], {}

    def probe(key, fmt, c_expr, value):
        body.append('    printf("%s %s\\n", %s);' % (key, fmt, c_expr))
        expected[key] = value

    for name, value in vars(_ffi).items():
        if isinstance(value, type) and issubclass(value, ctypes.Structure):
            probe("sizeof:" + name, "%zu", "sizeof(%s)" % name, str(ctypes.sizeof(value)))
            probe("alignof:" + name, "%zu", "_Alignof(%s)" % name, str(ctypes.alignment(value)))
            for field, ftype in value._fields_:
                probe("offsetof:%s.%s" % (name, field), "%zu", "offsetof(%s, %s)" % (name, field),
                      str(getattr(value, field).offset))
                probe("sizeof:%s.%s" % (name, field), "%zu", "sizeof(((%s *)0)->%s)" % (name, field),
                      str(ctypes.sizeof(ftype)))
        elif name.startswith("flashcore_") and isinstance(value, type) and issubclass(value, ctypes._SimpleCData):
            probe("sizeof:" + name, "%zu", "sizeof(%s)" % name, str(ctypes.sizeof(value)))
        elif name.startswith("FLASHCORE_") and isinstance(value, (int, float)):
            probe("value:" + name, "%.17g", "(double)(%s)" % name, "%.17g" % float(value))
    assert any(k.startswith("offsetof:flashcore_forward_params.struct_size") for k in expected)
    # The 0.3 to 0.6 additions are among what is compared.
    assert "offsetof:flashcore_forward_params.num_splits" in expected
    assert all("offsetof:flashcore_forward_params.%s" % f in expected for f, _ in VARLEN_PAGED_FIELDS)
    assert all("offsetof:flashcore_forward_params.%s" % f in expected for f in WINDOW_SOFTCAP_FIELDS)
    assert all("offsetof:flashcore_merge_params.%s" % f in expected for f in MERGE_FIELDS)
    assert "value:FLASHCORE_MAX_NUM_SPLITS" in expected and "value:FLASHCORE_DTYPE_FP32" in expected
    # And the 0.9 ones.
    assert all("offsetof:flashcore_forward_params.%s" % f in expected for f, _ in CHUNK_SINKS_FIELDS)
    assert "offsetof:flashcore_backward_params.dsinks" in expected
    assert "offsetof:flashcore_merge_params.sinks" in expected
    assert all("offsetof:flashcore_%s_params.sm_margin" % s in expected for s in ("forward", "backward"))
    src = tmp_path / "abi.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"flashcore.h\"\nint main(void) {\n%s\n"
                   "    return 0;\n}\n" % "\n".join(body))
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.dirname(HEADER), "-o", str(exe), str(src)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    seen = dict(line.split(" ", 1) for line in out.splitlines())
    assert seen == expected


MERGE_FIELDS = [
    "struct_size", "partial_dtype", "out_dtype", "num_states", "batch_size", "num_heads", "seqlen", "head_dim",
    "partial_out", "partial_lse", "out", "lse",
    "partial_state_stride", "partial_batch_stride", "partial_seq_stride", "partial_head_stride",
    "lse_state_stride", "lse_batch_stride", "lse_seq_stride", "lse_head_stride",
    "out_batch_stride", "out_seq_stride", "out_head_stride",
]


def test_split_kv_and_merge_declarations():
    """What 0.3 added, as the bindings use it: num_splits appended to the
    forward params (the struct only grows at the end), the merge struct's
    fields in header order, FP32 and the split limit, and both functions."""
    fields = [f for f, _ in _ffi.flashcore_forward_params._fields_]
    assert fields[fields.index("head_dim_v"):][:2] == ["head_dim_v", "num_splits"]
    assert _ffi.flashcore_forward_params.num_splits.offset + 4 <= ctypes.sizeof(_ffi.flashcore_forward_params)
    assert dict(_ffi.flashcore_forward_params._fields_)["num_splits"] is ctypes.c_int32
    merge = _ffi.flashcore_merge_params
    assert [f for f, _ in merge._fields_][:len(MERGE_FIELDS)] == MERGE_FIELDS
    types = dict(merge._fields_)
    assert types["struct_size"] is ctypes.c_size_t
    assert all(types[f] is ctypes.c_int32 for f in MERGE_FIELDS[1:8])
    assert all(types[f] is ctypes.c_void_p for f in MERGE_FIELDS[8:12])
    assert all(types[f] is ctypes.c_int64 for f in MERGE_FIELDS[12:])
    assert _ffi.Dtype.FP32 == _ffi.FLASHCORE_DTYPE_FP32 == 3
    assert _ffi.FLASHCORE_MAX_NUM_SPLITS == 128
    funcs = {f[0]: f for f in _ffi.FUNCTIONS}
    init = funcs["flashcore_merge_params_init"]
    assert init[1] is _ffi.flashcore_status
    assert [a for a, _ in init[2]] == ["params", "struct_size"]
    assert init[2][0][1]._type_ is merge and init[2][1][1] is ctypes.c_size_t
    merge_fn = funcs["flashcore_merge_states"]
    assert [a for a, _ in merge_fn[2]] == ["handle", "params", "stream"]
    assert merge_fn[2][0][1] is _ffi.flashcore_handle and merge_fn[2][1][1]._type_ is merge
    assert merge_fn[2][2][1] is ctypes.c_void_p


WINDOW_SOFTCAP_FIELDS = ["use_window", "window_left", "window_right", "softcap"]


def test_window_and_softcap_declarations():
    """What 0.4 added: the sliding window and softcap fields appended to the
    forward params after num_splits, in header order, with their C types."""
    fields = [f for f, _ in _ffi.flashcore_forward_params._fields_]
    start = fields.index("num_splits")
    assert fields[start:start + 5] == ["num_splits"] + WINDOW_SOFTCAP_FIELDS
    types = dict(_ffi.flashcore_forward_params._fields_)
    assert all(types[f] is ctypes.c_int32 for f in WINDOW_SOFTCAP_FIELDS[:3])
    assert types["softcap"] is ctypes.c_float
    assert _ffi.flashcore_forward_params.softcap.offset + 4 <= ctypes.sizeof(_ffi.flashcore_forward_params)


def test_seqused_k_declaration():
    """What 0.5 added: seqused_k, a pointer, appended after softcap."""
    fields = _ffi.flashcore_forward_params._fields_
    assert fields[[f for f, _ in fields].index("softcap") + 1] == ("seqused_k", ctypes.c_void_p)
    params = _ffi.flashcore_forward_params
    assert params.seqused_k.offset >= params.softcap.offset + 4
    assert params.seqused_k.offset % ctypes.sizeof(ctypes.c_void_p) == 0


# What 0.6 added after seqused_k, in header order, with their C types.
VARLEN_PAGED_FIELDS = [
    ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
    ("total_seqlen_q", ctypes.c_int32), ("total_seqlen_k", ctypes.c_int32),
    ("block_table", ctypes.c_void_p), ("block_table_batch_stride", ctypes.c_int64),
    ("page_size", ctypes.c_int32), ("num_pages", ctypes.c_int32),
]


def test_varlen_and_paged_declarations():
    """What 0.6 added: the variable-length and paged-cache fields, appended
    after seqused_k."""
    fields = _ffi.flashcore_forward_params._fields_
    start = fields.index(("seqused_k", ctypes.c_void_p))
    assert fields[start:start + len(VARLEN_PAGED_FIELDS) + 1] == [("seqused_k", ctypes.c_void_p)] + VARLEN_PAGED_FIELDS
    params = _ffi.flashcore_forward_params
    assert params.cu_seqlens_q.offset >= params.seqused_k.offset + ctypes.sizeof(ctypes.c_void_p)
    assert params.block_table_batch_stride.offset % 8 == 0
    assert params.num_pages.offset + 4 <= ctypes.sizeof(params)


# What 0.8 added after num_pages, in header order, with their C types: quantized K/V.
QUANTIZED_FIELDS = (
    [("kv_dtype", ctypes.c_int32), ("out_dtype", ctypes.c_int32)]
    + [("%s_descale" % t, ctypes.c_void_p) for t in "qkv"]
    + [("%s_descale_%s_stride" % (t, w), ctypes.c_int64) for t in "qkv" for w in ("batch", "head")])


def test_quantized_declarations():
    """What 0.8 added: kv_dtype, out_dtype and the descale arrays with their
    strides, appended after num_pages. FP8_E4M3 is a Dtype."""
    fields = _ffi.flashcore_forward_params._fields_
    start = fields.index(("num_pages", ctypes.c_int32))
    assert fields[start:start + len(QUANTIZED_FIELDS) + 1] == [("num_pages", ctypes.c_int32)] + QUANTIZED_FIELDS
    params = _ffi.flashcore_forward_params
    assert params._c_types_["k_descale"] == "const float *" and params._c_types_["kv_dtype"] == "int32_t"
    assert params.q_descale.offset % ctypes.sizeof(ctypes.c_void_p) == 0
    assert _ffi.Dtype.FP8_E4M3 == 4 and _ffi.FLASHCORE_DTYPE_FP8_E4M3 is _ffi.Dtype.FP8_E4M3


# What 0.9 added at the end of each params struct, in header order, with
# their C types: chunked attention and learnable sinks (and their gradient),
# then the SMs left to other streams (sm_margin, the last field of both).
CHUNK_SINKS_FIELDS = [("attention_chunk", ctypes.c_int32), ("sinks", ctypes.c_void_p)]
SM_MARGIN_FIELDS = [("sm_margin", ctypes.c_int32)]


def _padded_end(struct, field):
    """Where struct ends after its last field, an int32: padded to the
    struct's alignment (its pointers')."""
    align = ctypes.alignment(struct)
    return (getattr(struct, field).offset + 4 + align - 1) // align * align


def test_chunk_and_sinks_declarations():
    """What 0.9 added: attention_chunk and sinks after the descale strides,
    and after total_seqlen_k with dsinks after them (the backward's), then
    sm_margin, the last field of both structs; sinks at the end of the
    merge struct."""
    forward = _ffi.flashcore_forward_params
    assert forward._fields_[-4:] == ([("v_descale_head_stride", ctypes.c_int64)] + CHUNK_SINKS_FIELDS
                                     + SM_MARGIN_FIELDS)
    assert forward.sinks.offset + ctypes.sizeof(ctypes.c_void_p) == forward.sm_margin.offset
    assert _padded_end(forward, "sm_margin") == ctypes.sizeof(forward)
    assert forward._c_types_["sinks"] == "const float *" and forward._c_types_["attention_chunk"] == "int32_t"
    assert forward._c_types_["sm_margin"] == "int32_t"
    backward = _ffi.flashcore_backward_params
    assert backward._fields_[-5:] == ([("total_seqlen_k", ctypes.c_int32)] + CHUNK_SINKS_FIELDS
                                      + [("dsinks", ctypes.c_void_p)] + SM_MARGIN_FIELDS)
    assert backward._c_types_["dsinks"] == "float *" and backward._c_types_["sinks"] == "const float *"
    assert backward._c_types_["sm_margin"] == "int32_t"
    assert backward.dsinks.offset + ctypes.sizeof(ctypes.c_void_p) == backward.sm_margin.offset
    assert _padded_end(backward, "sm_margin") == ctypes.sizeof(backward)
    merge = _ffi.flashcore_merge_params
    assert [f for f, _ in merge._fields_] == MERGE_FIELDS + ["sinks"]
    assert dict(merge._fields_)["sinks"] is ctypes.c_void_p and merge._c_types_["sinks"] == "const float *"
    assert (_ffi.FLASHCORE_VERSION_MAJOR, _ffi.FLASHCORE_VERSION_MINOR) == (0, 9)


# What 0.7 added: the backward pass's struct, in header order.
BACKWARD_TENSORS = ["q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"]
BACKWARD_FIELDS = (
    ["struct_size", "dtype", "batch_size", "seqlen_q", "seqlen_k", "num_heads_q", "num_heads_kv", "head_dim",
     "head_dim_v", "causal", "softmax_scale", "use_window", "window_left", "window_right", "softcap", "deterministic"]
    + BACKWARD_TENSORS
    + ["%s_%s_stride" % (t, w) for t in BACKWARD_TENSORS if t != "lse" for w in ("batch", "seq", "head")]
    + ["seqused_k", "cu_seqlens_q", "cu_seqlens_k", "total_seqlen_q", "total_seqlen_k"])


def test_backward_declarations():
    """What 0.7 added: flashcore_backward_params (struct_size first, the
    forward's options, deterministic, the nine tensors, 24 strides, the
    ragged fields) and its five functions, as the binding calls them."""
    backward = _ffi.flashcore_backward_params
    assert [f for f, _ in backward._fields_][:len(BACKWARD_FIELDS)] == BACKWARD_FIELDS
    types = dict(backward._fields_)
    assert types["struct_size"] is ctypes.c_size_t
    assert types["softmax_scale"] is ctypes.c_float and types["softcap"] is ctypes.c_float
    assert all(types[f] is ctypes.c_void_p for f in BACKWARD_TENSORS + ["seqused_k", "cu_seqlens_q", "cu_seqlens_k"])
    assert all(types[f] is ctypes.c_int64 for f in BACKWARD_FIELDS if f.endswith("_stride"))
    assert backward._c_types_["lse"] == "const float *" and backward._c_types_["dq"] == "void *"
    funcs = {f[0]: f for f in _ffi.FUNCTIONS}
    expected = {
        "flashcore_backward_params_init": ["params", "struct_size"],
        "flashcore_backward_set_contiguous_strides": ["params", "layout"],
        "flashcore_backward_check": ["params"],
        "flashcore_backward_workspace_size": ["handle", "params", "workspace_bytes"],
        "flashcore_backward": ["handle", "params", "workspace", "workspace_bytes", "stream"],
    }
    for name, args in expected.items():
        assert funcs[name][1] is _ffi.flashcore_status, name
        assert [a for a, _ in funcs[name][2]] == args, name
        params = dict(funcs[name][2])["params"]
        assert params._type_ is backward, name
    assert dict(funcs["flashcore_backward"][2])["workspace_bytes"] is ctypes.c_size_t


def test_functions_have_named_arguments():
    names = [f[0] for f in _ffi.FUNCTIONS]
    assert len(names) == len(set(names)) and all(n.startswith("flashcore_") for n in names)
    for name, _, params in _ffi.FUNCTIONS:
        assert all(arg and ctype is not None for arg, ctype in params), name


SYNTHETIC = """\
#include <stddef.h>
#include <stdint.h>
#define FLASHCORE_A 3
/* B's comment */
#define FLASHCORE_B (FLASHCORE_A * 2 + 1)
#define FLASHCORE_HALF 0.5f
typedef enum flashcore_color {
    FLASHCORE_COLOR_RED,
    FLASHCORE_COLOR_GREEN = FLASHCORE_B - 2, /* green */
    FLASHCORE_COLOR_BLUE
} flashcore_color;
typedef struct flashcore_thing {
    size_t struct_size;
    int64_t a, b;
    const char *name;
    unsigned char bytes[FLASHCORE_A];
} flashcore_thing;
typedef struct flashcore_opaque_s *flashcore_opaque;
/* Does f. */
int flashcore_f(const flashcore_thing *thing, flashcore_color color, flashcore_opaque *out);
const char *flashcore_name(void);
"""


def _generate(gen, tmp_path, text):
    header = tmp_path / "flashcore_test.h"
    header.write_text(text)
    return gen.generate(str(header))


def test_generator_on_a_synthetic_header(tmp_path):
    code = _generate(_generator(), tmp_path, SYNTHETIC)
    ns = {}
    exec(compile(code, "generated", "exec"), ns)
    assert ns["FLASHCORE_A"] == 3 and ns["FLASHCORE_B"] == 7 and ns["FLASHCORE_HALF"] == 0.5
    color = ns["Color"]
    assert [(m.name, m.value) for m in color] == [("RED", 0), ("GREEN", 5), ("BLUE", 6)]
    assert ns["FLASHCORE_COLOR_BLUE"] is color.BLUE
    thing = ns["flashcore_thing"]
    assert [f for f, _ in thing._fields_] == ["struct_size", "a", "b", "name", "bytes"]
    assert ctypes.sizeof(thing) == 8 + 8 + 8 + 8 + 8  # 3 bytes padded to 8
    assert ns["flashcore_opaque"] is ctypes.c_void_p
    funcs = {f[0]: f for f in ns["FUNCTIONS"]}
    assert funcs["flashcore_f"][1] is ctypes.c_int
    assert [a for a, _ in funcs["flashcore_f"][2]] == ["thing", "color", "out"]
    assert funcs["flashcore_f"][2][2][1]._type_ is ctypes.c_void_p
    assert funcs["flashcore_name"] == ("flashcore_name", ctypes.c_char_p, ())
    assert "# B's comment" in code and "# green" in code and "# Does f." in code


def test_generated_structs_check_assignments(tmp_path):
    """Each struct records its fields' C types as the header spells them,
    and an assignment a field would not hold as given raises, naming the
    field (ValueError and TypeError outside the flashcore package) where
    ctypes would wrap the int or refuse naming nothing."""
    ns = {}
    exec(compile(_generate(_generator(), tmp_path, SYNTHETIC), "generated", "exec"), ns)
    thing = ns["flashcore_thing"]
    assert thing._c_types_ == {"struct_size": "size_t", "a": "int64_t", "b": "int64_t", "name": "const char *",
                               "bytes": "unsigned char[3]"}
    t = thing()
    t.a, t.struct_size, t.name = -2**63, 2**64 - 1, 2**64 - 1
    assert (t.a, t.struct_size, t.name) == (-2**63, 2**64 - 1, 2**64 - 1)
    with pytest.raises(ValueError, match=r"^flashcore_thing\.a \(9223372036854775808\) does not fit its C type "
                                         r"int64_t \(-9223372036854775808 to 9223372036854775807\)$"):
        t.a = 2**63
    with pytest.raises(ValueError, match=r"flashcore_thing\.struct_size \(-1\) does not fit its C type size_t"):
        t.struct_size = -1
    with pytest.raises(ValueError, match=r"flashcore_thing\.name \(-16\) does not fit its C type const char \*"):
        t.name = -16
    with pytest.raises(TypeError, match=r"flashcore_thing\.b \(int64_t\) must be an int, got float 1\.5"):
        t.b = 1.5
    assert (t.a, t.struct_size, t.name, t.b) == (-2**63, 2**64 - 1, 2**64 - 1, 0)
    t.bytes = (ctypes.c_ubyte * 3)(1, 2, 3)  # an array field: as ctypes takes it
    assert list(t.bytes) == [1, 2, 3]


@pytest.mark.parametrize("decl,match", [
    ("typedef void (*flashcore_callback)(int);", "function pointer"),
    ("int other_prefix(void);", "does not start with"),
    ("int flashcore_variadic(int n, ...);", "variadic"),
    ("extern int flashcore_global;", "no binding rule"),
    ("#define FLASHCORE_TEXT \"text\"", "cannot evaluate"),
])
def test_generator_refuses_what_it_cannot_bind(tmp_path, decl, match):
    gen = _generator()
    with pytest.raises(gen.GeneratorError, match=match):
        _generate(gen, tmp_path, "#include <stddef.h>\n" + decl + "\n")


def test_check_mode_reports_drift(tmp_path):
    gen = _generator()
    stale = tmp_path / "_ffi.py"
    stale.write_text("# stale\n")
    assert gen.main(["--header", HEADER, "--output", str(stale), "--check"]) == 1
    assert gen.main(["--header", HEADER, "--output", str(stale)]) == 0
    assert gen.main(["--header", HEADER, "--output", str(stale), "--check"]) == 0
