"""Where a placeholder from the user may stand in a profile: the rule that a message never runs code.

`{{MESSAGE}}`, `{{SESSION_ID}}` and `{{SESSION_NAME}}` come from whoever talks to
the agent. In argv they may stand only as a whole argument or as the whole
value of a long option (`--prompt={{MESSAGE}}`); anywhere else a program could
read them as code. Even whole, they are refused where the program would run
them: as the program itself, as the value of a code option (`sh -c`,
`node --eval=`), as an operand that is code (awk's program, ssh's remote
command), or where a program that can run code from an option reads options
(`python3 {{MESSAGE}}` with the message `-cimport os`). To know where that is,
argv is walked through wrapper commands (`timeout -s KILL 5 sh -c …`,
`find . -exec … ;`) with one table of programs, `PROGRAMS`. Where the table
does not know one of a wrapper's options, the walk reads argv each way that
option could be read, and a placeholder is refused if any reading refuses it.

The profile's `sandbox:` adds nothing to see through: bwrap's words are the bridge's own (`bridge.confinement.sandbox`),
put before argv at launch and never written by a profile, so the argv judged here is the program the sandbox runs.

Pure: no I/O. `bridge.profile.schema` refuses what `argv_problem` and
`environment_problem` find; `agent-bridge check` prints `option_injection_warnings`.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

UNTRUSTED_PLACEHOLDERS = ("MESSAGE", "SESSION_ID", "SESSION_NAME")
# The variable that carries each one, for the advice "read $AGENT_MESSAGE instead".
_VARIABLE_OF = {"MESSAGE": "AGENT_MESSAGE", "SESSION_ID": "AGENT_SESSION_ID", "SESSION_NAME": "AGENT_SESSION_NAME"}

_UNTRUSTED = r"\{\{(" + "|".join(UNTRUSTED_PLACEHOLDERS) + r")\}\}"
_PLACEHOLDER = re.compile(_UNTRUSTED)
_LONG_OPTION_VALUE = re.compile(r"--[A-Za-z0-9_.-]+=" + _UNTRUSTED)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_VERSIONED = re.compile(r"(.+?)-?[0-9.]*")  # python3.11, perl5.36, node20, tclsh8.6


# --------------------------------------------------------------------------- the table


class Operand(enum.Enum):
    """What a program does with one of its positional operands."""

    DATA = "data"  # reads it (a file, a value, $0 of `sh -c`)
    CODE = "code"  # runs it as code (awk's program text, the code after `sh -c`)
    SCRIPT = "script"  # runs the file it names; the operands after it are the script's arguments
    PROGRAM = "program"  # runs what it names (docker run's image, npx's package, gdb's executable)
    ARGUMENTS = "arguments"  # it and all after it go to code the table does not know (python -m MODULE …)
    COMMAND = "command"  # it and all after it are a command line to run (timeout 5 COMMAND…)
    SHELL_WORDS = "shell words"  # it and all after it are joined into a command for a shell (ssh, watch)
    SUBCOMMAND = "subcommand"  # picks the rules for the rest (git, docker)
    NUMBER = "number"  # data when it is a number; any other word is the next operand (chrt's priority)
    ASSIGNMENT = "assignment"  # a goal, or NAME=VALUE setting a variable its code runs (make)


@dataclass(frozen=True)
class Program:
    """How one program reads its argv: the options that matter and what its operands are.

    Options are written as the program spells them (`-c`, `--eval`, `-ex`).
    Without `flags`, an option not listed is taken as a flag without a value.
    With `flags`, an option in no list is one the table does not know (a newer
    version's, a misspelling): the walk reads it both ways, as a flag and as
    taking the next word, and a placeholder is refused if either reading
    refuses it. Wrappers list their flags, since reading an unknown option's
    value as the command would make the real command look like data.
    """

    code: frozenset[str] = frozenset()  # options whose value is code, or names code to load or run
    values: frozenset[str] = frozenset()  # options that take a value that is data
    attached: frozenset[str] = frozenset()  # short options whose optional value can only be attached (-i.bak)
    operands: tuple[Operand, ...] = (Operand.SCRIPT,)  # in order; the last one repeats
    modes: Mapping[str, tuple[Operand, ...]] = field(default_factory=dict)  # options that change the operands
    final: frozenset[str] = frozenset()  # no option is read after these (python -c, pwsh -Command)
    permutes: bool = False  # options may follow operands (GNU getopt)
    single_dash_long: bool = False  # `-name` is one long option (gdb -ex, pwsh -Command)
    case_insensitive: bool = False  # option names ignore case (pwsh)
    plus_options: bool = False  # `+o name` is an option too (shells)
    dash_is_option: bool = False  # a lone `-` is an option (env -, su -)
    assignments: bool = False  # NAME=VALUE words may come before the command (env, sudo)
    splits: frozenset[str] = frozenset()  # options whose value is split into words read in place (env -S)
    late: frozenset[str] = frozenset()  # options still read where the command would start (flock FILE -c)
    stdin_code: frozenset[str] = frozenset()  # options that make it read its program from stdin (sh -s)
    subcommands: Mapping[str, Program] = field(default_factory=dict)  # "": any other (default _ANY_SUBCOMMAND)
    flags: frozenset[str] | None = None  # options without a value, when the table knows them all
    arity: Mapping[str, int] = field(default_factory=dict)  # options taking several words (bwrap --bind SRC DEST)
    command_options: frozenset[str] = frozenset()  # followed by a command up to `;` (find -exec CMD … ;)
    dash_dash_ends_options: bool = True  # `--` ends its options (find reads its expression after one)
    shell_without_command: bool = False  # given no command, it runs the user's shell (unshare, nsenter)

    def option_kind(self, name: str) -> tuple[str, str]:
        """(the option's canonical name, "code" | "value" | "attached" | "command" | "flag" | "unknown")."""
        if name in self.code:
            return name, "code"
        if name in self.values:
            return name, "value"
        if name in self.attached:
            return name, "attached"
        if name in self.command_options:
            return name, "command"
        known_flags = self.flags or frozenset()
        if name in self.modes or name in known_flags:
            return name, "flag"
        unlisted = "flag" if self.flags is None else "unknown"
        if not name.startswith("--") and not self.single_dash_long:
            return name, unlisted
        # Long options may be abbreviated (GNU getopt_long, gdb, pwsh): --eval-c, -comm.
        for candidate in sorted(self.code):
            if candidate.startswith(name):
                return candidate, "code"
        candidates = [option for option in (*self.values, *self.modes, *known_flags) if option.startswith(name)]
        if len(candidates) == 1:
            return candidates[0], ("value" if candidates[0] in self.values else "flag")
        return name, unlisted


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_D, _C, _S, _P, _A = Operand.DATA, Operand.CODE, Operand.SCRIPT, Operand.PROGRAM, Operand.ARGUMENTS
_CMD, _SH, _SUB = Operand.COMMAND, Operand.SHELL_WORDS, Operand.SUBCOMMAND

# A subcommand the table does not know: it may still run code from its options (git grep -O, git
# fetch --upload-pack), so a message may stand only after `--`.
_ANY_SUBCOMMAND = Program(operands=(_D,), permutes=True)
_SHELL = Program(
    code=_words("--rcfile --init-file"),
    values=_words("-o +o -O +O"),
    plus_options=True,
    modes={"-c": (_C, _D), "-s": (_D,)},
    stdin_code=_words("-s"),
)
_PYTHON = Program(
    code=_words("-c -m"),
    values=_words("-W -X -Q --check-hash-based-pycs"),
    final=_words("-c -m"),
    modes={"-c": (_D,), "-m": (_A,)},
)
_NODE = Program(
    code=_words(
        "-e --eval -p --print -pe -r --require --import --loader --experimental-loader --env-file --env-file-if-exists"
    ),
    values=_words("-C --conditions --inspect-port --title --input-type --stack-size --redirect-warnings"),
    modes=dict.fromkeys(("-e", "--eval", "-p", "--print", "-pe"), (_D,)),
)
_AWK = Program(
    code=_words("-f --file -e --source -i --include -l --load -E --exec -W"),
    values=_words("-F --field-separator -v --assign"),
    operands=(_C, _D),
    final=_words("-E --exec"),
    modes=dict.fromkeys(("-f", "--file", "-e", "--source", "-E", "--exec"), (_D,)),
)
_VIM = Program(
    code=_words("-c --cmd -S -u -U -s -l --remote-send --remote-expr"),
    values=_words(
        "-i -T -t -q -w -W --servername --remote --remote-silent --remote-wait --remote-tab --startuptime --log"
    ),
    attached=_words("-o -O -p -V"),
    operands=(_D,),
    permutes=True,
)
_SU = Program(
    code=_words("-c --command --session-command -s --shell"),
    values=_words("-g --group -G --supp-group -w --whitelist-environment"),
    dash_is_option=True,
    permutes=True,
    operands=(_D, _SH),
    modes=dict.fromkeys(("-c", "--command", "--session-command"), (_D,)),
)
_DOCKER_EXEC = Program(
    values=_words("-e --env --env-file -u --user -w --workdir --detach-keys --preserve-fds"),
    operands=(_D, _CMD),
)
_DOCKER_RUN = Program(
    code=_words("--entrypoint --runtime --health-cmd"),
    values=_words(
        "-a --attach --add-host --annotation --blkio-weight --blkio-weight-device --cap-add --cap-drop "
        "--cgroup-parent --cgroupns --cidfile -c --cpu-shares --cpu-period --cpu-quota --cpu-rt-period "
        "--cpu-rt-runtime --cpus --cpuset-cpus --cpuset-mems --detach-keys --device --device-cgroup-rule "
        "--device-read-bps --device-read-iops --device-write-bps --device-write-iops --dns --dns-option "
        "--dns-search --domainname -e --env --env-file --expose --gpus --group-add --health-interval "
        "--health-retries --health-start-period --health-start-interval --health-timeout -h --hostname "
        "--ip --ip6 --ipc --isolation --kernel-memory -l --label --label-file --link --link-local-ip "
        "--log-driver --log-opt --mac-address -m --memory --memory-reservation --memory-swap "
        "--memory-swappiness --mount --name --network --net --network-alias --net-alias --oom-score-adj "
        "--pid --pids-limit --platform -p --publish --pull --restart --security-opt --shm-size "
        "--stop-signal --stop-timeout --storage-opt --sysctl --tmpfs --ulimit -u --user --userns --uts "
        "-v --volume --volume-driver --volumes-from -w --workdir --pod --secret --arch --os --variant "
        "--hooks-dir --conmon-pidfile --pidfile --requires --uidmap --gidmap --subuidname --subgidname"
    ),
    operands=(_P, _CMD),
)
_DOCKER = Program(
    code=_words("--config --hooks-dir --network-cmd-path --conmon --runtime"),
    values=_words(
        "-H --host -c --context -l --log-level --tlscacert --tlscert --tlskey --url --connection "
        "--root --runroot --storage-driver --storage-opt --cgroup-manager --events-backend --tmpdir "
        "--volumepath --identity --module --ssh --imagestore --db-backend"
    ),
    operands=(_SUB,),
    subcommands={
        "exec": _DOCKER_EXEC,
        "run": _DOCKER_RUN,
        "create": _DOCKER_RUN,
        "container": Program(
            operands=(_SUB,),
            subcommands={
                "exec": _DOCKER_EXEC,
                "run": _DOCKER_RUN,
                "create": _DOCKER_RUN,
            },
        ),
    },
)
_PACKAGE_RUNNER = Program(  # npx, bunx: run the package their first operand names
    code=_words("-p --package -c --call --node-options --shell --script-shell"),
    values=_words("--registry --cache --prefix --userconfig"),
    operands=(_P, _A),
)
_UVX = Program(
    code=_words("--from --with --with-editable --with-requirements --config-file --env-file"),
    values=_words(
        "-p --python --index --default-index --index-url --extra-index-url -f --find-links "
        "--directory --project --cache-dir --python-preference --color"
    ),
    operands=(_P, _A),
)
_BWRAP_PAIRS = (
    "--bind --bind-try --ro-bind --ro-bind-try --dev-bind --dev-bind-try --bind-fd --ro-bind-fd --file "
    "--bind-data --ro-bind-data --symlink --chmod"
)  # bwrap options taking two words: SRC DEST
_FIND = Program(
    values=_words(
        "-D -amin -anewer -atime -cmin -cnewer -ctime -fstype -gid -group -ilname -iname -inum -ipath "
        "-iregex -iwholename -links -lname -mmin -mtime -name -newer -path -perm -regex -samefile "
        "-size -type -uid -used -user -wholename -xtype -context -maxdepth -mindepth -files0-from "
        "-fprint -fprint0 -fls -printf -fprintf -regextype -Bmin -Bnewer -Btime"
    )
    | frozenset(f"-newer{x}{y}" for x in "aBcm" for y in "aBcmt"),
    attached=_words("-O"),
    arity={"-fprintf": 2},  # -fprintf FILE FORMAT
    command_options=_words("-exec -execdir -ok -okdir"),
    # A path it starts from is where its expression may start too (find -- -delete deletes): a message
    # there would be read as a test or an action, `--` or not.
    operands=(_D,),
    permutes=True,
    dash_dash_ends_options=False,
)
_MAKE = Program(
    code=_words("-f --file --makefile -C --directory -I --include-dir -E --eval"),  # a makefile, or where to find one
    values=_words(
        "-o --old-file --assume-old -W --what-if --new-file --assume-new --jobserver-auth "
        "--jobserver-fds --jobserver-style"
    ),
    attached=_words("-j -l -O"),  # make -j 4 takes a number as -j's value, anything else as a goal
    operands=(Operand.ASSIGNMENT,),
    permutes=True,
)

# Every program whose argv can carry code, by the name it is run as (a path and a
# version suffix are ignored). A program not in the table gets only the
# whole-argument rule, and `check` warns where a message could become its options.
PROGRAMS: dict[str, Program] = {
    # shells
    **dict.fromkeys(
        (
            "sh",
            "bash",
            "rbash",
            "zsh",
            "dash",
            "ksh",
            "mksh",
            "lksh",
            "pdksh",
            "oksh",
            "ash",
            "yash",
            "posh",
            "csh",
            "tcsh",
        ),
        _SHELL,
    ),
    "fish": Program(
        code=_words("-c --command -C --init-command"),
        values=_words("-d --debug -o --debug-output -p --profile --profile-startup --features"),
        modes=dict.fromkeys(("-c", "--command"), (_D,)),
    ),
    # interpreters
    "python": _PYTHON,
    "pypy": _PYTHON,
    "node": _NODE,
    "nodejs": _NODE,
    "bun": Program(
        code=_words("-e --eval -p --print -r --preload --require --import --env-file -c --config"),
        operands=(_SUB,),
        subcommands={"x": _PACKAGE_RUNNER, "exec": Program(operands=(_SH,)), "": Program(operands=(_A,))},
    ),
    "deno": Program(
        operands=(_SUB,),
        subcommands={
            "eval": Program(operands=(_C, _D)),
            "run": Program(
                code=_words("--config -c --import-map --env-file --preload"),
                values=_words("--location --seed --cert --lock --v8-flags"),
                operands=(_S,),
            ),
            "": Program(operands=(_A,)),
        },
    ),
    "perl": Program(
        code=_words("-e -E -I"),
        attached=_words("-0 -l -i -F -C -d -D -x -V -M -m"),
        modes=dict.fromkeys(("-e", "-E"), (_D,)),
    ),
    "ruby": Program(
        code=_words("-e -r -I"),
        values=_words("-C -E --encoding --external-encoding --internal-encoding --enable --disable --dump"),
        attached=_words("-0 -F -K -T -W -x -i"),
        modes={"-e": (_D,)},
    ),
    "php": Program(
        code=_words("-r -B -R -E -F -f -d -c -z"),
        values=_words("-t -S --rf --rc --re --rz --ri"),
        modes={"-r": (_D,), "-f": (_A,)},
    ),
    "lua": Program(code=_words("-e -l")),
    "luajit": Program(code=_words("-e -l -j -b"), values=_words("-O")),
    "Rscript": Program(code=_words("-e"), modes={"-e": (_D,)}),
    "osascript": Program(code=_words("-e"), values=_words("-l -s"), modes={"-e": (_D,)}),
    **dict.fromkeys(
        ("pwsh", "powershell"),
        Program(
            code=_words(
                "-command -c -encodedcommand -e -ec -enc -file -f -commandwithargs -cwa "
                "-configurationfile -settingsfile"
            ),
            values=_words(
                "-executionpolicy -ex -ep -workingdirectory -wd -configurationname -config "
                "-custompipename -inputformat -inp -if -outputformat -o -of -windowstyle -w -version"
            ),
            single_dash_long=True,
            case_insensitive=True,
            final=_words("-command -c -encodedcommand -e -ec -enc -file -f -commandwithargs -cwa"),
            modes={
                **dict.fromkeys(("-command", "-c", "-encodedcommand", "-e", "-ec", "-enc"), (_SH,)),
                **dict.fromkeys(("-file", "-f"), (_A,)),
                **dict.fromkeys(("-commandwithargs", "-cwa"), (_D,)),
            },
        ),
    ),
    "tclsh": Program(values=_words("-encoding")),
    "wish": Program(values=_words("-encoding")),
    "expect": Program(code=_words("-c -f -b"), values=_words("-D")),
    **dict.fromkeys(("awk", "gawk", "mawk", "nawk"), _AWK),
    **dict.fromkeys(
        ("sed", "gsed"),
        Program(
            code=_words("-e --expression -f --file"),
            values=_words("-l --line-length"),
            attached=_words("-i"),
            operands=(_C, _D),
            permutes=True,
            modes=dict.fromkeys(("-e", "--expression", "-f", "--file"), (_D,)),
        ),
    ),
    # debuggers, editors
    "gdb": Program(
        code=_words(
            "-ex -eval-command -iex -init-eval-command -x -command -ix -init-command -e -exec -D -data-directory"
        ),
        values=_words("-p -pid -c -core -s -symbols -se -d -directory -cd -tty -t -i -interpreter -b -l"),
        single_dash_long=True,
        permutes=True,
        operands=(_P, _D),
        modes={"-args": (_CMD,)},
        final=_words("-args"),
    ),
    **dict.fromkeys(("vim", "vi", "nvim", "ex", "view", "vimdiff", "gvim", "rvim", "rview", "evim"), _VIM),
    "emacs": Program(
        code=_words("-eval -execute -l -load -f -funcall -script -x -L -directory -init-directory -u -user"),
        values=_words(
            "-chdir -d -display -t -terminal -fn -font -T -title -name -bg -fg -bd -cr -ms -g "
            "-geometry -ib -bw -lsp -parent-id -dump-file -seccomp"
        ),
        single_dash_long=True,
        permutes=True,
        operands=(_D,),
    ),
    "find": _FIND,
    "make": _MAKE,
    "gmake": _MAKE,
    "git": Program(
        code=_words("-c --config-env --exec-path -C --git-dir --work-tree"),
        values=_words("--namespace --super-prefix --list-cmds --attr-source"),
        operands=(_SUB,),
    ),
    # remote and container commands
    "ssh": Program(
        code=_words("-o -F -I"),
        values=_words("-B -b -c -D -E -e -i -J -L -l -m -O -p -P -Q -R -S -W -w"),
        operands=(_D, _SH),
    ),
    "docker": _DOCKER,
    "podman": _DOCKER,
    # wrappers: they run the command that follows their own options and operands
    "env": Program(
        code=_words("-S --split-string"),
        values=_words("-u --unset -C --chdir"),
        splits=_words("-S --split-string"),
        dash_is_option=True,
        assignments=True,
        operands=(_CMD,),
    ),
    "timeout": Program(values=_words("-s --signal -k --kill-after"), operands=(_D, _CMD)),
    # nice -5 COMMAND: -NUM is an adjustment, read here as flags -5 (-1 -0 for -10); no flags list for that
    "nice": Program(values=_words("-n --adjustment"), operands=(_CMD,)),
    "nohup": Program(operands=(_CMD,)),
    "setsid": Program(operands=(_CMD,)),
    "stdbuf": Program(
        values=_words("-i -o -e --input --output --error"), flags=_words("--help --version"), operands=(_CMD,)
    ),
    # prlimit --nofile=64 COMMAND: a resource's limit is attached (-n64, --nofile=64), never the next word
    "prlimit": Program(
        values=_words("-p --pid -o --output"),
        attached=_words("-c -d -e -f -i -l -m -n -q -r -s -t -u -v -x -y"),
        flags=_words(
            "--noheadings --raw --verbose -h --help -V --version --as --core --cpu --data --fsize --locks "
            "--memlock --msgqueue --nice --nofile --nproc --rss --rtprio --rttime --sigpending --stack"
        ),
        operands=(_CMD,),
    ),
    "setpriv": Program(
        values=_words(
            "--inh-caps --ambient-caps --ruid --euid --rgid --egid --reuid --regid --groups "
            "--bounding-set --securebits --pdeathsig --ptracer --selinux-label --apparmor-profile "
            "--landlock-access --landlock-rule --list-landlock-rights --seccomp-filter"
        ),
        flags=_words(
            "-d --dump --nnp --no-new-privs --list-caps --clear-groups --keep-groups --init-groups "
            "--landlock-support --list-landlock-access --reset-env -h --help -V --version"
        ),
        operands=(_CMD,),
    ),
    # A property can be ExecStartPre=, an environment variable LD_PRELOAD: both are code.
    "systemd-run": Program(
        code=_words("-p --property -E --setenv --path-property --socket-property --timer-property"),
        values=_words(
            "-C --capsule -u --unit --description --slice --expand-environment -H --host -M --machine "
            "--service-type --uid --gid --nice --on-active --on-boot --on-startup --on-unit-active "
            "--on-unit-inactive --on-calendar --working-directory --job-mode --background --json"
        ),
        flags=_words(
            "-h --help --version --user --system --scope --slice-inherit -r --remain-after-exit "
            "--send-sighup --wait -t --tty --pty -P --pipe -q --quiet --on-timezone-change "
            "--on-clock-change --no-block --no-ask-password -G --collect -d --same-dir -S --shell "
            "--ignore-failure"
        ),
        stdin_code=_words("-S --shell"),
        operands=(_CMD,),
    ),
    # bwrap reads each option's values as separate words, and stops at the first word not starting with '-'.
    "bwrap": Program(
        code=_words("--args --setenv"),  # --args FD: more options from a file descriptor
        values=_words(
            _BWRAP_PAIRS + " --overlay --argv0 --chdir --remount-ro --overlay-src --tmp-overlay "
            "--ro-overlay --proc --exec-label --file-label --dev --tmpfs --mqueue --dir --lock-file "
            "--sync-fd --block-fd --userns-block-fd --info-fd --json-status-fd --seccomp "
            "--add-seccomp-fd --userns --userns2 --pidns --unsetenv --uid --gid --hostname --cap-add "
            "--cap-drop --perms --size"
        ),
        arity={**dict.fromkeys(_words(_BWRAP_PAIRS + " --setenv"), 2), "--overlay": 3},
        flags=_words(
            "--help --version --level-prefix --unshare-all --unshare-user --unshare-user-try "
            "--unshare-ipc --unshare-pid --unshare-net --unshare-uts --unshare-cgroup "
            "--unshare-cgroup-try --share-net --disable-userns --assert-userns-disabled --clearenv "
            "--new-session --die-with-parent --as-pid-1"
        ),
        operands=(_CMD,),
    ),
    # firejail's options are single words (--profile=FILE); no option takes the next word. Before 0.9.72 it
    # ran the command through --shell=PROGRAM (quoting the arguments).
    "firejail": Program(
        code=_words("--shell --profile --include --env --audit"), operands=(_CMD,), shell_without_command=True
    ),
    "time": Program(values=_words("-f --format -o --output"), operands=(_CMD,)),
    "sudo": Program(
        values=_words(
            "-u --user -g --group --host -p --prompt -C --close-from -D --chdir -r --role -t --type "
            "-T --command-timeout -U --other-user -R --chroot"
        ),
        assignments=True,
        operands=(_CMD,),
        modes={
            **dict.fromkeys(("-s", "--shell", "-i", "--login"), (_SH,)),
            **dict.fromkeys(("-e", "--edit", "-l", "--list"), (_D,)),
        },
    ),
    "doas": Program(values=_words("-u -C"), operands=(_CMD,)),
    "su": _SU,
    "runuser": Program(
        code=_SU.code,
        values=_SU.values | _words("-u --user"),
        dash_is_option=True,
        permutes=True,
        flags=_words("-f --fast -l --login -m -p --preserve-environment -P --pty -T --no-pty -h --help -V --version"),
        operands=_SU.operands,
        modes={**_SU.modes, **dict.fromkeys(("-u", "--user"), (_CMD,))},
    ),
    "sg": Program(code=_words("-c"), dash_is_option=True, operands=(_D, _SH)),
    "pkexec": Program(values=_words("--user"), operands=(_CMD,)),
    "xargs": Program(
        values=_words(
            "-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars --process-slot-var"
        ),
        attached=_words("-e -i -l"),
        operands=(_CMD,),
    ),
    "flock": Program(
        code=_words("-c --command"),
        values=_words("-w --wait --timeout -E --conflict-exit-code --start --length --fd"),
        flags=_words(
            "-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock --nonblocking -o "
            "--close -F --no-fork --verbose --fcntl -h --help -V --version"
        ),
        late=_words("-c --command"),
        operands=(_D, _CMD),
        modes={**dict.fromkeys(("-c", "--command"), (_D,)), "--fd": (_CMD,)},
    ),  # --fd N: no file
    "script": Program(
        code=_words("-c --command"),
        values=_words("-E --echo -I --log-in -O --log-out -B --log-io -T --log-timing -m --logging-format"),
        attached=_words("-t"),
        permutes=True,
        operands=(_D,),
    ),
    "busybox": Program(operands=(_CMD,)),
    "watch": Program(
        values=_words("-n --interval -q --equexit"),
        attached=_words("-d"),
        operands=(_SH,),
        modes=dict.fromkeys(("-x", "--exec"), (_CMD,)),
    ),
    "chroot": Program(values=_words("--userspec --groups"), operands=(_D, _CMD), shell_without_command=True),
    "unshare": Program(
        code=_words("-l --load-interp"),  # a binfmt_misc rule naming the interpreter to run
        values=_words(
            "--map-user --map-group --map-users --map-groups --owner --propagation --setgroups -S "
            "--setuid -G --setgid -R --root -w --wd --monotonic --boottime --whitelist-env"
        ),
        attached=_words("-m -u -i -n -p -U -C -T"),
        flags=_words(
            "-f --fork -h --help -V --version -r --map-root-user -c --map-current-user --map-auto "
            "--map-subids --keep-caps --clear-env --forward-signals --mount --uts --ipc --net --pid "
            "--user --cgroup --time --kill-child --mount-proc --mount-binfmt"
        ),
        operands=(_CMD,),
        shell_without_command=True,
    ),
    "nsenter": Program(  # -W DIR until util-linux 2.38, -WDIR since: left unknown, so read both ways
        values=_words("-t --target -N --net-socket -S --setuid -G --setgid"),
        attached=_words("-m -u -i -n -p -C -U -T -r -w"),
        flags=_words(
            "-a --all -h --help -V --version -e --env -c --join-cgroup -F --no-fork -Z --follow-context "
            "--preserve-credentials --keep-caps --user-parent --mount --uts --ipc --net --pid --user "
            "--cgroup --time --root --wd --wdns"
        ),
        operands=(_CMD,),
        shell_without_command=True,
    ),
    "ionice": Program(
        values=_words("-c --class -n --classdata -p --pid -P --pgid -u --uid"),
        flags=_words("-t --ignore -h --help -V --version"),
        operands=(_CMD,),
        modes=dict.fromkeys(("-p", "--pid", "-P", "--pgid", "-u", "--uid"), (_D,)),
    ),
    "taskset": Program(
        flags=_words("-a --all-tasks -c --cpu-list -h --help -V --version"),
        operands=(_D, _CMD),
        modes=dict.fromkeys(("-p", "--pid"), (_D,)),
    ),
    # chrt [POLICY] [PRIORITY] COMMAND: since util-linux 2.41 the priority may be left out
    "chrt": Program(
        values=_words("-T --sched-runtime -P --sched-period -D --sched-deadline -U --clamp-min -X --clamp-max"),
        flags=_words(
            "-a --all-tasks -b --batch -d --deadline -O --deadline-overrun -e --ext -f --fifo -i --idle "
            "-m --max -o --other -r --rr -R --reset-on-fork -G --reclaim-grub -v --verbose -h --help "
            "-V --version"
        ),
        operands=(Operand.NUMBER, _CMD),
        modes=dict.fromkeys(("-p", "--pid"), (_D,)),
    ),
    "strace": Program(
        code=_words("-o --output"),
        values=_words(
            "-a -b -e -E -I -O -p -P -s -S -u -U -X --trace --signal --status "
            "--trace-path --string-limit --user --env --columns --detach-on"
        ),
        operands=(_CMD,),
    ),
    "ltrace": Program(values=_words("-a -A -D -e -F -l -n -o -p -s -u -w -x"), operands=(_CMD,)),
    "valgrind": Program(code=_words("--db-command"), operands=(_CMD,)),
    "npx": _PACKAGE_RUNNER,
    "bunx": _PACKAGE_RUNNER,
    "pnpx": _PACKAGE_RUNNER,
    "uvx": _UVX,
    # coding agents whose ready profiles pass a session id as an option's next word: taken as its value
    "pi": Program(
        values=_words("--mode --session --model --provider --tools --thinking --session-dir"),
        operands=(_D,),
        permutes=True,
    ),
    "dsh": Program(values=_words("--profile --session-id --model --cwd"), operands=(_D,), permutes=True),
    "uv": Program(
        operands=(_SUB,),
        subcommands={
            "run": Program(
                code=_UVX.code,
                values=_UVX.values | _words("--group --extra --package"),
                operands=(_CMD,),
                modes=dict.fromkeys(("-m", "--module"), (_P, _A)),
            ),
            "tool": Program(operands=(_SUB,), subcommands={"run": _UVX}),
        },
    ),
}

# Environment variables whose value programs run, or load code from. An
# untrusted placeholder in one of these would let a message run code.
CODE_VARIABLES = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "PERL5DB",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONWARNINGS",
        "PYTHONBREAKPOINT",
        "RUBYOPT",
        "RUBYLIB",
        "GIT_SSH_COMMAND",
        "GIT_SSH",
        "GIT_EXTERNAL_DIFF",
        "GIT_PAGER",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_PROXY_COMMAND",
        "GIT_ASKPASS",
        "GIT_EXEC_PATH",
        "GIT_CONFIG_PARAMETERS",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "PROMPT_COMMAND",
        "PS4",
        "SHELLOPTS",
        "BASHOPTS",
        "ZDOTDIR",
        "PATH",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "LESSOPEN",
        "LESSCLOSE",
        "LUA_PATH",
        "LUA_CPATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
    }
)
CODE_VARIABLE_PREFIXES = ("BASH_FUNC_", "LD_", "LUA_INIT", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")


def program_rules(word: str) -> tuple[str, Program | None]:
    """The name a program is known by (`/usr/bin/python3.11` → python3.11) and its table entry, if any."""
    base = os.path.basename(word)
    rules = PROGRAMS.get(base)
    if rules is None:
        versioned = _VERSIONED.fullmatch(base)
        if versioned is not None:
            rules = PROGRAMS.get(versioned.group(1))
    return base, rules


# --------------------------------------------------------------------------- walking argv


class Role(enum.Enum):
    """What one argv word turned out to be, for the program that reads it."""

    PROGRAM = "program"  # names what runs
    CODE = "code"  # is run as code, or names a file or module run as code
    OPTION = "option"  # stands where a program that can run code from an option reads its options
    DATA = "data"  # read as data: a known option's value, an operand the program only reads
    ARGUMENT = "argument"  # passed to a program the table does not know, which may parse options


@dataclass(frozen=True, slots=True)
class Use:
    role: Role
    what: str = ""  # for messages: "the code sh -c runs", "the command env runs"; OPTION: where data goes
    owner: str = ""  # the program that reads the word
    region: int = -1  # ARGUMENT: index of the word that starts the owner's arguments
    guarded: bool = False  # ARGUMENT: a `--` came before it in the owner's arguments
    assuming: str = ""  # the unknown options this reading took as having a value ("prlimit --foo")


_Words = list[tuple[int | None, str]]  # (index in argv, or None for words split out of env -S; word)


def classify(argv: Sequence[str]) -> dict[int, Use]:
    """What every word of `argv` is to the program that reads it."""
    return _walk(argv).uses


def _walk(argv: Sequence[str]) -> _Walk:
    """Every reading of `argv`, one per way of reading the unknown options met, merged: each word's strictest use."""
    merged: _Walk | None = None
    readings: list[tuple[bool, ...]] = [()]
    while readings:
        choices = readings.pop()
        walk = _Walk(choices)
        walk.command(list(enumerate(argv)), 0, via="")
        for point in range(len(choices), walk.ambiguities):
            readings.append((*choices, *(False,) * (point - len(choices)), True))
        merged = walk if merged is None else merged.stricter(walk)
    assert merged is not None
    return merged


_MOST_AMBIGUITIES = 8  # unknown options read both ways per argv (2**8 readings at most); any more are flags


def _strictness(use: Use) -> int:
    if use.role in (Role.PROGRAM, Role.CODE, Role.OPTION):
        return 3
    if use.role is Role.ARGUMENT:
        return 1 if use.guarded else 2
    return 0


def _ends_command(words: _Words, position: int, start: int) -> bool:
    word = words[position][1]
    return word == ";" or (word == "+" and position > start and words[position - 1][1] == "{}")


class _Walk:
    def __init__(self, choices: tuple[bool, ...] = ()) -> None:
        self.uses: dict[int, Use] = {}
        self.stdin_code: list[str] = []  # programs that read the code they run from stdin
        self.choices = choices  # for each unknown option met, in order: does this reading give it a value?
        self.ambiguities = 0  # unknown options met
        self.assumed: list[str] = []  # the unknown options this reading gave a value

    def stricter(self, other: _Walk) -> _Walk:
        """This reading, where `other` refuses or warns about more, taking `other`'s word (and saying why)."""
        assumption = ", ".join(other.assumed)
        for index, use in other.uses.items():
            mine = self.uses.get(index)
            if mine is None or _strictness(use) > _strictness(mine):
                self.uses[index] = replace(use, assuming=assumption)
        self.stdin_code.extend(owner for owner in other.stdin_code if owner not in self.stdin_code)
        return self

    def note(self, index: int | None, use: Use) -> None:
        if index is not None:
            self.uses[index] = use

    def command(self, words: _Words, start: int, via: str) -> None:
        """`words[start]` names the program to run; `via` is the wrapper that runs it ("" for argv[0])."""
        index, word = words[start]
        self.note(index, Use(Role.PROGRAM, f"the command {via} runs" if via else "the program to run"))
        name, rules = program_rules(word)
        if rules is None or _is_whole(word):
            self.arguments(words, start + 1, name)
        else:
            self.program(rules, name, words, start + 1)

    def arguments(self, words: _Words, start: int, owner: str) -> None:
        """The rest of `words` go to `owner`, which the table does not know."""
        region = next((index for index, _ in words[start:] if index is not None), -1)
        guarded = False
        for index, word in words[start:]:
            if word == "--" and not guarded:
                guarded = True
            elif _is_whole(word):
                self.note(index, Use(Role.ARGUMENT, owner=owner, region=region, guarded=guarded))
            else:
                self.note(index, Use(Role.DATA))

    def program(self, rules: Program, owner: str, words: _Words, position: int) -> None:
        """Read the options and operands of `owner` from `words[position:]`."""
        operands, mode_option = rules.operands, ""
        count = 0  # operands seen
        reading_options = True
        has_code = False  # an option gave the code to run (sh -c, python -m, awk -f)
        while position < len(words):
            index, word = words[position]
            role = operands[min(count, len(operands) - 1)]
            if reading_options and word == "--" and rules.dash_dash_ends_options:
                reading_options = False
                position += 1
                continue
            late = role is Operand.COMMAND and word in rules.late  # flock FILE -c COMMAND
            if (reading_options and _is_option(rules, word)) or late:
                options, position = _read_option(rules, words, position)
                last = options[-1] if options else None
                if last is not None and last.kind == "command":  # find -exec CMD … ;
                    position = self.command_up_to_its_end(words, position, f"{owner} {last.name}")
                    continue
                if (
                    last is not None
                    and last.kind == "unknown"
                    and last.value_at is None
                    and position < len(words)
                    and self.reads_a_value(f"{owner} {last.name}")
                ):
                    options[-1] = _Option(last.name, "value", position, words[position][1])
                    position += 1
                for option in options:
                    if option.name in rules.stdin_code or (option.kind == "code" and option.value == "-"):
                        self.stdin_code.append(owner)  # sh -s, make -f -: the code is read from stdin
                    if option.kind == "code" or option.name in rules.modes:
                        has_code = True
                    if option.name in rules.modes:
                        operands, mode_option = rules.modes[option.name], option.name
                    if option.name in rules.final:
                        reading_options = False
                    if option.value_at is None:
                        continue
                    for value_at in range(option.value_at, option.value_at + option.span):
                        if option.kind == "code":
                            self.note(
                                words[value_at][0],
                                Use(
                                    Role.CODE,
                                    f"the value of {owner} {option.name}, which {owner} runs or loads as code",
                                    owner,
                                ),
                            )
                        else:
                            self.note(words[value_at][0], Use(Role.DATA))
                    if option.name in rules.splits and not _is_whole(option.value):
                        try:  # env -S 'sh -c …': the words it splits into are read in its place
                            words = [
                                *words[:position],
                                *((None, part) for part in shlex.split(option.value)),
                                *words[position:],
                            ]
                        except ValueError:
                            self.code_rest(words, position, owner)
                            return
                continue
            if rules.assignments and role is Operand.COMMAND and _ASSIGNMENT.fullmatch(word):
                self.note(index, Use(Role.DATA))  # env NAME=VALUE
                reading_options = False
                position += 1
                continue
            if role is Operand.NUMBER and not word.isdigit() and count + 1 < len(operands):
                count += 1  # chrt --other COMMAND: no priority, so this word is the next operand
                continue
            options_were_open = reading_options
            if not rules.permutes:
                reading_options = False
            count += 1
            if options_were_open and role in (Operand.DATA, Operand.ARGUMENTS) and _is_whole(word):
                # Where an option could stand: a message starting with '-' would be one.
                advice = "" if rules.dash_dash_ends_options else f"as the value of one of {owner}'s options"
                self.note(index, Use(Role.OPTION, advice, owner=owner))
                if role is Operand.ARGUMENTS:
                    self.arguments(words, position + 1, owner)
                    self.shadow(rules, owner, words, position, options_were_open)
                    return
            elif role is Operand.DATA:
                self.note(index, Use(Role.DATA))
            elif role is Operand.CODE:
                self.note(
                    index, Use(Role.CODE, f"the code {owner}{' ' + mode_option if mode_option else ''} runs", owner)
                )
            elif role is Operand.ASSIGNMENT:
                self.note(
                    index,
                    Use(
                        Role.CODE,
                        f"a goal or NAME=VALUE for {owner}, and a variable set there is run by {owner}'s recipes",
                        owner,
                    ),
                )
            elif role is Operand.PROGRAM:
                self.note(index, Use(Role.PROGRAM, f"the program {owner} runs", owner))
            elif role is Operand.SCRIPT:
                self.note(index, Use(Role.CODE, f"the script {owner} runs", owner))
                if word == "-":  # python -, perl -: the script is stdin
                    self.stdin_code.append(owner)
                self.arguments(words, position + 1, os.path.basename(word))
                return
            elif role is Operand.ARGUMENTS:
                self.arguments(words, position, owner)
                self.shadow(rules, owner, words, position, options_were_open)
                return
            elif role is Operand.SHELL_WORDS:
                self.code_rest(words, position, owner)
                return
            elif role is Operand.COMMAND:
                self.command(words, position, owner)
                self.shadow(rules, owner, words, position, options_were_open)
                return
            elif role is Operand.SUBCOMMAND:
                sub = rules.subcommands.get(word)
                if sub is None:
                    sub = rules.subcommands.get("", _ANY_SUBCOMMAND)
                    self.note(index, Use(Role.PROGRAM, f"the subcommand {owner} runs", owner))
                else:
                    self.note(index, Use(Role.DATA))
                self.program(sub, f"{owner} {word}", words, position + 1)
                return
            position += 1
        if count == 0 and not has_code and operands[0] in (Operand.SCRIPT, Operand.CODE):
            self.stdin_code.append(owner)  # no script and no code: it reads them from stdin
        elif operands[min(count, len(operands) - 1)] is Operand.SHELL_WORDS and count < len(operands):
            self.stdin_code.append(owner)  # ssh HOST, su USER: a shell that reads its commands from stdin
        elif operands[min(count, len(operands) - 1)] is Operand.COMMAND and rules.shell_without_command:
            self.stdin_code.append(owner)  # unshare, chroot DIR: no command, so the user's shell reads stdin

    def command_up_to_its_end(self, words: _Words, start: int, via: str) -> int:
        """find -exec CMD … ; (or … {} +): walk the command; the position after its end."""
        end = start
        while end < len(words) and not _ends_command(words, end, start):
            end += 1
        if end > start:
            self.command(words[:end], start, via)
        return end + 1

    def reads_a_value(self, option: str) -> bool:
        """At an option the table does not know: whether this reading takes the next word as its value."""
        if self.ambiguities >= _MOST_AMBIGUITIES:
            return False
        point = self.ambiguities
        self.ambiguities += 1
        takes = point < len(self.choices) and self.choices[point]
        if takes:
            self.assumed.append(option)
        return takes

    def code_rest(self, words: _Words, start: int, owner: str) -> None:
        for index, _ in words[start:]:
            self.note(index, Use(Role.CODE, f"part of the command line {owner} runs as code", owner))

    def shadow(self, rules: Program, owner: str, words: _Words, start: int, options_were_open: bool) -> None:
        """A program that permutes options still reads options after its command starts, up to `--`."""
        if not (rules.permutes and options_were_open):
            return
        for index, word in words[start:]:
            if word == "--":
                return
            use = self.uses.get(index) if index is not None else None
            if use is not None and use.role in (Role.DATA, Role.ARGUMENT) and _is_whole(word):
                self.note(index, Use(Role.OPTION, owner=owner))


def _is_whole(word: str) -> bool:
    """The word is exactly one untrusted placeholder, `{{MESSAGE}}`."""
    return _PLACEHOLDER.fullmatch(word) is not None


def _is_option(rules: Program, word: str) -> bool:
    if word == "-":
        return rules.dash_is_option
    return word.startswith("-") or (rules.plus_options and word.startswith("+") and len(word) > 1)


@dataclass(frozen=True, slots=True)
class _Option:
    name: str  # as the table spells it (an abbreviation resolved)
    kind: str  # as `Program.option_kind` says
    value_at: int | None = None  # the position of the word holding its value, if it has one
    value: str = ""
    span: int = 1  # the words holding its value, from value_at (bwrap --bind SRC DEST: 2)


def _read_option(rules: Program, words: _Words, position: int) -> tuple[list[_Option], int]:
    """The option at `words[position]` (several when bundled, as in `-lc`), and the position after its value."""
    word = words[position][1]
    long = word.startswith("--") or (rules.single_dash_long and word != "-")
    if long or (word.lower() if rules.case_insensitive else word) in rules.code | rules.values | rules.command_options:
        name, equals, value = word.partition("=") if long else (word, "", "")
        if rules.single_dash_long and name.startswith("--"):
            name = name[1:]
        name, kind = rules.option_kind(name.lower() if rules.case_insensitive else name)
        if equals:  # --eval=CODE
            span = min(rules.arity.get(name, 1), len(words) - position)
            return [_Option(name, kind, position, value, span)], position + span
        if kind in ("code", "value") and position + 1 < len(words):
            span = min(rules.arity.get(name, 1), len(words) - position - 1)
            return [_Option(name, kind, position + 1, words[position + 1][1], span)], position + 1 + span
        return [_Option(name, kind)], position + 1
    options = []
    for offset in range(1, len(word)):
        name, kind = rules.option_kind(word[0] + word[offset])
        if kind in ("code", "value"):
            if offset + 1 < len(word):  # -Wignore, -c'code'
                options.append(_Option(name, kind, position, word[offset + 1 :]))
            elif position + 1 < len(words):
                options.append(_Option(name, kind, position + 1, words[position + 1][1]))
                return options, position + 2
            else:
                options.append(_Option(name, kind))
            break
        options.append(_Option(name, kind))
        if kind == "attached":  # -i.bak: the rest of the word is its value
            break
    return options, position + 1


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True, slots=True)
class ArgvProblem:
    index: int  # the argv word it is about
    message: str


