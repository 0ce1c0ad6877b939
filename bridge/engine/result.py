"""From decoded events and the way the process ended to the result a host gets. Pure.

`TurnRecorder` applies the turn-level rules (docs/protocol.md §3–§5) as events arrive:
which partials are forwarded, the caps, the last session and error. Its
`finish()` applies the exit-code precedence and builds the `TurnResult`.
Given the bridge's environment (`environ`), a failed turn's error names the
credentials `env_inherit: minimal` held back from the agent.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..confinement.limits import ResourceLimits, describe_exceeded, refused_write
from ..dialects import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    LineCut,
    PartialEvent,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)
from ..dialects.events import FileEvent, QuestionRequest, RequestWithdrawn
from ..errors import AttachmentFailed
from ..permissions import PermissionRequest
from ..profile import Profile
from .launch import withheld_credentials

EXIT_TIMEOUT = 124
EXIT_CANCELLED = 130
# max_reply_chars: null lifts the profile's cap, not the bridge's own bound on
# memory: a reply body is never held beyond this many characters.
HARD_REPLY_LIMIT = 8 * 1024 * 1024
_BODY_RUN = 1024  # body lines kept as separate strings before they are joined
LAST_LINE_CHARS = 200  # of the agent's last stderr line, quoted in a failed turn's error
_CREDENTIALS_NAMED = 3  # held-back credentials named in an error; more are counted


class Outcome(enum.StrEnum):
    OK = "ok"
    AGENT_ERROR = "agent_error"
    EXIT_NONZERO = "exit_nonzero"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    SPAWN_FAILED = "spawn_failed"
    NOT_READING = "not_reading"  # the agent left too much of what the bridge wrote to it unread: it was killed
    ATTACHMENT_FAILED = "attachment_failed"  # an attachment could not be fetched: the agent was never started
    WORKER_LOST = "worker_lost"  # only through PostgreSQL: the worker running the turn died (bridge.host.postgres)
    LIMIT_EXCEEDED = (
        "limit_exceeded"  # the agent failed over one of its profile's `limits:` (bridge.confinement.limits)
    )

    def __str__(self) -> str:
        return self.value


@dataclass(slots=True, frozen=True)
class TurnResult:
    """Everything a host needs after a turn (docs/protocol.md §5)."""

    reply: str
    session_id: str
    error: str
    error_reply: str
    exit_code: int
    timed_out: bool
    outcome: Outcome
    stderr_tail: str
    duration_ms: int
    partials: int
    truncated: bool
    usage: Usage | None = None
    """Tokens and cost, when the agent reported them (JSON families do)."""
    folded_into: str = ""
    """The turn this message was steered into (`on_busy: steer`): that turn's result carries the reply."""
    files: tuple[FileEvent, ...] = ()
    """The files the agent left in its outbox, as its `FileEvent`s reported them (docs/protocol.md §5)."""
    files_note: str = ""
    """What the outbox held that was not sent (over the bounds, not a regular file), for the user; "" when none."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["outcome"] = self.outcome.value
        fields["usage"] = self.usage.to_dict() if self.usage is not None else None
        fields["files"] = [dataclasses.asdict(file) for file in self.files]
        return fields


@dataclass(slots=True, frozen=True)
class Ending:
    """How the agent's process ended, as its driver (`driver`, `warm_agents`) saw it."""

    returncode: int | None = None  # as from waitpid: -N when killed by signal N
    timeout: Literal["wall", "idle"] | None = None
    cancelled: bool = False
    spawn_failure: tuple[int, str] | None = None  # (exit code, what is wrong)
    attachment_failure: str | None = None  # which attachment could not be fetched and why: the agent never ran
    unread: int = 0  # > 0: the agent was killed for leaving this many bytes written to it unread (`StdinQueue`)
    limit: str = ""  # the profile's limit the agent ended over (`bridge.confinement.limits.exceeded`), when known


Forwarded = (
    PartialEvent
    | SessionEvent
    | ErrorEvent
    | ActivityEvent
    | PermissionRequest
    | QuestionRequest
    | RequestWithdrawn
    | AgentInput
    | ProtocolWarning
)


# Partials beyond this many characters cannot be repeated by a reply (held to HARD_REPLY_LIMIT and a suffix).
_STREAMED_KEPT = HARD_REPLY_LIMIT + 4096


