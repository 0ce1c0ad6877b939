"""The agent's OS process: spawned in its own session, signalled as a group, reaped once.

Waiting uses a pidfd, so a turn costs no thread. `wait_exited()` returns while
the agent is still an unreaped zombie: as long as the zombie exists its process
group id cannot be reused, so `signal_group()` can never hit a stranger.
"""

from __future__ import annotations

import _signal
import errno
import os
import signal
import subprocess
from collections.abc import Callable
from functools import partial

import trio

from .errors import LaunchError
from .launch import LaunchPlan

EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126


class AgentProcess:
    """A running agent and the parent's ends of its pipes.

    stdout and stderr are raw non-blocking descriptors: the supervisor reads
    them directly, which saves an event-loop iteration per read over a stream
    object (see `supervisor._Reader`).
    """

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream | None,
                 stdout: int, stderr: int) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        for fd in (stdout, stderr):
            os.set_blocking(fd, False)
        self._exited = False
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # not Linux ≥ 5.3: fall back to a waiting thread
            self._pidfd = None

    @property
    def reaped(self) -> bool:
        return self._popen.returncode is not None

    async def wait_exited(self) -> None:
        """Return once the agent has exited, without reaping it."""
        if self._exited:
            return
        if self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
        else:
            await trio.to_thread.run_sync(
                partial(os.waitid, os.P_PID, self.pid, os.WEXITED | os.WNOWAIT), abandon_on_cancel=True
            )
        self._exited = True

    def signal_group(self, signum: int) -> None:
        """Send `signum` to every process in the agent's group (it leads a session of its own)."""
        if self.reaped:
            return  # the group id may belong to someone else by now
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:  # a member changed credentials (setuid); signal what we can
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def reap(self) -> int:
        """Collect the exited agent's status (negative: killed by that signal).

        Anything else still in its group is killed first, while the zombie
        keeps the group id ours.
        """
        if not self.reaped:
            self.signal_group(signal.SIGKILL)
            self._popen.wait()
        assert self._popen.returncode is not None
        return self._popen.returncode

    def group_alive(self) -> bool:
        """True while any process of the agent's group exists (after `reap()`)."""
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close_output(self) -> None:
        """Stop reading the agent: close our ends of stdout and stderr (idempotent)."""
        self.stdout = _close_fd(self.stdout)
        self.stderr = _close_fd(self.stderr)

    def close(self) -> None:
        """Close the pipes and the pidfd (idempotent). The process must have been reaped."""
        if self.stdin is not None:
            self.stdin.close()
        self.close_output()
        if self._pidfd is not None:
            _close_fd(self._pidfd)
            self._pidfd = None


def _close_fd(fd: int) -> int:
    """Close a descriptor trio may be waiting on; returns -1, the closed marker."""
    if fd >= 0:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    return -1


