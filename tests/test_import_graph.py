"""The import graph of ``pipeline/`` and ``assets/``: no module-level cycle, and no import
inside a function unless a ``# import here: <reason>`` comment on it says why (a heavy optional
library only some commands need). A hidden import is how a cycle hides."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("pipeline", "assets")
MARKER = "# import here:"


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


@cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    """A module's text and syntax tree, read once for all the tests here (none changes them)."""
    source = path.read_text(encoding="utf-8")
    return source, ast.parse(source)


def _imported(
    node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]
) -> set[str]:
    """The project modules an import statement loads (a ``from x import name`` loads x.name
    when that is a module, else x)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parent, base] if base else parent)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def _function_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    yield inner


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module → the project modules loading it loads (with the packages around them, whose
    ``__init__`` runs first), and the imports inside functions that state no reason. An import
    with a stated reason is left out of the graph: the reason owns it."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    unexplained = []
    for name, path in modules.items():
        source, tree = _parsed(path)
        lines = source.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        explained = set()
        for node in _function_imports(tree):
            # The reason sits on the statement or on the line above it.
            around = lines[max(node.lineno - 2, 0) : node.end_lineno]
            if any(MARKER in line for line in around):
                explained.add(id(node))
            else:
                unexplained.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        edges[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in explained:
                for target in _imported(node, package, modules):
                    edges[name] |= {target, *_ancestors(target)} - _ancestors(name) - {name}
    return edges, unexplained


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    edges, _ = _graph()
    assert cycles(edges) == []


def test_every_import_inside_a_function_says_why() -> None:
    _, unexplained = _graph()
    assert unexplained == []


# ------------------------------------------------------------------------ folders of pipeline/
#
# A folder of ``pipeline/`` (a stage, ``present``) or a module at its top (``store``, ``layout``)
# is one unit; data walks one way, so no unit imports, directly or through others, a unit that
# imports it. The command modules (``pipeline/commands/``, and ``pipeline/cli.py`` which
# dispatches to them) sit above everything and are left out: they see the whole
# configuration, which sees every stage's section.


def is_command_module(name: str) -> bool:
    parts = name.split(".")
    return parts[:2] == ["pipeline", "commands"] or name == "pipeline.cli"


def _every_import(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, inside functions too (a hidden import still ties two units)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _imports_by_module() -> dict[str, set[str]]:
    """Module of ``pipeline/`` → the project modules it imports anywhere in its text."""
    modules = _modules()
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith("pipeline."):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        _, tree = _parsed(path)
        found[name] = {t for node in _every_import(tree) for t in _imported(node, package, modules)}
    return found


def unit_of(module: str) -> str | None:
    """``pipeline.bench.stage`` → ``pipeline.bench``; None for the package itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" and len(parts) > 1 else None


def unit_graph(imports: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Unit → unit it imports → the modules whose imports make that arrow (command modules
    left out)."""
    edges: dict[str, dict[str, set[str]]] = {}
    for module, targets in imports.items():
        source = unit_of(module)
        if source is None or is_command_module(module):
            continue
        for target in targets:
            unit = unit_of(target)
            if unit is not None and unit != source:
                edges.setdefault(source, {}).setdefault(unit, set()).add(module)
    return edges


def test_a_command_module_is_told_apart() -> None:
    assert is_command_module("pipeline.commands.bench")
    assert is_command_module("pipeline.commands.common") and is_command_module(
        "pipeline.commands.config"
    )
    assert not is_command_module("pipeline.config") and not is_command_module("pipeline.bench")
    assert unit_of("pipeline.bench.readers.vllm") == "pipeline.bench"
    assert unit_of("pipeline.store") == "pipeline.store" and unit_of("pipeline") is None


def test_the_unit_graph_finds_a_loop_through_a_folder() -> None:
    """Two stages that each import the other, one through a module deep in its folder, are one
    loop; a command module's import is no arrow."""
    imports = {
        "pipeline.a.stage": {"pipeline.b.result"},
        "pipeline.b.deep.reader": {"pipeline.a.result"},
        "pipeline.c.stage": {"pipeline.a.stage"},
        "pipeline.commands.a": {"pipeline.c.stage"},
    }
    edges = unit_graph(imports)
    assert cycles({u: set(t) for u, t in edges.items()}) == [["pipeline.a", "pipeline.b"]]
    assert "pipeline.c" not in edges.get("pipeline.a", {})


def test_no_folder_of_pipeline_imports_one_that_imports_it() -> None:
    edges = unit_graph(_imports_by_module())
    loops = cycles({unit: set(targets) for unit, targets in edges.items()})
    told = [
        f"{' ↔ '.join(loop)}: "
        + "; ".join(
            f"{a} → {b} ({', '.join(sorted(edges[a][b]))})"
            for a in loop
            for b in loop
            if b in edges.get(a, {})
        )
        for loop in loops
    ]
    assert told == []


def test_only_command_modules_see_the_whole_configuration() -> None:
    """A stage reads its own section and the results it needs; ``pipeline.config`` (every
    section) is for the command modules and ``assets/`` to hand them over."""
    seeing = sorted(
        module
        for module, targets in _imports_by_module().items()
        if "pipeline.config" in targets
        and not is_command_module(module)
        and module != "pipeline.config"
    )
    assert seeing == []
