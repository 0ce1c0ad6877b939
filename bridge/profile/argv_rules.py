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
`find . -exec … ;`) with one table of programs, `PROGRAMS` (`bridge.profile.argv_programs`). Where the table
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from .argv_programs import (
    ANY_SUBCOMMAND,
    CODE_VARIABLE_PREFIXES,
    CODE_VARIABLES,
    Operand,
    Program,
    program_rules,
)
from .argv_programs import PROGRAMS as PROGRAMS  # re-exported: the table the rule reads argv with

UNTRUSTED_PLACEHOLDERS = ("MESSAGE", "SESSION_ID", "SESSION_NAME")
# The variable that carries each one, for the advice "read $AGENT_MESSAGE instead".
_VARIABLE_OF = {"MESSAGE": "AGENT_MESSAGE", "SESSION_ID": "AGENT_SESSION_ID", "SESSION_NAME": "AGENT_SESSION_NAME"}

_UNTRUSTED = r"\{\{(" + "|".join(UNTRUSTED_PLACEHOLDERS) + r")\}\}"
_PLACEHOLDER = re.compile(_UNTRUSTED)
_LONG_OPTION_VALUE = re.compile(r"--[A-Za-z0-9_.-]+=" + _UNTRUSTED)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


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


@dataclass(slots=True)
class _Reading:
    """Where the walk stands in the argv of one program."""

    rules: Program
    owner: str
    words: _Words
    position: int
    operands: tuple[Operand, ...]  # what its operands are (an option may change them: sh -c)
    mode_option: str = ""  # the option that changed them
    count: int = 0  # operands seen
    reading_options: bool = True
    has_code: bool = False  # an option gave the code to run (sh -c, python -m, awk -f)

    def role(self) -> Operand:
        """What the next operand is (the last one repeats)."""
        return self.operands[min(self.count, len(self.operands) - 1)]


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
        reading = _Reading(rules, owner, words, position, rules.operands)
        while reading.position < len(reading.words):
            if not self.step(reading):
                return
        self.ended_without_command(reading)

    def step(self, reading: _Reading) -> bool:
        """Read the word at `reading.position` (and an option's values); False when the rest is read too."""
        rules = reading.rules
        index, word = reading.words[reading.position]
        role = reading.role()
        if reading.reading_options and word == "--" and rules.dash_dash_ends_options:
            reading.reading_options = False
            reading.position += 1
            return True
        late = role is Operand.COMMAND and word in rules.late  # flock FILE -c COMMAND
        if (reading.reading_options and _is_option(rules, word)) or late:
            return self.options(reading)
        if rules.assignments and role is Operand.COMMAND and _ASSIGNMENT.fullmatch(word):
            self.note(index, Use(Role.DATA))  # env NAME=VALUE
            reading.reading_options = False
            reading.position += 1
            return True
        if role is Operand.NUMBER and not word.isdigit() and reading.count + 1 < len(reading.operands):
            reading.count += 1  # chrt --other COMMAND: no priority, so this word is the next operand
            return True
        return self.operand(reading, index, word, role)

    def options(self, reading: _Reading) -> bool:
        """The option (or bundle of options) at `reading.position`, and its values."""
        owner = reading.owner
        options, reading.position = _read_option(reading.rules, reading.words, reading.position)
        last = options[-1] if options else None
        if last is not None and last.kind == "command":  # find -exec CMD … ;
            reading.position = self.command_up_to_its_end(reading.words, reading.position, f"{owner} {last.name}")
            return True
        if (
            last is not None
            and last.kind == "unknown"
            and last.value_at is None
            and reading.position < len(reading.words)
            and self.reads_a_value(f"{owner} {last.name}")
        ):
            options[-1] = _Option(last.name, "value", reading.position, reading.words[reading.position][1])
            reading.position += 1
        return all(self.option(reading, option) for option in options)

    def option(self, reading: _Reading, option: _Option) -> bool:
        """What one option changes (the operands, the end of options) and what its value is."""
        rules, owner = reading.rules, reading.owner
        if option.name in rules.stdin_code or (option.kind == "code" and option.value == "-"):
            self.stdin_code.append(owner)  # sh -s, make -f -: the code is read from stdin
        if option.kind == "code" or option.name in rules.modes:
            reading.has_code = True
        if option.name in rules.modes:
            reading.operands, reading.mode_option = rules.modes[option.name], option.name
        if option.name in rules.final:
            reading.reading_options = False
        if option.value_at is None:
            return True
        for value_at in range(option.value_at, option.value_at + option.span):
            if option.kind == "code":
                what = f"the value of {owner} {option.name}, which {owner} runs or loads as code"
                self.note(reading.words[value_at][0], Use(Role.CODE, what, owner))
            else:
                self.note(reading.words[value_at][0], Use(Role.DATA))
        if option.name in rules.splits and not _is_whole(option.value):
            try:  # env -S 'sh -c …': the words it splits into are read in its place
                parts = [(None, part) for part in shlex.split(option.value)]
            except ValueError:
                self.code_rest(reading.words, reading.position, owner)
                return False
            reading.words = [*reading.words[: reading.position], *parts, *reading.words[reading.position :]]
        return True

    def operand(self, reading: _Reading, index: int | None, word: str, role: Operand) -> bool:
        """An operand of `reading.owner`, by what it does with it (`OPERAND_READERS`)."""
        options_were_open = reading.reading_options
        if not reading.rules.permutes:
            reading.reading_options = False
        reading.count += 1
        if options_were_open and role in (Operand.DATA, Operand.ARGUMENTS) and _is_whole(word):
            # Where an option could stand: a message starting with '-' would be one.
            advice = "" if reading.rules.dash_dash_ends_options else f"as the value of one of {reading.owner}'s options"
            self.note(index, Use(Role.OPTION, advice, owner=reading.owner))
            if role is Operand.ARGUMENTS:
                self.rest_are_arguments(reading, reading.position + 1, options_were_open)
                return False
        else:
            going_on = OPERAND_READERS[role](self, reading, index, word, options_were_open)
            if not going_on:
                return False
        reading.position += 1
        return True

    def data_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.note(index, Use(Role.DATA))
        return True

    def number_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        return True  # chrt's priority

    def code_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        mode = f" {reading.mode_option}" if reading.mode_option else ""
        self.note(index, Use(Role.CODE, f"the code {reading.owner}{mode} runs", reading.owner))
        return True

    def assignment_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        owner = reading.owner
        what = f"a goal or NAME=VALUE for {owner}, and a variable set there is run by {owner}'s recipes"
        self.note(index, Use(Role.CODE, what, owner))
        return True

    def program_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.note(index, Use(Role.PROGRAM, f"the program {reading.owner} runs", reading.owner))
        return True

    def script_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.note(index, Use(Role.CODE, f"the script {reading.owner} runs", reading.owner))
        if word == "-":  # python -, perl -: the script is stdin
            self.stdin_code.append(reading.owner)
        self.arguments(reading.words, reading.position + 1, os.path.basename(word))
        return False

    def arguments_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.rest_are_arguments(reading, reading.position, options_were_open)
        return False

    def rest_are_arguments(self, reading: _Reading, first: int, options_were_open: bool) -> None:
        """`words[first:]` go to code the table does not know (python -m MODULE …)."""
        self.arguments(reading.words, first, reading.owner)
        self.shadow(reading.rules, reading.owner, reading.words, reading.position, options_were_open)

    def shell_words_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.code_rest(reading.words, reading.position, reading.owner)
        return False

    def command_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        self.command(reading.words, reading.position, reading.owner)
        self.shadow(reading.rules, reading.owner, reading.words, reading.position, options_were_open)
        return False

    def subcommand_operand(self, reading: _Reading, index: int | None, word: str, options_were_open: bool) -> bool:
        owner = reading.owner
        sub = reading.rules.subcommands.get(word)
        if sub is None:
            sub = reading.rules.subcommands.get("", ANY_SUBCOMMAND)
            self.note(index, Use(Role.PROGRAM, f"the subcommand {owner} runs", owner))
        else:
            self.note(index, Use(Role.DATA))
        self.program(sub, f"{owner} {word}", reading.words, reading.position + 1)
        return False

    def ended_without_command(self, reading: _Reading) -> None:
        """Its argv ended: a program given no code reads it from stdin."""
        operands, count = reading.operands, reading.count
        if count == 0 and not reading.has_code and operands[0] in (Operand.SCRIPT, Operand.CODE):
            self.stdin_code.append(reading.owner)  # no script and no code: it reads them from stdin
        elif reading.role() is Operand.SHELL_WORDS and count < len(operands):
            self.stdin_code.append(reading.owner)  # ssh HOST, su USER: a shell that reads its commands from stdin
        elif reading.role() is Operand.COMMAND and reading.rules.shell_without_command:
            self.stdin_code.append(reading.owner)  # unshare, chroot DIR: no command, so the user's shell reads stdin

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


_OperandReader = Callable[[_Walk, _Reading, int | None, str, bool], bool]
# What the walk does with each kind of operand (`Operand`); False: the operand took the rest of argv.
OPERAND_READERS: dict[Operand, _OperandReader] = {
    Operand.DATA: _Walk.data_operand,
    Operand.CODE: _Walk.code_operand,
    Operand.SCRIPT: _Walk.script_operand,
    Operand.PROGRAM: _Walk.program_operand,
    Operand.ARGUMENTS: _Walk.arguments_operand,
    Operand.COMMAND: _Walk.command_operand,
    Operand.SHELL_WORDS: _Walk.shell_words_operand,
    Operand.SUBCOMMAND: _Walk.subcommand_operand,
    Operand.NUMBER: _Walk.number_operand,
    Operand.ASSIGNMENT: _Walk.assignment_operand,
}


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
