"""The agent's own questions (`QuestionRequest`): the answer's rules, how the turn loop asks, the terminal's prompt.

Pure and in-process: `check_answers` and `Questions`, and `TurnLoop` with a dialect that asks. Questions of the real
Claude Code and Codex, answered through serve, `Host` and the terminal, are in their CLIs' tests.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from conftest import PROFILES

import bridge
from bridge import AnswerRefused, Option, Question, QuestionRequest
from bridge.cli.terminal import chosen_labels as chosen
from bridge.dialects.events import ActivityEvent, PartialEvent, RequestWithdrawn
from bridge.engine.loop import TurnLoop
from bridge.engine.questions import DECLINED, NOBODY_ANSWERED, TURN_ENDED, Questions, check_answers
from bridge.engine.result import TurnRecorder
from bridge.permissions import PermissionPolicy

COLOUR = Question("colour", "Which colour?", (Option("Red", "warm"), Option("Blue", "cool")), header="Colour")
TOPPINGS = Question("toppings", "Which toppings?", (Option("Cheese"), Option("Ham")), multi_select=True)
NAME = Question("name", "Your name?", free_text=True)
REQUEST = QuestionRequest("q-1", (COLOUR, TOPPINGS, NAME), tool="AskUserQuestion")


def test_an_answer_maps_each_question_to_its_labels() -> None:
    answer = {"colour": "Blue", "toppings": ["Cheese", "Ham"], "name": "Ada"}
    assert check_answers(REQUEST, answer) == {"colour": ("Blue",), "toppings": ("Cheese", "Ham"), "name": ("Ada",)}


def test_a_plain_label_answers_a_request_of_one_question() -> None:
    assert check_answers(QuestionRequest("q", (COLOUR,)), "Red") == {"colour": ("Red",)}
    with pytest.raises(AnswerRefused, match="asked 3 questions: answer each by its id"):
        check_answers(REQUEST, "Red")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"size": "L"}, "no question with id 'size'"),
        ({"colour": "Green"}, "'Green' is not an option of question 'colour' \\(the options: Blue, Red\\)"),
        ({"colour": ["Red", "Blue"]}, "question 'colour' takes one answer, not 2"),
        ({"toppings": ["Cheese", "rm -rf /"]}, "'rm -rf /' is not an option of question 'toppings'"),
        ({"toppings": ["Cheese", "Ham", "Olives"]}, "'Olives' is not an option of question 'toppings'"),
        ({"colour": ""}, "must be a label or a list of labels"),
        ({"colour": 7}, "must be a label or a list of labels"),
        ({"name": "x" * 1501}, "longer than 1500 characters"),
        (["Red"], "an answer is an object"),
    ],
)
def test_an_answer_that_does_not_fit_is_refused_with_what_is_wrong(answer: Any, says: str) -> None:
    with pytest.raises(AnswerRefused, match=says):
        check_answers(REQUEST, answer)


async def test_a_multi_select_answer_with_a_label_not_offered_leaves_the_question_waiting() -> None:
    """What `Host.answer` and serve's `answer` do: every label is checked, the first as much as the last; a refused
    answer reaches no agent, and the question still takes one that fits."""
    questions = Questions()
    with questions.asking("q-1", 10, REQUEST) as question:
        for labels in (["Cheese", "rm -rf /"], ["rm -rf /", "Ham"]):
            with pytest.raises(AnswerRefused, match="'rm -rf /' is not an option of question 'toppings'"):
                questions.answer("q-1", {"colour": "Red", "toppings": labels})
            assert questions.waiting == ["q-1"] and question.answers is None
        assert questions.answer("q-1", {"colour": "Red", "toppings": ["Ham", "Cheese"]})
    assert question.answers == {"colour": ("Red",), "toppings": ("Ham", "Cheese")}


async def test_a_question_takes_answers_and_a_permission_takes_decisions_never_the_other() -> None:
    questions = Questions()
    with questions.asking("q-1", 10, REQUEST) as question, questions.asking("p-1", 10):
        assert not questions.decide("q-1", bridge.Decision(allow=True))
        assert not questions.answer("p-1", "Red")
        with pytest.raises(AnswerRefused):
            questions.answer("q-1", {"colour": "Green"})
        assert questions.waiting == ["q-1", "p-1"]  # a refused answer leaves the question open
        assert questions.answer("q-1", {"colour": "Red"})
        assert not questions.answer("q-1", {"colour": "Blue"})  # answered already
        await question.answer()
    assert (question.answers, question.why) == ({"colour": ("Red",)}, "")


async def test_a_declined_question_and_one_whose_turn_ended_say_why() -> None:
    questions = Questions()
    with questions.asking("q-1", 10, REQUEST) as declined:
        questions.answer("q-1", None)
    with questions.asking("q-2", 10, REQUEST) as ended:
        questions.close()
        await ended.answer()
    assert (declined.answers, declined.why) == (None, DECLINED)
    assert (ended.answers, ended.why) == (None, TURN_ENDED)


class AskingDialect:
    """Asks one question; remembers what the loop wrote back."""

    def __init__(self) -> None:
        self.answered: list[tuple[Any, str]] = []

    def feed(self, data: bytes) -> list[Any]:
        return [QuestionRequest("q-1", (COLOUR,), tool="AskUserQuestion")]

    def answer_question(self, request: QuestionRequest, answers: Any, why: str = "") -> bytes:
        self.answered.append((answers, why))
        return b"answer\n"


async def run_loop(emit: Any, questions: Questions, timeout_secs: float = 10) -> tuple[AskingDialect, list[bytes]]:
    profile = bridge.load_profile(PROFILES / "echo.yaml")
    dialect = AskingDialect()
    sent: list[bytes] = []
    policy = PermissionPolicy(timeout_secs=timeout_secs)
    loop = TurnLoop(dialect, TurnRecorder(profile), policy, emit, bridge.log.get_logger(), sent.append, questions)
    with trio.fail_after(5):
        await loop.on_output(b"")
    return dialect, sent


async def test_the_loop_asks_the_host_and_writes_its_answer() -> None:
    questions = Questions()
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)
        if isinstance(event, QuestionRequest):
            assert questions.answer(event.request_id, "Blue")

    dialect, sent = await run_loop(emit, questions)
    assert dialect.answered == [({"colour": ("Blue",)}, "")] and sent == [b"answer\n"]
    assert [type(event).__name__ for event in seen] == ["QuestionRequest", "ActivityEvent"]
    assert seen[1] == ActivityEvent("tool", tool="AskUserQuestion", status="answered", call_id="q-1")


async def test_a_question_nobody_answers_in_time_is_declined() -> None:
    async def emit(event: Any) -> None:
        pass

    dialect, _ = await run_loop(emit, Questions(), timeout_secs=0.05)
    assert dialect.answered == [(None, NOBODY_ANSWERED)]


async def test_a_question_nobody_hears_is_declined_at_once() -> None:
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)

    dialect, _ = await run_loop(emit, Questions(hears_questions=False))
    assert dialect.answered == [(None, "nobody is there to answer")]
    assert seen == [ActivityEvent("tool", tool="AskUserQuestion", status="declined", call_id="q-1")]


def test_the_terminal_takes_option_numbers_or_the_persons_own_words() -> None:
    assert chosen(COLOUR, "2") == ["Blue"]
    assert chosen(COLOUR, "Blue") is None  # a label is typed as its number
    assert chosen(COLOUR, "3") is None
    assert chosen(TOPPINGS, "1, 2") == ["Cheese", "Ham"]
    assert chosen(COLOUR, "1, 2") is None
    assert chosen(NAME, "Ada") == ["Ada"]


class WithdrawingDialect(AskingDialect):
    """Asks one question on b"ask"; b"withdraw" withdraws it, b"later" is a partial, b"both" asks and withdraws,
    b"two" asks two questions at once, b"withdraw second" withdraws the second."""

    def feed(self, data: bytes) -> list[Any]:
        asked = QuestionRequest("q-1", (COLOUR,), tool="AskUserQuestion")
        return {
            b"ask": [asked],
            b"withdraw": [RequestWithdrawn("q-1")],
            b"later": [PartialEvent("later")],
            b"both": [asked, RequestWithdrawn("q-1")],
            b"two": [asked, QuestionRequest("q-2", (COLOUR,), tool="AskUserQuestion")],
            b"withdraw second": [RequestWithdrawn("q-2")],
        }[data]


async def run_reading_loop(
    emit: Any, questions: Questions, first: bytes, *then: bytes
) -> tuple[WithdrawingDialect, list[bytes]]:
    """The loop fed `first`, reading `then` (one chunk a read, then nothing more) while a question waits."""
    profile = bridge.load_profile(PROFILES / "echo.yaml")
    dialect = WithdrawingDialect()
    sent: list[bytes] = []
    chunks = list(then)

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    loop = TurnLoop(
        dialect, TurnRecorder(profile), PermissionPolicy(), emit, bridge.log.get_logger(), sent.append, questions, read
    )
    with trio.fail_after(5):
        await loop.on_output(first)
    return dialect, sent


async def test_a_question_the_agent_withdraws_while_the_host_decides_is_closed_and_never_answered() -> None:
    questions = Questions()
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)  # the host decides, and does not answer in time

    dialect, sent = await run_reading_loop(emit, questions, b"ask", b"withdraw")
    assert seen == [QuestionRequest("q-1", (COLOUR,), tool="AskUserQuestion"), RequestWithdrawn("q-1")]
    assert dialect.answered == [] and sent == []
    assert questions.answer("q-1", "Red") is False  # serve: unknown_request
    assert questions.was_withdrawn("q-1")


async def test_a_request_withdrawn_in_the_batch_that_asks_it_is_never_put_to_the_host() -> None:
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)

    dialect, sent = await run_reading_loop(emit, Questions(), b"both")
    assert seen == [] and dialect.answered == [] and sent == []


async def test_what_the_agent_says_while_a_question_waits_reaches_the_host_after_the_answer_in_order() -> None:
    questions = Questions()
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)
        if isinstance(event, QuestionRequest):
            await trio.testing.wait_all_tasks_blocked()  # the loop has read what the agent said meanwhile
            assert questions.answer(event.request_id, "Red")

    dialect, sent = await run_reading_loop(emit, questions, b"ask", b"later")
    assert dialect.answered == [({"colour": ("Red",)}, "")] and sent == [b"answer\n"]
    assert [type(event).__name__ for event in seen] == ["QuestionRequest", "ActivityEvent", "PartialEvent"]


async def test_a_request_withdrawn_while_an_earlier_one_waits_is_never_put_to_the_host() -> None:
    seen: list[Any] = []

    async def emit(event: Any) -> None:
        seen.append(event)

    dialect, sent = await run_reading_loop(emit, Questions(), b"two", b"withdraw second", b"withdraw")
    assert seen == [QuestionRequest("q-1", (COLOUR,), tool="AskUserQuestion"), RequestWithdrawn("q-1")]
    assert dialect.answered == [] and sent == []
