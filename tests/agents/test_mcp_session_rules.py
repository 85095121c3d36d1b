"""The MCP gateway with a rule on `run.input` (the proxy's --session, documented as a CEL variable).

The gateway picks a call's id by evaluating the policy itself (`Gateway._call_id`), but with
`run.input` empty, while `gate_call` evaluates it with the session's run, whose input is the
session. The two verdicts then differ, and so does the call id the gateway should have used.
The upstream here is a stand-in MCP server (the project's own database, policy and services are real).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from mcp import types

from agents import services
from agents.gateway.mcp import Gateway, Options
from agents.models import Approval


class Upstream:
    """An MCP server's client session: one destructive tool, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def list_tools(self) -> types.ListToolsResult:
        tool = types.Tool(
            name="purge_cache",
            description="Purge a cache",
            inputSchema={"type": "object"},
            annotations=types.ToolAnnotations(destructiveHint=True),
        )
        return types.ListToolsResult(tools=[tool])

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        self.calls.append(arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"purged #{len(self.calls)}")])


@pytest.fixture
def account(transactional_db: None, alice: Any) -> Iterator[None]:
    services.user_create(username="mcp", role="agent")
    yield
    connections.close_all()


def _config(agent_config: Callable[[str], Path], when: str) -> None:
    agent_config(
        "mcp:\n  cache:\n    purge_cache:\n      rules:\n"
        f'        - {{name: by-session, when: "{when}", action: allow}}\n'
    )


async def _call(gateway: Gateway) -> types.CallToolResult:
    result = await gateway.call_tool("purge_cache", {"region": "eu"}, None)
    await sync_to_async(connections.close_all)()
    return result


def test_a_call_a_session_rule_allows_is_forwarded_each_time(account: None, agent_config: Any) -> None:
    # Staging purges run unasked: each purge asked for should purge.
    _config(agent_config, "run.input == 'staging'")
    upstream = Upstream()
    gateway = Gateway(upstream, Options(owner="mcp", session="staging", server="cache", wait_seconds=0.5))  # type: ignore[arg-type]

    first = anyio.run(_call, gateway)
    second = anyio.run(_call, gateway)

    assert not first.isError and not second.isError
    # Today the second purge is answered with the first one's stored result ("purged #1") and
    # never reaches the server: _call_id saw run.input == "" (ask: a derived, reusable id).
    assert len(upstream.calls) == 2, f"forwarded {len(upstream.calls)} time(s); answered {second.content[0].text!r}"


def test_an_asked_call_is_picked_up_by_the_identical_retry(account: None, agent_config: Any) -> None:
    # Everything but prod runs unasked; in prod a person decides, and the retry picks it up.
    _config(agent_config, "run.input != 'prod'")
    upstream = Upstream()
    gateway = Gateway(upstream, Options(owner="mcp", session="prod", server="cache", wait_seconds=0.2))  # type: ignore[arg-type]

    first = anyio.run(_call, gateway)
    assert first.isError and "APPROVAL_PENDING" in first.content[0].text
    second = anyio.run(_call, gateway)

    # Today each retry gets a fresh random call id (_call_id saw run.input == "": allowed),
    # so it opens a new approval instead of picking up the first one's decision.
    assert Approval.objects.filter(status=Approval.Status.PENDING).count() == 1
    assert "APPROVAL_PENDING" in second.content[0].text
