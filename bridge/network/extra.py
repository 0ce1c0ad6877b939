"""Whether the `http` extra (hypercorn, Starlette, prometheus-client) is installed.

Kept apart from the modules that import those libraries, so that `serve --listen` and `worker --metrics` can say
which extra to install before anything imports them.
"""

from __future__ import annotations

from ..errors import ListenError

HTTP_EXTRA_HINT = (
    "install the network door's libraries: pip install 'agent-bridge[http]' "
    "(in a checkout of agent-bridge: make install EXTRAS=http)"
)


def require_http_extra(option: str = "--listen") -> None:
    """Raise `ListenError` naming `option`, the missing library and the command that installs it."""
    try:
        import hypercorn  # noqa: F401
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as err:
        raise ListenError(f"{option} needs {err.name}, which is not installed: {HTTP_EXTRA_HINT}") from None
