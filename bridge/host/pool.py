"""The host's warm agents: one live agent per conversation of a warm protocol, reused turn after turn.

A turn of a warm profile (ACP, aionrs, Ante) takes its conversation's agent
from the pool (`checkout`) and gives it back when the turn is over
(`checkin`). The scheduler already runs one turn per (profile, conversation,
session name) at a time, so an agent serves one turn at a time without a lock
of its own.

An agent is reused only when it can take the turn as if it had just resumed
the session: its process is alive, its profile is the one the turn runs
(an edited profile file gets a new agent), its session is the one the turn
resumes, and — when the store can tell — no other process recorded a turn
of the conversation since this agent's last one (`stamp`). Otherwise it is
shut down and a new agent resumes the stored session.

Between turns an agent stays `keep_warm_secs`; a profile keeps at most
`max_warm` agents alive between turns (the least recently used go first).
Shutting an agent down is the protocol's goodbye, `kill_grace_secs`, then
its process group is killed; it happens in the pool's own tasks, so no turn
waits for it. `aclose` shuts every agent down; a busy one (its turn outlived
the host's shutdown) is killed at once.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import trio

from ..engine.warm_agents import WarmAgent
from ..errors import WarmStartError
from ..log import Logger
from ..profile import Profile

Key = tuple[str, str, str]  # (profile name, conversation, session name)


class _Entry:
    __slots__ = ("agent", "expiry")

    def __init__(self, agent: WarmAgent) -> None:
        self.agent = agent
        self.expiry: trio.CancelScope | None = None  # the idle timer, while the agent waits between turns


class WarmPool:
    """Live warm agents by conversation. Its tasks (the agents' pipes, idle timers, goodbyes) run in `nursery`."""

    def __init__(self, nursery: trio.Nursery, log: Logger) -> None:
        self._nursery = nursery
        self._log = log
        self._idle: dict[str, OrderedDict[Key, _Entry]] = {}  # by profile name; least recently used first
        self._busy: dict[Key, _Entry] = {}
        self._busy_by_profile: Counter[str] = Counter()
        self._closing = False

    @property
    def size(self) -> int:
        """Agents alive in the pool (between turns or taking one)."""
        idle = sum(entry.agent.alive for entries in self._idle.values() for entry in entries.values())
        return idle + len(self._busy)

    async def checkout(self, key: Key, profile: Profile, session_id: str, stamp: str, log: Logger) -> WarmAgent:
        """The agent for `key`'s next turn: the warm one if it fits, else a new one that resumes `session_id`.

        Raises `WarmStartError` when a new agent cannot be started; the pool
        then holds nothing for `key`.
        """
        assert key not in self._busy, f"two turns of {key} at once"
        if self._closing:
            raise WarmStartError(126, "the host has shut its warm agents down")
        entry = self._take_idle(key)
        if entry is not None:
            unfit = entry.agent.unfit_for(profile, session_id, stamp)
            if unfit is None:
                self._set_busy(key, entry)
                log.debug("turn runs on the conversation's warm agent", pid=entry.agent.pid, turns=entry.agent.turns)
                return entry.agent
            log.info("the conversation's warm agent is not reused", why=unfit, pid=entry.agent.pid)
            self._retire(entry)
        agent = WarmAgent(profile, session_id=session_id, session_name=key[2], log=log)
        entry = _Entry(agent)
        self._set_busy(key, entry)
        self._make_room(key[0], profile.max_warm)
        try:
            await agent.start(self._nursery)
        except BaseException:
            self._unset_busy(key)
            raise
        return agent

    def checkin(self, key: Key, stamp: str) -> None:
        """`key`'s turn is over; `stamp` is what the store said when it recorded it ("" if it cannot tell)."""
        entry = self._unset_busy(key)
        agent = entry.agent
        if not agent.alive:
            return  # it died, or was killed for not stopping a turn: its pipes' task reaped it already
        if self._closing:
            self._retire(entry)
            return
        agent.stamp = stamp
        self._idle.setdefault(key[0], OrderedDict())[key] = entry
        entry.expiry = trio.CancelScope()
        self._nursery.start_soon(self._expire, key, entry)
        self._make_room(key[0], agent.profile.max_warm)  # more turns than max_warm ran at once

    def discard(self, key: Key) -> None:
        """Shut `key`'s idle agent down (a turn of the conversation runs elsewhere: the agent would miss it)."""
        entry = self._take_idle(key)
        if entry is not None:
            self._retire(entry)

    async def aclose(self) -> None:
        """Shut every agent down and wait until each is reaped; the pool takes no agent back afterwards."""
        self._closing = True
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as goodbyes:
                for idle in self._idle.values():
                    for entry in idle.values():
                        if entry.expiry is not None:
                            entry.expiry.cancel()
                        goodbyes.start_soon(entry.agent.close)
                self._idle.clear()
                for entry in self._busy.values():  # turns that outlived the host's shutdown
                    goodbyes.start_soon(entry.agent.close, 0)
        # Every agent is reaped and every idle timer cancelled: none of the pool's tasks is left. (Its
        # nursery's own cancel scope is not ours to cancel: it encloses the body of `async with host`.)

    def _make_room(self, profile_name: str, max_warm: int) -> None:
        """At most `max_warm` agents of `profile_name` alive: the least recently used idle ones go."""
        idle = self._idle.get(profile_name)
        if not idle:
            return
        for key in [key for key, entry in idle.items() if not entry.agent.alive]:  # died between turns
            self._take_idle(key)
        while idle and len(idle) + self._busy_by_profile[profile_name] > max_warm:
            _, entry = idle.popitem(last=False)
            if entry.expiry is not None:
                entry.expiry.cancel()
            self._log.info(
                "a warm agent is shut down to make room (max_warm)", profile=profile_name, pid=entry.agent.pid
            )
            self._retire(entry)

    def _take_idle(self, key: Key) -> _Entry | None:
        idle = self._idle.get(key[0])
        entry = idle.pop(key, None) if idle else None
        if entry is not None and entry.expiry is not None:
            entry.expiry.cancel()
        return entry

    def _set_busy(self, key: Key, entry: _Entry) -> None:
        self._busy[key] = entry
        self._busy_by_profile[key[0]] += 1

    def _unset_busy(self, key: Key) -> _Entry:
        self._busy_by_profile[key[0]] -= 1
        return self._busy.pop(key)

    def _retire(self, entry: _Entry) -> None:
        self._nursery.start_soon(entry.agent.close)

    async def _expire(self, key: Key, entry: _Entry) -> None:
        assert entry.expiry is not None
        with entry.expiry:
            await trio.sleep(entry.agent.profile.keep_warm_secs)
            idle = self._idle.get(key[0])
            if idle is not None and idle.get(key) is entry:
                del idle[key]
                self._log.info(
                    "a warm agent idle for keep_warm_secs is shut down",
                    pid=entry.agent.pid,
                    idle_secs=entry.agent.profile.keep_warm_secs,
                )
                await entry.agent.close()
