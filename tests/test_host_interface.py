"""One declared host interface: `Host` and the PostgreSQL gateway's `RemoteHost` both implement `BaseHost`,
`open_host` returns it, and `async with` runs a host's tasks once."""

from __future__ import annotations

import inspect

import pytest
import trio
from hostkit import Lab

import bridge
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
