"""The package's structure (issue 60): no import circle among its modules,
deferred imports inside functions included (a circle held off by a deferred
import is still a circle)."""
import ast
import os

import flashcore

PACKAGE_DIR = os.path.dirname(flashcore.__file__)


def imported_modules(path, module, is_package):
    """The package's modules that the file at `path` imports, by name."""
    base = module if is_package else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            parts = base.split(".")
            if node.level:
                parts = parts[: len(parts) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(target + "." + alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def import_graph():
    graph = {}
    root = os.path.dirname(PACKAGE_DIR)
    for dirpath, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            is_package = name == "__init__.py"
            module = module.removesuffix(".__init__")
            graph[module] = imported_modules(path, module, is_package)
    modules = set(graph)
    # The package itself (its __init__) re-exports; importing it is not a cycle edge.
    return {m: {d for d in deps if d in modules and d != m and d != "flashcore"} for m, deps in graph.items()}


def circles(edges):
    found = set()

    def visit(start, node, path):
        for nxt in edges[node]:
            if nxt == start:
                found.add(tuple(path))
            elif nxt not in path and nxt > start:
                visit(start, nxt, path + [nxt])

    for module in sorted(edges):
        visit(module, module, [module])
    return sorted(found)


def test_no_import_circle():
    edges = import_graph()
    assert len(edges) > 10, "the package's modules were not found"
    assert circles(edges) == [], "import circles: " + "; ".join(" -> ".join(c + (c[0],)) for c in circles(edges))


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [("a", "b", "c")]
