"""GatedToolNode in a graph whose thread_id is not text (LangGraph takes any value; its savers str() it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentfast_client import AsyncGate
from agentfast_client.langgraph import GatedToolNode
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from agents.models import Run
from tests.clients.conftest import Server

pytestmark = pytest.mark.integration


def test_a_numeric_thread_id_is_a_session_not_a_failed_node(server: Server) -> None:
    looked: list[str] = []

    @tool
    def lookup_order(order: str) -> str:
        """Look an order up."""
        looked.append(order)
        return f"order {order} shipped"

    async def run() -> Any:
        gate = AsyncGate(server.url, server.agent_token, agent="langgraph")
        graph = StateGraph(MessagesState)
        graph.add_node("tools", GatedToolNode(gate, [lookup_order]))
        graph.add_edge(START, "tools")
        graph.add_edge("tools", END)
        call = {"name": "lookup_order", "args": {"order": "A-1"}, "id": "call_1", "type": "tool_call"}
        try:
            return await graph.compile(checkpointer=InMemorySaver()).ainvoke(
                {"messages": [AIMessage(content="", tool_calls=[call])]}, {"configurable": {"thread_id": 42}}
            )
        finally:
            await gate.aclose()

    state = asyncio.run(run())  # today: GateError "400: session: Input should be a valid string"
    assert state["messages"][-1].content == "order A-1 shipped"
    assert looked == ["A-1"]
    assert Run.objects.get(kind=Run.Kind.EXTERNAL).input == "42"
