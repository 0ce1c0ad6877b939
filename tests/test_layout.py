"""The package's layout is its architecture: lower layers never import higher ones, and nothing imports the CLI.

base (errors, turn, log) < dialects < profile < turn engine < host < cli
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
    "launch": 3,
    "cgroups": 3,
    "keeper": 3,
    "agent_io": 3,
    "questions": 3,
    "warm_agent": 3,
    "process": 3,
    "result": 3,
    "supervisor": 3,
    "runner": 3,
    "host": 4,
    "cli": 5,
    "command": 5,
}
TOP = 6  # bridge/__init__.py and __main__.py re-export from every layer


def layer_of(parts: tuple[str, ...]) -> int:
    if parts == ("__version__",):
        return 0  # the package's version, read by `--version`
    return LAYERS[parts[0]] if parts and parts[0] in LAYERS else TOP


def imported_modules(path: Path) -> set[tuple[str, ...]]:
    """Every bridge module `path` imports, as a path inside the package (function-level imports included)."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = here[:-1] if path.name != "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = (*base, *(node.module.split(".") if node.module else ()))
            if node.module is None:
                found.update((*target, alias.name) for alias in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bridge."):
            found.add(tuple(node.module.split(".")[1:]))
        elif isinstance(node, ast.Import):
            found.update(tuple(alias.name.split(".")[1:]) for alias in node.names if alias.name.startswith("bridge."))
    return found


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
