#!/usr/bin/env python3
"""Generates flashcore/_ffi.py (the ctypes declarations) from include/flashcore.h.

    python3 bindings/python/tools/generate_ffi.py            # rewrite _ffi.py
    python3 bindings/python/tools/generate_ffi.py --check    # exit 1 if it is stale

The header goes through the C preprocessor (cc -E, with no predefined compiler
macros, so FLASHCORE_API expands to nothing, and with a stand-in <stddef.h> and
<stdint.h> that only declare the standard type names), then through pycparser.
Every enum, struct, opaque handle type, function prototype and numeric
`#define FLASHCORE_*` constant of the header becomes a ctypes declaration;
anything the generator does not know how to bind stops it with an error rather
than being dropped. Each struct also records its fields' C types
(_c_types_), against which flashcore/_fields.py checks an assignment to a
field: a value the field would not store as given (an int out of its range,
which ctypes wraps; a float that would become infinite or 0) is refused,
naming the field. The comments in front of each declaration are copied, so
the module documents itself. The output depends only on the header's text.

Needs: Python 3.8+, pycparser (2.21 or later), and a C compiler driver that
takes -E (cc, gcc or clang; set FLASHCORE_CPP to choose one).
"""

import argparse
import difflib
import hashlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

try:
    from pycparser import c_ast, c_parser
except ImportError:  # reported by parse(), so --help and imports still work
    c_ast = c_parser = None

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_ROOT))
DEFAULT_HEADER = os.path.join(REPO_ROOT, "include", "flashcore.h")
DEFAULT_OUTPUT = os.path.join(PACKAGE_ROOT, "flashcore", "_ffi.py")
MACRO_PREFIX = "FLASHCORE_"
SYMBOL_PREFIX = "flashcore_"
# Names the stand-in variable declarations for macros get, never in the header.
MACRO_PROBE = "flashcore_ffi_macro_probe__"

# Standard typedef names the header may use, and their ctypes equivalents.
STANDARD_TYPES = {
    "size_t": "ctypes.c_size_t",
    "ptrdiff_t": "ctypes.c_ssize_t",
    "intptr_t": "ctypes.c_ssize_t",
    "uintptr_t": "ctypes.c_size_t",
    "int8_t": "ctypes.c_int8",
    "int16_t": "ctypes.c_int16",
    "int32_t": "ctypes.c_int32",
    "int64_t": "ctypes.c_int64",
    "uint8_t": "ctypes.c_uint8",
    "uint16_t": "ctypes.c_uint16",
    "uint32_t": "ctypes.c_uint32",
    "uint64_t": "ctypes.c_uint64",
}
# What pycparser needs to know these are type names; their C types don't matter.
STANDIN_HEADERS = {
    "stddef.h": ["size_t", "ptrdiff_t"],
    "stdint.h": [n for n in STANDARD_TYPES if n not in ("size_t", "ptrdiff_t")],
}


class GeneratorError(Exception):
    pass


# --------------------------------------------------------------------------
# Preprocessing and parsing
# --------------------------------------------------------------------------


def find_cpp():
    chosen = os.environ.get("FLASHCORE_CPP")
    if chosen:
        return shlex.split(chosen)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    raise GeneratorError("no C preprocessor found: install gcc or clang, or set FLASHCORE_CPP")


