"""The examples of the README and of every page in docs/ as tests: every fenced block says, in an HTML comment
just before it, how it is run.

    <!-- example: MODE [POSITIONAL…] [OPTION=VALUE…] -->
    ```sh
    …
    ```

The comment is invisible on GitHub and in the mkdocs site; its words are split
like a shell's (quote values with spaces). A fenced block without one fails
`test_readme.py`, so a new example is covered as soon as it is written. The
modes:

- `sh` — each line is a command, run by `sh -c` (one after the other, in one
  directory); each must exit 0. `subst="<id>=abc"` replaces a placeholder
  first; `expect=TEXT` must appear in the output; `dry=PREFIX`: lines that
  start with PREFIX (a `make` target too slow for the suite, or the suite
  itself) run as `make -n`, which checks the target without building it;
  `cwd=repo` runs in the repository instead of the example's directory.
- `transcript` — `$ command` lines, each followed by the output it prints
  (stdout and stderr together). The output must match, line by line, after
  the rules of `matches` below.
- `chat` — a transcript of `agent-bridge chat` in a terminal: the `$` line
  starts it, each `you> TEXT` line is typed at the prompt (`^D` is Ctrl-D),
  and the screen must match.
- `serve` — `→ request` and `← response` lines of `agent-bridge serve
  --profiles profiles/`. Requests are written in order; a request after
  responses waits until those have come. Each response must match one
  expected in type and id, in order for its id; `vary="running queued"`
  lists keys whose numbers may differ (`duration_ms` always may).
- `python` — a program, run with the test's Python (the project's venv);
  it must exit 0 (`expect=TEXT` in its output).
- `agent` — an agent script: run as the command of a profile with
  `message=TEXT`, its reply must be `reply=TEXT`.
- `profile` — a profile: `agent-bridge check` must accept it. Its file name
  is the first positional word, else the file its first line names (`# profiles/x.yaml`).
- `file NAME` — the block is file NAME in every example's directory (for the
  examples that use it, on any page; two pages that show the same NAME must
  show the same text).
- `synopsis` — `agent-bridge COMMAND … --option …` lines (an indented line
  continues the one before): every option named must be in that command's `--help`.
- `illustration REASON` — not run (a diagram, a format, a message shown as an
  illustration); the reason says why.

Every example runs in a directory of its own holding a copy of `profiles/` and
`sample_agents/` and the `file` blocks, with `agent-bridge` on PATH the way
`make install` puts it there (a fresh shell: the venv is not activated).

How output matches (`transcript`, `chat`, `serve`): trailing spaces are
ignored; 32-digit hex ids and timestamps match any id and timestamp; `…` in
the page matches any text (so `3dc0…` stands for a whole id); a line that
is a JSON object is compared as JSON, key by key.

Links between pages are checked too (`relative_links`, `heading_anchors`): a
relative link must name a file of the repository, and its `#anchor` a heading
of that page, as GitHub makes anchors of headings.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

MODES = ("sh", "transcript", "chat", "serve", "python", "agent", "profile", "file", "synopsis", "illustration")
MARKER = re.compile(r"<!--\s*example:(.*?)-->", re.S)
FENCE = re.compile(r"^(```+|~~~+)(.*)$")
ALWAYS_VARY = frozenset({"duration_ms"})


@dataclass
class Example:
    """One fenced block of a page and how it is run."""

    page: str  # the page's path in the repository, e.g. "docs/guide.md"
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mode: str = ""
    positional: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    problem: str = ""  # why its marker is missing or wrong

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line} ({self.mode or 'no marker'})"


def examples(markdown: str, page: str = "README.md") -> list[Example]:
    """Every fenced block of `markdown` (the page at `page`), with the marker before it parsed."""
    lines = markdown.splitlines()
    found = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        opening, language = fence.group(1), fence.group(2).strip()
        end = index + 1
        while end < len(lines) and not lines[end].startswith(opening):
            end += 1
        example = Example(page, index + 1, language, "\n".join(lines[index + 1 : end]) + "\n")
        _read_marker(example, lines[:index])
        found.append(example)
        index = end + 1
    return found


def _read_marker(example: Example, before: list[str]) -> None:
    at = len(before) - 1
    while at >= 0 and not before[at].strip():
        at -= 1
    if at < 0 or not before[at].rstrip().endswith("-->"):
        example.problem = "no <!-- example: MODE … --> comment before it"
        return
    start = at
    while start >= 0 and "<!--" not in before[start]:
        start -= 1
    match = MARKER.search("\n".join(before[start : at + 1]))
    if match is None:
        example.problem = "the comment before it is not an <!-- example: MODE … --> marker"
        return
    try:
        words = shlex.split(match.group(1))
    except ValueError as err:
        example.problem = f"its marker does not split into words: {err}"
        return
    if not words or words[0] not in MODES:
        example.problem = f"its marker's mode must be one of {', '.join(MODES)}"
        return
    example.mode = words[0]
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if sep and re.fullmatch(r"[a-z]+", key):
            example.options[key] = value
        else:
            example.positional.append(word)
    if example.mode in ("illustration", "file") and not example.positional:
        example.problem = f"`{example.mode}` needs " + ("a reason" if example.mode == "illustration" else "a NAME")


# --------------------------------------------------------------------------- matching output

_HEX_ID = re.compile(r"\b[0-9a-f]{32}\b")
_ABBREVIATED_ID = re.compile(r"\b[0-9a-f]{4,31}…")  # a page's "3dc0…"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


def normalize(text: str) -> str:
    return _TIMESTAMP.sub("<time>", _HEX_ID.sub("<id>", text)).rstrip()


def text_matches(expected: str, actual: str) -> bool:
    """`actual` is `expected`, where `…` in `expected` stands for any text."""
    expected, actual = normalize(_ABBREVIATED_ID.sub("<id>", expected)), normalize(actual)
    if "…" not in expected:
        return expected == actual
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, re.S) is not None


def value_matches(expected: Any, actual: Any, vary: frozenset[str] = frozenset(), key: str = "") -> bool:
    """JSON values compared key by key; strings as `text_matches`; numbers of `vary` keys only by type."""
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(value_matches(expected[name], actual[name], vary, name) for name in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(value_matches(one, other, vary, key) for one, other in zip(expected, actual))
        )
    if isinstance(expected, str):
        return isinstance(actual, str) and text_matches(expected, actual)
    if key in vary or key in ALWAYS_VARY:
        return type(expected) is type(actual) or (vary_number(expected) and vary_number(actual))
    return expected == actual and type(expected) is type(actual)


def vary_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def line_matches(expected: str, actual: str) -> bool:
    """One line of output: as JSON when the page's line is a JSON object, else as text."""
    if expected.lstrip().startswith("{"):
        try:
            want = json.loads(expected)
            got = json.loads(actual)
        except ValueError:
            pass
        else:
            if isinstance(want, dict):
                return value_matches(want, got)
    return text_matches(expected, actual)


