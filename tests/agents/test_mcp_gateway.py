"""The MCP approval gateway end to end: a real MCP client session, `agentfast mcp-proxy`, a real MCP server.

The client is the SDK's `stdio_client` + `ClientSession`; it launches the proxy, which
launches tests/support/mcp_server.py (a read-only, a destructive and an unannotated tool,
each logging its calls to a ledger file). Decisions are made with `agentfast approvals`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.urls import reverse
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agents import services
from agents.models import Approval, ToolCall
from tests.conftest import ROOT, child_env
from tests.support.processes import ServerProcess, free_port

pytestmark = pytest.mark.integration
AGENTFAST = str(Path(sys.executable).with_name("agentfast"))
UPSTREAM = f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_server.py'}"


@pytest.fixture
def ledger(transactional_db: None, alice: Any, agent_config: Callable[[str], Path], tmp_path: Path) -> Path:
    agent_config("mcp:\n  notes:\n    rename_note: {risk: low}\n")
    services.user_create(username="mcp", role="agent")
    return tmp_path / "ledger.jsonl"


@pytest.fixture(autouse=True)
async def _close_thread_connection() -> AsyncIterator[None]:
    """Close the database connection of sync_to_async's thread, so the test database can be dropped."""
    yield
    await sync_to_async(connections.close_all)()


@asynccontextmanager
async def proxy(ledger: Path, *, wait: float = 30) -> AsyncIterator[ClientSession]:
    """Open an MCP client session on `agentfast mcp-proxy` in front of the test server."""
    env = child_env(MCP_LEDGER=str(ledger))
    args = ["mcp-proxy", "--upstream", UPSTREAM, "--wait", str(wait)]
    params = StdioServerParameters(command=AGENTFAST, args=args, env=env, cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _ran(ledger: Path) -> list[tuple[str, str]]:
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return [(entry["tool"], entry["name"]) for entry in map(json.loads, lines)]


def _text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


@sync_to_async
def _pending() -> list[str]:
    return list(Approval.objects.filter(status=Approval.Status.PENDING).values_list("id", flat=True))


async def _await_pending() -> str:
    with anyio.fail_after(30):
        while not (found := await _pending()):
            await anyio.sleep(0.05)
    assert len(found) == 1
    return found[0]


def _inbox_as_alice() -> str:
    client = Client()
    client.force_login(User.objects.get(username="alice"))
    return client.get(reverse("inbox")).content.decode()


async def _decide(approval_id: str, decision: str, *options: str) -> None:
    action = "approve" if decision == "approved" else "reject"
    command = [AGENTFAST, "approvals", action, approval_id, "--by", "alice", *options]
    done = await anyio.run_process(command, env=child_env(), check=False)
    assert done.returncode == 0, done.stderr.decode()


async def test_it_lists_the_tools_unchanged_and_runs_read_only_ones_unasked(ledger: Path) -> None:
    async with proxy(ledger) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        read = await session.call_tool("read_note", {"name": "todo"})
        renamed = await session.call_tool("rename_note", {"name": "todo", "to": "done"})  # mcp: says risk low

    assert sorted(tools) == ["delete_note", "dump_note", "read_note", "rename_note"]
    assert tools["read_note"].annotations.readOnlyHint is True
    assert tools["delete_note"].annotations.destructiveHint is True
    assert tools["delete_note"].description == "Delete a note for good."
    assert not read.isError and _text(read) == "the note todo says hello"
    assert not renamed.isError and _text(renamed) == "renamed todo to done"
    assert _ran(ledger) == [("read_note", "todo"), ("rename_note", "todo")]
    assert await _pending() == []


async def test_it_forwards_an_approved_destructive_call_once(ledger: Path) -> None:
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with proxy(ledger) as session:
        async with anyio.create_task_group() as tasks:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await session.call_tool("delete_note", {"name": "old"}, progress_callback=on_progress))

            tasks.start_soon(call)
            approval_id = await _await_pending()
            assert _ran(ledger) == []
            await _decide(approval_id, "approved")
        again = await session.call_tool("delete_note", {"name": "old"})

    assert _text(results[0]) == "deleted old" and not results[0].isError
    assert _text(again) == "deleted old"  # the stored result: not deleted twice
    assert _ran(ledger) == [("delete_note", "old")]
    assert any(approval_id in message for message in progress)
    approval = await sync_to_async(Approval.objects.select_related("run", "tool_call").get)(pk=approval_id)
    assert approval.run.agent == "notes" and approval.tool_call.name == "mcp.notes.delete_note"


