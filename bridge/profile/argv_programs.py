"""The table of programs the argv rule knows (`bridge.profile.argv_rules`): how each one reads its argv.

Data, not code: one `Program` per program whose argv can carry code — which options take code or data, what its
operands are, whether it wraps another command — by the name it is run as (`PROGRAMS`), and the environment
variables whose value programs run (`CODE_VARIABLES`). A program is taught to the rule by a row here (and a
transcript in tests/test_argv_programs.py); the walk that reads argv with it is `argv_rules`.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_VERSIONED = re.compile(r"(.+?)-?[0-9.]*")  # python3.11, perl5.36, node20, tclsh8.6


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
    subcommands: Mapping[str, Program] = field(default_factory=dict)  # "": any other (default ANY_SUBCOMMAND)
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
ANY_SUBCOMMAND = Program(operands=(_D,), permutes=True)
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
