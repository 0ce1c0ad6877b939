"""A transcript of every row of the argv rule's table of programs (`bridge.profile.argv_programs.PROGRAMS`).

For each program: what `PROGRAM {{MESSAGE}}` and `PROGRAM -- {{MESSAGE}}` are to it — refused as the `program`
it runs, as `code`, or as an `option` it reads (a message starting with '-' would be one), else `allowed` —
and whether, given nothing, it reads the code it runs from stdin (so `stdin: message` is refused). A row added to
the table without a line here fails `test_every_row_of_the_table_has_a_transcript`: the line says what the row
does, and a change to a row that changes a verdict shows here.
"""

from __future__ import annotations

import pytest

from bridge.profile.argv_programs import PROGRAMS
from bridge.profile.argv_rules import argv_problem, classify, option_injection_warnings, stdin_problem

MESSAGE = "{{MESSAGE}}"
# program: (PROGRAM {{MESSAGE}}, PROGRAM -- {{MESSAGE}}, reads its code from stdin when given none)
TRANSCRIPT = {
    "sh": ("code", "code", True),
    "bash": ("code", "code", True),
    "rbash": ("code", "code", True),
    "zsh": ("code", "code", True),
    "dash": ("code", "code", True),
    "ksh": ("code", "code", True),
    "mksh": ("code", "code", True),
    "lksh": ("code", "code", True),
    "pdksh": ("code", "code", True),
    "oksh": ("code", "code", True),
    "ash": ("code", "code", True),
    "yash": ("code", "code", True),
    "posh": ("code", "code", True),
    "csh": ("code", "code", True),
    "tcsh": ("code", "code", True),
    "fish": ("code", "code", True),
    "python": ("code", "code", True),
    "pypy": ("code", "code", True),
    "node": ("code", "code", True),
    "nodejs": ("code", "code", True),
    "bun": ("program", "program", False),
    "deno": ("program", "program", False),
    "perl": ("code", "code", True),
    "ruby": ("code", "code", True),
    "php": ("code", "code", True),
    "lua": ("code", "code", True),
    "luajit": ("code", "code", True),
    "Rscript": ("code", "code", True),
    "osascript": ("code", "code", True),
    "pwsh": ("code", "code", True),
    "powershell": ("code", "code", True),
    "tclsh": ("code", "code", True),
    "wish": ("code", "code", True),
    "expect": ("code", "code", True),
    "awk": ("code", "code", True),
    "gawk": ("code", "code", True),
    "mawk": ("code", "code", True),
    "nawk": ("code", "code", True),
    "sed": ("code", "code", True),
    "gsed": ("code", "code", True),
    "gdb": ("program", "program", False),
    "vim": ("option", "allowed", False),
    "vi": ("option", "allowed", False),
    "nvim": ("option", "allowed", False),
    "ex": ("option", "allowed", False),
    "view": ("option", "allowed", False),
    "vimdiff": ("option", "allowed", False),
    "gvim": ("option", "allowed", False),
    "rvim": ("option", "allowed", False),
    "rview": ("option", "allowed", False),
    "evim": ("option", "allowed", False),
    "emacs": ("option", "allowed", False),
    "find": ("option", "option", False),
    "make": ("code", "code", False),
    "gmake": ("code", "code", False),
    "git": ("program", "program", False),
    "ssh": ("option", "allowed", False),
    "docker": ("program", "program", False),
    "podman": ("program", "program", False),
    "env": ("program", "program", False),
    "timeout": ("option", "allowed", False),
    "nice": ("program", "program", False),
    "nohup": ("program", "program", False),
    "setsid": ("program", "program", False),
    "stdbuf": ("program", "program", False),
    "prlimit": ("program", "program", False),
    "setpriv": ("program", "program", False),
    "systemd-run": ("program", "program", False),
    "bwrap": ("program", "program", False),
    "firejail": ("program", "program", True),
    "time": ("program", "program", False),
    "sudo": ("program", "program", False),
    "doas": ("program", "program", False),
    "su": ("option", "allowed", False),
    "runuser": ("option", "allowed", False),
    "sg": ("option", "allowed", False),
    "pkexec": ("program", "program", False),
    "xargs": ("program", "program", False),
    "flock": ("option", "allowed", False),
    "script": ("option", "allowed", False),
    "busybox": ("program", "program", False),
    "watch": ("code", "code", True),
    "chroot": ("option", "allowed", False),
    "unshare": ("program", "program", True),
    "nsenter": ("program", "program", True),
    "ionice": ("program", "program", False),
    "taskset": ("option", "allowed", False),
    "chrt": ("program", "program", False),
    "strace": ("program", "program", False),
    "ltrace": ("program", "program", False),
    "valgrind": ("program", "program", False),
    "npx": ("program", "program", False),
    "bunx": ("program", "program", False),
    "pnpx": ("program", "program", False),
    "uvx": ("program", "program", False),
    "pi": ("option", "allowed", False),
    "dsh": ("option", "allowed", False),
    "uv": ("program", "program", False),
}


def verdict(argv: list[str]) -> str:
    problem = argv_problem(argv)
    if problem is not None:
        return classify(argv)[problem.index].role.value
    return "warned" if option_injection_warnings(argv) else "allowed"


def test_every_row_of_the_table_has_a_transcript() -> None:
    assert set(TRANSCRIPT) == set(PROGRAMS)


@pytest.mark.parametrize("program", TRANSCRIPT)
def test_each_program_reads_a_message_as_its_transcript_says(program: str) -> None:
    operand, after_dashes, stdin_code = TRANSCRIPT[program]
    assert verdict([program, MESSAGE]) == operand
    assert verdict([program, "--", MESSAGE]) == after_dashes
    assert (stdin_problem([program]) is not None) == stdin_code
