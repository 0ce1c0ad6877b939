"""The questions of one turn that wait for the host: an agent asked to run a tool and the profile said ask.

The turn engine asks (`asking`: the question is open, the host is told, the
answer awaited); the host answers by request id (`decide` — `TurnStream.decide`,
`Host.decide`, serve's `decide` request, chat's y/n prompt). Nothing waits
for ever: a question nobody answers within the profile's
`permissions.timeout_secs` is answered deny, and when the turn ends (the
agent exited, timed out, was cancelled) every question still open — and
whatever the host was doing to answer it — is answered as cancelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from .permissions import CANCELLED, UNANSWERED, Decision


class Question:
    """One open question: `decision` once answered."""

    __slots__ = ("scope", "answered", "settled", "decision")

    def __init__(self, timeout_secs: float) -> None:
        self.scope = trio.CancelScope(deadline=trio.current_time() + timeout_secs)
        self.answered = trio.Event()
        self.settled = trio.Event()  # the question is closed: answered, timed out, or its turn ended
        self.decision: Decision | None = None

    async def answer(self) -> None:
        """Wait until the host answers (the `asking` block's deadline bounds it)."""
        await self.answered.wait()


class Questions:
    """Open questions by request id; one object per turn, shared by the engine and whoever answers."""

    __slots__ = ("_open", "_closed", "listening")

    def __init__(self, *, listening: bool = True) -> None:
        self._open: dict[str, Question] = {}
        self._closed = False
        self.listening = listening  # False: nobody hears the questions, so each is denied at once

    @property
    def waiting(self) -> list[str]:
        """The request ids that wait for an answer now."""
        return list(self._open)

    @contextmanager
    def asking(self, request_id: str, timeout_secs: float) -> Iterator[Question]:
        """While the block runs, `request_id` is open: `decide` answers it. Leaving it closes the question.

        The block is cancelled at the deadline, or when the turn ends (`close`);
        afterwards `result(question)` is the answer, deny or cancelled.
        """
        question = Question(timeout_secs)
        if self._closed:
            question.decision = CANCELLED
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
    def result(question: Question) -> Decision:
        return question.decision if question.decision is not None else UNANSWERED

    def decide(self, request_id: str, decision: Decision) -> bool:
        """Answer an open question; False when `request_id` waits for nothing (unknown, or answered already)."""
        question = self._open.pop(request_id, None)
        if question is None:
            return False
        question.decision = decision
        question.answered.set()
        return True

    def close(self) -> None:
        """The turn is over: every open question is answered as cancelled, and no new one will wait."""
        self._closed = True
        for request_id, question in list(self._open.items()):
            self.decide(request_id, CANCELLED)
            question.scope.cancel()