async def test_it_forwards_a_reviewers_edit_that_empties_the_arguments(ledger: Path) -> None:
    async with proxy(ledger) as session, anyio.create_task_group() as tasks:
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await session.call_tool("delete_note", {"name": "old"}))

        tasks.start_soon(call)
        approval_id = await _await_pending()
        await _decide(approval_id, "approved", "--args", "{}")

    # The server refuses a call without a name: the proposal ("old") is never what runs.
    assert results[0].isError
    assert _ran(ledger) == []


async def test_it_returns_the_reviewers_note_when_rejected(ledger: Path) -> None:
    async with proxy(ledger) as session, anyio.create_task_group() as tasks:
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await session.call_tool("rename_note", {"name": "a", "to": "b"}))
            results.append(await session.call_tool("delete_note", {"name": "keep"}))

        tasks.start_soon(call)
        approval_id = await _await_pending()
        await _decide(approval_id, "rejected", "--note", "keep that one")

    assert results[1].isError
    assert "keep that one" in _text(results[1])
    assert _ran(ledger) == [("rename_note", "a")]


async def test_it_answers_pending_then_the_identical_retry_picks_up_the_decision(ledger: Path) -> None:
    async with proxy(ledger, wait=0) as session:
        first = await session.call_tool("delete_note", {"name": "draft"})
        [approval_id] = await _pending()
        assert first.isError
        assert "APPROVAL_PENDING" in _text(first) and approval_id in _text(first)
        again = await session.call_tool("delete_note", {"name": "draft"})
        assert again.isError and approval_id in _text(again)  # the same approval, not a second one
        inbox = await sync_to_async(_inbox_as_alice)()
        assert "MCP server <strong>notes</strong>: Delete a note for good." in inbox
        assert "mcp.notes.delete_note" in inbox
        await _decide(approval_id, "approved")
        retried = await session.call_tool("delete_note", {"name": "draft"})

    assert not retried.isError and _text(retried) == "deleted draft"
    assert _ran(ledger) == [("delete_note", "draft")]
    assert await sync_to_async(Approval.objects.count)() == 1


async def test_it_picks_up_a_call_a_schedule_rule_holds_on_the_identical_retry(
    ledger: Path, agent_config: Callable[[str], Path]
) -> None:
    agent_config(
        "mcp:\n  notes:\n    delete_note:\n      rules:\n"
        "        - {name: later, action: schedule, at: \"now + duration('1h')\"}\n"
    )
    async with proxy(ledger, wait=0) as session:
        first = await session.call_tool("delete_note", {"name": "draft"})
        again = await session.call_tool("delete_note", {"name": "draft"})

    [approval_id] = await _pending()  # one call held until its time, not one more per retry
    assert first.isError and again.isError and approval_id in _text(again)
    assert _ran(ledger) == []


async def test_it_keeps_a_result_it_must_repair_and_answers_it_unchanged(ledger: Path) -> None:
    async with proxy(ledger) as session:
        dumped = await session.call_tool("dump_note", {"name": "todo"})

    assert not dumped.isError and _text(dumped) == "todo\x00raw"
    [stored] = await sync_to_async(list)(ToolCall.objects.filter(name="mcp.notes.dump_note"))
    assert stored.status == ToolCall.Status.SUCCEEDED
    assert stored.result["result"]["content"][0]["text"] == "todo\ufffdraw"


class _Listening(ServerProcess):
    """A process serving HTTP on a port of 127.0.0.1; ready once the port accepts connections."""

    def __init__(self, args: list[str], *, port: int, log: Path, env: dict[str, str]) -> None:
        super().__init__(args, log=log, env=env)
        self.name, self.port = Path(args[1]).name, port

    def is_ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False