def run_cpp(cpp, source, include_dir, extra):
    cmd = cpp + ["-E", "-undef", "-U__GNUC__", "-nostdinc", "-x", "c", "-I", include_dir] + extra + ["-"]
    proc = subprocess.run(cmd, input=source, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GeneratorError("preprocessor failed (%s):\n%s" % (" ".join(cmd), proc.stderr))
    return proc.stdout


def header_macro_names(text):
    """Object-like FLASHCORE_* macros #defined in the header, in order."""
    names = []
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(%s\w*)(?![\w(])" % MACRO_PREFIX, text, re.M):
        if m.group(1) not in names:
            names.append(m.group(1))
    return names


def preprocess(header, text, cpp):
    """Returns (preprocessed source, macros with a non-empty expansion)."""
    with tempfile.TemporaryDirectory(prefix="flashcore-ffi-") as tmp:
        for fname, types in STANDIN_HEADERS.items():
            with open(os.path.join(tmp, fname), "w") as f:
                f.writelines("typedef int %s;\n" % t for t in types)
        include = '#include "%s"\n' % header.replace("\\", "\\\\").replace('"', '\\"')
        defined = run_cpp(cpp, include, tmp, ["-dM"])
        bodies = {}
        for line in defined.splitlines():
            m = re.match(r"#define (\w+)(?: (.*))?$", line)
            if m:
                bodies[m.group(1)] = (m.group(2) or "").strip()
        macros = [n for n in header_macro_names(text) if bodies.get(n)]
        probes = "".join("static const int %s%s = %s;\n" % (MACRO_PROBE, n, n) for n in macros)
        return run_cpp(cpp, include + probes, tmp, []), macros


def parse(source):
    if c_parser is None:
        raise GeneratorError("pycparser is not installed (pip install pycparser, or apt install python3-pycparser)")
    return c_parser.CParser().parse(source, filename="<stdin>")


# --------------------------------------------------------------------------
# Comments of the header, by line
# --------------------------------------------------------------------------


class Comments:
    def __init__(self, text):
        self.leading = {}  # line after a standalone comment ends -> its text
        self.trailing = {}  # line a comment that follows code starts on -> its text
        line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

        def line_of(pos):
            lo, hi = 0, len(line_starts) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if line_starts[mid] <= pos:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1

        for m in re.finditer(r"/\*(.*?)\*/", text, re.S):
            first, last = line_of(m.start()), line_of(m.end())
            before = text[line_starts[first - 1]:m.start()]
            body = self._clean(m.group(1))
            if before.strip():
                self.trailing[first] = body
            else:
                self.leading[last + 1] = body

    @staticmethod
    def _clean(body):
        lines = []
        for raw in body.split("\n"):
            line = raw.strip()
            if line.startswith("*"):
                line = line[1:]
                if line.startswith(" "):
                    line = line[1:]
            line = line.rstrip()
            if re.fullmatch(r"-+", line.strip()):
                continue
            lines.append(line)
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        # Keep relative indentation (code samples) but drop the common margin.
        margin = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
        return [l[margin:] if l.strip() else "" for l in lines]

    def for_decl(self, first_line, last_line=None):
        out = list(self.leading.get(first_line, []))
        trail = self.trailing.get(last_line if last_line is not None else first_line)
        if trail:
            out.extend(trail)
        return out


def python_comment(lines, indent):
    return "".join((indent + "# " + l).rstrip() + "\n" for l in lines)


def wrap(items, indent, width=112):
    """items joined by spaces into lines of at most width characters."""
    lines, line = [], ""
    for item in items:
        if line and len(indent) + len(line) + 1 + len(item) > width:
            lines.append(line)
            line = ""
        line = item if not line else line + " " + item
    if line:
        lines.append(line)
    return "".join(indent + l + "\n" for l in lines)


# --------------------------------------------------------------------------
# Constant expressions
# --------------------------------------------------------------------------


def c_int_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: c_int_div(a, b) if isinstance(a, int) and isinstance(b, int) else a / b,
    "%": lambda a, b: a - c_int_div(a, b) * b,
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "|": lambda a, b: a | b,
    "&": lambda a, b: a & b,
    "^": lambda a, b: a ^ b,
}
UNARY = {"-": lambda a: -a, "+": lambda a: a, "~": lambda a: ~a}


def evaluate(node, names):
    if isinstance(node, c_ast.Constant):
        value = node.value
        if node.type in ("float", "double", "long double"):
            return float(value.rstrip("fFlL"))
        if "int" not in node.type.split():
            raise GeneratorError("cannot evaluate the %s constant %s" % (node.type, value))
        digits = value.rstrip("uUlL")
        if digits[:2].lower() in ("0x", "0b"):
            return int(digits, 0)
        return int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)
    if isinstance(node, c_ast.ID):
        if node.name not in names:
            raise GeneratorError("unknown name %s in a constant expression" % node.name)
        return names[node.name]
    if isinstance(node, c_ast.BinaryOp) and node.op in BINARY:
        return BINARY[node.op](evaluate(node.left, names), evaluate(node.right, names))
    if isinstance(node, c_ast.UnaryOp) and node.op in UNARY:
        return UNARY[node.op](evaluate(node.expr, names))
    raise GeneratorError("cannot evaluate constant expression %r" % type(node).__name__)


# --------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------


