"""Run one turn under trio: launch the agent, let its process and its events run, return the result.

`drive_turn` is the turn engine every front door uses. For a one-turn
protocol it plans the launch, spawns the agent, and lets `AgentIO` (the
process's pipes, deadlines and end) run it, while a `TurnLoop` feeds each
chunk of stdout to the profile's dialect, records the events by the turn's
rules, answers the agent's permission requests by the profile's policy, and
delivers the rest to the host. A warm protocol's turn runs on a fresh
`WarmAgent` (`run_warm_turn`), which uses the same driver and loop. Every
dialect is driven the same way: a new agent family never touches this module.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import trio

from ..confinement.spawner import start
from ..dialects import SessionEvent
from ..dialects.base import outbox_named
from ..dialects.claude_stream import is_claude_code, with_system_prompt_appended
from ..errors import FileRefused, LaunchError
from ..files.turn_directory import TurnFiles
from ..profile import Profile
from ..turn import Turn
from .driver import AgentIO, TurnLimits
from .hand_out import hand_out_turn_files
from .launch import LaunchPlan, plan_launch, turn_working_directory
from .loop import Emit, TurnLoop, finish_turn, turn_logger
from .questions import Questions
from .result import Ending, TurnRecorder, TurnResult, ending_of

__all__ = ["drive_turn"]


async def drive_turn(
    profile: Profile,
    turn: Turn,
    emit: Emit | None = None,
    *,
    cancel: trio.Event | None = None,
    turn_id: str | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    questions: Questions | None = None,
    allow_hosts: tuple[str, ...] = (),
) -> TurnResult:
    """Run one turn to its end and return the result; `emit` sees every host event before (not the result).

    Setting `cancel` stops the agent the way a host cancel must (SIGINT, grace,
    SIGKILL) and still returns a result (exit 130). A trio cancellation of the
    caller does the same cleanup, then lets `Cancelled` propagate. `turn_id`
    tags the turn's log records (default: a random id). `on_stderr` is given
    each chunk of the agent's stderr as it is read (the tail is kept anyway).
    When the profile's `permissions` say ask, `emit` gets the `PermissionRequest`
    and the host answers it through `questions` (see `bridge.engine.questions`).
    The turn's attachments are fetched into its directory before the agent
    starts (`bridge.files.attachments`); a failure ends the turn there
    (`attachment_failed`), and the directory is removed when the turn ends.
    `allow_hosts`: the host's exceptions to the attachments' address rule, on top of the profile's.
    """
    if profile.warm:  # a long-lived agent, started for this one turn
        # Imported here: a one-shot run (the CLI's cold start, bench row 6) does not load the warm engine.
        from .warm_agents import run_warm_turn

        return await run_warm_turn(
            profile,
            turn,
            emit,
            cancel=cancel,
            turn_id=turn_id,
            questions=questions,
            on_stderr=on_stderr,
            allow_hosts=allow_hosts,
        )
    started = trio.current_time()
    turn_id = turn_id or os.urandom(6).hex()
    try:
        cwd = turn_working_directory(profile, turn) or os.getcwd()
    except LaunchError:  # it fails to start the same way below, before anything is made or fetched
        cwd = ""
    makes_files = False
    if turn.attachments:
        # Imported here: a turn without attachments (the CLI's cold start, bench row 6) does not load HTTP and TLS.
        from ..files.attachments import makes_files as attachments_make_files

        makes_files = attachments_make_files(profile, turn.attachments, allow_hosts)
    try:
        files = _turn_files(cwd, turn_id, makes_files)
    except FileRefused as err:
        if makes_files:
            return _not_started(
                profile, turn_id, started, LaunchError(126, f"the turn's directory cannot be made: {err}")
            )
        # A read-only working directory (serve started in /, say) costs the agent its outbox, not its turn.
        turn_logger(profile, turn_id).warning(
            "the turn's directory cannot be made; the agent gets no outbox", reason=str(err)
        )
        files = None
    keep = False
    if makes_files and files is not None:
        from ..files.attachments import AttachmentFailed, policy_of, prepare_attachments

        policy = policy_of(profile, allow_hosts)
        log = turn_logger(profile, turn_id)
        try:
            turn = await prepare_attachments(turn, files, policy, log, cancel)
        except BaseException as err:
            files.remove()
            if not isinstance(err, AttachmentFailed):
                raise
            log.warning("the agent was not started: its attachments were not fetched", reason=str(err), in_result=True)
            return finish_turn(TurnRecorder(profile), ending_of(err), "", started, log)
        keep = policy.keep
    return await _one_process(profile, turn, files, keep, emit, cancel, turn_id, on_stderr, questions, started)


async def _one_process(
    profile: Profile,
    turn: Turn,
    files: TurnFiles | None,
    keep: bool,
    emit: Emit | None,
    cancel: trio.Event | None,
    turn_id: str,
    on_stderr: Callable[[bytes], None] | None,
    questions: Questions | None,
    started: float,
) -> TurnResult:
    """A one-process turn whose attachments (if any) are in `files`, where its outbox is too (`keep`: the profile
    keeps the attachments after the turn)."""
    plan: LaunchPlan | None = None
    log = None
    try:
        plan = plan_launch(profile, turn, os.environ)
        if files is not None:
            plan = dataclasses.replace(
                plan, env={**plan.env, "AGENT_OUTBOX": files.outbox}, argv=_outbox_told(profile, plan, files.outbox)
            )
        # Made before the agent starts, not while it does: work the bridge does while bwrap sets a sandbox up
        # delays that by most of its own time (bench row 29); an agent without one starts ~10 µs later (row 1).
        # A dialect that cannot be made raises here, before there is an agent to stop.
        log = _turn_logger(profile, turn_id, plan)
        recorder = TurnRecorder(profile, os.environ)
        dialect = profile.dialect(profile.dialect_context, turn)
        questions = questions if questions is not None else Questions()
        agent = await start(plan, kill_grace_secs=profile.kill_grace_secs)
    except LaunchError as err:
        if files is not None:
            files.remove()
        return _not_started(profile, turn_id, started, err, plan, log)

    io = AgentIO(plan, agent, log, TurnLimits.of(profile), on_stderr)
    io.begin_turn(started)
    loop = TurnLoop(dialect, recorder, profile.permission_policy, emit, log, io.send, questions, io.stdout.receive)
    log.info("agent started", pid=agent.pid, program=plan.argv[0])
    try:
        if plan.new_session_id:  # the profile let the bridge name the new session: that is the turn's session
            await loop.handle([SessionEvent(plan.new_session_id)])
        ending = await io.run(loop.on_output, cancel, questions.close)
        await loop.handle(loop.dialect.close())
    except BaseException:
        with trio.CancelScope(shield=True):
            await io.abandon()
        if files is not None:
            files.remove()
        log.info("turn abandoned by the host; agent stopped", exit_code=130)
        raise
    finally:
        agent.close()
    result = finish_turn(recorder, ending, io.stderr_text(), started, log)
    if files is None:
        return result
    return await hand_out_turn_files(files, keep, profile, result, emit, log)


def _turn_files(cwd: str, turn_id: str, attachments: bool) -> TurnFiles | None:
    """The turn's directories (its outbox, its attachments) in the agent's working directory; None when that is not
    a directory: the agent's start fails on it, with its own error."""
    return TurnFiles(cwd, turn_id, attachments=attachments) if cwd and os.path.isdir(cwd) else None


