"""agent-bridge: run any agent executable from a small YAML profile, one process per message.

    import bridge

    profile = bridge.load_profile("profiles/echo.yaml")
    result = await bridge.run_turn(profile, bridge.Turn("hello"), on_partial=print)
    print(result.reply)
"""

from .errors import BridgeError, LaunchError, Problem, ProfileError, TurnError
from .launch import LaunchPlan, plan_launch
from .profile import Profile, json_schema, load_profile, parse_profile
from .protocol import ErrorEvent, PartialEvent, SessionEvent
from .result import Outcome, TurnResult
from .runner import TurnStream, open_turn, run_turn, run_turn_sync
from .supervisor import HostEvent
from .turn import Attachment, Turn

__version__ = "0.1.0"

__all__ = [
    "Attachment",
    "BridgeError",
    "ErrorEvent",
    "HostEvent",
    "LaunchError",
    "LaunchPlan",
    "Outcome",
    "PartialEvent",
    "Problem",
    "Profile",
    "ProfileError",
    "SessionEvent",
    "Turn",
    "TurnError",
    "TurnResult",
    "TurnStream",
    "json_schema",
    "load_profile",
    "open_turn",
    "parse_profile",
    "plan_launch",
    "run_turn",
    "run_turn_sync",
]
