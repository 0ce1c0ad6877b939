"""`agent-bridge connect`: the chat platforms a config names, served over one host, until SIGTERM or SIGINT.

Each configured platform (`telegram:`, `matrix:`) gets its connector and a `ChatBridge`
(`bridge.chat.runtime`) over the same host: `--profiles` (with `--state`), or a gateway to the fleet's
workers (`--postgres`, `--name`). The chat store (`bridge.chat.inbox`) is a file beside the session store;
each bot is locked to this process (`bridge.chat.botlock`) before anything polls.

The first signal stops polling and lets the turns in flight finish (for `--shutdown-grace` seconds, then
they are cancelled); a second cancels them at once. An update stored but not answered, or answered but not
delivered, is taken up by the next `connect`.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..engine.run import ungrouped
from ..errors import ChatError
from ..host.location import store_path
from ..host.runtime import DEFAULT_SHUTDOWN_GRACE, open_host
from ..log import get_logger

if TYPE_CHECKING:  # the chat kit loads only when connect runs
    from ..chat.botlock import BotLock
    from ..chat.config import MatrixConfig, TelegramConfig
    from ..chat.inbox import Inbox
    from ..chat.runtime import ChatBridge, ChatSettings
    from ..host.interface import BaseHost
    from ..network.worker_metrics import WorkerMetrics

# The connectors, by the config's section name: module and class (each `Class(section, client_factory)`).
CONNECTORS = {
    "telegram": ("bridge.chat.telegram", "TelegramPlatform"),
    "matrix": ("bridge.chat.matrix", "MatrixPlatform"),
}


def require_chat_extra() -> None:
    """The chat extra's libraries, or one line saying how to install them."""
    missing = [name for name in ("httpx", "markdown_it") if find_spec(name) is None]
    if missing:
        raise ChatError(
            f"agent-bridge connect needs the chat extra ({', '.join(missing)} missing): "
            "pip install 'agent-bridge[chat]'"
        )


def chat_store_path(state: str | None, postgres: str | None, name: str) -> Path:
    """The chat store's file: beside `--state`'s file (`<state>.chat`); for a gateway, or a PostgreSQL `--state`,
    in the default state directory, named by the gateway's name."""
    if postgres is not None or (state is not None and state.startswith(("postgresql://", "postgres://"))):
        return store_path(None).with_name(f"chat-{name}.sqlite3")
    sessions = store_path(state)
    return sessions.with_name(sessions.name + ".chat")


def bot_identity(section: TelegramConfig | MatrixConfig) -> str:
    """What makes two configs the same bot: the Telegram token, the Matrix account."""
    from ..chat.config import TelegramConfig

    if isinstance(section, TelegramConfig):
        return section.token.get_secret_value() if section.token is not None else ""
    return f"{section.homeserver}\0{section.user_id}"


def settings_of(section: TelegramConfig | MatrixConfig) -> ChatSettings:
    """The runtime's settings from a config section."""
    from ..chat.runtime import ChatSettings

    return ChatSettings(
        profile=section.profile,
        profiles=tuple(section.profiles or (section.profile,)),
        allow_users=frozenset(str(user) for user in section.allow_users),
        answer_in_groups=section.groups.answer,
        turns_per_day=section.budget.turns_per_day,
        cost_usd_per_day=section.budget.cost_usd_per_day,
    )


def run_connect(
    config_path: str,
    profiles: str | None,
    *,
    state: str | None = None,
    postgres: str | None = None,
    name: str = "connect",
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    client_factory: Callable[[], Any] | None = None,
    metrics: str | None = None,
    metrics_tokens: str | None = None,
) -> int:
    """`agent-bridge connect`; returns the exit code (0 after a graceful shutdown). A config, profiles directory,
    store, bot lock or `--metrics` address that cannot be used raises a `BridgeError` before anything polls."""
    require_chat_extra()
    door = _metrics_door(metrics, metrics_tokens)
    from ..chat.botlock import BotLock, lock_path
    from ..chat.http_transport import chat_http_client
    from ..chat.inbox import Inbox

    sections = _platform_sections(config_path, profiles)
    chat_store = chat_store_path(state, postgres, name)
    locks = [
        BotLock(lock_path(chat_store.parent, platform, bot_identity(section)), platform)
        for platform, section in sections
    ]
    factory = client_factory or chat_http_client
    platforms = [
        (getattr(import_module(CONNECTORS[platform][0]), CONNECTORS[platform][1]), section)
        for platform, section in sections
    ]
    with _all_held(locks):
        inbox = Inbox(chat_store)
        try:
            _claim_store(inbox, chat_store, sections)
            new_host = partial(
                open_host, profiles, state=state, postgres=postgres, gateway_name=name, shutdown_grace=shutdown_grace
            )
            with ungrouped():  # a BridgeError (a refused token, a 409) reaches the CLI as itself
                return trio.run(_run_bots, new_host, platforms, factory, inbox, door, shutdown_grace)
        finally:
            inbox.close()


def _claim_store(inbox: Inbox, path: Path, sections: list[tuple[str, TelegramConfig | MatrixConfig]]) -> None:
    """The chat store is one bot's on each platform: another's would take its position (confirming, so losing, what is
    pending) and its unanswered updates, and share its conversations' sessions."""
    for platform, section in sections:
        owner = inbox.claim(platform, _store_owner(section))
        if owner is not None:
            raise ChatError(
                f"the chat store {path} belongs to another {platform} bot ({owner}): give this bot a --state of "
                "its own (or --name, with --postgres); its sessions are kept beside it"
            )