def reap_group_orphans(pgid: int) -> None:
    """Reap members of group `pgid` that were reparented to this process.

    They only become our children when this process is a child subreaper
    (see `become_subreaper`); otherwise this returns at once.
    """
    while True:
        try:
            os.waitpid(-pgid, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so killed grandchildren are reaped here.

    Without it they are reparented to PID 1, which in many containers never
    reaps them. Process-wide, so only a program that owns its process (the
    CLI, `serve`) should call it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def spawn(plan: LaunchPlan) -> AgentProcess:
    """Start the agent described by `plan`; raises `LaunchError` with a message saying what to fix."""
    parent_fds: list[int] = []
    child_fds: list[int] = []

    def pipe() -> tuple[int, int]:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        return read_end, write_end

    try:
        stdout_read, stdout_write = pipe()
        parent_fds.append(stdout_read)
        child_fds.append(stdout_write)
        stderr_read, stderr_write = pipe()
        parent_fds.append(stderr_read)
        child_fds.append(stderr_write)
        stdin_arg: int = subprocess.DEVNULL
        stdin_write = -1
        if plan.stdin is not None:
            stdin_arg, stdin_write = pipe()
            child_fds.append(stdin_arg)
            parent_fds.append(stdin_write)
        try:
            popen = subprocess.Popen(
                plan.argv,
                stdin=stdin_arg,
                stdout=stdout_write,
                stderr=stderr_write,
                cwd=plan.cwd,
                env=plan.env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_signal_reset(),
            )
        except (OSError, ValueError, UnicodeError) as err:
            raise _explain_spawn_failure(err, plan) from None
    except BaseException:
        for fd in parent_fds:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    return AgentProcess(
        popen,
        stdin=trio.lowlevel.FdStream(stdin_write) if plan.stdin is not None else None,
        stdout=stdout_read,
        stderr=stderr_read,
    )


# The signals the bridge stops an agent with. An ignored disposition survives
# exec, so an agent started by a host that ignores them (nohup, `cmd &` in a
# script) could never be interrupted or terminated gracefully.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _signal_reset() -> Callable[[], None] | None:
    """A pre-exec step restoring default handling of the stop signals, when the bridge ignores them.

    Only then: any pre-exec step makes Python fork instead of vfork, which
    costs every spawn of a large host noticeably more.
    """
    # _signal is what `signal` wraps; its getsignal skips the enum conversion (a few us per spawn).
    ignored = [signum for signum in _STOP_SIGNALS if _signal.getsignal(signum) == _signal.SIG_IGN]
    if not ignored:
        return None

    def restore_defaults() -> None:
        try:
            for signum in ignored:
                signal.signal(signum, signal.SIG_DFL)
        except ValueError:
            pass  # spawned from a thread other than the main one: Python refuses; keep the inherited state

    return restore_defaults


def _explain_spawn_failure(err: BaseException, plan: LaunchPlan) -> LaunchError:
    program = plan.argv[0]
    if isinstance(err, OSError) and plan.cwd is not None and err.filename == plan.cwd:
        if isinstance(err, FileNotFoundError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {plan.cwd!r} does not exist")
        if isinstance(err, NotADirectoryError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {plan.cwd!r} is not a directory")
        return LaunchError(EXIT_CANNOT_RUN, f"cannot enter the working directory {plan.cwd!r}: {err.strerror}")
    if isinstance(err, FileNotFoundError):
        return _explain_not_found(program, plan)
    if isinstance(err, PermissionError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} is not executable (permission denied); "
                           f"try chmod +x {program}" if os.path.isfile(_resolve(program, plan) or "")
                           else f"{program!r} cannot be executed: permission denied")
    if isinstance(err, IsADirectoryError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} is a directory, not a program")
    if isinstance(err, OSError) and err.errno == errno.E2BIG:
        return LaunchError(EXIT_CANNOT_RUN, "the arguments and environment are too large for the OS (E2BIG); "
                           "shorten them or pass the message with `stdin: message`")
    if isinstance(err, OSError) and err.errno == errno.ENOEXEC:
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} is not a program the OS can run; a script needs a "
                           "#! line such as #!/bin/sh")
    if isinstance(err, OSError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} cannot be executed: {err.strerror or err}")
    return LaunchError(EXIT_CANNOT_RUN, f"the command line cannot be passed to the OS: {err}")


def _explain_not_found(program: str, plan: LaunchPlan) -> LaunchError:
    path = _resolve(program, plan)
    if path is not None and os.path.isfile(path):
        # The file exists, so the missing piece is its #! interpreter.
        try:
            with open(path, "rb") as script:
                first_line = script.readline(256).rstrip()
        except OSError:
            first_line = b""
        if first_line.startswith(b"#!"):
            interpreter = first_line[2:].decode("utf-8", "replace").strip()
            return LaunchError(EXIT_CANNOT_RUN, f"{program!r} names an interpreter that does not exist: #!{interpreter}")
    if "/" in program:
        where = f" (relative to {plan.cwd or os.getcwd()})" if not os.path.isabs(program) else ""
        return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found{where}")
    return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found on PATH")


def _resolve(program: str, plan: LaunchPlan) -> str | None:
    """Where the OS looked for `program`: relative paths resolve against the agent's cwd."""
    if "/" in program:
        return os.path.join(plan.cwd or os.getcwd(), program)
    for directory in plan.env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.exists(candidate):
            return candidate
    return None
