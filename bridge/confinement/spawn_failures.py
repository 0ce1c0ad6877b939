"""Why an agent did not start, in words that say what to fix: the messages of a failed spawn."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..errors import LaunchError

EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126


class CommandLine(Protocol):
    """What of a launch plan (`bridge.engine.launch.LaunchPlan`) the messages read."""

    @property
    def argv(self) -> Sequence[str]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def shown_cwd(self) -> str | None: ...


def _cwd_named(plan: CommandLine) -> str:
    return plan.shown_cwd or plan.cwd or os.getcwd()


def explain_spawn_failure(err: BaseException, plan: CommandLine) -> LaunchError:
    program = plan.argv[0]
    if isinstance(err, OSError) and plan.cwd is not None and err.filename == plan.cwd:
        cwd = _cwd_named(plan)
        if isinstance(err, FileNotFoundError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {cwd!r} does not exist")
        if isinstance(err, NotADirectoryError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {cwd!r} is not a directory")
        return LaunchError(EXIT_CANNOT_RUN, f"cannot enter the working directory {cwd!r}: {err.strerror}")
    if isinstance(err, FileNotFoundError):
        return explain_not_found(program, plan)
    if isinstance(err, PermissionError):
        return LaunchError(
            EXIT_CANNOT_RUN,
            f"{program!r} is not executable (permission denied); try chmod +x {program}"
            if os.path.isfile(resolved_program(program, plan) or "")
            else f"{program!r} cannot be executed: permission denied",
        )
    if isinstance(err, IsADirectoryError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} is a directory, not a program")
    if isinstance(err, OSError) and err.errno == errno.E2BIG:
        return LaunchError(
            EXIT_CANNOT_RUN,
            "the arguments and environment are too large for the OS (E2BIG); "
            "shorten them or pass the message with `stdin: message`",
        )
    if isinstance(err, OSError) and err.errno == errno.ENOEXEC:
        return LaunchError(
            EXIT_CANNOT_RUN, f"{program!r} is not a program the OS can run; a script needs a #! line such as #!/bin/sh"
        )
    if isinstance(err, OSError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} cannot be executed: {err.strerror or err}")
    if isinstance(err, subprocess.SubprocessError):  # the pre-exec step failed
        return LaunchError(EXIT_CANNOT_RUN, f"the agent's signal handling could not be reset: {err}")
    return LaunchError(EXIT_CANNOT_RUN, f"the command line cannot be passed to the OS: {err}")


def explain_not_found(program: str, plan: CommandLine) -> LaunchError:
    path = resolved_program(program, plan)
    if path is not None and os.path.isfile(path):
        # The file exists, so the missing piece is its #! interpreter.
        try:
            with open(path, "rb") as script:
                first_line = script.readline(256)
        except OSError:
            first_line = b""
        if first_line.startswith(b"#!") and first_line.rstrip(b"\n").endswith(b"\r"):
            import shlex  # only on this error's way

            return LaunchError(
                EXIT_CANNOT_RUN,
                f"{program!r} has Windows line endings (CRLF): its #! line ends with a carriage return, which the "
                f"OS takes as part of the interpreter's name; convert the file: sed -i 's/\\r$//' {shlex.quote(path)} "
                f"(or dos2unix {shlex.quote(path)})",
            )
        if first_line.startswith(b"#!"):
            interpreter = first_line[2:].decode("utf-8", "replace").strip()
            return LaunchError(
                EXIT_CANNOT_RUN, f"{program!r} names an interpreter that does not exist: #!{interpreter}"
            )
    if "/" in program:
        if os.path.isabs(program):
            return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found")
        return LaunchError(
            EXIT_NOT_FOUND,
            f"command {program!r} not found (relative to {_cwd_named(plan)}, the agent's working "
            'directory); for a file next to the profile, write "{{PROFILE_DIR}}/'
            f'{program.removeprefix("./")}"',
        )
    return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found on PATH")


def resolved_program(program: str, plan: CommandLine) -> str | None:
    """Where the OS looked for `program`: relative paths resolve against the agent's cwd."""
    if "/" in program:
        return os.path.join(plan.cwd or os.getcwd(), program)
    for directory in plan.env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.exists(candidate):
            return candidate
    return None
