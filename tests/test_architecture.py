"""The engine's shape (docs/architecture.md): no import cycle between its modules nor
between its packages, no Airflow in it, a docstring opening every package, and sources
and dev tools outside it. Read from the source with `ast` (nothing is imported), so
these are quick."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "include" / "trailbound"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(path: Path, name: str, *, module_level: bool) -> set[str]:
    """Every module a file imports: at module level only (what runs at import), or
    anywhere (inside functions too). Imports for type checkers only never run: left out."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for inner in ast.walk(node)}
    found = set()
    for node in (tree.body if module_level else ast.walk(tree)):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph(*, module_level: bool) -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        # Importing a.b.c imports package a.b first: that is no dependency of a.b on a.b.c.
        graph[name] = {m for m in _imports(path, name, module_level=module_level)
                       if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_engine_modules():
    assert _cycles(_graph(module_level=True)) == [], "modules that import each other at import time"
    assert _cycles(_graph(module_level=False)) == [], "modules that import each other (some inside functions)"


def _package(module: str) -> str:
    """The package a module belongs to: trailbound.load.run -> trailbound.load,
    trailbound.sources.postgres.miner -> trailbound.sources; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    """Which package imports which (anywhere in a file, inside functions too)."""
    graph: dict[str, set[str]] = {}
    for name, deps in _graph(module_level=False).items():
        graph.setdefault(_package(name), set()).update(_package(d) for d in deps if _package(d) != _package(name))
    return graph


def test_no_import_cycle_between_engine_packages():
    """Packages (trailbound.load, trailbound.capture, trailbound.sources, ...) and top-level
    modules (trailbound.status, ...) taken whole: none imports one that imports it back."""
    cycles = sorted(_cycles(_package_graph()))
    assert cycles == [], "packages that import each other"


def test_the_engine_never_imports_airflow():
    offenders = [name for name, path in _modules().items()
                 if any(m == "airflow" or m.startswith("airflow.")
                        for m in _imports(path, name, module_level=False))]
    assert offenders == []


def test_every_package_opens_with_a_docstring():
    missing = [str(p.relative_to(ENGINE)) for p in ENGINE.rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_sources_and_dev_tools_stand_outside_the_engine():
    """Only the command line (`trailbound simulate`) and the initial load's command (which
    reads the live source, as the miner does) may reach a source; nothing reaches dev tools.
    The key-range planner the load shares with the compare is no source (keyranges.py)."""
    graph = _command_line_as_one(_graph(module_level=False))
    outside = ("trailbound.sources", "trailbound.devtools")
    users = {name: sorted(d for d in deps if d.startswith(outside))
             for name, deps in graph.items() if not name.startswith(outside)}
    assert sorted(name for name, deps in users.items() if deps) == ["trailbound.cli", "trailbound.load.run"]
    # and only the command line starts a load: the engine (replicat) uses the load's
    # target-side modules, which reach no source
    assert sorted(name for name, deps in graph.items() if "trailbound.load.run" in deps) == ["trailbound.cli"]


def _command_line_as_one(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with the command line's package (trailbound.cli, a module per verb
    family) as one node, "trailbound.cli", holding what any of its modules imports."""
    def one(name: str) -> str:
        return "trailbound.cli" if name.startswith("trailbound.cli.") else name

    merged: dict[str, set[str]] = {}
    for name, deps in graph.items():
        merged.setdefault(one(name), set()).update(one(d) for d in deps)
    return merged


def test_every_package_docstring_names_its_modules_and_only_modules():
    """A package's docstring is its map: it names each of its modules (`name.py`) and
    subpackages (`name/`), and every `name.py` it names exists: its own, another engine
    package's, or, given as a path, one under the package, the engine or the repository."""
    engine_modules = {p.name for p in ENGINE.rglob("*.py")}
    unlisted, unknown = [], []
    for init in sorted(ENGINE.rglob("__init__.py")):
        package = init.parent
        text = ast.get_docstring(ast.parse(init.read_text())) or ""
        named = set(re.findall(r"(?<![\w/.-])([\w/]+\.py)\b", text))
        for path in sorted(package.iterdir()):
            if path.name == "__init__.py" or path.name.startswith((".", "_")) and path.name != "__main__.py":
                continue
            if path.suffix == ".py" and path.name not in named:
                unlisted.append(str(path.relative_to(ENGINE)))
            elif (path / "__init__.py").exists() and not re.search(rf"(?<![\w/]){re.escape(path.name)}/", text):
                unlisted.append(str(path.relative_to(ENGINE)) + "/")
        for name in sorted(named):
            exists = any((base / name).exists() for base in (package, ENGINE, ENGINE.parents[1])) if "/" in name \
                else (package / name).exists() or name in engine_modules
            if not exists:
                unknown.append(f"{package.relative_to(ENGINE.parent)}: {name}")
    assert unlisted == [], "modules their package's docstring does not name"
    assert unknown == [], "names in a package's docstring that are no module"
