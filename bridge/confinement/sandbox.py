"""The `sandbox:` section: the agent runs under bubblewrap, with an argv the bridge builds — never the profile.

A profile says only what the agent may see beyond the defaults (`read`, `write`), whether it has a network, and
whether the real home stays hidden. The bwrap command line is made here from those values and the turn's working
directory, and put in front of the profile's own argv; the placeholder rule (`argv_rules`) judges the profile's
argv, which is the program bwrap runs, so a message is refused wherever that program would run it.

What a sandboxed agent gets (docs/sandbox.md):
- the system read-only (`--ro-bind / /`), a fresh `/dev` and `/proc` (its `/proc/sys` read-only), a private empty
  `/tmp`;
- the real home directories (`$HOME`, and the user's home from the password database) hidden under empty private
  directories at the same paths, so `$HOME` names an empty directory and `~` in `read`/`write` names the bound paths;
- `read` bound read-only, `write` writable, then the working directory writable (and so the turn's attachments and
  outbox, `bridge.files.turn_directory`);
- a PID namespace of its own (the agent's escapees die with it), IPC too, no capabilities (bwrap run by root keeps
  them otherwise), `--die-with-parent`, and with `network: false` a network namespace with only its own loopback.

bwrap is in the process group the bridge made; its PID 1 and the agent run in a session of their own
(`--new-session`), where the engine's stop signals go (`AgentProcess.signal_group`), so bwrap outlives the stop
and the agent has its grace. The PID namespace contains them all: bwrap's end, with the turn or with the bridge,
takes it down with everything in it, so the agent needs no cgroup of its own (see docs/processes.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROFILE_DIR = "{{PROFILE_DIR}}"


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """`sandbox:` — what the agent sees under bubblewrap beyond the system and its working directory
    (docs/sandbox.md); `read` and `write` as written, before `~` and `{{PROFILE_DIR}}` are expanded."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: bool = True
    hide_home: bool = True


@dataclass(frozen=True, slots=True)
class SandboxView:
    """The effective sandbox of one launch: every path absolute, as bwrap is given it."""

    bwrap: str
    cwd: str
    hidden: tuple[str, ...]
    """The home directories under an empty private directory."""
    read: tuple[str, ...]
    write: tuple[str, ...]
    network: bool
    guarded: tuple[str, ...] = ()
    """What the bridge reads its orders from that a writable bind holds (the profile's file, maybe its directory,
    the profile cache): bound read-only over the writable binds, see `guarded_paths`."""

    def argv(self) -> list[str]:
        """bwrap's words up to and including the `--` after which the agent's argv follows."""
        # `--new-session`: the agent cannot push keystrokes into a terminal (TIOCSTI), and it leads a process
        # group apart from bwrap's, which dies of a stop signal and takes the namespace down with it; a stop goes
        # to the agent's group alone (`AgentProcess.signal_group`), so the agent has its `kill_grace_secs`.
        words = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc"]
        words += ["--cap-drop", "ALL"]
        if not self.network:
            words.append("--unshare-net")
        words += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # uid 0 needs no capability to write most sysctls (`kernel.core_pattern` runs a program as root outside
        # every namespace), and bwrap run by root leaves /proc/sys writable: it asks access(2), to which a 0555
        # directory is read-only for a root without CAP_DAC_OVERRIDE.
        words += ["--ro-bind-try", "/proc/sys", "/proc/sys"]
        # Each path where its links lead, as the homes are hidden (`sandbox_view`): bwrap cannot make a mount point
        # through a link into a hidden home, and `~` may be one (Fedora Silverblue's /home links to /var/home).
        binds = [("--ro-bind-try", os.path.realpath(path)) for path in self.read]
        binds += [("--bind-try", os.path.realpath(path)) for path in self.write]
        # Later mounts cover earlier ones: what holds a hidden home (a `read: [/home]`) is bound before the home is
        # hidden, what lies inside one (`~/.codex`) after, so neither undoes the other.
        inside = [any(within(path, home) for home in self.hidden) for _, path in binds]
        for (option, path), within_home in zip(binds, inside, strict=True):
            if not within_home:
                words += [option, path, path]
        for path in self.hidden:
            words += ["--tmpfs", path]
        for (option, path), within_home in zip(binds, inside, strict=True):
            if within_home:
                words += [option, path, path]
        words += ["--bind", self.cwd, self.cwd]
        words += self._guard_words()
        words += ["--chdir", self.cwd, "--"]
        return words

    @property
    def writable(self) -> tuple[str, ...]:
        """Where the agent may write: each `write` path where its links lead, then its working directory."""
        return (*map(os.path.realpath, self.write), self.cwd)

    def _guard_words(self) -> list[str]:
        """`guarded` read-only, after every writable bind. A read-only file is a mount point, which cannot be
        written, replaced, renamed or removed; the directories between it and the writable bind that holds it are
        bound onto themselves, so they are mount points too: renaming one would carry the file away, and leave its
        path free for a new one."""
        writable = self.writable
        pinned: set[str] = set()
        for path in self.guarded:
            outermost = min((bind for bind in writable if within(path, bind)), key=len, default=path)
            directory = os.path.dirname(path)
            while within(directory, outermost) and directory != outermost:
                pinned.add(directory)
                directory = os.path.dirname(directory)
        words: list[str] = []
        for directory in sorted(pinned - set(writable), key=lambda path: path.count("/")):
            words += ["--bind", directory, directory]
        for path in self.guarded:
            words += ["--ro-bind", path, path]
        return words

    def describe(self) -> list[str]:
        """What an agent gets, one line each, as `check` prints it."""
        lines = [
            f"sandbox: bubblewrap ({self.bwrap}): the system read-only, a PID namespace of its own, "
            "ended with the bridge",
            f"writable: {self.cwd} (the working directory: the turn's attachments and outbox)"
            + "".join(f", {_shown(path)}" for path in self.write),
        ]
        if self.read:
            lines.append("readable too: " + ", ".join(map(_shown, self.read)))
        lines.append(", ".join(["private and empty: /tmp", *(f"{path} (a home directory)" for path in self.hidden)]))
        lines.append(
            "network: on"
            if self.network
            else "network: off (a network namespace of its own, with only its own loopback)"
        )
        return lines


