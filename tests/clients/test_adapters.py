"""The client's framework adapters end to end: a real framework, a local OpenAI-compatible model, a running agentfast.

The model (tests/support/fake_openai.py) proposes `wire_money`; a reviewer approves it over
the API; the tool runs once and the model reads its output. The OpenAI Agents SDK's package
is named `agents`, like agentfast's engine, so its agent runs in a process of its own
(tests/clients/openai_agents_flow.py) started outside the repository.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from agentfast_client import AsyncGate
from agentfast_client.langgraph import GatedToolNode
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

from tests.clients.conftest import Server
from tests.support.fake_openai import Reply, tool_messages

pytestmark = pytest.mark.integration
FLOW = Path(__file__).with_name("openai_agents_flow.py")


def _wire_then_answer(body: dict[str, Any]) -> Reply:
    """Propose one wire; once its output is back, say what it was."""
    outputs = tool_messages(body)
    if not outputs:
        return Reply(tool_calls=[("call_wire_1", "wire_money", json.dumps({"cents": 2500, "to": "ACME"}))])
    return Reply(content=f"Done: {outputs[-1]['content']}")


def test_it_gates_a_langgraph_tool_node(server: Server, fake_openai: Any) -> None:
    fake_openai.script(_wire_then_answer)
    wires: list[int] = []

    @tool
    def wire_money(cents: int, to: str) -> str:
        """Wire money to a supplier."""
        wires.append(cents)
        return f"wire W-{len(wires)} of {cents} to {to}"

    model = ChatOpenAI(model="test-model", base_url=fake_openai.base_url, api_key="test").bind_tools([wire_money])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    async def run() -> Any:
        gate = AsyncGate(server.url, server.agent_token, agent="langgraph")
        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", GatedToolNode(gate, [wire_money]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route)
        graph.add_edge("tools", "agent")
        config = {"configurable": {"thread_id": "lg-1"}}
        try:
            return await graph.compile().ainvoke({"messages": [("user", "Pay ACME 25.00")]}, config)
        finally:
            await gate.aclose()

    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(state=asyncio.run(run())))
    thread.start()
    approval_id = server.approval_id(agent="langgraph", session="lg-1", call_id="call_wire_1")
    server.await_pending(approval_id)
    assert wires == []
    server.decide(approval_id, "approved")
    thread.join(timeout=60)

    assert wires == [2500]
    assert outcome["state"]["messages"][-1].content == "Done: wire W-1 of 2500 to ACME"


def test_it_gates_an_openai_agents_sdk_function_tool(
    server: Server, fake_openai: Any, tmp_path: Path, openai_agents_python: Path
) -> None:
    fake_openai.script(_wire_then_answer)
    ledger = tmp_path / "wires.txt"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    args = [str(openai_agents_python), str(FLOW), server.url, server.agent_token, fake_openai.base_url, str(ledger)]
    # In the SDK's own environment and outside the repository: there `agents` is the SDK's package.
    process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        approval_id = server.approval_id(agent="openai-agents", session="oa-1", call_id="call_wire_1")
        server.await_pending(approval_id)
        assert not ledger.exists()
        server.decide(approval_id, "approved")
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()

    assert process.returncode == 0, err
    assert ledger.read_text().splitlines() == ["2500 ACME"]
    assert out.strip() == "Done: wire W-1 of 2500 to ACME"
