"""Helpers for the tests of the coding-CLI dialects and their ready profiles.

- `decode`: feed a dialect whole or in chunks of any size, as the turn engine would.
- `install_fake_clis`: put the sample stand-ins on PATH under the CLIs' own names, with a
  fresh HOME for the sessions they keep, so the ready profiles run unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import PYTHON, SAMPLE_AGENTS

from bridge import Turn
from bridge.dialects import DialectContext, Event, JsonSettings, dialect_class

STAND_INS = dict.fromkeys(
    ("grok", "kimi", "opencode", "pi", "dsh", "deepseek", "agy", "aider"), SAMPLE_AGENTS / "coding_clis.py"
)
STAND_INS["aictrl"] = SAMPLE_AGENTS / "aictrl_like.py"
TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"


def decode(
    protocol: str, data: bytes, *, chunk: int | None = None, max_line_bytes: int | None = None, turn: Turn | None = None
) -> list[Event]:
    """Every event `protocol`'s dialect makes of `data`, fed in `chunk`-byte pieces (all at once by default)."""
    settings = JsonSettings(max_line_bytes) if max_line_bytes is not None else None
    dialect = dialect_class(protocol)(DialectContext(settings=settings), turn or Turn("hi"))
    events: list[Event] = []
    size = chunk or max(len(data), 1)
    for start in range(0, len(data), size):
        events.extend(dialect.feed(data[start : start + size]))
    events.extend(dialect.close())
    return events


def of_type(events: list[Event], kind: type) -> list[Event]:
    return [event for event in events if type(event) is kind]


def install_fake_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-ins on PATH as `grok`, `kimi`, … (each a script that runs the sample as that name); returns HOME."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, sample in STAND_INS.items():
        launcher = bin_dir / name
        # The stand-in knows which CLI to be from the name it was run as (runpy would rename it).
        launcher.write_text(
            f"#!{PYTHON}\nimport sys\nsys.argv[0] = {str(launcher)!r}\n"
            f"source = open({str(sample)!r}).read()\n"
            f"exec(compile(source, {str(sample)!r}, 'exec'), {{'__name__': '__main__'}})\n"
        )
        launcher.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(home))
    return home
