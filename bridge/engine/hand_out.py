"""The end of a turn's files: the outbox's files handed out with the result, the turn's directory let go of."""

from __future__ import annotations

import dataclasses

from ..dialects.events import ActivityEvent
from ..files.outbox import collect_beneath
from ..files.turn_directory import TurnFiles
from ..log import Logger
from ..profile import Profile
from .loop import Emit
from .result import Outcome, TurnResult


async def hand_out(
    files: TurnFiles, profile: Profile, result: TurnResult, emit: Emit | None, log: Logger
) -> TurnResult:
    """The turn is over: `result` with the files of the turn's outbox, each emitted as a `FileEvent` (and what was
    left out as a `notice`) before the result. An outbox that holds nothing to send is removed beneath the
    descriptor `files` holds; one that does is the host's to remove (`remove_outbox`) once the files were
    delivered."""
    if result.outcome is Outcome.CANCELLED:  # nobody waits for what a cancelled turn made
        files.remove_outbox()
        return result
    parent, name = files.outbox_beneath()
    collected = collect_beneath(
        parent, name, files.outbox, max_files=profile.outbox_max_files, max_bytes=profile.outbox_max_bytes
    )
    if not collected.files:
        files.remove_outbox()
    if collected.note:
        log.warning("outbox files left out", note=collected.note)
    if emit is not None:
        for file in collected.files:
            await emit(file)
        if collected.note:
            await emit(ActivityEvent("notice", text=collected.note))
    if not collected.files and not collected.note:
        return result
    return dataclasses.replace(result, files=collected.files, files_note=collected.note)


async def hand_out_turn_files(
    files: TurnFiles, keep_attachments: bool, profile: Profile, result: TurnResult, emit: Emit | None, log: Logger
) -> TurnResult:
    """The turn is over: its fetched attachments deleted (unless `keep_attachments`: the profile keeps them), its
    outbox handed out (`hand_out`), and its directories let go of (what is left in them is the host's)."""
    if not keep_attachments:
        files.remove_attachments()
    if files.remove_outbox_if_empty():  # as most are: nothing to read
        files.close()
        return result
    try:
        return await hand_out(files, profile, result, emit, log)  # the outbox stays while it holds files
    finally:
        files.close()
