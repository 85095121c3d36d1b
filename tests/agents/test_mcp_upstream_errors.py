"""The MCP approval gateway when the upstream fails a forwarded call below the tool level.

A JSON-RPC error is the upstream's answer: the call failed, and is recorded so at once. No
answer (the upstream died mid-call) says nothing of whether it ran: the claim stays, to be
marked in doubt. The upstream is tests/support/mcp_failing_server.py, behind `agentfast mcp-proxy`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client

from agents import ids, services
from agents.models import ToolCall
from tests.agents.test_mcp_gateway import (
    AGENTFAST,
    _await_pending,
    _close_thread_connection,  # noqa: F401 (an autouse fixture)
    _decide,
    _ran,
    _text,
)
from tests.conftest import ROOT, child_env

pytestmark = pytest.mark.integration
UPSTREAM = f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_failing_server.py'}"


@pytest.fixture
def ledger(transactional_db: None, alice: Any, agent_config: Callable[[str], Path], tmp_path: Path) -> Path:
    agent_config("")
    services.user_create(username="mcp", role="agent")
    return tmp_path / "ledger.jsonl"


@asynccontextmanager
async def proxy(ledger: Path) -> AsyncIterator[ClientSession]:
    """Open an MCP client session on `agentfast mcp-proxy` in front of the failing server."""
    env = child_env(MCP_LEDGER=str(ledger))
    args = ["mcp-proxy", "--upstream", UPSTREAM, "--wait", "30"]
    params = StdioServerParameters(command=AGENTFAST, args=args, env=env, cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@sync_to_async
def _calls(name: str) -> list[ToolCall]:
    return list(ToolCall.objects.filter(name=name))


async def test_it_records_a_call_the_upstream_answered_with_an_error_as_failed_at_once(ledger: Path) -> None:
    async with proxy(ledger) as session:
        async with anyio.create_task_group() as tasks:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await session.call_tool("cancel_order", {"name": "A-1"}))

            tasks.start_soon(call)
            approval_id = await _await_pending()
            await _decide(approval_id, "approved")
        again = await session.call_tool("cancel_order", {"name": "A-1"})

    [call] = await _calls("mcp.orders.cancel_order")
    assert call.status == ToolCall.Status.FAILED
    assert call.result["ok"] is False and "order A-1 has shipped" in call.result["error"]
    [failed] = results
    assert failed.isError
    assert "order A-1 has shipped" in _text(failed) and "'orders'" in _text(failed)
    assert again.isError and _text(again) == _text(failed)  # the stored outcome: not forwarded again
    assert _ran(ledger) == [("cancel_order", "A-1")]


async def test_it_leaves_a_call_the_upstream_never_answered_claimed_for_the_sweeper(ledger: Path) -> None:
    async with proxy(ledger) as session:
        unanswered = await session.call_tool("probe_host", {"name": "db-1"})

    [call] = await _calls("mcp.orders.probe_host")
    assert unanswered.isError
    assert "whether it ran is unknown" in _text(unanswered)
    assert ids.approval_id(call.run_id, call.call_id) in _text(unanswered)
    assert _ran(ledger) == [("probe_host", "db-1")]
    assert call.executed_at is not None and call.result is None  # claimed, unreported: in doubt after the lease
    assert call.status == ToolCall.Status.RUNNING
