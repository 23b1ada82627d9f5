"""The package's layout rules (docs/architecture.md, "Layers and the import rule"), checked on
the source with ``ast``: layers import only those below them, no import circle between the
files of one package, no import inside a function in the core layers, no module over 900
lines.

Every rule holds without exceptions: a violation fails the test with the file, line and rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "megbrain"

#: the layers, lowest first: a module may import its own layer's package and the layers below.
#: ``megbrain`` is the public namespace (``import megbrain as mgb``) that the training layer,
#: the bridges and the command line build on.
LAYERS: list[set[str]] = [
    {"errors"},
    {"dtype"},
    {"device"},
    {"tensor", "kernels"},
    {"graph"},
    {"serialization"},
    {"opr"},
    {"gopt", "plugin"},
    {"api"},
    {"megbrain"},
    {"nn", "optim"},
    {"distributed", "onnx"},
    {"cli"},
    {"examples"},
]
#: the top-level modules of megbrain/ in no layer are facades named like the modules of
#: megengine._internal (mgb.py, helper.py, ...) and the entry points (__init__.py, which
#: assembles the public namespace, and __main__.py): above everything, imported by no layer

#: optional dependencies, imported where they are first needed
OPTIONAL = {"onnx", "mpi4py", "graphviz", "tqdm", "torch"}
#: the packages in which no function imports (rule c)
NO_FUNCTION_IMPORTS = ("opr", "kernels", "graph")
MAX_LINES = 900


@dataclass(frozen=True)
class Import:
    file: str  # relative to megbrain/
    line: int
    target: str  # the imported module, dotted ("megbrain.opr.base", "numpy")
    in_function: bool
    module_level: bool  # executed on import (not in a function, not under TYPE_CHECKING)


def _module_name(rel: Path) -> list[str]:
    parts = ["megbrain", *rel.with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(dotted: list[str]) -> bool:
    base = PKG.parent.joinpath(*dotted)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve(rel: Path, node: ast.ImportFrom | ast.Import) -> Iterator[str]:
    """The modules an import statement loads (``from pkg import name`` names a module when
    ``pkg.name`` is one, else ``pkg``)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    if node.level:
        pkg = _module_name(rel)
        if rel.name != "__init__.py":
            pkg = pkg[:-1]
        base = pkg[: len(pkg) - (node.level - 1)]
    else:
        base = []
    base = base + (node.module.split(".") if node.module else [])
    for a in node.names:
        yield ".".join(base + [a.name]) if _is_module(base + [a.name]) else ".".join(base)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(rel: Path) -> Iterator[Import]:
    tree = ast.parse((PKG / rel).read_text(), str(rel))

    def walk(node, in_function: bool, type_checking: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _resolve(rel, child):
                    yield Import(
                        str(rel), child.lineno, target, in_function,
                        not in_function and not type_checking,
                    )  # fmt: skip
            fn = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            tc = isinstance(child, ast.If) and _is_type_checking(child)
            yield from walk(child, in_function or fn, type_checking or tc)

    yield from walk(tree, False, False)


FILES = sorted(p.relative_to(PKG) for p in PKG.rglob("*.py"))
IMPORTS = [imp for rel in FILES for imp in _imports(rel)]


def _layer_of(name: str) -> int | None:
    """The layer index of top-level name ``name`` of megbrain (None: a facade)."""
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    return None


def _top(rel_or_target: str) -> str:
    """The top-level name of megbrain a file (``opr/base.py``) or module
    (``megbrain.opr.base``) belongs to; ``megbrain`` for the package itself."""
    if rel_or_target == "megbrain" or rel_or_target.startswith("megbrain."):
        parts = rel_or_target.split(".")
        return parts[1] if len(parts) > 1 else "megbrain"
    return Path(rel_or_target).parts[0].removesuffix(".py")


def _check(found: dict, what: str) -> None:
    """Fail with every violation found, each naming its file, line and ``what`` rule."""
    errors = [f"{m} [{what}]" for m in sorted(found.values())]
    assert not errors, "\n".join(errors)


# ---- (a) imports go downward -------------------------------------------------------------
def upward_imports() -> dict:
    found = {}
    for imp in IMPORTS:
        if not (imp.target == "megbrain" or imp.target.startswith("megbrain.")):
            continue
        src, dst = _top(imp.file), _top(imp.target)
        ls, ld = _layer_of(src), _layer_of(dst)
        if src == "__init__" or ls is None or src == dst:
            continue  # a facade imports anything; a package imports itself
        if ld is None or ld >= ls:
            key = (imp.file, imp.target)
            found.setdefault(
                key,
                f"megbrain/{imp.file}:{imp.line}: imports {imp.target}, which is not below "
                f"layer {src!r}",
            )
    return found


def test_layers_import_only_those_below():
    _check(upward_imports(), "rule: each layer imports only those below it")


# ---- (b) no import circle within a package -----------------------------------------------
def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_circles() -> dict:
    file_of = {".".join(_module_name(rel)): str(rel) for rel in FILES}
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], int] = {}
    for imp in IMPORTS:
        dst = file_of.get(imp.target)
        if not imp.module_level or dst is None or dst == imp.file:
            continue
        if Path(dst).parent != Path(imp.file).parent:
            continue  # another package
        graph.setdefault(imp.file, set()).add(dst)
        where.setdefault((imp.file, dst), imp.line)
    found = {}
    for comp in _sccs(graph):
        if len(comp) > 1:
            edges = ", ".join(
                f"{a}:{where[a, b]} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp
            )
            found[frozenset(comp)] = f"megbrain/{Path(comp[0]).parent}: import circle: {edges}"
    return found


def test_no_import_circle_within_a_package():
    _check(import_circles(), "rule: no import circle between a package's files")


def test_circle_search_finds_circles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [c for c in _sccs(g) if len(c) > 1] == [["a", "b", "c"]]


# ---- (c) no import inside a function in the core layers ----------------------------------
def function_imports() -> dict:
    found = {}
    for imp in IMPORTS:
        if not imp.in_function or _top(imp.file) not in NO_FUNCTION_IMPORTS:
            continue
        if imp.target.split(".")[0] in OPTIONAL:
            continue
        found.setdefault(
            (imp.file, imp.target),
            f"megbrain/{imp.file}:{imp.line}: imports {imp.target} inside a function",
        )
    return found


def test_no_imports_inside_functions_of_the_core():
    _check(
        function_imports(),
        f"rule: no import inside a function in {', '.join(NO_FUNCTION_IMPORTS)}",
    )


# ---- (d) no long module ------------------------------------------------------------------
def long_modules() -> dict:
    found = {}
    for rel in FILES:
        n = len((PKG / rel).read_text().splitlines())
        if n > MAX_LINES:
            found[str(rel)] = (n, f"megbrain/{rel}:{n}: {n} lines, over {MAX_LINES}")
    return found


def test_no_module_over_900_lines():
    _check({rel: msg for rel, (_, msg) in long_modules().items()}, "rule: no module over 900 lines")
