"""The package's layout is its architecture: lower layers never import higher ones, and nothing imports the CLI.

base (errors, turn, log) < dialects < profile < turn engine < host < cli

Within and across layers the imports form no circle, and no module imports another one's private (`_name`) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"
LAYERS = {
    "errors": 0,
    "turn": 0,
    "log": 0,
    "permissions": 0,
    "dialects": 1,
    "profile": 2,
    "agent_files": 3,
    "turn_files": 3,
    "fetch_policy": 0,
    "attachments": 3,
    "launch": 3,
    "outbox": 3,
    "cgroups": 3,
    "keeper": 3,
    "limits": 3,
    "agent_io": 3,
    "questions": 3,
    "warm_agent": 3,
    "process": 3,
    "result": 3,
    "supervisor": 3,
    "turn_setup": 3,
    "turn_loop": 3,
    "runner": 3,
    "host": 4,
    "cli": 5,
    "chat": 5,
    "serving": 5,
    "network": 5,
    "command": 5,
}
TOP = 6  # bridge/__init__.py and __main__.py re-export from every layer


def layer_of(parts: tuple[str, ...]) -> int:
    if parts == ("__version__",):
        return 0  # the package's version, read by `--version`
    return LAYERS[parts[0]] if parts and parts[0] in LAYERS else TOP


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
def test_a_module_imports_only_from_its_own_layer_or_lower_ones(path: Path) -> None:
    here = path.relative_to(PACKAGE).with_suffix("").parts
    own = layer_of(here) if here[0] not in ("__init__", "__main__") else TOP
    upward = {".".join(target) for target in imported_modules(path) if layer_of(target) > own}
    assert not upward, f"{path.relative_to(PACKAGE)} (layer {own}) imports from higher layers: {sorted(upward)}"


def test_the_layer_table_covers_every_module() -> None:
    tops = {path.relative_to(PACKAGE).with_suffix("").parts[0] for path in MODULES}
    assert tops - {"__init__", "__main__"} == set(LAYERS)


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
