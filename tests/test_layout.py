"""The package's layout is its architecture: lower floors never import higher ones, and nothing imports the CLI.

The bottom (errors, log, version, turn) < dialects < profile < confinement < a turn's files < the engine < host
< serving < network, chat < cli, command; inside the three wings each module has its own floor (`FLOORS`).

Within and across floors the imports form no circle, no module imports another one's private (`_name`) names,
and the longest chain of imports is at most `MOST_FLOORS` long.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"
WINGS = ("engine", "files", "confinement")
FLOORS = {
    "engine": 0,  # the wings' __init__ says what the wing holds, and imports nothing
    "files": 0,
    "errors": 0,
    "log": 0,
    "version": 0,
    "engine.permissions": 0,
    "files.fetch_policy": 0,
    "turn": 1,
    "confinement": 1,
    "dialects": 2,
    "files.agent_requests": 3,
    "profile": 3,
    "engine.launch": 4,
    "files.turn_directory": 4,
    "confinement.process": 5,
    "engine.questions": 5,
    "engine.result": 5,
    "engine.driver": 6,
    "engine.loop": 6,
    "files.attachments": 6,
    "files.outbox": 7,
    "engine.warm_agents": 8,
    "engine.one_process": 9,
    "engine.run": 10,
    "host": 11,
    "serving": 12,
    "network": 13,
    "chat": 13,
    "cli": 14,
    "command": 14,
}
"""Each module's floor, by the longest dotted prefix listed: a module imports only from its own floor or lower."""
TOP = 15  # bridge/__init__.py and __main__.py re-export from every floor
MOST_FLOORS = 12
"""The issue's bound on the longest import chain, counting a wing's module, a package or a top module as one floor."""


def floor_of(parts: tuple[str, ...]) -> int:
    if parts in (("__init__",), ("__main__",)):
        return TOP
    for length in range(len(parts), 0, -1):
        floor = FLOORS.get(".".join(parts[:length]))
        if floor is not None:
            return floor
    return TOP


def imported_modules(path: Path) -> set[tuple[str, ...]]:
    """Every bridge module `path` imports, as a path inside the package (function-level imports included)."""
    return {target for target, _ in imports_from(path)}


def imports_from(path: Path) -> list[tuple[tuple[str, ...], list[str]]]:
    """Each bridge module `path` imports (function-level imports included), with the names taken from it."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = here[:-1]
    found: list[tuple[tuple[str, ...], list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = (*base, *(node.module.split(".") if node.module else ()))
            if node.module is None:
                found.extend(((*target, alias.name), []) for alias in node.names)
            else:
                found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bridge."):
            found.append((tuple(node.module.split(".")[1:]), [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend(
                (tuple(alias.name.split(".")[1:]), []) for alias in node.names if alias.name.startswith("bridge.")
            )
    return found


def module_of(target: tuple[str, ...]) -> tuple[str, ...] | None:
    """The module file an import target names (a package is its __init__), or None (a name, not a module)."""
    if (PACKAGE.joinpath(*target).with_suffix(".py")).is_file():
        return target
    if (PACKAGE.joinpath(*target) / "__init__.py").is_file():
        return (*target, "__init__")
    return None


def import_graph() -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Module → the modules it imports (a `from package import name` that is no module counts as the package)."""
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in MODULES:
        here = path.relative_to(PACKAGE).with_suffix("").parts
        edges = graph.setdefault(here, set())
        for target, _ in imports_from(path):
            module = module_of(target) or (module_of(target[:-1]) if target else None)
            if module is not None and module != here:
                edges.add(module)
    return graph


MODULES = sorted(path for path in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_only_from_its_own_floor_or_lower_ones(path: Path) -> None:
    here = path.relative_to(PACKAGE).with_suffix("").parts
    own = floor_of(here)
    upward = {".".join(target) for target in imported_modules(path) if floor_of(target) > own}
    assert not upward, f"{path.relative_to(PACKAGE)} (floor {own}) imports from higher floors: {sorted(upward)}"


def test_the_floor_table_covers_every_module() -> None:
    unplaced = [
        ".".join(parts)
        for parts in (path.relative_to(PACKAGE).with_suffix("").parts for path in MODULES)
        if parts not in (("__init__",), ("__main__",)) and floor_of(parts) == TOP
    ]
    assert not unplaced, f"modules with no floor in FLOORS: {unplaced}"


def test_the_import_graph_has_no_circle() -> None:
    graph = import_graph()
    done: set[tuple[str, ...]] = set()
    circles: list[str] = []

    def visit(module: tuple[str, ...], path: list[tuple[str, ...]]) -> None:
        if module in path:
            circle = [*path[path.index(module) :], module]
            circles.append(" -> ".join(".".join(step) for step in circle))
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_no_private_name_from_another(path: Path) -> None:
    private = {
        f"{'.'.join(target)}.{name}"
        for target, names in imports_from(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    }
    assert not private, f"{path.relative_to(PACKAGE)} imports private names: {sorted(private)}"
