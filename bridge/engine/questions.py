"""The questions of one turn that wait for the host: permission to run a tool, and the agent's own questions.

The turn engine asks (`asking`: the question is open, the host is told, the
answer awaited); the host answers by request id: a permission with `decide`
(`TurnStream.decide`, `Host.decide`, serve's `decide` request, chat's y/n
prompt), a `QuestionRequest` with `answer` (`TurnStream.answer`,
`Host.answer`, serve's `answer` request, chat's numbered options). Nothing
waits for ever: a question nobody answers within the profile's
`permissions.timeout_secs` is answered deny, or declined; when the turn ends
(the agent exited, timed out, was cancelled) every question still open — and
whatever the host was doing to answer it — is answered as cancelled. A
question the agent withdraws (`withdraw`) is closed at once: the agent is
sent no answer, and an answer the host gives later is refused as for a
question that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

import trio

from ..dialects.events import QuestionRequest
from ..dialects.warm import Answers
from ..errors import AnswerRefused
from ..permissions import CANCELLED, UNANSWERED, Decision

Kind = Literal["permission", "question"]
# A host's answer to a `QuestionRequest`: question id → labels (or one label; a plain string for a request of one
# question); None declines.
QuestionAnswer = Mapping[str, str | Sequence[str]] | str | None
# Why a question got no answer, as the agent is told.
NOBODY_ANSWERED = "nobody answered in time"
TURN_ENDED = "the turn was cancelled"
DECLINED = "the user declined to answer"
WITHDRAWN = "the agent withdrew the question"
# An answer's text, all questions together: a chat message's worth, and what a PostgreSQL NOTIFY carries to a worker.
MAX_ANSWER_CHARS = 1500


class OpenQuestion:
    """One open question: `decision` (a permission) or `answers` (a question) once answered."""

    __slots__ = ("kind", "request", "scope", "answered", "settled", "decision", "answers", "why", "withdrawn")

    def __init__(self, kind: Kind, timeout_secs: float, request: QuestionRequest | None = None) -> None:
        self.kind = kind
        self.request = request  # the question asked, to check an answer against
        self.scope = trio.CancelScope(deadline=trio.current_time() + timeout_secs)
        self.answered = trio.Event()
        self.settled = trio.Event()  # the question is closed: answered, timed out, or its turn ended
        self.decision: Decision | None = None
        self.answers: Answers | None = None
        self.why = NOBODY_ANSWERED  # why `answers` is None, once the question is closed
        self.withdrawn = False  # the agent withdrew it: it takes no answer

    async def answer(self) -> None:
        """Wait until the host answers (the `asking` block's deadline bounds it)."""
        await self.answered.wait()


class Questions:
    """Open questions by request id; one object per turn, shared by the engine and whoever answers."""

    __slots__ = ("_open", "_closed", "_withdrawn", "listening", "hears_questions")

    def __init__(self, *, listening: bool = True, hears_questions: bool | None = None) -> None:
        self._open: dict[str, OpenQuestion] = {}
        self._closed = False
        self._withdrawn: set[str] = set()  # the requests the agent withdrew
        self.listening = listening  # False: nobody hears the permission requests, so each is denied at once
        # False: nobody sees the agent's questions (a host with on_permission alone), so each is declined at once
        self.hears_questions = listening if hears_questions is None else hears_questions

    @property
    def waiting(self) -> list[str]:
        """The request ids that wait for an answer now."""
        return list(self._open)

    @contextmanager
    def asking(
        self, request_id: str, timeout_secs: float, question_asked: QuestionRequest | None = None
    ) -> Iterator[OpenQuestion]:
        """While the block runs, `request_id` is open: `decide` answers it (`answer`, when it is `question_asked`).
        Leaving it closes the question.

        The block is cancelled at the deadline, or when the turn ends (`close`);
        afterwards `result(question)` is the answer, deny or cancelled (for a
        question: `answers`, None with `why` when it got none).
        """
        question = OpenQuestion("question" if question_asked else "permission", timeout_secs, question_asked)
        if self._closed:
            question.decision = CANCELLED
            question.why = TURN_ENDED
            question.scope.cancel()
        else:
            self._open[request_id] = question
        try:
            with question.scope:
                yield question
        finally:
            if self._open.get(request_id) is question:
                del self._open[request_id]
            question.settled.set()

    async def settled(self, request_id: str) -> None:
        """Return once `request_id` waits for no answer: answered, unanswered in time, or its turn ended."""
        question = self._open.get(request_id)
        if question is not None:
            await question.settled.wait()

    @staticmethod
    def result(question: OpenQuestion) -> Decision:
        return question.decision if question.decision is not None else UNANSWERED

    def decide(self, request_id: str, decision: Decision) -> bool:
        """Answer an open permission request; False when `request_id` waits for no such answer (unknown, a
        question, or answered already)."""
        question = self._open.get(request_id)
        if question is None or question.kind != "permission":
            return False
        del self._open[request_id]
        question.decision = decision
        question.answered.set()
        return True

    def answer(self, request_id: str, answer: QuestionAnswer) -> bool:
        """Answer an open question (`check_answers` says whether `answer` fits it: `AnswerRefused` when not), or
        decline it (None); False when `request_id` waits for no such answer."""
        question = self._open.get(request_id)
        if question is None or question.request is None:
            return False
        checked = check_answers(question.request, answer) if answer is not None else None
        self._settle(request_id, checked, DECLINED if checked is None else "")
        return True

    def withdraw(self, request_id: str) -> bool:
        """The agent withdrew `request_id`: it is closed with no answer, and whatever the host was doing to answer it
        is cancelled. False when it was not open."""
        question = self._open.pop(request_id, None)
        if question is None:
            return False
        self._withdrawn.add(request_id)
        question.withdrawn = True
        question.why = WITHDRAWN
        question.answered.set()
        question.scope.cancel()
        return True

    def was_withdrawn(self, request_id: str) -> bool:
        """The agent withdrew `request_id` before it was answered."""
        return request_id in self._withdrawn

    def _settle(self, request_id: str, answers: Answers | None, why: str) -> None:
        question = self._open.pop(request_id)
        question.answers = answers
        question.why = why
        question.answered.set()

    def close(self) -> None:
        """The turn is over: every open question is answered as cancelled, and no new one will wait."""
        self._closed = True
        for request_id, question in list(self._open.items()):
            if question.kind == "permission":
                self.decide(request_id, CANCELLED)
            else:
                self._settle(request_id, None, TURN_ENDED)
            question.scope.cancel()


def check_answers(request: QuestionRequest, answers: Mapping[str, str | Sequence[str]] | str) -> Answers:
    """The host's answer to `request` in the one shape dialects take: question id → labels (or own words).

    A plain string answers a request of one question. Each label must be one of
    the question's options unless it takes the user's own words (`free_text`),
    and a question that is not `multi_select` takes one. A question left out is
    answered with nothing. `AnswerRefused` says what does not fit.
    """
    if isinstance(answers, str):
        if len(request.questions) != 1:
            raise AnswerRefused(
                f"the agent asked {len(request.questions)} questions: answer each by its id "
                f"({', '.join(question.id for question in request.questions)})"
            )
        answers = {request.questions[0].id: answers}
    if not isinstance(answers, Mapping):
        raise AnswerRefused("an answer is an object: each question's id → the labels chosen (or a single label)")
    known = {question.id: question for question in request.questions}
    checked: dict[str, tuple[str, ...]] = {}
    for question_id, given in answers.items():
        question = known.get(question_id) if isinstance(question_id, str) else None
        if question is None:
            raise AnswerRefused(f"the agent asked no question with id {str(question_id)[:80]!r}")
        labels = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, (list, tuple)) else None
        if labels is None or not all(isinstance(label, str) and label for label in labels):
            raise AnswerRefused(f"the answer to {question_id!r} must be a label or a list of labels (non-empty text)")
        if len(labels) > 1 and not question.multi_select:
            raise AnswerRefused(f"question {question_id!r} takes one answer, not {len(labels)}")
        offered = {option.label for option in question.options}
        if not question.free_text and (strange := [label for label in labels if label not in offered]):
            raise AnswerRefused(
                f"{strange[0][:80]!r} is not an option of question {question_id!r} "
                f"(the options: {', '.join(sorted(offered)) or 'none'})"
            )
        checked[question_id] = labels
    if sum(len(label) for labels in checked.values() for label in labels) > MAX_ANSWER_CHARS:
        raise AnswerRefused(f"the answer is longer than {MAX_ANSWER_CHARS} characters; shorten it")
    return checked