def _store_owner(section: TelegramConfig | MatrixConfig) -> str:
    """Which bot a chat store serves, unchanged by a new token for the same bot: the Telegram bot's id (the token's
    part before its colon, not secret), the Matrix account."""
    from ..chat.config import TelegramConfig

    if isinstance(section, TelegramConfig):
        token = section.token.get_secret_value() if section.token is not None else ""
        return f"bot id {token.partition(':')[0]}"
    return section.user_id


def _platform_sections(config_path: str, profiles: str | None) -> list[tuple[str, TelegramConfig | MatrixConfig]]:
    """The config's platform sections, checked against the profiles directory's profiles when there is one."""
    from ..chat.config import load_chat_config

    known = None
    if profiles is not None:
        from ..host.registry import ProfileRegistry

        known = sorted(ProfileRegistry(profiles).loaded())
    config = load_chat_config(config_path, known_profiles=known)
    sections: list[tuple[str, TelegramConfig | MatrixConfig]] = [
        (platform, section) for platform in CONNECTORS if (section := getattr(config, platform)) is not None
    ]
    if not sections:
        raise ChatError(f"{config_path} names no platform: add a telegram: or matrix: section (docs/chat.md)")
    return sections


@contextmanager
def _all_held(locks: list[BotLock]) -> Iterator[None]:
    """Every bot's lock held while the block runs (`PlatformConflict` when another process holds one)."""
    held: list[BotLock] = []
    try:
        for lock in locks:
            lock.acquire()
            held.append(lock)
        yield
    finally:
        for lock in held:
            lock.release()


async def _run_bots(
    new_host: Callable[[], BaseHost],
    connectors: list[tuple[Any, TelegramConfig | MatrixConfig]],
    factory: Callable[[], Any],
    inbox: Inbox,
    door: WorkerMetrics | None,
    shutdown_grace: float,
) -> int:
    """Each platform's bot over one host, until a signal stops them (gracefully, within `shutdown_grace`)."""
    from ..chat.runtime import ChatBridge
    from ..confinement.orphans import become_subreaper, sweep_orphans_on_sigchld

    become_subreaper()
    platforms = [(connector(section, factory), section) for connector, section in connectors]
    host = new_host()
    async with host, trio.open_nursery() as system:
        await system.start(sweep_orphans_on_sigchld)
        bridges = [ChatBridge(host, platform, settings_of(section), inbox) for platform, section in platforms]
        if door is not None:
            from ..chat.metrics import ChatCollector

            host.observer = door.metrics
            door.metrics.registry.register(ChatCollector(bridges))
            await system.start(door.serve, host)
        await system.start(_stop_on_signals, bridges, host, shutdown_grace)
        try:
            async with trio.open_nursery() as bots:
                for bridge in bridges:
                    bots.start_soon(bridge.run)
        finally:
            with trio.CancelScope(shield=True):
                for platform, _ in platforms:
                    await platform.aclose()
        system.cancel_scope.cancel()
    get_logger(component="connect").info("connect stopped")
    return 0


def _metrics_door(listen: str | None, tokens_file: str | None) -> WorkerMetrics | None:
    """`--metrics HOST:PORT` (with `--metrics-tokens FILE`): the server of /metrics, /healthz and /readyz, as a
    worker's (docs/metrics.md); checked before anything starts."""
    if listen is None:
        if tokens_file is not None:
            raise ChatError("--metrics-tokens is an option of --metrics: add --metrics HOST:PORT")
        return None
    from ..network.extra import require_http_extra

    require_http_extra("--metrics")  # before worker_metrics, which imports the extra's libraries
    from ..network.worker_metrics import worker_metrics

    return worker_metrics(listen, tokens_file, program="connect")


async def _stop_on_signals(
    bridges: list[ChatBridge],
    host: BaseHost,
    grace: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """SIGTERM or SIGINT: stop polling and let the turns in flight finish for `grace` seconds, then cancel them;
    a second signal cancels them at once."""
    log = get_logger(component="connect")
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log.info("signal received; shutting down", signal=signal.Signals(signum).name)
            for bridge in bridges:
                bridge.stop()
            with trio.move_on_after(grace):
                async for _ in signals:
                    break
            host.cancel_all()
            return


def check_connect_options(profiles: str | None, postgres: str | None) -> str | None:
    """What is wrong with the options, or None."""
    if profiles is None and postgres is None:
        return "connect needs --profiles DIR (or --postgres DSN, to run the turns on the fleet's workers)"
    return None


__all__ = ["CONNECTORS", "chat_store_path", "run_connect"]


def connect_command(args: argparse.Namespace) -> int:
    if problem := check_connect_options(args.profiles, args.postgres):
        args.command_parser.error(problem)
    options: dict[str, Any] = {"shutdown_grace": args.shutdown_grace} if args.shutdown_grace is not None else {}
    options.update(metrics=args.metrics, metrics_tokens=args.metrics_tokens)
    return run_connect(args.config, args.profiles, state=args.state, postgres=args.postgres, name=args.name, **options)