def argv_problem(argv: Sequence[str]) -> ArgvProblem | None:
    """The first place in `argv` where an untrusted placeholder could let a message run code, if any."""
    uses: dict[int, Use] | None = None
    for index, word in enumerate(argv):
        match = _PLACEHOLDER.search(word)
        if match is None:
            continue
        if uses is None:
            uses = classify(argv)
        use = uses.get(index, Use(Role.DATA))
        found, variable = match.group(0), _VARIABLE_OF[match.group(1)]
        if not (_is_whole(word) or _LONG_OPTION_VALUE.fullmatch(word)):
            return ArgvProblem(index, _embedded_message(word, found, variable, use))
        if use.role in (Role.PROGRAM, Role.CODE, Role.OPTION):
            return ArgvProblem(index, _refusal_message(found, variable, use))
    return None


def stdin_problem(argv: Sequence[str]) -> str | None:
    """Why the message may not be written to the stdin of `argv`, if it may not: the program reads its code there."""
    readers = _walk(argv).stdin_code
    if not readers:
        return None
    return (
        f"{readers[0]} reads the code it runs from stdin, and `stdin: message` (or `line`) would put the "
        "message there, so a message would run code. "
        f'Give {readers[0]} its script (e.g. python3 "{{{{PROFILE_DIR}}}}/agent.py") '
        "and let the script read stdin, or use `stdin: none` and read $AGENT_MESSAGE"
    )


