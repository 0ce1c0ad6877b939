"""The MCP server: each profile a tool, each call a turn on the host (docs/mcp.md).

Built on the official SDK's low-level `Server` (anyio, which runs on trio's own loop here: no asyncio). A call
runs as `serve`'s turns do, through `BaseHost.submit`:

- partials go out as `notifications/progress` (the SDK sends none when the call carried no progress token);
- the client's `notifications/cancelled` cancels the call's handler, which cancels the turn through the host
  (`host.cancel`, which reaches a fleet's worker too): its agent is stopped;
- a permission request of the agent is answered by its profile's `permissions:` alone — a tool call has nobody
  to ask — so what the policy leaves to a person is denied, saying why; with `elicit`, a client that declared
  the elicitation capability is asked instead (`elicitation/create`, a yes/no form);
- a question of the agent is declined (it gets no answer, as a turn without a client would); with `elicit`, a
  client that declared the elicitation capability is asked it as a form (`question_form`) and its answer reaches
  the agent (declining or cancelling the form declines the question).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ..dialects import LineSplitter, PartialEvent
from ..dialects.events import QuestionRequest
from ..engine.loop import HostEvent
from ..engine.result import TurnResult
from ..errors import AnswerRefused, BridgeError, ProfileError, TurnError
from ..host.interface import BaseHost
from ..log import get_logger
from ..permissions import Decision, PermissionRequest
from ..serving.file_delivery import FileDeliveries
from ..serving.requests import PROFILE_INVALID, UNKNOWN_PROFILE
from ..serving.session import LOCAL, Tenant, told_of_profile
from .mcp_tools import EMBED_MAX_BYTES, parse_call, question_answer, question_form, result_content, tool_definition

NOBODY_TO_ASK = (
    "denied: this agent runs as an MCP tool, and a tool call has nobody to ask; allow the tool in the profile's "
    "`permissions:`, or start agent-bridge mcp with --elicit for a client that can ask its user"
)
INVALID_PARAMS = -32602
MAX_LINE_BYTES = 8 * 1024 * 1024  # a message of 1 MiB, escaped as JSON at worst, and the rest of the call
READ_CHUNK = 64 * 1024
# On SIGTERM, how long the answers of calls whose turns ended within the shutdown grace may take to be written: a
# client that stopped reading stdout must not hold the shutdown.
ANSWERS_FLUSH_SECS = 5.0
CLIENT_GONE = "agent_bridge.client_gone"  # an HTTP request's scope key: a trio.Event set once its client has gone


class McpDoor:
    """The tools of `profiles` (name → description) over `host`; one door serves every MCP connection."""

    def __init__(
        self,
        host: BaseHost,
        profiles: Mapping[str, str | None],
        files: FileDeliveries,
        *,
        local_paths: bool,
        elicit: bool = False,
        tenant_of: Callable[[Any], Tenant | None] = lambda _request: LOCAL,
        embed_max_bytes: int = EMBED_MAX_BYTES,
    ) -> None:
        """`tenant_of(request)`: who sent a call (the HTTP request the SDK hands over; None on stdio)."""
        self.host = host
        self.profiles = dict(profiles)
        self._files = files
        self._local_paths = local_paths
        self._elicit = elicit
        self._tenant_of = tenant_of
        self._embed_max_bytes = embed_max_bytes
        self._log = get_logger(component="mcp")

    def server(self) -> Any:
        """The SDK's low-level `Server` with this door's handlers."""
        from mcp.server.lowlevel import Server

        from ..version import __version__

        server = Server(
            "agent-bridge",
            version=__version__,
            instructions="Each tool is an agent: call it with a message; pass the same conversation to go on.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        server.middleware = []  # no OpenTelemetry spans: the bridge logs what it needs itself
        return server

    def _tenant(self, ctx: Any) -> Tenant:
        tenant = self._tenant_of(ctx.request)
        if tenant is None:  # the door's ASGI check refuses such a request before the SDK sees it
            raise BridgeError("a call without a valid token reached the MCP server")
        return tenant

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types

        tenant = self._tenant(ctx)
        tools = [
            tool_definition(name, description)
            for name, description in sorted(self.profiles.items())
            if tenant.may_use(name)
        ]
        return mcp_types.ListToolsResult.model_validate({"tools": tools})

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        import mcp_types
        from mcp.shared.exceptions import MCPError

        tenant = self._tenant(ctx)
        name = params.name
        if name not in self.profiles or not tenant.may_use(name):
            raise MCPError(INVALID_PARAMS, f"unknown tool {name[:200]!r}; tools/list names the tools")
        try:
            call = parse_call(params.arguments, local_paths=self._local_paths)
        except TurnError as err:
            return mcp_types.CallToolResult.model_validate(
                {"content": [{"type": "text", "text": str(err)}], "isError": True}
            )
        result = await self._run(ctx, name, tenant.conversation_prefix + call.conversation, call.turn, tenant)
        return mcp_types.CallToolResult.model_validate(result)

    async def _run(self, ctx: Any, profile: str, conversation: str, turn: Any, tenant: Tenant) -> dict[str, Any]:
        turn_id = f"mcp-{uuid.uuid4().hex}"
        partials = 0

        # The client's notifications/cancelled, or stdin's end, cancels this handler: the host stops the agent.
        # Over HTTP, the SDK keeps a call whose response stream was dropped running for the session: the door's
        # middleware marks the request's scope when its connection goes, and that cancels the call too.
        gone: trio.Event | None = getattr(ctx.request, "scope", {}).get(CLIENT_GONE)
        with trio.CancelScope() as call:
            async with trio.open_nursery() as watcher:

                async def forward(event: HostEvent) -> None:
                    nonlocal partials
                    if type(event) is PartialEvent:
                        partials += 1
                        await ctx.session.report_progress(partials, None, event.text)
                    elif type(event) is QuestionRequest:  # asked beside the turn: its events go on meanwhile
                        watcher.start_soon(self._question, ctx, turn_id, event)

                if gone is not None:
                    watcher.start_soon(_cancel_when_set, gone, call)
                try:
                    result = await self._submit_stoppable(
                        turn_id,
                        lambda: self.host.submit(
                            profile,
                            conversation,
                            turn,
                            on_event=forward,
                            on_permission=lambda request: self._permission(ctx, request),
                            turn_id=turn_id,
                        ),
                    )
                except BridgeError as err:  # refused before it ran: a full queue, a profile that no longer loads
                    return self._refused(err, profile, tenant)
                finally:
                    watcher.cancel_scope.cancel()
        if call.cancelled_caught:
            return {
                "content": [{"type": "text", "text": "the client went away; the turn was cancelled"}],
                "isError": True,
            }
        files = [self._files.offer(turn_id, file, self._embed_max_bytes) for file in result.files]
        self._files.turn_over(result)
        return result_content(result, files)

    async def _submit_stoppable(self, turn_id: str, submit: Callable[[], Awaitable[TurnResult]]) -> TurnResult:
        """`submit()`, its turn stopped through `host.cancel` when the call is cancelled: cancelling the task that
        waits for a fleet worker's turn (`--postgres`) would leave the turn running on the worker."""
        running = trio.CancelScope(shield=True)
        finished = False

        async def stop_when_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not finished and not self.host.cancel(turn_id):
                    running.cancel()  # not in the host yet (or no more): nothing runs to stop

        refused: BridgeError | None = None
        async with trio.open_nursery() as stopper:
            stopper.start_soon(stop_when_cancelled)
            try:
                with running:
                    result = await submit()
            except BridgeError as err:  # raised past the nursery, it would come out in an exception group
                refused = err
            finally:
                finished = True
                stopper.cancel_scope.cancel()
        if refused is not None:
            raise refused
        return result

    def _refused(self, err: BridgeError, profile: str, tenant: Tenant) -> dict[str, Any]:
        problem = str(err)
        code = PROFILE_INVALID if isinstance(err, ProfileError) else err.code  # a fleet's worker names its own
        if code in (PROFILE_INVALID, UNKNOWN_PROFILE) and tenant is not LOCAL:
            self._log.warning("a tool's profile was refused", profile=profile, error=problem)
            problem = told_of_profile(tenant, code, profile, problem)
        return {"content": [{"type": "text", "text": problem}], "isError": True}

    async def _permission(self, ctx: Any, request: PermissionRequest) -> Decision:
        if not self._elicit or not _can_elicit(ctx):
            self._log.info("a permission request was denied: a tool call has nobody to ask", tool=request.tool)
            return Decision(allow=False, message=NOBODY_TO_ASK)
        schema = {
            "type": "object",
            "properties": {"allow": {"type": "boolean", "title": "Allow", "description": "let the agent do it"}},
            "required": ["allow"],
        }
        from mcp.shared.exceptions import MCPError

        what = request.title or request.tool
        try:
            answer = await ctx.session.elicit_form(
                f"The agent asks to run {request.tool}: {what}", schema, related_request_id=ctx.request_id
            )
        except MCPError as err:  # the client could not ask (no user at hand, a form it cannot show)
            self._log.info("the MCP client did not ask its user; denied", tool=request.tool, error=str(err))
            return Decision(allow=False, message=NOBODY_TO_ASK)
        allowed = answer.action == "accept" and bool((answer.content or {}).get("allow"))
        return Decision(allow=allowed, message="" if allowed else "denied by the MCP client's user")

    async def _question(self, ctx: Any, turn_id: str, request: QuestionRequest) -> None:
        from mcp.shared.exceptions import MCPError

        answer = None
        if not self._elicit or not _can_elicit(ctx):
            self._log.info("a question of the agent was declined: a tool call has nobody to ask", tool=request.tool)
        else:
            message, schema = question_form(request)
            try:
                form = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
            except MCPError as err:
                self._log.info("the MCP client did not ask its user; the question is declined", error=str(err))
            else:
                answer = question_answer(request, form.content) if form.action == "accept" else None
        try:
            self.host.answer(turn_id, request.request_id, answer)
        except AnswerRefused as err:  # a client that sent what its form did not offer
            self._log.info("the MCP client's answer fits no option; the question is declined", error=str(err))
            self.host.answer(turn_id, request.request_id, None)


