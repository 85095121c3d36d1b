"""The MCP approval gateway: an MCP server in front of another, sending every tool call through the policy.

It lists the upstream's tools unchanged. Each call is gated in process (the same services
as POST /api/gate) as policy tool `mcp.<server>.<tool>`: tools annotated read-only run,
destructive or unannotated ones are asked, unless `mcp:` in agentfast.yaml says otherwise.
A pending call waits (with progress notifications) up to a limit, then answers a tool error
naming the approval and APPROVAL_PENDING; the identical call again (same tool, arguments
and session) finds the same approval. An approved call is claimed, forwarded once and its
result stored, so a retry gets the stored result instead of a second run. An error the
upstream answers is stored as the call's failure; no answer leaves the call in doubt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

import anyio
import httpx
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import McpError

from agents import events, text
from agents.gateway import ids as gateway_ids
from agents.gateway import services as gateway
from agents.gateway.selectors import account_may_gate, approval_state
from agents.models import Approval
from agents.policy.config import LISTED, ToolPolicy, mcp_tool_name
from agents.policy.rules import CallFacts, evaluate
from agents.services.errors import InvalidInput, ServiceError
from agents.services.grants import grant_match

logger = logging.getLogger(__name__)
Progress = Callable[[float, str], Awaitable[None]]
PENDING = "APPROVAL_PENDING"
ACCOUNT_ENDED = "account_ended"  # a wait's status: the proxy's account may no longer gate
# The errors the SDK makes up itself when no answer came (the connection closed, or its read
# timeout passed): the upstream may or may not have run the call. Every other error is its answer.
UNANSWERED = frozenset({types.CONNECTION_CLOSED, httpx.codes.REQUEST_TIMEOUT})


@dataclass(frozen=True)
class Options:
    """How the gateway records and waits: under which account, session and server name."""

    owner: str  # the account of the `agent` role the calls are recorded under
    session: str  # the external session (one run in the inbox); identical calls in it are one call
    server: str = ""  # the MCP server's name in agentfast.yaml and the inbox (default: the upstream's own)
    wait_seconds: float = 50.0
    poll_seconds: float = 1.0


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], isError=True)


def _unlisted(tool: types.Tool) -> ToolPolicy | None:
    """Return what a tool agentfast.yaml does not list needs: nothing when read-only, a person otherwise."""
    read_only = tool.annotations is not None and tool.annotations.readOnlyHint is True
    return None if read_only else LISTED


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


class Gateway:
    """The policy between an MCP client and one upstream session."""

    def __init__(self, upstream: ClientSession, options: Options) -> None:
        self.upstream, self.options = upstream, options
        self.tools: dict[str, types.Tool] = {}

    async def list_tools(self) -> list[types.Tool]:
        """Return the upstream's tools, unchanged."""
        tools = (await self.upstream.list_tools()).tools
        self.tools = {tool.name: tool for tool in tools}
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], progress: Progress | None) -> types.CallToolResult:
        """Gate a call; forward it once when allowed or approved; else a tool error saying why."""
        tool = self.tools.get(name) or {tool.name: tool for tool in await self.list_tools()}.get(name)
        if tool is None:
            return _error(f"unknown tool {text.repair(name)!r}")
        if not await sync_to_async(account_may_gate)(self.options.owner):
            return self._account_ended()
        try:
            answer = await sync_to_async(self._gate)(tool, arguments)
        except ServiceError as exc:
            return _error(exc.message)
        if answer.decision == "pending":
            status, note = await self._wait(answer.approval_id, answer.run_id, progress)
            if status == ACCOUNT_ENDED:
                return self._account_ended()
            if status == "pending":
                return _error(
                    f"{PENDING}: approval {answer.approval_id} awaits a reviewer; "
                    "call the tool again with the same arguments to pick up the decision"
                )
            if status != "approved":
                return _error(f"{status.upper()}: {note or 'a reviewer refused this call'} ({answer.approval_id})")
        elif answer.decision != "allowed":
            return _error(f"{answer.decision.upper()}: {answer.reason or 'refused'} ({answer.approval_id})")
        return await self._run(tool, answer.approval_id, arguments)

    def _gate(self, tool: types.Tool, arguments: dict[str, Any]) -> gateway.GateAnswer:
        policy_tool = mcp_tool_name(self.options.server, tool.name)
        unlisted = _unlisted(tool)
        request = gateway.GateRequest(
            agent=self.options.server,
            session=self.options.session,
            call_id=self._call_id(policy_tool, arguments, unlisted),
            tool=policy_tool,
            arguments=arguments,
            description=tool.description or "",
            metadata={
                "mcp_server": self.options.server,
                "mcp_tool": tool.name,
                "annotations": tool.annotations.model_dump(exclude_none=True) if tool.annotations else {},
            },
        )
        return gateway.gate_call(owner=self.options.owner, request=request, unlisted=unlisted)

    def _call_id(self, policy_tool: str, arguments: dict[str, Any], unlisted: ToolPolicy | None) -> str:
        """Return the call's id: derived when a person must decide (a retry finds it), else fresh.

        A call nobody needs to decide may be repeated on purpose (a read-only lookup), so it
        must not be answered with an earlier call's stored result.
        """
        derived = "mcp_" + _digest(policy_tool, arguments, self.options.session)
        run = gateway_ids.run_id(owner=self.options.owner, agent=self.options.server, session=self.options.session)
        now = timezone.now()
        facts = CallFacts(
            tool=policy_tool,
            args=arguments,
            agent=self.options.server,
            # As gate_call sees the session's run: its input is the session (a rule may test run.input).
            run={
                "id": run,
                "agent": self.options.server,
                "created_by": self.options.owner,
                "input": self.options.session,
            },
            now=now,
            account=self.options.owner,
        )
        # With the grants: a call one allows is decided already, as by an allow rule.
        verdict = evaluate(gateway.policy_for(policy_tool, unlisted), facts, grant_lookup=grant_match)
        # A call held until a later time is picked up by the identical call again, as an asked one is.
        held = verdict.held_until(now) is not None
        return derived if verdict.action == "ask" or held else f"{derived}_{uuid.uuid4().hex[:12]}"

    def _account_ended(self) -> types.CallToolResult:
        return _error(
            f"the account {self.options.owner!r} may no longer gate calls (deactivated, or its agent role "
            "removed): nothing was forwarded"
        )

    async def _wait(self, approval_id: str, run_id: str, progress: Progress | None) -> tuple[str, str]:
        """Wait for a decision up to the limit, telling the client it waits; return (status, note).

        The status is ACCOUNT_ENDED once the account may no longer gate: as the HTTP gate's
        wait ends when its token stops working, an approval given after that runs nothing.
        """
        started = anyio.current_time()
        async with _Wakeup(events.run_group(run_id)) as wakeup:
            while True:
                status, note = await sync_to_async(_decision)(self.options.owner, approval_id)
                waited = anyio.current_time() - started
                if status != "pending" or waited >= self.options.wait_seconds:
                    return status, note
                if progress is not None:
                    await progress(waited, f"waiting for a reviewer to decide {approval_id}")
                await wakeup.wait(min(self.options.poll_seconds, self.options.wait_seconds - waited))

    async def _run(self, tool: types.Tool, approval_id: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Claim the call; forward it once and store its result, or answer the stored result."""
        owner = self.options.owner
        try:
            claim = await sync_to_async(gateway.external_call_claim)(owner=owner, approval_id=approval_id)
        except ServiceError as exc:
            return _error(exc.message)
        if not claim.claimed:
            if claim.result is None:
                return _error(f"approval {approval_id} is {claim.state}: another call runs it (or ran it unreported)")
            return _stored(claim.result)
        try:
            to_run = arguments if claim.arguments is None else claim.arguments  # an edit to {} is an edit
            result = await self.upstream.call_tool(tool.name, to_run)
        except McpError as exc:
            if exc.error.code in UNANSWERED:  # left claimed: the sweeper marks it in doubt, never to run again
                return _error(
                    f"no answer from the MCP server {self.options.server!r} ({exc.error.message}): "
                    f"whether it ran is unknown; approval {approval_id} will be marked in doubt"
                )
            answer = f"{exc.error.message} (error {exc.error.code})"
            result = _error(f"the call failed: the MCP server {self.options.server!r} answered {answer}")
        payload = result.model_dump(mode="json", exclude_none=True)
        error = "" if not result.isError else _text_of(result)
        report = sync_to_async(gateway.external_call_report)
        # The call ran: its result goes back to the client even if the report is refused
        # (another result was reported for it meanwhile, after it was marked in doubt).
        with contextlib.suppress(ServiceError):
            await report(owner=owner, approval_id=approval_id, ok=not result.isError, result=payload, error=error)
        return result


class _Wakeup:
    """A wait on a run's events: any message of its group cuts the current wait short.

    The table stays the truth, read after each wait: a decision's event (published by whichever
    process decided) only says when to read it, so a reviewer's approval is forwarded at once
    rather than at the next poll. Without the channel layer (Redis out of reach), waits run to
    their end, as polls.
    """

    SETUP_SECONDS = 2.0

    def __init__(self, group: str) -> None:
        self.group = group
        self.layer: Any = None
        self.channel = ""

    async def __aenter__(self) -> Self:
        try:
            with anyio.fail_after(self.SETUP_SECONDS):
                layer = get_channel_layer()
                channel = await layer.new_channel()
                await layer.group_add(self.group, channel)
            self.layer, self.channel = layer, channel
        except Exception as exc:  # noqa: BLE001 — any transport failure: polls alone
            logger.warning("waiting for decisions by polling alone (no channel layer: %s)", exc)
        return self

    async def wait(self, seconds: float) -> None:
        """Return after `seconds`, or sooner when a message of the group arrives."""
        with anyio.move_on_after(seconds):
            if self.layer is None:
                await anyio.sleep(seconds)
                return
            try:
                await self.layer.receive(self.channel)
            except Exception as exc:  # noqa: BLE001 — the layer went away: polls alone from now on
                logger.warning("waiting for decisions by polling alone (channel layer lost: %s)", exc)
                self.layer = None
                await anyio.sleep(seconds)

    async def __aexit__(self, *exc: object) -> None:
        if self.layer is not None:
            with contextlib.suppress(Exception), anyio.move_on_after(self.SETUP_SECONDS):
                await self.layer.group_discard(self.group, self.channel)


def _decision(owner: str, approval_id: str) -> tuple[str, str]:
    if not account_may_gate(owner):
        return ACCOUNT_ENDED, ""
    status = approval_state(approval_id)
    if status in ("rejected", "expired"):
        return status, Approval.objects.values_list("note", flat=True).get(pk=approval_id)
    return ("approved" if status == "allowed" else status), ""


def _stored(outcome: dict[str, Any]) -> types.CallToolResult:
    try:
        return types.CallToolResult.model_validate(outcome.get("result") or {})
    except ValueError:
        return _error(f"the call already ran: {outcome.get('error') or outcome.get('result')}")


def _text_of(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))[:10_000]


@contextlib.asynccontextmanager
async def upstream_session(*, command: str | None, url: str | None) -> AsyncIterator[ClientSession]:
    """Connect to the upstream MCP server: a command over stdio (inheriting our environment), or a URL."""
    async with contextlib.AsyncExitStack() as stack:
        if command:
            argv = shlex.split(command)
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            read, write, _ = await stack.enter_async_context(streamable_http_client(url or ""))
        session = await stack.enter_async_context(ClientSession(read, write))
        initialized = await session.initialize()
        session.server_name = initialized.serverInfo.name  # type: ignore[attr-defined]
        yield session


def build_server(gateway_: Gateway) -> Server[Any, Any]:
    """Return the MCP server the client talks to: the upstream's tools, each call through the gateway."""
    server: Server[Any, Any] = Server(f"agentfast-{gateway_.options.server}")

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return await gateway_.list_tools()

    @server.call_tool(validate_input=False)  # the upstream validates its own input
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        context = server.request_context
        token = context.meta.progressToken if context.meta is not None else None

        async def progress(done: float, message: str) -> None:
            await context.session.send_progress_notification(token, done, message=message)  # type: ignore[arg-type]

        return await gateway_.call_tool(name, arguments, progress if token is not None else None)

    return server