async def test_it_proxies_streamable_http_both_ways(ledger: Path, tmp_path: Path) -> None:
    upstream_port, proxy_port = free_port(), free_port()
    env = child_env(MCP_LEDGER=str(ledger))
    upstream_args = [sys.executable, str(ROOT / "tests" / "support" / "mcp_server.py"), "--http", str(upstream_port)]
    upstream = _Listening(upstream_args, port=upstream_port, log=tmp_path / "upstream.log", env=env)
    proxy_args = [AGENTFAST, "mcp-proxy", "--upstream-url", f"http://127.0.0.1:{upstream_port}/mcp"]
    proxy_args += ["--listen", f"127.0.0.1:{proxy_port}", "--wait", "0"]
    gateway = _Listening(proxy_args, port=proxy_port, log=tmp_path / "proxy.log", env=env)
    upstream.start()
    try:
        await anyio.to_thread.run_sync(upstream.wait_ready)
        gateway.start()
        await anyio.to_thread.run_sync(gateway.wait_ready)
        async with (
            streamable_http_client(f"http://127.0.0.1:{proxy_port}/mcp") as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            read_result = await session.call_tool("read_note", {"name": "todo"})
            deleted = await session.call_tool("delete_note", {"name": "todo"})
    finally:
        gateway.kill()
        upstream.kill()

    assert _text(read_result) == "the note todo says hello"
    assert deleted.isError and "APPROVAL_PENDING" in _text(deleted)
    assert _ran(ledger) == [("read_note", "todo")]


def test_it_refuses_an_account_that_may_not_gate(transactional_db: None, bob: Any) -> None:
    for account in ("nobody", "bob"):
        args = [AGENTFAST, "mcp-proxy", "--upstream", UPSTREAM, "--account", account]
        done = subprocess.run(
            args, check=False, env=child_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL
        )

        assert done.returncode == 1
        assert done.stderr == (
            f"agentfast: --account {account}: no active agent account (agentfast users create {account} --role agent)\n"
        )
        assert done.stdout == ""


def test_it_refuses_at_start_a_server_name_that_cannot_name_its_tools(ledger: Path) -> None:
    env = child_env(MCP_SERVER_NAME="My Files")
    for extra, refusal in (
        ([], "agentfast: the MCP server calls itself 'My Files', which cannot name its tools here: pass --name NAME"),
        (["--name", "my files"], "agentfast: --name 'my files': use letters, digits and _ . : / - only"),
    ):
        args = [AGENTFAST, "mcp-proxy", "--upstream", UPSTREAM, *extra]
        done = subprocess.run(args, check=False, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)

        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.startswith(refusal) and done.stderr.count("\n") == 1, done.stderr
    assert _ran(ledger) == []


async def test_it_forwards_each_call_a_standing_grant_allows_as_a_call_of_its_own(ledger: Path) -> None:
    # A grant decides like an allow rule: a deliberate repeat runs again, not the first call's stored result.
    async with proxy(ledger) as session:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.call_tool, "delete_note", {"name": "old"})
            await _decide(await _await_pending(), "approved", "--remember", "1h", "--remember-scope", "tool")
        first = await session.call_tool("delete_note", {"name": "tmp"})
        again = await session.call_tool("delete_note", {"name": "tmp"})

    assert not first.isError and not again.isError
    assert _ran(ledger) == [("delete_note", "old"), ("delete_note", "tmp"), ("delete_note", "tmp")]
    assert await _pending() == []


@sync_to_async
def _deactivate(username: str) -> None:
    User.objects.filter(username=username).update(is_active=False)


async def test_it_forwards_nothing_once_its_account_is_deactivated_while_a_call_waits(ledger: Path) -> None:
    # As the HTTP gate's token stops working: an approval given after the account ended runs nothing.
    async with proxy(ledger) as session:
        async with anyio.create_task_group() as tasks:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await session.call_tool("delete_note", {"name": "old"}))

            tasks.start_soon(call)
            approval_id = await _await_pending()
            await _deactivate("mcp")
            await _decide(approval_id, "approved")
        later = await session.call_tool("read_note", {"name": "todo"})

    assert results[0].isError and "'mcp' may no longer gate calls" in _text(results[0])
    assert later.isError and "'mcp' may no longer gate calls" in _text(later)
    assert _ran(ledger) == []
    call = await sync_to_async(ToolCall.objects.get)(name="mcp.notes.delete_note")
    assert call.executed_at is None  # never claimed: nothing is in doubt