def _can_elicit(ctx: Any) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


async def run_stdio(door: McpDoor) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes stdin; every call in flight is then
    cancelled, its turn with it. File descriptor 1 is pointed at stderr once the protocol has its own copy of it,
    so nothing but MCP reaches the client's stdout (as `serve` does).

    The transport is the bridge's, not the SDK's `stdio_server`: that one reads and writes each line in a worker
    thread (anyio's `wrap_file`), three thread hand-offs a call, which cost more than the 1 ms a tool call may add
    to a turn (bench/mcp_door.py); trio reads the pipes in its own loop. It also answers a line that is no
    JSON-RPC message with the parse error JSON-RPC asks for (-32700, id null), where the SDK drops it without a
    word and leaves its sender waiting.
    """
    import anyio
    from mcp.shared.message import SessionMessage

    protocol_out = os.dup(1)
    os.dup2(2, 1)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(protocol_out)
    server = door.server()
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)
    stopped = trio.Event()
    unanswered = UnansweredRequests()
    async with stdin, stdout, trio.open_nursery() as nursery:
        await nursery.start(shut_down_on_signals, door.host, stopped)
        nursery.start_soon(_close_once_answered, stopped, unanswered, nursery.cancel_scope)
        nursery.start_soon(_read_messages, stdin, inbound_send, outbound, unanswered)
        nursery.start_soon(_write_messages, outbound_receive, stdout, unanswered)
        await server.run(inbound, outbound, server.create_initialization_options())
        nursery.cancel_scope.cancel()


async def shut_down_on_signals(
    host: BaseHost, stopped: trio.Event, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """SIGTERM or SIGINT: no new calls (each gets an error result), the turns in flight get the host's shutdown
    grace and are then cancelled; `stopped` is set once they are over."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            get_logger(component="mcp").info("signal received; shutting down", signal=signal.Signals(signum).name)
            try:
                await host.aclose()
            finally:
                stopped.set()
            return


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class UnansweredRequests:
    """The client's requests read from stdin and not yet answered on stdout, by id."""

    def __init__(self) -> None:
        self._ids: set[str | int] = set()
        self._none = trio.Event()
        self._none.set()

    def read(self, message: Any) -> None:
        import mcp_types

        if isinstance(message, mcp_types.JSONRPCRequest):
            self._ids.add(message.id)
            if self._none.is_set():  # one waiter may hold the unset event: it must be the one set later
                self._none = trio.Event()
        elif isinstance(message, mcp_types.JSONRPCNotification) and message.method == "notifications/cancelled":
            self._answered((message.params or {}).get("requestId"))  # a cancelled request gets no answer

    def written(self, message: Any) -> None:
        import mcp_types

        if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
            self._answered(message.id)

    def _answered(self, request_id: Any) -> None:
        self._ids.discard(request_id)
        if not self._ids:
            self._none.set()

    async def wait_answered(self) -> None:
        await self._none.wait()


async def _close_once_answered(stopped: trio.Event, unanswered: UnansweredRequests, scope: trio.CancelScope) -> None:
    """Once shutdown has ended the turns, their calls' answers are written before the door closes."""
    await stopped.wait()
    with trio.move_on_after(ANSWERS_FLUSH_SECS):
        await unanswered.wait_answered()
    scope.cancel()


async def _read_messages(
    stdin: trio.lowlevel.FdStream, inbound: Any, outbound: Any, unanswered: UnansweredRequests
) -> None:
    """Each line of stdin, as a JSON-RPC message for the server; a line that is none is answered here."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    lines = LineSplitter(MAX_LINE_BYTES)
    async with inbound:
        while True:
            try:
                data = await stdin.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            batch = lines.feed(data) if data else lines.close()
            for index, line in enumerate(batch.text):
                if not line.strip():
                    continue
                if index in batch.cut:
                    problem = (mcp_types.INVALID_REQUEST, f"a message is longer than {MAX_LINE_BYTES} bytes")
                else:
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError:
                        problem = (mcp_types.PARSE_ERROR, "not a JSON-RPC message: each line must be one JSON object")
                    else:
                        unanswered.read(message)
                        await inbound.send(SessionMessage(message))
                        continue
                error = mcp_types.ErrorData(code=problem[0], message=problem[1])
                await outbound.send(SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=None, error=error)))
            if not data:
                return  # the client closed stdin, or went away: server.run ends, and its calls with it


async def _write_messages(outbound: Any, stdout: trio.lowlevel.FdStream, unanswered: UnansweredRequests) -> None:
    async with outbound:
        async for message in outbound:
            line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            try:
                await stdout.send_all(line.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return  # nobody reads stdout any more: stdin's end follows
            unanswered.written(message.message)
