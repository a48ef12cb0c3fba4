"""The import graph of the source tree: no module imports another in a circle, each
engine subpackage imports only the layers its docstring allows, and each package
above the engine only what `ABOVE` says, with no exception.

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
FOLDERS = ("engine", "cache", "agents", "patterns", "serve", "view", "bench", "cli")
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
SHARED = {
    "errors",
    "config",
    "config_rules",
    "env",
    "adapter_dir",
    "stats",
    "repair",
    "audit",
    "auto_repair",
}
#: package above the engine -> (the corps packages it may import, the engine modules
#: below `corps.engine` and its shared modules it may import, by prefix)
ABOVE = {
    # the calls its asks carry and their workflow tag, a selection, the events it traces
    "agents": (
        {"cache", "engine"},
        ("corps.engine.request", "corps.engine.api.select", "corps.engine.trace.events"),
    ),
    # a run's workflow tag and trace events, a cluster's merged traces and its workers'
    # torch thread, and distillation: the differentiable recompute, weights, adapters
    "patterns": (
        {"cache", "engine", "agents"},
        ("corps.engine.request.workflow", "corps.engine.trace", "corps.engine.exec.torch_thread",
         "corps.engine.distill", "corps.engine.model.adapter_files", "corps.engine.model.weights"),
    ),
    # the tool-call syntax, grammar and parse it offers a request's tools with
    "serve": ({"cache", "engine"}, ("corps.engine.request.tools",)),
    # the trace viewer's pictures: trace files (events, reader) and the step cost it shows
    "view": ({"cache", "engine", "view"}, ("corps.engine.trace", "corps.engine.sched.cost")),
    # the benchmarks measure the engine's kernels, tuning and steps: every layer
    "bench": ({"cache", "engine", "agents", "patterns", "serve", "view"}, ("corps.engine.",)),
    # the shell: trace files (events, reader, exporters), the model files it lists and
    # makes (names, dummy shapes, adapters)
    "cli": (
        {"cache", "engine", "agents", "patterns", "serve", "view", "bench", "cli"},
        ("corps.engine.trace", "corps.engine.model.names", "corps.engine.model.dummy",
         "corps.engine.model.adapter_files"),
    ),
}  # fmt: skip


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


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_packages_above_the_engine_import_only_what_they_may(package):
    """Each imports the corps packages `ABOVE` names, the public `corps.engine` and its
    shared modules, and of the engine's subpackages only the modules it lists (type
    hints included)."""
    packages, below = ABOVE[package]
    wrong = []
    for m, deps in graph(hints=True).items():
        if m.split(".")[1] != package:
            continue
        for d in deps:
            top = d.split(".")[1]
            inside = layer(d) not in (None, "shared")
            if top not in packages | {package} or (inside and not d.startswith(below)):
                wrong.append(f"{m} -> {d}")
    assert sorted(wrong) == []


def test_every_package_has_its_rule():
    assert {m.split(".")[1] for m in modules()} == set(ABOVE) | {"engine", "cache"}


def test_the_engine_has_no_back_door():
    """`corps.engine` names its public API and nothing else: no lazy table of internal
    names that would let the packages above reach below it unseen."""
    import corps.engine as engine

    assert not any(name.startswith("_TOOLS") for name in vars(engine))
    for name in engine.__all__:
        getattr(engine, name)
    with pytest.raises(AttributeError):
        engine.tuning  # noqa: B018  (an internal module: import it from its home)


def test_the_command_line_wires_commands_only():
    assert len((ROOT / "cli" / "app.py").read_text().splitlines()) <= 300


def test_the_server_and_the_benchmarks_live_outside_the_command_line():
    assert not (ROOT / "cli" / "serve").exists() and not (ROOT / "cli" / "bench").exists()
