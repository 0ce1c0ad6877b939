"""`agent-bridge init`: a starter agent and its profile written, and the command that runs them."""

from __future__ import annotations

import argparse


def init_command(args: argparse.Namespace) -> int:
    import shlex

    from .starter import write_starter

    written = write_starter(args.name, lang=args.lang, directory=args.dir)
    for path in written:
        print(f"wrote {path}")
    profile = written[-1]
    print(
        f'next: agent-bridge run {shlex.quote(str(profile))} "hello"   (or: agent-bridge chat '
        f"{shlex.quote(str(profile))})"
    )
    return 0