def sandbox_view(
    section: SandboxSettings,
    *,
    bwrap: str,
    cwd: str,
    home: str | None,
    profile_dir: str,
    profile_file: str | None = None,
    profile_cache: str | None = None,
) -> SandboxView:
    """The sandbox a profile's `sandbox` section gives an agent working in `cwd` (absolute); `profile_file` (the
    file the profile was loaded from) and `profile_cache` (the directory of validated profiles) stay read-only.

    Raises ValueError when the working directory would uncover what the sandbox hides (it is `/`, or holds a
    hidden home), with what to do instead.
    """
    hidden: list[str] = []
    if section.hide_home:
        for candidate in dict.fromkeys((home, _password_home())):  # most often one: $HOME is the user's home
            if candidate and os.path.isabs(candidate):
                candidate = os.path.realpath(candidate)
                if candidate != "/" and candidate not in hidden and os.path.isdir(candidate):
                    hidden.append(candidate)
    cwd = os.path.realpath(cwd)  # bwrap binds what a symlink names: judge, and bind, that
    if cwd == "/" or any(within(path, cwd) for path in hidden):
        raise ValueError(
            f"a sandboxed agent's working directory cannot be {cwd}: binding it writable would uncover "
            + ("the whole system" if cwd == "/" else "the home directory the sandbox hides")
            + "; set cwd to a directory of the agent's own"
        )
    write = tuple(expand_path(path, profile_dir) for path in section.write)
    return SandboxView(
        bwrap=bwrap,
        cwd=cwd,
        hidden=tuple(hidden),
        read=tuple(expand_path(path, profile_dir) for path in section.read),
        write=write,
        network=section.network,
        guarded=guarded_paths((*map(os.path.realpath, write), cwd), profile_file, profile_cache),
    )


def guarded_paths(writable: tuple[str, ...], profile_file: str | None, profile_cache: str | None) -> tuple[str, ...]:
    """What of the bridge's own the agent must not write though a writable bind holds it (docs/sandbox.md).

    The profile's file: rewritten, the next turn would run as the agent wrote it, without the sandbox. Its
    directory too when it lies inside a writable bind without being or holding one (read-only, it would take from
    the agent what the profile gives it): there the agent could add a profile that `serve --profiles` serves. The
    profile cache, whose entries say what a profile file holds. Each where its links lead."""
    candidates: list[str] = []
    if profile_file is not None:
        file = os.path.realpath(profile_file)
        directory = os.path.dirname(file)
        if not any(within(bind, directory) for bind in writable):
            candidates.append(directory)
        candidates.append(file)
    if profile_cache is not None:
        candidates.append(os.path.realpath(profile_cache))
    held = [path for path in candidates if any(within(path, bind) for bind in writable)]
    # One inside another is read-only already; bound again, the directories pinned on its way would not be.
    return tuple(path for path in held if not any(other != path and within(path, other) for other in held))


def expand_path(path: str, profile_dir: str) -> str:
    """A `read` or `write` path as bwrap gets it: `{{PROFILE_DIR}}` and `~` expanded, relative to the profile's
    directory (as `cwd`)."""
    return os.path.normpath(os.path.join(profile_dir, os.path.expanduser(path.replace(PROFILE_DIR, profile_dir))))


def _shown(path: str) -> str:
    return path if os.path.lexists(path) else f"{path} (not there: not bound)"


def within(inner: str, outer: str) -> bool:
    """Whether path `inner` is `outer` or lies beneath it (both absolute, links resolved)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


_home_of_user: list[str] = []


def _password_home() -> str:
    """This user's home in the password database (once per process): hidden too, whatever `$HOME` says."""
    if not _home_of_user:
        try:
            import pwd

            _home_of_user.append(pwd.getpwuid(os.getuid()).pw_dir)
        except (ImportError, KeyError):
            _home_of_user.append("")
    return _home_of_user[0]
