"""Adding a family is one module and one line of `PROTOCOLS`: each line says what its class is."""

from __future__ import annotations

import pytest

from bridge.dialects import PROTOCOLS, DialectContext, JsonLinesReader, dialect_class
from bridge.dialects.agentproc01 import AgentProc01
from bridge.dialects.warm import WarmDialect
from bridge.turn import Turn


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_each_registry_line_names_its_class_settings_and_kind(protocol: str) -> None:
    info = PROTOCOLS[protocol]
    dialect = dialect_class(protocol)
    assert dialect.name == protocol
    assert dialect.Settings is info.settings
    assert issubclass(dialect, WarmDialect) == info.warm
    assert issubclass(dialect, JsonLinesReader) or dialect is AgentProc01  # AgentProc 0.1 writes lines, not JSON
    if not info.warm:
        handover = dialect.handover(Turn("hi"), DialectContext(settings=info.settings()))
        assert (handover.stdin is not None) == info.message_on_stdin


@pytest.mark.parametrize("protocol", sorted(name for name, info in PROTOCOLS.items() if name != "agentproc-0.1"))
def test_every_json_family_dispatches_by_a_table_of_its_message_types(protocol: str) -> None:
    handlers = dialect_class(protocol).handlers
    # No type member: the JSON-RPC families' tables are by method (requests, results, notifications), Ante's by
    # event name.
    assert handlers or protocol in ("acp", "ante", "codex-app-server")
    assert all(isinstance(kind, str) and callable(handler) for kind, handler in handlers.items())
