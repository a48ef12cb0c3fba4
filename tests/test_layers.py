"""The import graph of the source tree: no module imports another in a circle, and
each engine subpackage imports only the layers its docstring allows.

Every import counts, at module level or inside a function; for circles, those
under `if TYPE_CHECKING:` (annotations only) count too: a circle of type hints is
still two modules that cannot be read apart. The layer rules leave them out.
`from corps.engine import Engine` is an edge to the package `corps.engine` (its
`__init__` defines the name);
`from corps.patterns import forms` an edge to the module `corps.patterns.forms`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "cache", "agents", "patterns", "cli")
#: engine layer -> the engine layers it may import ("shared": the torch-free top modules)
ALLOWED = {
    "shared": {"shared"},
    "request": {"shared"},
    "trace": {"shared"},
    "kernels": {"shared"},
    "attention": {"shared", "kernels"},
    "model": {"shared", "attention", "kernels"},
    "distill": {"shared", "model"},
    "exec": {"shared", "request", "trace", "model", "attention", "kernels"},
    "sched": {"shared", "request", "trace", "exec"},
    "api": {"shared", "request", "trace", "exec", "sched", "model", "attention", "distill"},
}
SHARED = {"errors", "config", "stats", "repair", "audit", "auto_repair"}


def modules() -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = ("corps", *path.relative_to(ROOT).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def imports(path: Path, known: set[str], *, hints: bool = False) -> set[str]:
    """The corps modules `path` imports (a `from pkg import mod` names the module);
    with `hints`, those imported under `if TYPE_CHECKING:` too."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node) and not hints:
            return
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    found.add(sub)  # a module of the package
                elif node.module in known:
                    found.add(node.module)  # a name its module (or __init__) defines
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def graph(*, hints: bool = False) -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods), hints=hints) - {name} for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    """The engine layer of a module (None: outside corps.engine, or the package)."""
    parts = module.split(".")
    if parts[:2] != ["corps", "engine"] or len(parts) < 3:
        return None
    return "shared" if parts[2] in SHARED else parts[2]


def test_no_module_imports_another_in_a_circle():
    assert cycles(graph()) == []


def test_no_circle_of_type_hints_either():
    assert cycles(graph(hints=True)) == []


def test_cycles_are_found():  # the checker itself: a circle of three, a lone edge
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]


def test_every_engine_layer_is_known():
    layers = {layer(m) for m in modules()} - {None}
    assert layers == set(ALLOWED)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_engine_layers_import_only_what_their_docstrings_allow(name):
    wrong = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        if layer(m) == name
        for d in deps
        if d == "corps.engine" or (layer(d) not in (None, name) and layer(d) not in ALLOWED[name])
    )
    assert wrong == []


def test_the_store_knows_nothing_of_the_engine_or_above():
    up = ("corps.engine", "corps.agents", "corps.patterns", "corps.cli")
    wrong = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        if m.startswith("corps.cache")
        for d in deps
        if d.startswith(up)
    )
    assert wrong == []


def test_the_command_line_imports_only_the_public_engine_api():
    """cli/ is a shell over `corps.engine` (and its shared base modules: config,
    errors, repair, stats), never over the engine's subpackages."""
    subpackages = {m.split(".")[2] for m in modules() if layer(m) not in (None, "shared")}
    wrong = sorted(
        f"{m} -> {d}"
        for m, deps in graph(hints=True).items()
        if m.startswith("corps.cli")
        for d in deps
        if d.startswith("corps.engine.") and d.split(".")[2] in subpackages
    )
    assert wrong == []


def test_the_command_line_wires_commands_only():
    assert len((ROOT / "cli" / "app.py").read_text().splitlines()) <= 300