def environment_problem(name: str, value: str) -> str | None:
    """Why `value` cannot be the template of environment variable `name`, if it cannot."""
    match = _PLACEHOLDER.search(value)
    if match is None or not (name in CODE_VARIABLES or name.startswith(CODE_VARIABLE_PREFIXES)):
        return None
    return (
        f"{match.group(0)} cannot be used in {name}: programs run or load code from that variable, so a "
        f"message there would run code. Read ${_VARIABLE_OF[match.group(1)]} in the agent instead"
    )


def option_injection_warnings(argv: Sequence[str], only: range | None = None) -> list[str]:
    """Where a message starting with `-` would reach a program the table does not know as its options.

    Allowed (the program may take it as data), but worth a `--` before it.
    With `only`, just the warnings about the words at those positions.
    """
    uses = classify(argv)
    unguarded: dict[int, list[int]] = {}
    for index, use in sorted(uses.items()):
        if use.role is Role.ARGUMENT and not use.guarded:
            unguarded.setdefault(use.region, []).append(index)
    warnings = []
    for indexes in unguarded.values():
        if only is not None and not any(index in only for index in indexes):
            continue
        owner = uses[indexes[0]].owner
        names = " and ".join(argv[index] for index in indexes)
        fixed = [*argv[: indexes[0]], "--", *argv[indexes[0] :]]
        verb = "are" if len(indexes) > 1 else "is"
        warnings.append(
            f"{names} {verb} not preceded by --, so a message starting with '-' would reach {owner} as options; "
            f"end the options first: {_display(fixed)} (or, if it is an option's value, write "
            f"--option={argv[indexes[0]]})"
        )
    return warnings


