"""agent-bridge: run any agent executable from a small YAML profile, one process per message.

import bridge

profile = bridge.load_profile("profiles/echo.yaml")
result = await bridge.run_turn(profile, bridge.Turn("hello"), on_partial=print)
print(result.reply)
"""

from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dialects import (
        ActivityEvent,
        ErrorEvent,
        FileEvent,
        Option,
        PartialEvent,
        PlanStep,
        Question,
        QuestionRequest,
        RequestWithdrawn,
        SessionEvent,
        Usage,
    )
    from .engine.launch import LaunchPlan, plan_launch
    from .engine.loop import HostEvent
    from .engine.result import Outcome, TurnResult
    from .engine.run import TurnStream, open_turn, run_turn, run_turn_sync
    from .errors import (
        AnswerRefused,
        BridgeError,
        DuplicateTurn,
        HostClosed,
        LaunchError,
        OutboxError,
        Problem,
        ProfileError,
        ProtocolMisuse,
        QueueFull,
        SessionIdRefused,
        StoreError,
        TurnError,
        TurnLockError,
        UnknownProfile,
    )
    from .host.interface import BaseHost, HostStats
    from .host.runtime import Host, open_host
    from .host.sqlite_store import SessionRecord, SessionStore
    from .permissions import Decision, PermissionRequest
    from .profile import Profile, json_schema, load_profile, parse_profile
    from .turn import Attachment, Turn

from .version import __version__ as __version__  # read by `--version`, and re-exported as before

# Every name loads on first use: `import bridge` costs nothing, and the `agent-bridge` command takes a
# conversation's place in its queue before the turn engine (trio, the dialects) is imported.
_WHERE = {
    **dict.fromkeys(
        (
            "ActivityEvent",
            "ErrorEvent",
            "FileEvent",
            "Option",
            "PartialEvent",
            "PlanStep",
            "Question",
            "QuestionRequest",
            "RequestWithdrawn",
            "SessionEvent",
            "Usage",
        ),
        "dialects",
    ),
    **dict.fromkeys(
        (
            "AnswerRefused",
            "BridgeError",
            "DuplicateTurn",
            "HostClosed",
            "LaunchError",
            "OutboxError",
            "Problem",
            "ProfileError",
            "ProtocolMisuse",
            "QueueFull",
            "SessionIdRefused",
            "StoreError",
            "TurnError",
            "TurnLockError",
            "UnknownProfile",
        ),
        "errors",
    ),
    **dict.fromkeys(("LaunchPlan", "plan_launch"), "engine.launch"),
    **dict.fromkeys(("Decision", "PermissionRequest"), "permissions"),
    **dict.fromkeys(("Profile", "json_schema", "load_profile", "parse_profile"), "profile"),
    **dict.fromkeys(("Outcome", "TurnResult"), "engine.result"),
    **dict.fromkeys(("TurnStream", "open_turn", "run_turn", "run_turn_sync"), "engine.run"),
    "HostEvent": "engine.loop",
    **dict.fromkeys(("Attachment", "Turn"), "turn"),
    # the host runtime's names, through `bridge.host`
    **dict.fromkeys(
        ("BaseHost", "Host", "HostStats", "open_host", "SessionRecord", "SessionStore"),
        "host",
    ),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(import_module(f".{module}", __name__), name)
    elif not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        value = import_module(f".{name}", __name__)  # `import bridge`, then `bridge.dialects.PROTOCOLS`
    else:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "ActivityEvent",
    "AnswerRefused",
    "Attachment",
    "BaseHost",
    "BridgeError",
    "Decision",
    "DuplicateTurn",
    "ErrorEvent",
    "FileEvent",
    "Host",
    "HostClosed",
    "HostEvent",
    "HostStats",
    "LaunchError",
    "LaunchPlan",
    "Option",
    "OutboxError",
    "Outcome",
    "PartialEvent",
    "PermissionRequest",
    "PlanStep",
    "Problem",
    "Profile",
    "ProfileError",
    "ProtocolMisuse",
    "Question",
    "QuestionRequest",
    "QueueFull",
    "RequestWithdrawn",
    "SessionEvent",
    "SessionIdRefused",
    "SessionRecord",
    "SessionStore",
    "StoreError",
    "Turn",
    "TurnError",
    "TurnLockError",
    "TurnResult",
    "TurnStream",
    "UnknownProfile",
    "Usage",
    "json_schema",
    "load_profile",
    "open_host",
    "open_turn",
    "parse_profile",
    "plan_launch",
    "run_turn",
    "run_turn_sync",
]