class StreamedText:
    """The partials a person was shown, so that of the reply they see only what the partials did not show."""

    __slots__ = ("_parts", "_chars")

    def __init__(self) -> None:
        self._parts: list[str] | None = []  # None: longer than any reply can be, so no reply repeats it
        self._chars = 0

    def add(self, text: str) -> None:
        if self._parts is None:
            return
        self._chars += len(text)
        if self._chars > _STREAMED_KEPT:
            self._parts = None
        else:
            self._parts.append(text)

    def unstreamed(self, reply: str) -> tuple[str, bool]:
        """What of the reply was not shown yet, and whether it continues the text shown.

        JSON families stream the reply itself: its text was shown as partials
        (and, when they stream whole messages, the reply is the last of them).
        An AgentProc agent's partials are usually something else ("working on
        it…"), and then the whole reply is shown.
        """
        if not reply or not self._parts:
            return reply, False
        streamed = "".join(self._parts)
        if streamed.rstrip().endswith(reply.rstrip()):
            return "", False
        if reply.startswith(streamed):
            return reply[len(streamed) :], True
        return reply, False


class TurnRecorder:
    """The turn's state while it runs. Give it each batch of decoded events with `record()`."""

    __slots__ = (
        "_profile",
        "_body",
        "_body_runs",
        "_body_lines",
        "_body_length",
        "_body_cap",
        "_body_tail",
        "_body_full",
        "_partial_room",
        "_partials_cut",
        "_line_cut",
        "session_id",
        "error",
        "error_seen",
        "partials",
        "usage",
        "_unfinished",
        "_environ",
    )

    def __init__(self, profile: Profile, environ: Mapping[str, str] | None = None) -> None:
        self._profile = profile
        self._environ = environ  # the agent's was planned from it: read only to explain a failure
        cap = profile.max_reply_chars
        self._body: list[str] = []  # the latest body lines
        self._body_runs: list[str] = []  # earlier body lines, joined a run at a time (see record())
        self._body_lines = 0
        self._body_length = 0  # length of the joined body so far, never over _body_cap
        self._body_cap = min(cap, HARD_REPLY_LIMIT) if cap is not None else HARD_REPLY_LIMIT
        self._body_tail = ""  # the part of the line that crossed the cap which still fits
        self._body_full = False
        self._partial_room: int | None = cap  # characters of partials still allowed; None = no cap
        self._partials_cut = False
        self._line_cut = False  # the decoder cut an over-long line
        self.session_id = ""
        self.error = ""
        self.error_seen = False
        self.partials = 0
        self.usage: Usage | None = None
        self._unfinished = ""  # the dialect saw the stream end before the agent's final event

    def record(self, events: list[Event]) -> list[Forwarded]:
        """Record a batch of events; returns, in order, what to forward to the host and the warnings to log."""
        forward: list[Forwarded] = []
        # A partial passes as it is unless a cap, an error or `streaming: false` says otherwise (an error in
        # this batch turns it off below).
        plain_partials = self._partial_room is None and not self.error_seen and self._profile.streaming
        for event in events:
            if type(event) is PartialEvent:
                if plain_partials:
                    self.partials += 1
                    forward.append(event)
                elif (partial := self._limited_partial(event)) is not None:
                    forward.append(partial)
            elif type(event) is str:  # a BodyLine
                if self._body_full:
                    continue
                grown = self._body_length + len(event) + (1 if self._body_lines else 0)
                if grown <= self._body_cap:
                    self._body.append(event)
                    self._body_length = grown
                    self._body_lines += 1
                else:
                    joined = ("\n" + event) if self._body_lines else event
                    self._body_tail = joined[: self._body_cap - self._body_length]
                    self._body_full = True
            elif type(event) is SessionEvent:
                self.session_id = event.session_id
                forward.append(event)
            elif type(event) is ErrorEvent:
                if event.unfinished:
                    self._unfinished = event.text  # its weight depends on how the process ended (see finish)
                else:
                    self.error_seen = True
                    plain_partials = False
                    self.error = event.text
                    forward.append(event)
            elif type(event) is ReplyEvent:
                self._set_reply(event.text)
            elif type(event) is UsageEvent:
                usage = event.usage
                self.usage = usage if event.replace or self.usage is None else self.usage.plus(usage)
            elif isinstance(
                event,
                (ActivityEvent, PermissionRequest, QuestionRequest, RequestWithdrawn, AgentInput, ProtocolWarning),
            ):
                self._line_cut = self._line_cut or isinstance(event, LineCut)
                forward.append(event)
            # else: a warm agent's own events (ready, turn end, file requests) never reach a turn's recorder
        if len(self._body) > _BODY_RUN:
            # Millions of short lines would cost ~50 bytes of object each on top of
            # their text; joined, the body's memory follows its character bound.
            self._body_runs.append("\n".join(self._body))
            self._body.clear()
        return forward

    def _set_reply(self, text: str) -> None:
        """The whole reply at once (JSON families): it replaces whatever body came before."""
        self._body.clear()
        self._body_runs.clear()
        self._body_tail = ""
        if len(text) <= self._body_cap:
            self._body = [text]
            self._body_length, self._body_lines, self._body_full = len(text), 1, False
        else:
            self._body_length = self._body_lines = 0
            self._body_tail = text[: self._body_cap]
            self._body_full = True

    def _limited_partial(self, event: PartialEvent) -> PartialEvent | None:
        if self.error_seen or self._partials_cut or not self._profile.streaming:
            return None
        room = self._partial_room
        if room is not None:
            if len(event.text) > room:
                self._partials_cut = True
                event = PartialEvent(event.text[:room] + self._profile.truncation_suffix)
                room = 0
            else:
                room -= len(event.text)
            self._partial_room = room
        self.partials += 1
        return event

    def finish(self, ending: Ending, *, stderr_tail: str = "", duration_ms: int = 0) -> TurnResult:
        """Apply docs/protocol.md §4's precedence and build the result."""
        unfinished = False  # the error is the dialect's "ended without finishing", not the agent's own words
        if self._unfinished and not self.error_seen and ending.timeout is None and not ending.cancelled:
            self.error_seen = True  # the agent ended on its own, without finishing: that fails the turn
            self.error = self._unfinished
            unfinished = True
        profile = self._profile
        exit_code, outcome, cause = self._classify(ending, stderr_tail)
        succeeded = exit_code == 0
        reply = ""
        truncated = self._partials_cut or self._line_cut
        if succeeded:
            runs = [*self._body_runs, "\n".join(self._body)] if self._body else self._body_runs
            reply = "\n".join(runs) + self._body_tail
            if self._body_full:
                reply += profile.truncation_suffix
                truncated = True
        error = self.error
        agent_said_why = self.error_seen and bool(error)
        if outcome in (Outcome.NOT_READING, Outcome.LIMIT_EXCEEDED):  # the bridge's reason, not the agent's words
            error, agent_said_why = f"the agent {cause}", False
        elif outcome is Outcome.ATTACHMENT_FAILED:
            error, agent_said_why = ending.attachment_failure or "", False
        if unfinished and (last_line := last_stderr_line(stderr_tail)):
            # The dialect's words name no cause ("ended without finishing"); the agent's last stderr line may.
            error = f"{error}; its stderr ends: {last_line}"
        error_reply = ""
        if not succeeded and profile.send_error_reply:
            error_reply = error if agent_said_why else f"The agent {cause}."
            if profile.max_reply_chars is not None and len(error_reply) > profile.max_reply_chars:
                error_reply = error_reply[: profile.max_reply_chars] + profile.truncation_suffix
        if profile.include_stderr_in_reply and stderr_tail:
            if succeeded:
                reply = _with_stderr(reply, stderr_tail)
            elif error_reply:
                error_reply = _with_stderr(error_reply, stderr_tail)
        if outcome in (Outcome.AGENT_ERROR, Outcome.EXIT_NONZERO) and self._environ is not None:
            held_back = withheld_credentials(profile, self._environ)
            if held_back:
                error = f"{error or f'the agent {cause}'}; {credentials_note(profile, held_back)}"
        return TurnResult(
            reply=reply,
            session_id=self.session_id,
            error=error,
            error_reply=error_reply,
            exit_code=exit_code,
            timed_out=ending.timeout is not None,
            outcome=outcome,
            stderr_tail=stderr_tail,
            duration_ms=duration_ms,
            partials=self.partials,
            truncated=truncated,
            usage=self.usage,
        )

    def _classify(self, ending: Ending, stderr_tail: str = "") -> tuple[int, Outcome, str]:
        """(exit code, outcome, generic cause) in docs/protocol.md §4's order of precedence."""
        profile = self._profile
        if ending.timeout == "wall":
            return EXIT_TIMEOUT, Outcome.TIMEOUT, f"timed out after {profile.timeout_secs:g} s"
        if ending.timeout == "idle":
            return EXIT_TIMEOUT, Outcome.TIMEOUT, f"timed out after {profile.idle_timeout_secs:g} s without output"
        if ending.cancelled:
            return EXIT_CANCELLED, Outcome.CANCELLED, "was cancelled"
        if ending.unread:
            return (
                1,
                Outcome.NOT_READING,
                (
                    f"stopped reading its stdin ({_mib(ending.unread)} written to it would "
                    "have waited unread, over the bridge's limit), so it was killed"
                ),
            )
        if ending.attachment_failure is not None:
            return 1, Outcome.ATTACHMENT_FAILED, f"was not started: {ending.attachment_failure}"
        if ending.spawn_failure is not None:
            code, reason = ending.spawn_failure
            return code, Outcome.SPAWN_FAILED, f"could not be started: {reason}"
        returncode = ending.returncode if ending.returncode is not None else 0
        if returncode < 0:
            code, cause = 128 - returncode, f"was killed by {_signal_name(-returncode)}"
        else:
            code, cause = returncode, f"exited with code {returncode}"
        limits = ResourceLimits.of(profile.limits)
        limit = ending.limit or refused_write(limits, code, stderr_tail)
        if limit and code:
            return code, Outcome.LIMIT_EXCEEDED, describe_exceeded(limit, limits)
        if self.error_seen:
            return code or 1, Outcome.AGENT_ERROR, cause if code else "reported an error"
        if code:
            return code, Outcome.EXIT_NONZERO, cause
        return 0, Outcome.OK, ""


