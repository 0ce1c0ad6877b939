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

import trio

from ..confinement.spawner import start
from ..dialects import SessionEvent
from ..dialects.base import outbox_named
from ..dialects.claude_stream import is_claude_code, with_system_prompt_appended
from ..errors import LaunchError
from ..log import Logger
from ..profile import Profile
from ..turn import Turn
from .driver import AgentIO, TurnLimits
from .launch import LaunchPlan, plan_launch, turn_working_directory
from .loop import Emit, TurnLoop, finish_turn, turn_logger
from .questions import Questions
from .result import Ending, TurnRecorder, TurnResult
from .turn_setup import TurnSetup, turn_set_up

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
    log = turn_logger(profile, turn_id)
    async with turn_set_up(
        profile, turn, _agent_directory(profile, turn), turn_id, log, allow_hosts=allow_hosts, cancel=cancel
    ) as setup:
        if setup.ending is not None:
            return finish_turn(TurnRecorder(profile), setup.ending, "", started, log)
        return await _one_process(profile, setup, emit, cancel, log, on_stderr, questions, started)


async def _one_process(
    profile: Profile,
    setup: TurnSetup,
    emit: Emit | None,
    cancel: trio.Event | None,
    log: Logger,
    on_stderr: Callable[[bytes], None] | None,
    questions: Questions | None,
    started: float,
) -> TurnResult:
    """A one-process turn whose files (its attachments, its outbox) are `setup`'s."""
    plan: LaunchPlan | None = None
    try:
        plan = plan_launch(profile, setup.turn, os.environ)
        if setup.files is not None:
            plan = dataclasses.replace(
                plan, env={**plan.env, "AGENT_OUTBOX": setup.outbox}, argv=_outbox_told(profile, plan, setup.outbox)
            )
        # Made before the agent starts, not while it does: work the bridge does while bwrap sets a sandbox up
        # delays that by most of its own time (bench row 29); an agent without one starts ~10 µs later (row 1).
        # A dialect that cannot be made raises here, before there is an agent to stop.
        _log_notes(log, plan)
        recorder = TurnRecorder(profile, os.environ)
        dialect = profile.turn_dialect(profile.dialect_context, setup.turn)
        questions = questions if questions is not None else Questions()
        agent = await start(plan, kill_grace_secs=profile.kill_grace_secs)
    except LaunchError as err:
        return _not_started(profile, started, err, log)

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
        log.info("turn abandoned by the host; agent stopped", exit_code=130)
        raise
    finally:
        agent.close()
    result = finish_turn(recorder, ending, io.stderr_text(), started, log)
    return await setup.hand_out(profile, result, emit)


def _agent_directory(profile: Profile, turn: Turn) -> str:
    """The directory the agent runs in, where its turn's directories are made; "" when it is not one: the agent's
    start fails on it, with its own error, before anything is made or fetched."""
    try:
        cwd = turn_working_directory(profile, turn) or os.getcwd()
    except LaunchError:
        return ""
    return cwd if os.path.isdir(cwd) else ""


def _not_started(profile: Profile, started: float, err: LaunchError, log: Logger) -> TurnResult:
    log.warning("agent could not be started", reason=err.message, exit_code=err.exit_code, in_result=True)
    return finish_turn(TurnRecorder(profile), Ending(spawn_failure=(err.exit_code, err.message)), "", started, log)


def _log_notes(log: Logger, plan: LaunchPlan) -> None:
    for note in plan.notes:
        log.warning(note)


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
