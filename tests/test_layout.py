"""The package's layout is its architecture: lower floors never import higher ones, and nothing imports the CLI.

errors, log, version, permissions < turn < dialects, confinement < profile < files < engine < host < serving
< network, chat < cli < command (`FLOORS`); inside the engine each module has its own floor (`ENGINE_FLOORS`).

Within and across floors the imports form no circle, no module imports another one's private (`_name`) names,
and the longest chain of imports between the package's parts is at most `MOST_FLOORS` long.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"
FLOORS = {
    "errors": 0,
    "log": 0,
    "version": 0,
    "permissions": 0,
    "turn": 1,
    "dialects": 2,
    "confinement": 2,
    "profile": 3,
    "files": 4,
    "engine": 5,
    "host": 6,
    "serving": 7,
    "network": 8,
    "chat": 8,
    "cli": 9,
    "command": 10,
}
"""The floor of each part of the package (a module at the top, or a package): a part imports only lower floors."""
ENGINE_FLOORS = {
    "__init__": 0,
    "launch": 0,
    "questions": 0,
    "result": 1,
    "driver": 2,
    "loop": 2,
    "hand_out": 3,
    "turn_setup": 4,
    "warm_agents": 5,
    "one_process": 6,
    "run": 7,
}
"""The floors inside the engine: an engine module imports only engine modules of a lower floor."""
TOP = 11  # bridge/__init__.py and __main__.py re-export from every floor
MOST_FLOORS = 12
"""Issue 37's bound on the longest chain of imports between the package's parts, `__main__` included (18 before)."""


def part_of(parts: tuple[str, ...]) -> str:
    """The part of the package a module is in: its top-level module or package."""
    return parts[0] if parts else "__init__"


def floor_of(parts: tuple[str, ...]) -> int:
    return FLOORS.get(part_of(parts), TOP)


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
def test_a_module_imports_only_from_its_own_part_or_lower_floors(path: Path) -> None:
    here = path.relative_to(PACKAGE).with_suffix("").parts
    own = floor_of(here)
    upward = {
        ".".join(target)
        for target in imported_modules(path)
        if part_of(target) != part_of(here) and floor_of(target) >= own
    }
    assert not upward, f"{path.relative_to(PACKAGE)} (floor {own}) imports from its floor or higher: {sorted(upward)}"


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("engine/*.py")), ids=lambda path: path.name)
def test_an_engine_module_imports_only_lower_floors_of_the_engine(path: Path) -> None:
    own = ENGINE_FLOORS[path.stem]
    upward = {
        ".".join(target)
        for target in imported_modules(path)
        if target[:1] == ("engine",) and len(target) > 1 and ENGINE_FLOORS.get(target[1], TOP) >= own
    }
    assert not upward, f"engine/{path.name} (engine floor {own}) imports from its floor or higher: {sorted(upward)}"


def test_the_floor_tables_cover_every_module() -> None:
    parts = {part_of(path.relative_to(PACKAGE).with_suffix("").parts) for path in MODULES}
    assert parts - {"__init__", "__main__"} == set(FLOORS)
    assert {path.stem for path in PACKAGE.glob("engine/*.py")} == set(ENGINE_FLOORS)


def test_the_longest_chain_of_imports_between_the_parts_is_at_most_twelve_floors() -> None:
    between_parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        edges = between_parts.setdefault(part_of(module), set())
        edges.update(part_of(target) for target in targets if part_of(target) not in (part_of(module), "__init__"))

    @functools.cache
    def longest_from(part: str) -> tuple[str, ...]:
        chains = [longest_from(target) for target in sorted(between_parts.get(part, ()))]
        return (part, *max(chains, key=len, default=()))

    longest = max((longest_from(part) for part in between_parts if part != "__init__"), key=len)
    assert len(longest) <= MOST_FLOORS, f"{len(longest)} floors: {' -> '.join(longest)}"


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
