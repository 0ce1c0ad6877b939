"""What a long-lived agent's dialect is: one process, one session, many turns. Sans-I/O.

Claude Code (claude-sdk), codex app-server, ACP, aionrs and Ante agents stay
alive for a whole conversation. Their dialect is made once per process, told
the session to resume (or "" for a new one), and then drives the conversation
in the family's own words:

- `open()`: the first bytes of the handshake (ACP `initialize`, Ante
  `StartSession`/`ResumeSession`; b"" when the agent speaks first, as
  aionrs's `ready` does). Later handshake steps come out of `feed()` as
  `AgentInput` events, answering what the agent said;
- `feed(data)`: events, as for every dialect, plus `Ready(session_id)` once
  the session takes turns, `TurnEnd` when a turn is over (the process stays),
  and `AgentInput` for anything the dialect must write by itself (the next
  handshake step, an error answer to a request the host does not serve).
  Events that are not part of a turn — a resumed session's replayed history,
  the handshake's own noise — are the dialect's to drop: `feed` reports
  only what belongs to the turn in progress (or to the handshake);
- `prompt(turn, outbox)`: the bytes that start a turn (naming its outbox); `cancel()`: the bytes that ask
  the agent to stop it (pending permission requests answered as cancelled);
  `answer(request, decision)`: the bytes of a permission answer;
  `answer_question(request, answers, why)`: the bytes of the answer to a
  `QuestionRequest` (None: declined, `why` says why);
  `steer(turn, steer_id)` (families with `can_steer`): the bytes that give the
  running turn another message; a `SteerOutcome` says later whether the turn
  took it in;
  `shutdown()`: a graceful goodbye (b"" when closing stdin is the goodbye);
- `close()`: the agent's stdout ended; a turn in progress did not finish.

Where the conversation is, is explicit, as h11's `_state.py` has it: a
`WarmState`, and a table of the moves each state allows (`TRANSITIONS`),
checked in one place (`WarmDialect.move`). A family moves by saying so: it
makes its `Ready` with `session_ready()` and its `TurnEnd` with
`turn_over()`; `prompt()` moves into a turn and `close()` out of everything.
A move the table does not allow is `ProtocolMisuse`: a prompt before the
session is ready or during a turn, a feed after close. A family may keep finer
steps of its own inside a state (Ante: resuming or starting; waiting for the
turn's start or in it).

The turn engine (`bridge.engine.warm_agents`) owns the process, the deadlines and the
policy; a warm dialect only speaks. Every rule is tested from transcripts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import ClassVar

from ..errors import ProtocolMisuse
from ..permissions import Decision, PermissionRequest
from ..turn import Turn
from .base import DialectContext, JsonLinesReader
from .events import ErrorEvent, Event, QuestionRequest, Ready, TurnEnd

Answers = Mapping[str, tuple[str, ...]]
"""The user's answer to a `QuestionRequest`: each question's id → the labels chosen (or the user's own words)."""


class WarmState(enum.Enum):
    """Where a long-lived agent's conversation is."""

    STARTING = "starting"  # the session is being set up (the handshake)
    READY = "ready"  # the session takes a turn
    IN_TURN = "in a turn"  # prompt() was sent; the turn has not ended
    CLOSED = "closed"  # the agent's stdout ended


class EndOfOutput:
    """What moves every state to CLOSED: the agent's stdout ended (`close()`)."""


TRANSITIONS: dict[WarmState, dict[type, WarmState]] = {
    WarmState.STARTING: {Ready: WarmState.READY, EndOfOutput: WarmState.CLOSED},
    WarmState.READY: {Turn: WarmState.IN_TURN, EndOfOutput: WarmState.CLOSED},
    WarmState.IN_TURN: {TurnEnd: WarmState.READY, EndOfOutput: WarmState.CLOSED},
    WarmState.CLOSED: {},
}
"""State → what may happen in it (a `Ready` said, a `Turn` prompted, a `TurnEnd` said, the end of the output)
→ the state it leads to. Anything else is `ProtocolMisuse`."""

_REFUSED = {
    WarmState.STARTING: "before the session is ready",
    WarmState.READY: "between turns",
    WarmState.IN_TURN: "while a turn is in progress",
    WarmState.CLOSED: "after the agent's output ended",
}


class WarmDialect(JsonLinesReader):
    """The base of every long-lived agent's dialect: JSON lines both ways, and the conversation's `state`.

    A family fills `handlers` (as every JSON family does), writes `open`,
    `start_turn`, `cancel`, `answer` and `shutdown`, and may add `finish`:
    the events due when the output ends (a turn that did not finish, say).
    """

    __slots__ = ("state",)

    can_steer: ClassVar[bool] = False
    """The family can give a running turn another message (`steer`); else `on_busy: steer` queues it."""

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        """`session_id`: the stored session to resume ("" for a new one); `cwd`: the agent's working directory."""
        super().__init__(context)
        self.state = WarmState.STARTING

    def move(self, happening: type) -> None:
        """The one place a state changes: to where `TRANSITIONS` leads, or `ProtocolMisuse` when it leads nowhere."""
        following = TRANSITIONS[self.state].get(happening)
        if following is None:
            if happening is Turn:
                raise ProtocolMisuse(
                    f"prompt() {_REFUSED[self.state]}: a session takes a prompt only when it is ready "
                    "(wait for Ready or TurnEnd)"
                )
            raise ProtocolMisuse(f"{happening.__name__} {_REFUSED[self.state]}")
        self.state = following

    # ------------------------------------------------------------------ what the engine calls

    def open(self) -> bytes:
        """The first bytes of the handshake (b"" when the agent speaks first)."""
        raise NotImplementedError

    def tell_standing(self, instructions: str) -> bool:
        """Give the agent `instructions` for its whole session through the protocol's own channel for standing
        instructions (the handshake, or `command_line`), if it has one; whether it does. Called before `open`:
        where it has none, the bridge puts them in the first turn's message instead."""
        return False

    def command_line(self, argv: Sequence[str], command_at: int) -> tuple[str, ...]:
        """The agent's command line `argv` (the profile's command from `command_at` on, after the bridge's programs)
        with what the family adds to it (standing instructions given to `tell_standing`, say); bridge-built words,
        never the user's."""
        return tuple(argv)

    def prompt(self, turn: Turn, outbox: str = "") -> bytes:
        """The bytes that start `turn`, naming `outbox` (the session's outbox, when this message is to tell it; "" for
        nothing: the user's message as sent) to the agent; only when the session is ready (`ProtocolMisuse`
        otherwise)."""
        self.move(Turn)
        return self.start_turn(turn, outbox)

    def feed(self, data: bytes) -> list[Event]:
        if self.state is WarmState.CLOSED:
            raise ProtocolMisuse("feed() after close()")
        return self.decode_lines(self._lines.feed(data))

    def close(self) -> list[Event]:
        """The agent's stdout ended: what is due (a turn in progress did not finish); nothing the second time."""
        if self.state is WarmState.CLOSED:
            return []
        events = self.decode_lines(self._lines.close())
        events.extend(self.finish())
        events.extend(self.ignored_lines_warning())
        self.move(EndOfOutput)
        return events

    def cancel(self) -> bytes:
        raise NotImplementedError

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        raise NotImplementedError

    def answer_question(self, request: QuestionRequest, answers: Answers | None, why: str = "") -> bytes:
        """The bytes of the user's `answers` to `request`; None declines it (`why`: nobody answered in time, the
        turn was cancelled…). b"" when the question waits for nothing any more (the agent withdrew it)."""
        raise NotImplementedError

    def steer(self, turn: Turn, steer_id: str) -> bytes:
        """The bytes that give the running turn `turn`'s message; only IN_TURN, only when `can_steer`. A
        `SteerOutcome(steer_id, …)` follows, at the latest with the turn's `TurnEnd`."""
        raise ProtocolMisuse(f"{type(self).__name__} cannot steer a running turn (can_steer is False)")

    @classmethod
    def argv_problems(cls, argv: Sequence[str]) -> list[str]:
        """What `agent-bridge check` says is missing from a profile's command line for this protocol to work
        (a flag the family cannot do without); [] when nothing is."""
        return []

    def shutdown(self) -> bytes:
        return b""  # closing stdin is the goodbye, unless the family says one

    # ------------------------------------------------------------------ what a family calls and writes

    def start_turn(self, turn: Turn, outbox: str) -> bytes:
        """The family's bytes for `turn`, naming `outbox` as the family can (`outbox_named`; the state is IN_TURN
        already)."""
        raise NotImplementedError

    def finish(self) -> list[Event]:
        """Events due at the end of the output (the state is not CLOSED yet)."""
        return []

    def ended_early(self, agent: str, session: str) -> list[Event]:
        """The error due when the output ends in the middle of a turn, or before `session` was ready (nothing
        between turns); `agent` names who stopped talking ("the agent", "codex")."""
        if self.state is WarmState.IN_TURN:
            said = f"{agent}'s output ended in the middle of the turn ({agent} exited or closed its stdout)"
        elif self.state is WarmState.STARTING:
            said = f"{agent}'s output ended before {session} was ready"
        else:
            return []
        return [ErrorEvent(f"{said}; its stderr may say why", unfinished=True)]

    def session_ready(self, session_id: str) -> Ready:
        """The `Ready` of the session set up: the conversation takes turns from now on."""
        self.move(Ready)
        return Ready(session_id)

    def turn_over(self, stop_reason: str = "end_turn") -> TurnEnd:
        """The `TurnEnd` of the turn in progress: the session takes the next one."""
        self.move(TurnEnd)
        return TurnEnd(stop_reason)
