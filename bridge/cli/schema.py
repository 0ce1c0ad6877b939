"""`agent-bridge schema`: the JSON Schema of a profile or of a chat config, for editors."""

from __future__ import annotations

import argparse
import json

from ..profile import json_schema


def schema_command(args: argparse.Namespace) -> int:
    if args.of == "chat":
        from ..chat.config import chat_json_schema

        print(json.dumps(chat_json_schema(), indent=2, ensure_ascii=False))
        return 0
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0