def _not_started(
    profile: Profile, turn_id: str, started: float, err: LaunchError, plan: LaunchPlan | None = None, log: Any = None
) -> TurnResult:
    if log is None:
        log = _turn_logger(profile, turn_id, plan)
    log.warning("agent could not be started", reason=err.message, exit_code=err.exit_code, in_result=True)
    return finish_turn(TurnRecorder(profile), Ending(spawn_failure=(err.exit_code, err.message)), "", started, log)


def _turn_logger(profile: Profile, turn_id: str | None, plan: LaunchPlan | None) -> Any:
    log = turn_logger(profile, turn_id)
    for note in plan.notes if plan is not None else ():
        log.warning(note)
    return log


def _outbox_told(profile: Profile, plan: LaunchPlan, outbox: str) -> tuple[str, ...]:
    """The turn's command line, telling Claude Code (`claude -p`) the turn's outbox in its system prompt unless the
    profile says `outbox: {tell_agent: never}`; any other program learns it from `AGENT_OUTBOX` alone."""
    if (
        profile.tell_agent_outbox == "never"
        or profile.protocol != "claude-stream-json"
        or not is_claude_code(plan.argv, plan.command_at)
    ):
        return plan.argv
    return with_system_prompt_appended(plan.argv, plan.command_at, outbox_named(outbox))