def builtin_ctype(names):
    words = list(names)
    unsigned = "unsigned" in words
    signed = "signed" in words
    words = [w for w in words if w not in ("unsigned", "signed")]
    longs = words.count("long")
    words = [w for w in words if w != "long"]
    if len(words) > 1 and "int" in words:
        words.remove("int")
    base = words[0] if words else "int"
    if base == "void" and not longs:
        return None
    if base == "char":
        return "ctypes.c_ubyte" if unsigned else "ctypes.c_byte" if signed else "ctypes.c_char"
    if base == "short":
        return "ctypes.c_ushort" if unsigned else "ctypes.c_short"
    if base == "int":
        kind = {0: "int", 1: "long", 2: "longlong"}[longs]
        return "ctypes.c_%s%s" % ("u" if unsigned else "", kind)
    if base == "float":
        return "ctypes.c_float"
    if base == "double":
        return "ctypes.c_longdouble" if longs else "ctypes.c_double"
    if base == "_Bool":
        return "ctypes.c_bool"
    raise GeneratorError("no ctypes equivalent for C type %r" % " ".join(names))


class Binder:
    def __init__(self, header, text):
        self.header = header
        self.text = text
        self.comments = Comments(text)
        self.typedefs = {}  # C typedef name -> Python expression of its ctypes type
        self.constants = {}  # enumerator and macro names -> values (for expressions)
        self.blocks = []  # (header line, text) of declarations other than functions
        self.functions = []  # text of FUNCTIONS entries

    # -- helpers -----------------------------------------------------------

    def lines_of(self, node):
        lines = []

        def visit(n):
            if n.coord is not None and n.coord.file == self.header and n.coord.line > 0:
                lines.append(n.coord.line)
            for _, child in n.children():
                visit(child)

        visit(node)
        if not lines:
            raise GeneratorError("declaration without a position in the header")
        return min(lines), max(lines)

    def ctype(self, node, where, in_struct=False):
        if isinstance(node, c_ast.TypeDecl):
            inner = node.type
            if isinstance(inner, c_ast.IdentifierType):
                name = " ".join(inner.names)
                if name in self.typedefs:
                    return self.typedefs[name]
                if name in STANDARD_TYPES:
                    return STANDARD_TYPES[name]
                return builtin_ctype(inner.names)
            if isinstance(inner, (c_ast.Struct, c_ast.Enum)) and inner.name in self.typedefs:
                return self.typedefs[inner.name]
        if isinstance(node, c_ast.PtrDecl):
            target = node.type
            if isinstance(target, c_ast.FuncDecl):
                raise GeneratorError("%s: function pointers are not supported" % where)
            if in_struct:
                # Struct pointer fields hold addresses (device memory): plain ints.
                return "ctypes.c_void_p"
            pointee = self.ctype(target, where)
            if pointee is None:
                return "ctypes.c_void_p"
            if pointee == "ctypes.c_char":
                return "ctypes.c_char_p"
            return "ctypes.POINTER(%s)" % pointee
        if isinstance(node, c_ast.ArrayDecl) and in_struct:
            length = evaluate(node.dim, self.constants)
            return "(%s * %d)" % (self.ctype(node.type, where, in_struct), length)
        raise GeneratorError("%s: cannot map type %s to ctypes" % (where, type(node).__name__))

    def add_block(self, node_or_line, text):
        line = node_or_line if isinstance(node_or_line, int) else self.lines_of(node_or_line)[0]
        self.blocks.append((line, text))

    # -- declarations --------------------------------------------------------

    def bind(self, ast, macros):
        for node in ast.ext:
            file = node.coord.file if node.coord is not None else None
            if file != self.header:
                if isinstance(node, c_ast.Decl) and node.name and node.name.startswith(MACRO_PROBE):
                    self.bind_macro(node.name[len(MACRO_PROBE):], node.init)
                continue
            if isinstance(node, c_ast.Typedef):
                self.bind_typedef(node)
            elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
                self.bind_function(node)
            else:
                raise GeneratorError("line %d: no binding rule for this declaration" % node.coord.line)
        missing = [m for m in macros if m not in self.constants]
        if missing:
            raise GeneratorError("macros not bound: %s" % ", ".join(missing))

    def bind_macro(self, name, init):
        value = evaluate(init, self.constants)
        self.constants[name] = value
        m = re.search(r"^[ \t]*#[ \t]*define[ \t]+%s\b" % name, self.text, re.M)
        line = self.text.count("\n", 0, m.start()) + 1
        text = python_comment(self.comments.for_decl(line), "") + "%s = %r\n" % (name, value)
        self.add_block(line, text)

    def bind_typedef(self, node):
        t = node.type
        if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Enum) and t.type.values is not None:
            self.bind_enum(node, t.type)
        elif isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Struct) and t.type.decls is not None:
            self.bind_struct(node, t.type)
        elif (isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.TypeDecl)
              and isinstance(t.type.type, c_ast.Struct) and t.type.type.decls is None):
            self.typedefs[node.name] = node.name
            first, _ = self.lines_of(node)
            text = python_comment(self.comments.for_decl(first), "")
            text += "%s = ctypes.c_void_p  # pointer to opaque struct %s\n" % (node.name, t.type.type.name)
            self.add_block(node, text)
        else:
            self.typedefs[node.name] = self.ctype(t, node.name)
            text = "%s = %s\n" % (node.name, self.typedefs[node.name])
            self.add_block(node, python_comment(self.comments.for_decl(self.lines_of(node)[0]), "") + text)

    def bind_enum(self, node, enum):
        first, _ = self.lines_of(node)
        members, value = [], -1
        for e in enum.values.enumerators:
            value = evaluate(e.value, self.constants) if e.value is not None else value + 1
            self.constants[e.name] = value
            members.append((e.name, value, self.comments.for_decl(e.coord.line)))
        names = [m[0] for m in members]
        prefix = node.name.upper() + "_"
        if not all(n.startswith(prefix) for n in names):
            prefix = os.path.commonprefix(names)
            prefix = prefix[: prefix.rfind("_") + 1]
        short = [n[len(prefix):] for n in names]
        if not all(s.isidentifier() and not s[0].isdigit() for s in short):
            prefix, short = "", names
        py_name = "".join(w.capitalize() for w in node.name[len(SYMBOL_PREFIX):].split("_") if w)
        self.typedefs[node.name] = node.name
        out = python_comment(self.comments.for_decl(first), "")
        out += "%s = ctypes.c_int  # C type of enum %s\n\n\n" % (node.name, node.name)
        out += "class %s(enum.IntEnum):\n" % py_name
        out += '    """enum %s; members are the C names without %s."""\n\n' % (node.name, prefix or "a prefix")
        for (cname, val, comment), s in zip(members, short):
            out += python_comment(comment, "    ") + "    %s = %d\n" % (s, val)
        out += "\n\n"
        out += "".join("%s = %s.%s\n" % (cname, py_name, s) for (cname, _, _), s in zip(members, short))
        self.add_block(first, out)

    def bind_struct(self, node, struct):
        first, _ = self.lines_of(node)
        self.typedefs[node.name] = node.name
        if struct.name:
            self.typedefs.setdefault(struct.name, node.name)
        out = python_comment(self.comments.for_decl(first), "")
        out += "class %s(ctypes.Structure):\n" % node.name
        out += '    """struct %s; pointer fields are addresses (ints)."""\n\n' % (struct.name or node.name)
        out += "    _fields_ = [\n"
        commented = set()
        c_types = []
        for d in struct.decls:
            if d.bitsize is not None:
                raise GeneratorError("%s.%s: bit-fields are not supported" % (node.name, d.name))
            lo, hi = self.lines_of(d)
            if lo not in commented:  # `int64_t a, b, c;` shares one comment
                commented.add(lo)
                out += python_comment(self.comments.for_decl(lo, hi), "        ")
            out += '        ("%s", %s),\n' % (d.name, self.ctype(d.type, "%s.%s" % (node.name, d.name), True))
            c_types.append((d.name, self.c_spelling(d.type)))
        out += "    ]\n"
        out += "    # Each field's C type as the header spells it (a line per run of fields of one\n"
        out += "    # type), against which flashcore/_fields.py checks assignments.\n"
        out += "    _c_types_ = {\n"
        for _, run in itertools.groupby(c_types, key=lambda field: field[1]):
            out += wrap(['"%s": "%s",' % field for field in run], "        ")
        out += "    }\n"
        out += "    __setattr__ = _checked_setattr\n"
        self.add_block(first, out)

    def c_spelling(self, node):
        """The C type of a declarator as the header spells it, for messages:
        "int32_t", "const void *", "unsigned char[3]"."""
        if isinstance(node, c_ast.TypeDecl):
            inner = node.type
            if isinstance(inner, c_ast.IdentifierType):
                base = " ".join(inner.names)
            elif isinstance(inner, (c_ast.Struct, c_ast.Enum)):
                base = "%s %s" % ("struct" if isinstance(inner, c_ast.Struct) else "enum", inner.name)
            else:
                raise GeneratorError("cannot spell type %s" % type(inner).__name__)
            return " ".join(list(node.quals) + [base])
        if isinstance(node, c_ast.PtrDecl):
            return self.c_spelling(node.type) + " *"
        if isinstance(node, c_ast.ArrayDecl):
            return "%s[%d]" % (self.c_spelling(node.type), evaluate(node.dim, self.constants))
        raise GeneratorError("cannot spell type %s" % type(node).__name__)

    def bind_function(self, node):
        if not node.name.startswith(SYMBOL_PREFIX):
            raise GeneratorError("function %s does not start with %s" % (node.name, SYMBOL_PREFIX))
        fdecl = node.type
        restype = self.ctype(fdecl.type, node.name)
        params = []
        for i, p in enumerate(fdecl.args.params if fdecl.args is not None else []):
            if isinstance(p, c_ast.EllipsisParam):
                raise GeneratorError("%s: variadic functions are not supported" % node.name)
            ptype = self.ctype(p.type, "%s argument %d" % (node.name, i + 1))
            if ptype is None:  # (void)
                continue
            if not p.name:
                raise GeneratorError("%s: argument %d has no name" % (node.name, i + 1))
            params.append((p.name, ptype))
        first, _ = self.lines_of(node)
        out = python_comment(self.comments.for_decl(first), "    ")
        out += '    ("%s", %s, (' % (node.name, restype)
        if params:
            out += "\n" + "".join('        ("%s", %s),\n' % p for p in params) + "    )),\n"
        else:
            out += ")),\n"
        self.functions.append(out)


