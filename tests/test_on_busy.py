"""What a message does while its conversation's turn still runs (`on_busy`), with the host and real agents.

`queue` (the default) is covered by test_host's ordering tests. Here: `interrupt` stops the running turn and the new
message runs next, for any protocol; `steer` on a protocol that cannot steer queues the message. Steering into a
running turn of Claude Code or Codex is tested with the real CLIs (test_claude_sdk_live, test_codex_app_server_live).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hostkit import Lab

import bridge
from bridge import Turn, TurnResult

DEADLINE = 15
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")


LAB_PROFILES = ()  # the `lab` fixture's (conftest.py): each test writes its own


async def two_messages(lab: Lab, *, release_when_queued: bool) -> dict[str, TurnResult]:
    """`slow` (held at its gate) runs; `next` of the same conversation comes meanwhile. With `release_when_queued`
    the gate opens once the host has queued `next` (whatever on_busy did with the running turn by then)."""
    gate = lab.gate()
    results: dict[str, TurnResult] = {}

    async def submit(host: bridge.BaseHost, tag: str, words: str = "") -> None:
        results[tag] = await host.submit("rec", "chat", Turn(f"tag={tag} {words}"))

    with trio.fail_after(DEADLINE):
        async with bridge.open_host(lab.profiles, state=lab.state) as host, trio.open_nursery() as nursery:
            nursery.start_soon(submit, host, "slow", f"gate={gate}")
            while "slow" not in lab.events("start"):
                await trio.sleep(0.01)
            nursery.start_soon(submit, host, "next")
            if release_when_queued:
                while (await host.current_stats()).queued < 1:
                    await trio.sleep(0.01)
                await lab.release(gate)
    return results


async def test_interrupt_stops_the_running_turn_and_the_new_message_runs_next(lab: Lab) -> None:
    lab.profile("rec", extra="on_busy: interrupt\n")
    results = await two_messages(lab, release_when_queued=False)  # only the interrupt ends `slow`
    assert results["slow"].outcome.value == "cancelled"
    assert (results["next"].ok, results["next"].reply) == (True, "reply next one")
    assert lab.events("sigint") == ["slow"]
    assert lab.events("start") == ["slow", "next"]  # never at the same time: next started once slow was gone
    assert lab.lines().index(["sigint", "slow"]) < lab.lines().index(["start", "next", "-", str(lab.pid("next"))])


async def test_interrupt_runs_the_newest_message_next_and_cancels_those_it_overtook(lab: Lab) -> None:
    """Two messages come while the running turn is being stopped: the newest runs next; the one before it does not
    run in full first (the newest would have interrupted it had it started): it ends cancelled."""
    lab.profile("rec", extra="on_busy: interrupt\n")
    gate = lab.gate()
    results: dict[str, TurnResult] = {}

    async def submit(
        host: bridge.BaseHost, tag: str, words: str = "", task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        results[tag] = await host.submit("rec", "chat", Turn(f"tag={tag} {words}"), task_status=task_status)

    with trio.fail_after(DEADLINE):
        async with bridge.open_host(lab.profiles, state=lab.state) as host, trio.open_nursery() as nursery:
            nursery.start_soon(submit, host, "slow", f"gate={gate}")
            while "slow" not in lab.events("start"):
                await trio.sleep(0.01)
            await nursery.start(submit, host, "next")  # returns once the host took it in
            await nursery.start(submit, host, "newest")
    outcomes = [results[tag].outcome.value for tag in ("slow", "next", "newest")]
    assert outcomes == ["cancelled", "cancelled", "ok"], lab.lines()
    assert results["newest"].reply == "reply newest one"
    assert "next" not in lab.events("end")


async def release_unless_interrupted(lab: Lab, gate: Path, tag: str) -> None:
    """Open `tag`'s gate — at once if its agent waits there; failing, not hanging, if it was interrupted."""
    while True:
        assert tag not in lab.events("sigint"), f"a message of another conversation interrupted turn {tag}"
        try:
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO: nothing reads the gate (yet)
            return
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
        await trio.sleep(0.01)


@pytest.mark.parametrize("max_concurrent", [1, 4])
async def test_interrupt_stops_only_its_own_conversation_s_turn(lab: Lab, max_concurrent: int) -> None:
    """Two conversations on one profile: a message that waits in conversation `b` — behind `b`'s running turn, or
    (one turn at a time) behind `a`'s — never interrupts `a`'s turn."""
    lab.profile("rec", extra="on_busy: interrupt\n")
    gate_a, gate_b = lab.gate(), lab.gate()
    results: dict[str, TurnResult] = {}

    async def submit(host: bridge.BaseHost, conversation: str, tag: str, words: str = "") -> None:
        results[tag] = await host.submit("rec", conversation, Turn(f"tag={tag} {words}"))

    with trio.fail_after(DEADLINE):
        async with (
            bridge.open_host(lab.profiles, state=lab.state, max_concurrent=max_concurrent) as host,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(submit, host, "room-a", "a", f"gate={gate_a}")
            while "a" not in lab.events("start"):
                await trio.sleep(0.01)
            if max_concurrent > 1:
                nursery.start_soon(submit, host, "room-b", "b", f"gate={gate_b}")
                while "b" not in lab.events("start"):
                    await trio.sleep(0.01)
                nursery.start_soon(submit, host, "room-b", "b2")
                while not lab.events("sigint"):
                    await trio.sleep(0.01)
                assert lab.events("sigint") == ["b"], "a message of another conversation interrupted turn a"
            else:
                nursery.start_soon(submit, host, "room-b", "b2")
                # b2 waits for a slot: on_busy has acted on it by then (or it ran at once, a interrupted for it)
                while (await host.current_stats()).queued < 1 and not lab.events("sigint"):
                    await trio.sleep(0.01)
            await release_unless_interrupted(lab, gate_a, "a")
    assert (results["a"].ok, results["a"].reply) == (True, "reply a one"), results["a"].error
    assert results["b2"].ok
    assert lab.events("sigint") == (["b"] if max_concurrent > 1 else [])


async def test_queue_leaves_the_running_turn_alone(lab: Lab) -> None:
    lab.profile("rec")  # on_busy: queue
    results = await two_messages(lab, release_when_queued=True)
    assert [results[tag].ok for tag in ("slow", "next")] == [True, True]
    assert lab.events("end") == ["slow", "next"]
    assert lab.events("sigint") == []


async def test_steer_on_a_protocol_that_cannot_steer_queues_the_message(lab: Lab) -> None:
    lab.profile("rec", extra="on_busy: steer\n")
    results = await two_messages(lab, release_when_queued=True)
    assert [(results[tag].ok, results[tag].folded_into) for tag in ("slow", "next")] == [(True, ""), (True, "")]
    assert lab.events("end") == ["slow", "next"]
    assert lab.events("sigint") == []


def test_check_says_a_protocol_that_cannot_steer_queues(lab: Lab) -> None:
    path = lab.profile("rec", extra="on_busy: steer\n")
    done = subprocess.run([AGENT_BRIDGE, "check", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "protocol agentproc-0.1 cannot give a running turn another message" in done.stderr
    queued = lab.profile("plain")
    done = subprocess.run([AGENT_BRIDGE, "check", str(queued)], capture_output=True, text=True, check=False)
    assert "steer" not in done.stderr
