"""The exception tree: every exception class of the package is defined in bridge/errors.py and derives from
BridgeError, its docstring draws them all, and each stays importable from where users import it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import bridge
import bridge.errors
import bridge.host

PACKAGE = Path(bridge.__file__).parent
# Private control-flow signals that never reach a user, with where they are caught.
PRIVATE_SIGNALS = {
    "bridge.cli.options.CommandStopped",  # a BaseException like KeyboardInterrupt: a signal ends `run`; main() catches it
}


def package_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(bridge.__path__, "bridge.")
        if info.name != "bridge.__main__"  # runs the command line when imported
    )


def exception_classes() -> list[type[BaseException]]:
    found = []
    for name in package_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                found.append(value)
    return found


def test_every_exception_class_is_defined_in_errors_and_derives_from_bridge_error() -> None:
    classes = exception_classes()
    assert len(classes) > 15  # the walk found the package's modules
    astray = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if f"{cls.__module__}.{cls.__qualname__}" not in PRIVATE_SIGNALS
        and (cls.__module__ != "bridge.errors" or not issubclass(cls, bridge.BridgeError))
    ]
    assert not astray, f"define these in bridge/errors.py, under BridgeError: {astray}"


def test_no_exception_class_is_defined_inside_a_function_or_class() -> None:
    nested = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top:
                bases = {ast.unparse(base) for base in node.bases}
                if any(base.endswith(("Error", "Exception", "Refused", "Misuse")) for base in bases):
                    nested.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert not nested


def drawn_tree() -> dict[str, str]:
    """Each class errors.py's docstring draws, with the class it is drawn under."""
    doc = bridge.errors.__doc__ or ""
    parents: dict[str, str] = {}
    path = ["BridgeError"]  # the classes above the current line, one per depth
    for line in doc[doc.index("    BridgeError\n") :].splitlines()[1:]:
        if "── " not in line:
            break
        depth = line.index("── ") // 4  # "├── " at depth 1, "│   └── " at depth 2…
        name = line[line.index("── ") + 3 :].split()[0]
        del path[depth:]
        parents[name] = path[-1]
        path.append(name)
    return parents


def test_the_errors_docstring_draws_every_class_under_its_parent() -> None:
    drawn = drawn_tree()
    for name, value in vars(bridge.errors).items():
        if not (inspect.isclass(value) and issubclass(value, BaseException)) or value is bridge.BridgeError:
            continue
        assert name in drawn, f"errors.py's docstring does not draw {name}"
        parent = next(base for base in value.__bases__ if issubclass(base, bridge.BridgeError))
        assert drawn[name] == parent.__name__, f"{name} is drawn under {drawn[name]}, not {parent.__name__}"


def test_protocol_misuse_is_still_a_runtime_error() -> None:
    assert issubclass(bridge.ProtocolMisuse, RuntimeError)
    assert issubclass(bridge.ProtocolMisuse, bridge.BridgeError)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("bridge", "BridgeError"),
        ("bridge", "DuplicateTurn"),
        ("bridge", "HostClosed"),
        ("bridge", "LaunchError"),
        ("bridge", "ProfileError"),
        ("bridge", "ProtocolMisuse"),
        ("bridge", "QueueFull"),
        ("bridge", "SessionIdRefused"),
        ("bridge", "StoreError"),
        ("bridge", "TurnError"),
        ("bridge", "TurnLockError"),
        ("bridge", "UnknownProfile"),
        ("bridge.host", "DuplicateTurn"),
        ("bridge.host", "GatewayNameTaken"),
        ("bridge.host", "HostClosed"),
        ("bridge.host", "PostgresError"),
        ("bridge.host", "QueueFull"),
        ("bridge.host", "RemoteTurnError"),
        ("bridge.host", "SessionIdRefused"),
        ("bridge.host", "StoreError"),
        ("bridge.host", "TurnDetached"),
        ("bridge.host", "TurnLockError"),
        ("bridge.host", "UnknownProfile"),
        # the modules that raise them, as tests and earlier code import them
        ("bridge.files.agent_requests", "FileRefused"),
        ("bridge.serving.requests", "RequestError"),
        ("bridge.engine.warm_agents", "WarmStartError"),
        ("bridge.host.sqlite_store", "StoreError"),
        ("bridge.host.file_turnlock", "TurnLockError"),
        ("bridge.host.registry", "UnknownProfile"),
        ("bridge.host.scheduler", "QueueFull"),
        ("bridge.host.runtime", "DuplicateTurn"),
        ("bridge.host.runtime", "HostClosed"),
        ("bridge.host.runtime", "SessionIdRefused"),
        ("bridge.host.postgres.db", "PostgresError"),
        ("bridge.host.postgres.db", "PostgresUnavailable"),
        ("bridge.host.postgres.gateway", "GatewayNameTaken"),
        ("bridge.host.postgres.gateway", "RemoteTurnError"),
        ("bridge.host.postgres.gateway", "TurnDetached"),
    ],
)
def test_an_error_is_importable_from_where_users_import_it(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(bridge.errors, name)


def test_the_public_errors_are_listed_in_all() -> None:
    for name in ("BridgeError", "ProtocolMisuse", "HostClosed", "QueueFull", "StoreError", "UnknownProfile"):
        assert name in bridge.__all__
    for name in ("GatewayNameTaken", "PostgresError", "RemoteTurnError", "TurnDetached"):
        assert name in bridge.host.__all__