def _embedded_message(word: str, found: str, variable: str, use: Use) -> str:
    fix = (
        f"Pass it as its own argument (e.g. sh -c 'echo \"$1\"' sh {found}), read ${variable}, "
        f'or put the text in an env value (env: {{PROMPT: "…{found}…"}})'
    )
    if use.role is Role.CODE:
        return f"{found} is inside the inline code run by {use.owner}; that would let a message run code. {fix}"
    shown = word if len(word) <= 40 else word[:39] + "…"
    return (
        f"{found} is part of a larger argument ({shown!r}); a placeholder may stand only as a whole "
        f"argument ({found}) or as a long option's whole value (--name={found}), since anywhere else a "
        f"program may read the message as code or options. {fix}"
    )


def _refusal_message(found: str, variable: str, use: Use) -> str:
    return _refusal(found, variable, use) + (
        f" (this reads {use.assuming} as taking the next word as its value: an option the rule does not know "
        "may, so both readings are checked; write its value attached, --option=VALUE, or leave it out)"
        if use.assuming
        else ""
    )


def _refusal(found: str, variable: str, use: Use) -> str:
    if use.role is Role.PROGRAM:
        return (
            f"{found} is {use.what}; a message must never choose what runs. Name the program in the "
            f"profile and pass {found} to it as an argument, or read ${variable}"
        )
    if use.role is Role.OPTION:
        where = use.what or f"where {use.owner} takes data: after the script or code it runs, or after `--`"
        return (
            f"{found} stands where {use.owner} reads its options: a message starting with '-' would become an "
            f"option of {use.owner}, and {use.owner} can run code from its options (e.g. '-c…', '--eval=…'). "
            f"Pass it {where}; or read ${variable}"
        )
    return (
        f"{found} is {use.what}, so a message there would run code. Pass it as its own argument after the "
        f"code (e.g. sh -c 'echo \"$1\"' sh {found}), or read ${variable}"
    )


_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./{}-]+")


def _display(argv: Iterable[str]) -> str:
    """argv as a command line, placeholders left bare so it reads like the profile."""
    return " ".join(word if _PLAIN_WORD.fullmatch(word) else shlex.quote(word) for word in argv)
