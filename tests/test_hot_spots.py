"""No function of the package is above 60 lines, except a table or a parser definition (issue 37).

Its twin for cyclomatic complexity is ruff's C901 (`max-complexity = 15` in pyproject.toml, no file exempt).
An exception that is no longer long fails here, so the list of exceptions only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bridge"
MOST_LINES = 60
# Long because they are one declaration each: a line per option or per row.
TABLES_AND_PARSERS = {
    "cli/main.py:build_parser",
}


def function_lengths() -> dict[str, int]:
    """Every function and method of the package ("path:Class.name") and its lines, from `def` to its last line."""
    lengths: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        _collect(ast.parse(path.read_text(encoding="utf-8")), where, "", lengths)
    return lengths


def _collect(node: ast.AST, where: str, prefix: str, lengths: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            assert child.end_lineno is not None
            lengths[f"{where}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
            _collect(child, where, f"{prefix}{child.name}.", lengths)
        elif isinstance(child, ast.ClassDef):
            _collect(child, where, f"{prefix}{child.name}.", lengths)


def test_no_function_is_above_60_lines_but_a_table_or_a_parser() -> None:
    long = {name: lines for name, lines in function_lengths().items() if lines > MOST_LINES}
    unexpected = {name: lines for name, lines in long.items() if name not in TABLES_AND_PARSERS}
    assert not unexpected, f"functions above {MOST_LINES} lines: split them ({unexpected})"


def test_the_exceptions_are_still_long() -> None:
    lengths = function_lengths()
    gone = sorted(name for name in TABLES_AND_PARSERS if lengths.get(name, 0) <= MOST_LINES)
    assert not gone, f"no longer above {MOST_LINES} lines (or moved): remove from this file's lists: {gone}"
