"""The parts of `codex app-server`'s JSON schema the codex-app-server dialect uses, kept under tests/schemas/.

    codex app-server generate-json-schema --experimental --out DIR

prints the exact schema of the pinned binary (`--experimental`: the dialect's
Plan mode uses experimental fields). The union files (every request or
notification of a side) are cut down to the methods the dialect writes or
reads, with the definitions those reach; the small response files are kept
whole. `python tests/codex_app_server_schema.py` rewrites the copy from the
cached binary; `test_dialect_codex_app_server.py` checks that the binary still
prints the same, so a CLI upgrade shows up as a test diff.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parent / "schemas" / "codex-app-server"
UNIONS = {
    "ClientRequest.json": (
        "initialize",
        "thread/start",
        "thread/resume",
        "turn/start",
        "turn/interrupt",
        "turn/steer",
    ),
    "ClientNotification.json": ("initialized",),
    "ServerRequest.json": (
        "item/commandExecution/requestApproval",
        "item/fileChange/requestApproval",
        "item/tool/requestUserInput",
    ),
    "ServerNotification.json": (
        "item/agentMessage/delta",
        "item/started",
        "item/completed",
        "turn/plan/updated",
        "thread/tokenUsage/updated",
        "error",
        "serverRequest/resolved",
        "turn/completed",
    ),
}
"""Each union file → the methods the dialect uses of it."""
WHOLE = (
    "CommandExecutionRequestApprovalResponse.json",
    "FileChangeRequestApprovalResponse.json",
    "ToolRequestUserInputResponse.json",
    "JSONRPCError.json",
    "v2/TurnSteerResponse.json",
    "v2/TurnInterruptResponse.json",
)


def generate(codex: str | Path) -> dict[str, str]:
    """The used parts of the schema `codex` prints: file name → its text as kept under tests/schemas/."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [str(codex), "app-server", "generate-json-schema", "--experimental", "--out", out],
            check=True,
            capture_output=True,
            timeout=60,
        )
        kept = {name: _trimmed(json.loads((Path(out) / name).read_text()), methods) for name, methods in UNIONS.items()}
        kept |= {name: json.loads((Path(out) / name).read_text()) for name in WHOLE}
    return {
        name: json.dumps(schema, indent=1, sort_keys=True, ensure_ascii=False) + "\n" for name, schema in kept.items()
    }


def load(name: str) -> Any:
    return json.loads((SCHEMAS / name).read_text())


def _trimmed(schema: dict[str, Any], methods: tuple[str, ...]) -> dict[str, Any]:
    variants = [variant for variant in schema["oneOf"] if set(_methods(variant)) & set(methods)]
    assert sorted(method for variant in variants for method in _methods(variant)) == sorted(methods), (
        f"{schema.get('title')}: the dialect uses methods the schema does not have"
    )
    kept = {key: value for key, value in schema.items() if key != "definitions"}
    kept["oneOf"] = variants
    definitions = schema.get("definitions", {})
    reached: dict[str, Any] = {}
    pending = _refs(variants)
    while pending:
        name = pending.pop()
        if name in reached or name not in definitions:
            continue
        reached[name] = definitions[name]
        pending |= _refs(definitions[name])
    if reached:
        kept["definitions"] = reached
    return kept


def _methods(variant: dict[str, Any]) -> list[str]:
    return list(variant.get("properties", {}).get("method", {}).get("enum", []))


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node)) if node else set()
    return set()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from agents_cache import npm_binary

    for name, text in generate(npm_binary("codex")).items():
        (SCHEMAS / name).parent.mkdir(parents=True, exist_ok=True)
        (SCHEMAS / name).write_text(text)