async def serve(options: Options, *, command: str | None, url: str | None, listen: str | None) -> None:
    """Serve the gateway over stdio, or over streamable HTTP at `listen` (HOST:PORT, path /mcp).

    A server name that cannot name its tools is refused before any call (InvalidInput),
    raised once the upstream is closed: its task groups would wrap it in an ExceptionGroup.
    """
    async with upstream_session(command=command, url=url) as upstream:
        server_name = options.server or getattr(upstream, "server_name", "") or "mcp"
        refusal = _server_name_refusal(server_name, given=bool(options.server))
        if not refusal:
            await _serve(Gateway(upstream, Options(**{**options.__dict__, "server": server_name})), listen)
    if refusal:
        raise InvalidInput(refusal, field="name")


async def _serve(gateway_: Gateway, listen: str | None) -> None:
    await gateway_.list_tools()
    server = build_server(gateway_)
    if listen:
        await _serve_http(server, listen)
        return
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _server_name_refusal(name: str, *, given: bool) -> str:
    """Return why a server name cannot name its tools (`mcp.<server>.<tool>`), or "".

    Every call would otherwise be refused. A name derived from it instead would be one the
    user never wrote, yet must write as the key of the server's `mcp:` entry to configure it.
    """
    if gateway.is_tool_name(mcp_tool_name(name, "t")):
        return ""
    rule = "letters, digits and _ . : / - only, at most 94 characters"
    if given:
        return f"--name {text.repair(name)!r}: use {rule}"
    return (
        f"the MCP server calls itself {text.repair(name)!r}, which cannot name its tools here: "
        f"pass --name NAME ({rule}), the key of its entry under mcp: in agentfast.yaml"
    )


async def _serve_http(server: Server[Any, Any], listen: str) -> None:
    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host, _, port = listen.rpartition(":")
    manager = StreamableHTTPSessionManager(app=server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lifespan)
    await uvicorn.Server(uvicorn.Config(app, host=host or "127.0.0.1", port=int(port), log_level="warning")).serve()
