"""The chat pacer: when each message to a platform may go out (bridge.chat.pacing, pure: times are passed in).

Each scenario runs in a small discrete-event simulation: operations are submitted at given times, the pacer is
asked what to do, and every operation it hands out is answered — done, or a 429 — after a simulated latency.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from bridge.chat.config import Pace
from bridge.chat.pacing import (
    MATRIX_LIMITS,
    TELEGRAM_LIMITS,
    Delete,
    Edit,
    Op,
    PaceLimits,
    Pacer,
    Send,
)
from bridge.errors import OutboxFull, ProtocolMisuse, QueueFull

EPSILON = 1e-9

Answer = Callable[[Op[str], int], float | None]  # (op, its attempt number from 1) -> None: done; seconds: a 429


def always_done(op: Op[str], attempt: int) -> float | None:
    return None


@dataclass
class Attempt:
    at: float
    op: Op[str]
    retry_after: float | None  # the 429's seconds, or None: carried out


def simulate(
    pacer: Pacer[str],
    submissions: list[tuple[float, Op[str]]],
    *,
    answer: Answer = always_done,
    latency: float = 0.0,
    groups: tuple[str, ...] = (),
    max_steps: int = 100_000,
) -> list[Attempt]:
    """Every operation the pacer hands out, in order, with its time and how the platform answered it."""
    for chat in groups:
        pacer.is_group(chat, True)
    waiting = sorted(submissions, key=lambda item: item[0])
    in_flight: list[tuple[float, Op[str], float | None]] = []  # (answered at, op, retry_after)
    attempts: list[Attempt] = []
    tries: Counter[int] = Counter()
    now = 0.0
    for _ in range(max_steps):
        while waiting and waiting[0][0] <= now:
            pacer.submit(waiting.pop(0)[1], now)
        for answered in sorted((item for item in in_flight if item[0] <= now), key=lambda item: item[0]):
            in_flight.remove(answered)
            _, op, retry = answered
            if retry is None:
                pacer.done(op, now)
            else:
                pacer.retry_after(op, retry, now)
        op, wait = pacer.next(now)
        if op is not None:
            assert wait == 0.0
            tries[id(op)] += 1
            retry = answer(op, tries[id(op)])
            attempts.append(Attempt(now, op, retry))
            in_flight.append((now + latency, op, retry))
            continue
        moments = [now + wait, *(item[0] for item in in_flight), *(item[0] for item in waiting[:1])]
        later = min(moments)
        if later == math.inf:
            assert not in_flight and not waiting and pacer.pending() == 0, "the pacer waits forever with work left"
            return attempts
        now = max(later, now)
    raise AssertionError(f"no end after {max_steps} steps: {attempts[-5:]}")


def handed_out(attempts: list[Attempt]) -> list[tuple[float, Op[str]]]:
    return [(round(attempt.at, 6), attempt.op) for attempt in attempts]


def most_in_any_window(times: list[float], seconds: float) -> int:
    """The most of `times` in any window [t, t + seconds): a sliding window over the simulated clock."""
    times = sorted(times)
    most = 0
    start = 0
    for end, at in enumerate(times):
        while times[start] <= at - seconds + EPSILON:
            start += 1
        most = max(most, end - start + 1)
    return most


def most_a_bucket_allows(times: list[float], rate: float, burst: int) -> bool:
    """Whether `times` fit a token bucket of `burst` refilled at `rate` a second: between any two hand-outs, at
    most the burst plus what the time between them refilled."""
    times = sorted(times)
    return all(
        end - start + 1 <= burst + rate * (times[end] - times[start]) + EPSILON
        for start in range(len(times))
        for end in range(start, len(times))
    )


def check_limits(attempts: list[Attempt], limits: PaceLimits, groups: tuple[str, ...] = ()) -> None:
    """Every attempt counts, a refused one too: the platform counted it."""
    by_chat: dict[str, list[float]] = defaultdict(list)
    for attempt in attempts:
        by_chat[attempt.op.chat].append(attempt.at)
    for chat, times in by_chat.items():
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        assert all(gap >= limits.per_chat_interval - EPSILON for gap in gaps), (chat, min(gaps))
        if chat in groups:
            assert most_in_any_window(times, 60.0) <= limits.group_per_minute, chat
    everything = [attempt.at for attempt in attempts]
    if limits.global_burst is None:
        assert most_in_any_window(everything, 1.0) <= limits.global_per_second
    else:
        assert most_a_bucket_allows(everything, limits.global_per_second, limits.global_burst)


CASES: list[tuple[str, PaceLimits, tuple[str, ...], list[tuple[float, Op[str]]], list[tuple[float, Op[str]]]]] = [
    ("one send goes at once", TELEGRAM_LIMITS, (), [(0.0, Send("a", "hi"))], [(0.0, Send("a", "hi"))]),
    (
        "a chat's messages a second apart, in order",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Send("a", "1")), (0.0, Send("a", "2")), (0.0, Send("a", "3"))],
        [(0.0, Send("a", "1")), (1.0, Send("a", "2")), (2.0, Send("a", "3"))],
    ),
    (
        "other chats do not wait for a busy one",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Send("a", "1")), (0.0, Send("a", "2")), (0.0, Send("b", "1"))],
        [(0.0, Send("a", "1")), (0.0, Send("b", "1")), (1.0, Send("a", "2"))],
    ),
    (
        "sends before edits, though the edit came first",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Edit("a", "m1", "preview")), (0.0, Send("a", "reply"))],
        [(0.0, Send("a", "reply")), (1.0, Edit("a", "m1", "preview"))],
    ),
    (
        "pending edits of one message merged: only the last payload goes",
        TELEGRAM_LIMITS,
        (),
        [
            (0.0, Send("a", "x")),
            (0.1, Edit("a", "m1", "he")),
            (0.2, Edit("a", "m1", "hell")),
            (0.3, Edit("a", "m1", "hello")),
        ],
        [(0.0, Send("a", "x")), (1.0, Edit("a", "m1", "hello"))],
    ),
    (
        "merged edits keep the first one's place among the chat's messages",
        TELEGRAM_LIMITS,
        (),
        [
            (0.0, Send("a", "x")),
            (0.1, Edit("a", "m1", "1")),
            (0.2, Edit("a", "m2", "1")),
            (0.3, Edit("a", "m1", "2")),
        ],
        [(0.0, Send("a", "x")), (1.0, Edit("a", "m1", "2")), (2.0, Edit("a", "m2", "1"))],
    ),
    (
        "an edit repeating what the message shows is dropped",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Edit("a", "m1", "same")), (5.0, Edit("a", "m1", "same")), (9.0, Edit("a", "m1", "new"))],
        [(0.0, Edit("a", "m1", "same")), (9.0, Edit("a", "m1", "new"))],
    ),
    (
        "an edit repeating the one in flight is dropped",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Edit("a", "m1", "v1")), (0.5, Edit("a", "m1", "v1"))],
        [(0.0, Edit("a", "m1", "v1"))],
    ),
    (
        "edits that end where the message is cancel out",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Edit("a", "m1", "v1")), (0.2, Edit("a", "m1", "v2")), (0.4, Edit("a", "m1", "v1"))],
        [(0.0, Edit("a", "m1", "v1"))],
    ),
    (
        "a delete drops its message's pending edits and keeps its place after the sends",
        TELEGRAM_LIMITS,
        (),
        [
            (0.0, Send("a", "first")),
            (0.1, Edit("a", "preview", "partial")),
            (0.2, Send("a", "final")),
            (0.3, Delete("a", "preview")),
        ],
        [(0.0, Send("a", "first")), (1.0, Send("a", "final")), (2.0, Delete("a", "preview"))],
    ),
    (
        "an edit of a message about to be deleted is dropped",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Send("a", "final")), (0.0, Delete("a", "preview")), (0.1, Edit("a", "preview", "late partial"))],
        [(0.0, Send("a", "final")), (1.0, Delete("a", "preview"))],
    ),
    (
        "a group gets 20 a minute",
        TELEGRAM_LIMITS,
        ("g",),
        [(0.0, Send("g", str(n))) for n in range(22)],
        [*((float(n), Send("g", str(n))) for n in range(20)), (60.0, Send("g", "20")), (61.0, Send("g", "21"))],
    ),
    (
        "a private chat is not held to the group limit",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Send("p", str(n))) for n in range(22)],
        [(float(n), Send("p", str(n))) for n in range(22)],
    ),
    (
        "30 a second in all (a second and the margin for late arrivals)",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Send(f"c{n:02}", "hi")) for n in range(32)],
        [*((0.0, Send(f"c{n:02}", "hi")) for n in range(30)), (1.2, Send("c30", "hi")), (1.2, Send("c31", "hi"))],
    ),
    (
        "when the global limit binds, other chats' sends go before an edit submitted earlier",
        TELEGRAM_LIMITS,
        (),
        [(0.0, Edit("e", "m", "preview")), *((0.0, Send(f"c{n:02}", "hi")) for n in range(30))],
        [*((0.0, Send(f"c{n:02}", "hi")) for n in range(30)), (1.2, Edit("e", "m", "preview"))],
    ),
    (
        "Matrix: a burst of 8, then one every 5 seconds, across rooms",
        MATRIX_LIMITS,
        (),
        [(0.0, Send(f"!r{n:02}", "hi")) for n in range(10)],
        [*((0.0, Send(f"!r{n:02}", "hi")) for n in range(8)), (5.0, Send("!r08", "hi")), (10.0, Send("!r09", "hi"))],
    ),
]


@pytest.mark.parametrize(
    ("limits", "groups", "submissions", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_rules(
    limits: PaceLimits,
    groups: tuple[str, ...],
    submissions: list[tuple[float, Op[str]]],
    expected: list[tuple[float, Op[str]]],
) -> None:
    attempts = simulate(Pacer(limits), submissions, groups=groups)
    assert handed_out(attempts) == expected
    check_limits(attempts, limits, groups)


def refuse_first_attempt_of(target: Op[str], seconds: float) -> Answer:
    def answer(op: Op[str], attempt: int) -> float | None:
        return seconds if op == target and attempt == 1 else None

    return answer


RETRY_CASES: list[tuple[str, PaceLimits, list[tuple[float, Op[str]]], Op[str], list[tuple[float, Op[str]]]]] = [
    (
        "a 429 holds its chat, its message goes again first; other chats go on",
        TELEGRAM_LIMITS,
        [(0.0, Send("a", "1")), (0.0, Send("a", "2")), (0.0, Send("b", "1")), (2.0, Send("b", "2"))],
        Send("a", "1"),
        [
            (0.0, Send("a", "1")),
            (0.0, Send("b", "1")),
            (2.0, Send("b", "2")),
            (5.0, Send("a", "1")),
            (6.0, Send("a", "2")),
        ],
    ),
    (
        "a delete refused by a 429 goes again first, before later sends",
        TELEGRAM_LIMITS,
        [(0.0, Delete("a", "m")), (0.5, Send("a", "2"))],
        Delete("a", "m"),
        [(0.0, Delete("a", "m")), (3.0, Delete("a", "m")), (4.0, Send("a", "2"))],
    ),
    (
        "a refused edit gives way to a newer edit of its message, which takes its place",
        TELEGRAM_LIMITS,
        [(0.0, Edit("a", "m", "v1")), (0.0, Edit("a", "n", "w1")), (0.5, Edit("a", "m", "v2"))],
        Edit("a", "m", "v1"),
        [(0.0, Edit("a", "m", "v1")), (3.0, Edit("a", "m", "v2")), (4.0, Edit("a", "n", "w1"))],
    ),
    (
        "Matrix: a 429 holds every room",
        MATRIX_LIMITS,
        [(0.0, Send("!a", "1")), (1.0, Send("!b", "1"))],
        Send("!a", "1"),
        [(0.0, Send("!a", "1")), (3.0, Send("!a", "1")), (3.0, Send("!b", "1"))],
    ),
]


@pytest.mark.parametrize(
    ("limits", "submissions", "refused", "expected"),
    [case[1:] for case in RETRY_CASES],
    ids=[case[0] for case in RETRY_CASES],
)
def test_retry_after(
    limits: PaceLimits,
    submissions: list[tuple[float, Op[str]]],
    refused: Op[str],
    expected: list[tuple[float, Op[str]]],
) -> None:
    seconds = 5.0 if limits is TELEGRAM_LIMITS and isinstance(refused, Send) else 3.0
    attempts = simulate(Pacer(limits), submissions, answer=refuse_first_attempt_of(refused, seconds))
    assert handed_out(attempts) == expected


def test_200_chats_at_once_each_message_goes_exactly_once_within_telegrams_limits() -> None:
    chats = [f"chat{n:03}" for n in range(200)]
    groups = tuple(chats[::10])  # every tenth a group
    submissions: list[tuple[float, Op[str]]] = [
        (0.0, Send(chat, f"{chat} part {part}")) for chat in chats for part in range(3)
    ]
    attempts = simulate(Pacer(TELEGRAM_LIMITS), submissions, latency=0.08, groups=groups)

    sent = Counter(attempt.op for attempt in attempts)
    assert set(sent) == {op for _, op in submissions}
    assert set(sent.values()) == {1}, "a message went out more than once"
    check_limits(attempts, TELEGRAM_LIMITS, groups)
    assert most_in_any_window([attempt.at for attempt in attempts], 1.0) == 30  # and the limit is used, not idled
    for chat in chats:
        assert [attempt.op for attempt in attempts if attempt.op.chat == chat] == [
            Send(chat, f"{chat} part {part}") for part in range(3)
        ]
    assert attempts[-1].at < 600 / 30 * (1 + TELEGRAM_LIMITS.window_margin) + 1  # 600 messages, 30 a window
    assert (attempts[0].at, attempts[29].at) == (0.0, 0.0), "the first 30 chats wait for nothing"


def test_a_429_storm_never_sends_early_and_loses_nothing() -> None:
    randomly = random.Random(36)
    chats = [f"c{n:02}" for n in range(40)]
    groups = tuple(chats[:5])
    submissions: list[tuple[float, Op[str]]] = []
    for chat in chats:
        at = randomly.uniform(0, 5)
        for part in range(4):
            submissions.append((at, Send(chat, f"{chat}/{part}")))
        for version in range(5):
            submissions.append((at + version * 0.3, Edit(chat, f"{chat}-preview", f"v{version}")))
    holds: dict[str, float] = {}

    def answer(op: Op[str], attempt: int) -> float | None:
        if randomly.random() < 0.4:
            return float(randomly.randint(1, 30))
        return None

    attempts = simulate(Pacer(TELEGRAM_LIMITS), submissions, answer=answer, latency=0.05, groups=groups)

    check_limits(attempts, TELEGRAM_LIMITS, groups)
    assert sum(attempt.retry_after is not None for attempt in attempts) > 100, "the storm did storm"
    for attempt in attempts:
        chat = attempt.op.chat
        assert attempt.at >= holds.get(chat, -math.inf) - EPSILON, f"{attempt.op} went during its chat's hold"
        if attempt.retry_after is not None:
            holds[chat] = attempt.at + 0.05 + attempt.retry_after  # the 429 arrives after the latency
    delivered = [attempt.op for attempt in attempts if attempt.retry_after is None]
    sends = [op for op in delivered if isinstance(op, Send)]
    assert Counter(sends) == Counter(op for _, op in submissions if isinstance(op, Send)), "a send lost or repeated"
    for chat in chats:
        assert [op for op in sends if op.chat == chat] == [Send(chat, f"{chat}/{part}") for part in range(4)]
        edits = [op for op in delivered if isinstance(op, Edit) and op.chat == chat]
        assert edits and edits[-1] == Edit(chat, f"{chat}-preview", "v4"), "the preview ends on the last version"


def test_a_429_the_caller_knows_to_be_global_holds_every_chat() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    pacer.submit(Send("a", "1"), 0.0)
    pacer.submit(Send("b", "1"), 0.0)
    first, _ = pacer.next(0.0)
    assert first == Send("a", "1")
    pacer.retry_after(first, 4.0, 0.1, everything=True)
    assert pacer.next(0.1) == (None, pytest.approx(4.0))
    assert pacer.next(4.1) == (Send("a", "1"), 0.0)  # back first
    assert pacer.next(4.1) == (Send("b", "1"), 0.0)


def test_an_edit_repeating_the_message_a_send_made_is_dropped() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    pacer.submit(Send("a", "thinking…"), 0.0)
    op, _ = pacer.next(0.0)
    assert op == Send("a", "thinking…")
    pacer.done(op, 0.1, message_key="42")
    pacer.submit(Edit("a", "42", "thinking…"), 0.2)
    assert pacer.pending() == 0
    assert pacer.next(5.0) == (None, math.inf)


def test_after_a_failed_edit_the_same_edit_may_go_again() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    pacer.submit(Edit("a", "42", "v1"), 0.0)
    op, _ = pacer.next(0.0)
    assert op is not None
    pacer.done(op, 0.1, failed=True)
    pacer.submit(Edit("a", "42", "v1"), 0.2)
    assert pacer.next(1.0) == (Edit("a", "42", "v1"), 0.0)


def test_next_says_how_long_to_wait() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    assert pacer.next(0.0) == (None, math.inf)  # nothing to do: wait for a submit
    pacer.submit(Send("a", "1"), 0.0)
    pacer.submit(Send("a", "2"), 0.0)
    first, _ = pacer.next(0.0)
    assert first == Send("a", "1")
    assert pacer.next(0.5) == (None, math.inf)  # the chat's message is in flight: wait for done
    pacer.done(first, 0.25)
    assert pacer.next(0.5) == (None, 0.5)  # a second after the first went
    assert pacer.next(1.0) == (Send("a", "2"), 0.0)


@pytest.mark.parametrize(
    "bound",
    [
        pytest.param({"max_pending_per_chat": 3}, id="a chat's bound"),
        pytest.param({"max_pending": 3}, id="the bound of all chats"),
    ],
)
def test_a_send_over_the_bound_is_refused_with_an_error_never_dropped_unseen(bound: dict[str, int]) -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS, **bound)
    for n in range(3):
        pacer.submit(Send("a", str(n)), 0.0)
    with pytest.raises(OutboxFull, match="refused, not queued") as refused:
        pacer.submit(Send("a", "3"), 0.0)
    assert isinstance(refused.value, QueueFull)
    assert pacer.pending() == 3
    delivered = [op for _, op in handed_out(simulate(pacer, []))]
    assert delivered == [Send("a", str(n)) for n in range(3)]
    pacer.submit(Send("a", "3"), 100.0)  # room again once they went
    assert pacer.next(100.0) == (Send("a", "3"), 0.0)


def test_merging_an_edit_needs_no_room() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS, max_pending_per_chat=2)
    pacer.submit(Send("a", "x"), 0.0)
    pacer.submit(Edit("a", "m", "1"), 0.0)
    pacer.submit(Edit("a", "m", "2"), 0.0)  # merged into the pending one
    with pytest.raises(OutboxFull):
        pacer.submit(Delete("a", "n"), 0.0)
    assert pacer.pending("a") == 2


def test_done_for_an_operation_not_in_flight_is_a_misuse() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    pacer.submit(Send("a", "1"), 0.0)
    with pytest.raises(ProtocolMisuse, match="not the operation in flight"):
        pacer.done(Send("a", "1"), 0.0)


def test_memory_follows_the_active_chats() -> None:
    pacer: Pacer[str] = Pacer(TELEGRAM_LIMITS)
    simulate(pacer, [(0.0, Send(f"c{n}", "hi")) for n in range(100)])
    pacer.next(1000.0)
    assert pacer._chats == {}  # every chat's state went once its limits stopped binding


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"per_chat_interval": -1.0, "group_per_minute": 20, "global_per_second": 30}, "per_chat_interval"),
        ({"per_chat_interval": 1.0, "group_per_minute": 0, "global_per_second": 30}, "group_per_minute"),
        ({"per_chat_interval": 1.0, "group_per_minute": 20, "global_per_second": 0}, "global_per_second"),
        ({"per_chat_interval": 1.0, "group_per_minute": 20, "global_per_second": 0.5}, "whole number"),
        (
            {"per_chat_interval": 1.0, "group_per_minute": 20, "global_per_second": 0.5, "global_burst": 0},
            "global_burst",
        ),
    ],
)
def test_limits_that_cannot_hold_are_refused(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PaceLimits(**arguments)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the config's account-wide pace


def test_a_configured_account_wide_bucket_is_kept_and_used() -> None:
    limits = Pace(per_chat_secs=0, account_per_second=10, account_burst=3).applied_to(MATRIX_LIMITS)
    submissions: list[tuple[float, Op[str]]] = [(0.0, Send(f"room{n}", f"reply {n}")) for n in range(20)]
    attempts = simulate(Pacer(limits), submissions)
    check_limits(attempts, limits)
    times = [attempt.at for attempt in attempts]
    # The burst at once, then one each 0.1 s: 1.7 s for the 20, where Synapse's default pace takes 60.
    assert times[:3] == [0.0, 0.0, 0.0]
    assert times[-1] == pytest.approx(1.7)


def test_a_configured_account_wide_window_is_kept_and_used() -> None:
    limits = Pace(account_per_second=5).applied_to(TELEGRAM_LIMITS)
    submissions: list[tuple[float, Op[str]]] = [(0.0, Send(f"chat{n}", f"reply {n}")) for n in range(12)]
    attempts = simulate(Pacer(limits), submissions)
    check_limits(attempts, limits)
    times = [attempt.at for attempt in attempts]
    assert times == pytest.approx([0.0] * 5 + [1.2] * 5 + [2.4] * 2)  # 5 a window, its margin after each


def test_a_fraction_of_a_message_a_second_spaces_every_message_evenly_on_telegram() -> None:
    limits = Pace(account_per_second=0.5).applied_to(TELEGRAM_LIMITS)
    submissions: list[tuple[float, Op[str]]] = [(0.0, Send(f"chat{n}", f"reply {n}")) for n in range(4)]
    assert [attempt.at for attempt in simulate(Pacer(limits), submissions)] == pytest.approx([0.0, 2.0, 4.0, 6.0])
