"""A turn's files set up before its agent gets the turn, and handed out after: one set-up for every engine.

`turn_set_up` is the one place where a turn's directories are made in the agent's working directory
(`bridge.files.turn_directory`), its attachments fetched into them (`bridge.files.attachments`), and, when the turn
is over, its outbox collected for the host (`bridge.engine.hand_out`). The one-process turn
(`bridge.engine.one_process`) and the warm agent (`bridge.engine.warm_agents`) both run their turn inside it:

    async with turn_set_up(profile, turn, cwd, label, log, allow_hosts=..., cancel=...) as setup:
        if setup.ending is not None:       # the turn ends before its agent gets it
            return finish_turn(recorder, setup.ending, ...)
        ...                                # the agent runs `setup.turn`, told `setup.outbox`
        return await setup.hand_out(profile, result, emit)

Whatever does not reach `hand_out` (a failure before the agent started, a cancellation, a callback that raised)
leaves nothing behind: the turn's directories are removed when the block is left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ..errors import FileRefused
from ..files.turn_directory import TurnFiles
from ..log import Logger
from ..profile import Profile
from ..turn import Turn
from .hand_out import hand_out_turn_files
from .loop import Emit
from .result import Ending, TurnResult, ending_of

__all__ = ["TurnSetup", "turn_set_up"]


class TurnSetup:
    """A turn's files while it runs. `turn` is the turn as its agent gets it (attachments fetched become files);
    `files` the turn's directories, None when it has none (no working directory, or a read-only one: the agent gets
    no outbox); `ending` is set when the turn ends before its agent gets it (its directory or attachments failed)."""

    def __init__(self, turn: Turn, log: Logger) -> None:
        self.turn = turn
        self.files: TurnFiles | None = None
        self.ending: Ending | None = None
        self.keep_attachments = False  # the profile keeps a turn's fetched attachments after it
        self.log = log
        self._handed_out = False

    @property
    def outbox(self) -> str:
        """The turn's outbox, "" when it has none."""
        return self.files.outbox if self.files is not None else ""

    async def hand_out(self, profile: Profile, result: TurnResult, emit: Emit | None) -> TurnResult:
        """The turn is over: `result` with the files of its outbox (each emitted before), its fetched attachments
        deleted unless the profile keeps them (`bridge.engine.hand_out.hand_out_turn_files`)."""
        if self.files is None:
            return result
        self._handed_out = True  # from here the outbox is the host's: it stays while it holds files
        return await hand_out_turn_files(self.files, self.keep_attachments, profile, result, emit, self.log)

    def _remove_unless_handed_out(self) -> None:
        if self.files is not None and not self._handed_out:
            self.files.remove()


@asynccontextmanager
async def turn_set_up(
    profile: Profile,
    turn: Turn,
    cwd: str,
    label: str,
    log: Logger,
    *,
    allow_hosts: tuple[str, ...] = (),
    cancel: trio.Event | None = None,
) -> AsyncIterator[TurnSetup]:
    """The turn's directories made in `cwd` (named after `label`; none when `cwd` is ""), its attachments fetched
    into them, and the `TurnSetup` they make; left, the directories are removed unless `hand_out` took them.
    `allow_hosts`: the host's exceptions to the attachments' address rule, on top of the profile's; `cancel` stops
    a fetch (the turn ends `cancelled`)."""
    setup = TurnSetup(turn, log)
    try:
        await _prepare(setup, profile, cwd, label, allow_hosts, cancel)
        yield setup
    finally:
        setup._remove_unless_handed_out()


async def _prepare(
    setup: TurnSetup,
    profile: Profile,
    cwd: str,
    label: str,
    allow_hosts: tuple[str, ...],
    cancel: trio.Event | None,
) -> None:
    makes_files = False
    if setup.turn.attachments:
        # Imported here: a turn without attachments (the CLI's cold start, bench row 6) does not load HTTP and TLS.
        from ..files.attachments import makes_files as attachments_make_files

        makes_files = attachments_make_files(profile, setup.turn.attachments, allow_hosts)
    if not cwd:  # the agent's start fails on its working directory, with its own error
        return
    try:
        setup.files = TurnFiles(cwd, label, attachments=makes_files)
    except FileRefused as err:
        if makes_files:
            reason = f"the turn's directory cannot be made: {err}"
            setup.log.warning("agent could not be started", reason=reason, exit_code=126, in_result=True)
            setup.ending = Ending(spawn_failure=(126, reason))
        else:  # a read-only working directory (serve started in /, say) costs the agent its outbox, not its turn
            setup.log.warning("the turn's directory cannot be made; the agent gets no outbox", reason=str(err))
        return
    if makes_files:
        await _fetch_attachments(setup, setup.files, profile, allow_hosts, cancel)


async def _fetch_attachments(
    setup: TurnSetup, files: TurnFiles, profile: Profile, allow_hosts: tuple[str, ...], cancel: trio.Event | None
) -> None:
    from ..files.attachments import AttachmentFailed, policy_of, prepare_attachments

    policy = policy_of(profile, allow_hosts)
    try:
        setup.turn = await prepare_attachments(setup.turn, files, policy, setup.log, cancel)
    except AttachmentFailed as err:
        setup.log.warning(
            "the agent was not started: its attachments were not fetched", reason=str(err), in_result=True
        )
        setup.ending = ending_of(err)
        return
    setup.keep_attachments = policy.settings.keep