_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def last_stderr_line(stderr_tail: str, limit: int = LAST_LINE_CHARS) -> str:
    """The last non-blank line of the agent's stderr, without colours or control characters, cut to `limit`."""
    for line in reversed(stderr_tail.splitlines()):
        text = " ".join(_CONTROL.sub(" ", _ANSI_ESCAPE.sub("", line)).split())
        if text:
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""


def credentials_note(profile: Profile, names: list[str]) -> str:
    """What an error says about credentials the agent did not get (`launch.withheld_credentials`): their names,
    never their values, and the profile line that passes them."""
    named = names[:_CREDENTIALS_NAMED]
    listed = ", ".join(named) + (f" and {len(names) - len(named)} more" if len(names) > len(named) else "")
    entries = [f'{name}: "${{{name}}}"' for name in named]
    it = "it" if len(names) == 1 else "them"
    if not profile.env:
        where = f"add to the profile: env: {{{', '.join(entries)}}}"
    else:
        where = "add under its env" + (": " if len(entries) == 1 else ", a line each: ") + "; ".join(entries)
    return (
        f"the agent did not get {listed} from the bridge's environment (env_inherit: minimal holds back all "
        f"but PATH, HOME and the like); if it needs {it}, {where}"
    )


def cancelled_result(profile: Profile, duration_ms: int = 0) -> TurnResult:
    """The result of a turn cancelled before its agent started: exit 130, like any host cancel."""
    return TurnRecorder(profile).finish(Ending(cancelled=True), duration_ms=duration_ms)


def folded_result(profile: Profile, turn_id: str, session_id: str, duration_ms: int = 0) -> TurnResult:
    """The result of a message steered into turn `turn_id` (`on_busy: steer`): it succeeded, and has no reply of
    its own — the reply of the turn it was folded into answers it."""
    result = TurnRecorder(profile).finish(Ending(returncode=0), duration_ms=duration_ms)
    return dataclasses.replace(result, session_id=session_id, folded_into=turn_id)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _with_stderr(text: str, stderr_tail: str) -> str:
    return f"{text}\n\n[stderr]\n{stderr_tail}" if text else f"[stderr]\n{stderr_tail}"


def ending_of(failure: AttachmentFailed) -> Ending:
    """How a turn whose attachments failed ends (its result's outcome: `attachment_failed`, or `cancelled`)."""
    return Ending(cancelled=True) if failure.cancelled else Ending(attachment_failure=failure.message)
