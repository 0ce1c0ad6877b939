"""The exception hierarchy: everything the bridge raises derives from `BridgeError`.

A host can catch `BridgeError` to handle every bridge failure in one place, or a
subclass to react to one kind. Messages are written for the person who has to
fix the problem: they say what is wrong and, where possible, what to do.
"""

from __future__ import annotations

from dataclasses import dataclass


class BridgeError(Exception):
    """Root of every error agent-bridge raises."""


@dataclass(slots=True, frozen=True)
class Problem:
    """One thing wrong with a profile, located as precisely as the input allows."""

    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.file is None:
            return self.message
        if self.line is None:
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}: {self.message}"


class ProfileError(BridgeError, ValueError):
    """A profile could not be loaded; `problems` lists every reason, one per line."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


class TurnError(BridgeError, ValueError):
    """A turn's input (message, session id, attachments…) cannot be sent to an agent."""


class ProtocolMisuse(BridgeError):
    """A dialect or warm agent was used out of order: a bug in the caller, not in the agent."""


class LaunchError(BridgeError):
    """The agent could not be started; `exit_code` is 127 (not found) or 126 (cannot run).

    `run_turn` never raises this: it becomes a result with outcome
    `spawn_failed`. It is public for callers of `plan_launch`.
    """

    def __init__(self, exit_code: int, message: str) -> None:
        self.exit_code = exit_code
        self.message = message
        super().__init__(message)
