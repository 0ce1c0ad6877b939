"""A fake Gemini API for Gemini CLI (`GOOGLE_GEMINI_BASE_URL`), with canned scenarios.

`POST /v1beta/models/<model>:streamGenerateContent?alt=sse` is answered with
server-sent `GenerateContentResponse` chunks, the last one with a
`finishReason` (without one gemini retries and repeats its text) and
`usageMetadata`; side calls (`:generateContent`, `:countTokens`) get a small
JSON answer. Scenarios:

- `text`: "Hello from the fake Gemini server." in four chunks;
- `tool`: "Let me run it." and a `run_shell_command` call (`echo hi`); the
  request that carries its `functionResponse` is answered "The tool said: <output>";
- `bad_request`: HTTP 400 (gemini does not retry it).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fake_api import Answer, Events, FakeApi, Json, Request

MODEL = "gemini-2.5-flash"
TEXT_PIECES = ["Hello", " from the", " fake Gemini", " server."]
TEXT_REPLY = "".join(TEXT_PIECES)
USAGE = {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120, "cachedContentTokenCount": 5}


def prompts(request: Request) -> list[str]:
    """The last text part of every user turn that has text, oldest first (the prompt is the last one's)."""
    texts = []
    for content in request.body.get("contents", []):
        parts = [part["text"] for part in content.get("parts", []) if isinstance(part.get("text"), str)]
        if content.get("role") == "user" and parts:
            texts.append(parts[-1])
    return texts


def function_response(request: Request) -> dict[str, Any] | None:
    """The functionResponse of the last turn, if it answers a tool call."""
    contents = request.body.get("contents") or []
    for part in contents[-1].get("parts", []) if contents else []:
        if "functionResponse" in part:
            return part["functionResponse"]
    return None


def chunks(parts: list[list[dict[str, Any]]]) -> Events:
    """One SSE chunk per list of parts; the last one finishes the response and carries the usage."""
    events: list[tuple[str | None, dict[str, Any]]] = []
    for index, chunk_parts in enumerate(parts):
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": chunk_parts}, "index": 0}
        chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL, "responseId": "fake-response"}
        if index == len(parts) - 1:
            candidate["finishReason"] = "STOP"
            chunk["usageMetadata"] = USAGE
        events.append((None, chunk))
    return Events(events)


def answer(scenario: str) -> Any:
    """The answer function of `scenario` for `FakeApi`."""

    def respond(request: Request) -> Answer:
        path = request.path.split("?")[0]
        if path.endswith(":countTokens"):
            return Json(200, {"totalTokens": 42})
        if path.endswith(":generateContent"):  # side calls: one whole JSON answer
            return Json(
                200,
                {
                    "candidates": [
                        {"content": {"role": "model", "parts": [{"text": "{}"}]}, "finishReason": "STOP", "index": 0}
                    ]
                },
            )
        if not path.endswith(":streamGenerateContent"):
            return Json(404, {"error": {"code": 404, "message": "unknown path", "status": "NOT_FOUND"}})
        if scenario == "bad_request":
            return Json(
                400,
                {
                    "error": {
                        "code": 400,
                        "message": "The fake server refuses this request.",
                        "status": "INVALID_ARGUMENT",
                    }
                },
            )
        if scenario == "tool":
            response = function_response(request)
            if response is not None:
                output = json.dumps(response.get("response"))
                return chunks([[{"text": "The tool said: "}], [{"text": output}]])
            return chunks(
                [
                    [{"text": "Let me run it."}],
                    [
                        {
                            "functionCall": {
                                "name": "run_shell_command",
                                "args": {"command": "echo hi", "description": "Say hi"},
                            }
                        }
                    ],
                ]
            )
        return chunks([[{"text": piece}] for piece in TEXT_PIECES])

    return respond


def fake_gemini(scenario: str = "text") -> FakeApi:
    """A server for `scenario` (start it with `with`); point Gemini CLI at it with `gemini_home` and `gemini_env`."""
    return FakeApi(answer(scenario))


def gemini_home(home: str) -> None:
    """Settings that let Gemini CLI run against the fake: an API key auth type (with the base URL in the
    environment gemini would pick an auth type its headless mode refuses), one attempt per request, and a
    model (the default, "auto", first asks a router model)."""
    os.makedirs(os.path.join(home, ".gemini"), exist_ok=True)
    with open(os.path.join(home, ".gemini", "settings.json"), "w") as out:
        json.dump(
            {
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "general": {"maxAttempts": 1},
                "model": {"name": MODEL},
            },
            out,
        )


def gemini_env(api: FakeApi, home: str) -> dict[str, str]:
    """The environment that runs Gemini CLI against `api` with nothing of the user's, and its temporary files
    (error reports, the shell tool's) under `home` rather than /tmp."""
    os.makedirs(os.path.join(home, "tmp"), exist_ok=True)
    return {
        "HOME": home,
        "TMPDIR": os.path.join(home, "tmp"),
        "GEMINI_API_KEY": "fake-key",
        "GOOGLE_GEMINI_BASE_URL": api.url,
        "GEMINI_CLI_NO_RELAUNCH": "true",  # no second node process: start-up halves
    }