def lines_match(expected: list[str], actual: list[str]) -> str:
    """ "" when the lines match; else what differs, for the assertion message."""
    expected = _without_trailing_blank(expected)
    actual = _without_trailing_blank(actual)
    for number, (want, got) in enumerate(zip(expected, actual), 1):
        if not line_matches(want, got):
            return f"line {number} differs:\n  page:   {want!r}\n  actual: {got!r}"
    if len(expected) != len(actual):
        return f"the page shows {len(expected)} lines, the program printed {len(actual)}:\n" + "\n".join(actual)
    return ""


def _without_trailing_blank(lines: list[str]) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def transcript_steps(text: str, prompt: str = "$ ") -> list[tuple[str, list[str]]]:
    """(command, the output shown after it) for each `$ command` line."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(prompt):
            steps.append((line[len(prompt) :], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def synopsis_commands(text: str) -> list[tuple[list[str], list[str]]]:
    """(command path, options named) for each `agent-bridge …` line; continuations (a backslash, or an
    indented line) joined."""
    joined = re.sub(r"\\?\n(?=\s)", " ", text)
    found = []
    for line in joined.splitlines():
        words = line.split()
        if not words or words[0] != "agent-bridge":
            continue
        path = []
        for word in words[1:]:
            if not re.fullmatch(r"[a-z]+", word):
                break
            path.append(word)
        found.append((path, re.findall(r"--[a-z][a-z-]*", line)))
    return found


# --------------------------------------------------------------------------- links between pages

_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose_lines(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks."""
    found = []
    fence = ""
    for number, line in enumerate(markdown.splitlines(), 1):
        opening = FENCE.match(line)
        if opening and (not fence or line.startswith(fence)):
            fence = "" if fence else opening.group(1)
            continue
        if not fence:
            found.append((number, line))
    return found


def relative_links(markdown: str) -> list[tuple[int, str]]:
    """(line, target) of every link and image that is not a URL, outside code; a link's text may span lines."""
    lines = [""] * len(markdown.splitlines())
    for number, line in _prose_lines(markdown):
        lines[number - 1] = _INLINE_CODE.sub(lambda code: " " * len(code.group(0)), line)
    prose = "\n".join(lines)
    found = []
    for match in _LINK.finditer(prose):
        target = match.group(1) or match.group(2)
        if not re.match(r"[a-z]+:", target):
            found.append((prose.count("\n", 0, match.end()) + 1, target))
    return found


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated one numbered (`-1`, `-2`)."""
    anchors: set[str] = set()
    for _, line in _prose_lines(markdown):
        heading = re.match(r"#{1,6} (.*)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        candidate, number = slug, 0
        while candidate in anchors:
            number += 1
            candidate = f"{slug}-{number}"
        anchors.add(candidate)
    return anchors
