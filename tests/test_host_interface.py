"""One declared host interface: `Host` and the PostgreSQL gateway's `RemoteHost` both implement `BaseHost`,
`open_host` returns it, and `async with` runs a host's tasks once."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from hostkit import Lab

import bridge
from bridge import Turn
from bridge.host import BaseHost, Host, RemoteHost


def interface() -> list[str]:
    """The public methods and properties of the interface."""
    return [name for name in vars(BaseHost) if not name.startswith("_")]


@pytest.mark.parametrize("implementation", [Host, RemoteHost])
def test_both_hosts_implement_the_whole_interface(implementation: type[BaseHost]) -> None:
    assert issubclass(implementation, BaseHost)
    assert not inspect.isabstract(implementation), f"{implementation.__name__} leaves abstract methods"
    for name in interface():
        declared, implemented = getattr(BaseHost, name), getattr(implementation, name)
        if callable(declared):
            ours = list(inspect.signature(declared).parameters)
            theirs = list(inspect.signature(implemented).parameters)
            assert theirs[: len(ours)] == ours, f"{implementation.__name__}.{name}{theirs} is not {ours}"
            assert inspect.iscoroutinefunction(declared) == inspect.iscoroutinefunction(implemented), name


def test_the_interface_names_what_serve_uses() -> None:
    assert {
        "submit",
        "cancel",
        "in_flight",
        "decide",
        "current_stats",
        "undelivered",
        "follow",
        "delivered",
        "closing",
        "stop_accepting",
        "cancel_all",
        "aclose",
    } <= set(interface())


async def test_open_host_returns_the_interface_for_either_kind(lab: Lab) -> None:
    host = bridge.open_host(lab.profiles, state=lab.state)
    assert isinstance(host, Host) and isinstance(host, BaseHost)
    await host.aclose()
    gateway = bridge.open_host(postgres="postgresql://nobody@localhost:1/nothing")  # nothing connects before use
    assert isinstance(gateway, RemoteHost) and isinstance(gateway, BaseHost)


async def test_a_host_whose_results_end_with_it_has_none_to_send_again(lab: Lab) -> None:
    async with bridge.open_host(lab.profiles, state=lab.state) as host:
        result = await host.submit("rec", "c", bridge.Turn("tag=a"), client_id=7)
        assert result.ok
        assert await host.undelivered() == []
        await host.delivered("turn-1")  # nothing to mark
        with pytest.raises(bridge.ProtocolMisuse, match="not listed by undelivered"):
            await host.follow("turn-1")


async def test_a_host_is_entered_once(lab: Lab) -> None:
    host = bridge.open_host(lab.profiles, state=lab.state)
    async with host:
        with pytest.raises(bridge.ProtocolMisuse, match="a Host is entered once"):
            async with host:
                pass
    with pytest.raises(RuntimeError, match="entered once"):  # ProtocolMisuse is also a RuntimeError
        async with host:
            pass


def test_under_asyncio_a_host_says_it_runs_under_trio(lab: Lab) -> None:
    async def entered() -> None:
        async with bridge.open_host(lab.profiles, state=lab.state):
            pass

    async def submitted() -> None:
        await bridge.open_host(lab.profiles, state=lab.state).submit("rec", "c", Turn("x"))

    for call in (entered, submitted):
        with pytest.raises(bridge.ProtocolMisuse, match=r"runs under trio.*agent-bridge serve"):
            asyncio.run(call())


async def test_the_body_s_exception_leaves_async_with_as_itself(lab: Lab) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with bridge.open_host(lab.profiles, state=lab.state) as host:
            assert not host.closing
            raise KeyError("mine")
    assert host.closing


async def test_a_cancelled_body_shuts_the_host_down(lab: Lab) -> None:
    with trio.move_on_after(0.2) as scope:
        async with bridge.open_host(lab.profiles, state=lab.state) as host:
            await trio.sleep_forever()
    assert scope.cancelled_caught and host.closing


# --------------------------------------------------------------------------- one submit, one message per rule


@asynccontextmanager
async def either_host(kind: str, lab: Lab, request: pytest.FixtureRequest) -> AsyncIterator[BaseHost]:
    """An entered host of `kind`: this process's, or a gateway on a database of its own (no worker: its turns
    wait in the queue)."""
    if kind == "local":
        host = bridge.open_host(lab.profiles, state=lab.state, client_session_ids="stored")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        host = bridge.open_host(postgres=dsn, client_session_ids="stored", shutdown_grace=0)
    async with host:
        yield host


REFUSALS: list[tuple[str, Any, Any, type[Exception], str]] = [
    # (what, conversation, turn, error, its whole message)
    ("not a Turn", "chat", "hello", bridge.TurnError, "submit() needs a bridge.Turn, not str"),
    ("no conversation", "", Turn("x"), bridge.TurnError, "the conversation key must be a non-empty string, not ''"),
    ("a key not text", 42, Turn("x"), bridge.TurnError, "the conversation key must be a non-empty string, not 42"),
    (
        "a NUL in the key",
        "a\0b",
        Turn("x"),
        bridge.TurnError,
        "the conversation key contains a NUL character, which no process can receive; remove it",
    ),
    (
        "no session name",
        "chat",
        Turn("x", session_name=""),
        bridge.TurnError,
        "the turn's session_name must not be empty (the default is 'default')",
    ),
    (
        "a session id not the stored one",
        "chat",
        Turn("x", session_id="s-other"),
        bridge.SessionIdRefused,
        "the turn's session_id is not the session stored for conversation 'chat' (profile 'rec', session name "
        "'default'), and this host takes no other: leave session_id empty to resume the conversation's own "
        "session (a session id resumes whichever conversation's history it belongs to)",
    ),
]


@pytest.mark.parametrize("kind", ["local", "gateway"])
async def test_both_hosts_refuse_a_bad_submit_with_the_same_message(
    kind: str, lab: Lab, request: pytest.FixtureRequest
) -> None:
    async with either_host(kind, lab, request) as host, trio.open_nursery() as nursery:
        for what, conversation, turn, error, message in REFUSALS:
            with pytest.raises(error) as refused:
                await host.submit("rec", conversation, turn)
            assert str(refused.value) == message, what
        gate = lab.gate()
        await nursery.start(partial(host.submit, "rec", "chat", Turn(f"tag=a gate={gate}"), turn_id="t1"))
        with pytest.raises(bridge.DuplicateTurn) as duplicate:
            await host.submit("rec", "other", Turn("tag=b"), turn_id="t1")
        assert str(duplicate.value) == "turn 't1' is already in flight; give each turn its own id"
        host.stop_accepting()
        with pytest.raises(bridge.HostClosed) as closed:
            await host.submit("rec", "chat", Turn("tag=c"))
        assert str(closed.value) == "the host is shutting down and takes no new turns"
        nursery.cancel_scope.cancel()
    assert set(lab.events("start")) <= {"a"}  # nothing refused ever ran


async def test_open_host_opens_no_store_until_it_is_entered_and_a_store_that_cannot_open_fails_there(
    lab: Lab, tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh" / "sessions.sqlite3"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    host = bridge.open_host(lab.profiles, state=fresh)
    unopenable = bridge.open_host(lab.profiles, state=blocker / "sessions.sqlite3")
    unreachable = bridge.open_host(lab.profiles, state="postgresql://nobody@127.0.0.1:1/nothing")
    assert not fresh.parent.exists()  # nothing made, nothing connected: the store opens at `async with`
    with pytest.raises(bridge.StoreError, match=r"a-file \(or a parent\) is a file, not a directory"):
        async with unopenable:
            pass
    with pytest.raises(bridge.StoreError, match="127.0.0.1"):
        async with unreachable:
            pass
    async with host:
        assert fresh.exists()
        assert (await host.submit("rec", "chat", Turn("tag=a"))).ok
