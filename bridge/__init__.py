"""agent-bridge: run any agent executable from a small YAML profile, one process per message.

    import bridge

    profile = bridge.load_profile("profiles/echo.yaml")
    result = await bridge.run_turn(profile, bridge.Turn("hello"), on_partial=print)
    print(result.reply)
"""

from typing import TYPE_CHECKING, Any

from .dialects import ActivityEvent, ErrorEvent, PartialEvent, PlanStep, SessionEvent, Usage
from .errors import BridgeError, LaunchError, Problem, ProfileError, TurnError
from .launch import LaunchPlan, plan_launch
from .permissions import Decision, PermissionRequest
from .profile import Profile, json_schema, load_profile, parse_profile
from .result import Outcome, TurnResult
from .runner import TurnStream, open_turn, run_turn, run_turn_sync
from .supervisor import HostEvent
from .turn import Attachment, Turn

if TYPE_CHECKING:
    from .host.registry import UnknownProfile
    from .host.runtime import DuplicateTurn, Host, HostClosed, HostStats, SessionIdRefused, open_host
    from .host.scheduler import QueueFull
    from .host.store import SessionRecord, SessionStore, StoreError
    from .host.turnlock import TurnLockError

__version__ = "0.1.0"

_HOST_NAMES = frozenset({"DuplicateTurn", "Host", "HostClosed", "HostStats", "open_host", "QueueFull",
                         "UnknownProfile", "SessionIdRefused",
    "Usage", "SessionRecord", "SessionStore", "StoreError", "TurnLockError"})


def __getattr__(name: str) -> Any:
    """The host runtime's names, loaded on first use (by `bridge.host`), so `run`, `check` and `schema`
    never pay for importing it."""
    if name not in _HOST_NAMES:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    from . import host

    value = getattr(host, name)
    globals()[name] = value
    return value


__all__ = [
    "ActivityEvent",
    "Attachment",
    "BridgeError",
    "Decision",
    "DuplicateTurn",
    "ErrorEvent",
    "Host",
    "HostClosed",
    "HostEvent",
    "HostStats",
    "LaunchError",
    "LaunchPlan",
    "Outcome",
    "PartialEvent",
    "PermissionRequest",
    "PlanStep",
    "Problem",
    "Profile",
    "ProfileError",
    "QueueFull",
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