TEMPLATE_HEAD = '''\
# Generated by bindings/python/tools/generate_ffi.py from {header}.
# Do not edit: change the header and run
#     python3 bindings/python/tools/generate_ffi.py
# CI regenerates this file and fails when it differs.
"""ctypes declarations of the flashcore C API, generated from {header}."""

import ctypes
import enum

HEADER = "{header}"
HEADER_SHA256 = "{sha}"

'''

# What a module with structs imports: the checks of assignments to their fields
# (flashcore/_fields.py), which each struct takes as its __setattr__. Loaded
# on its own, outside the package (the tests exec what this generates), the
# module takes them from the flashcore package, raising Python's errors.
TEMPLATE_CHECKS = '''
# Assigning to a field of the structs below checks the value against the
# field's C type (_c_types_): see flashcore/_fields.py.
try:
    from ._fields import checked_setattr as _checked_setattr
except (ImportError, KeyError):  # loaded on its own (exec() with no __name__ raises KeyError)
    from flashcore._fields import plain_checked_setattr as _checked_setattr
'''


def generate(header=DEFAULT_HEADER, cpp=None):
    header = os.path.abspath(header)
    with open(header, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    source, macros = preprocess(header, text, cpp or find_cpp())
    binder = Binder(header, text)
    binder.bind(parse(source), macros)
    rel = os.path.relpath(header, REPO_ROOT).replace(os.sep, "/")
    if rel.startswith("../"):
        rel = os.path.basename(header)
    out = TEMPLATE_HEAD.format(header=rel, sha=hashlib.sha256(raw).hexdigest())
    if any("__setattr__ = _checked_setattr" in text for _, text in binder.blocks):
        out += TEMPLATE_CHECKS + "\n\n"
    previous = None
    for _, text in sorted(binder.blocks, key=lambda b: b[0]):
        if previous is not None:
            out += "\n\n" if "\nclass " in "\n" + previous + text else "\n"
        out += text
        previous = text
    out += "\n\n# (name, restype, ((argument name, argtype), ...)) of every function, in header order.\n"
    out += "FUNCTIONS = (\n" + "".join(binder.functions) + ")\n"
    return re.sub(r"\n{4,}", "\n\n\n", out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", default=DEFAULT_HEADER, help="the C header (default: include/flashcore.h)")
    ap.add_argument("--output", default=DEFAULT_OUTPUT, help="the module to write (default: flashcore/_ffi.py)")
    ap.add_argument("--check", action="store_true", help="compare with --output instead of writing it; exit 1 on any difference")
    args = ap.parse_args(argv)
    try:
        new = generate(args.header)
    except GeneratorError as e:
        print("generate_ffi.py: error: %s" % e, file=sys.stderr)
        return 2
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old != new:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), args.output + " (committed)", args.output + " (regenerated)"))
            print("\n%s is out of date with %s: run python3 bindings/python/tools/generate_ffi.py and commit the result."
                  % (args.output, args.header), file=sys.stderr)
            return 1
        print("%s is up to date with %s" % (args.output, args.header))
        return 0
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        f.write(new)
    print("wrote %s" % args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
