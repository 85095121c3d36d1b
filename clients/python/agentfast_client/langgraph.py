"""LangGraph adapter (extra `langgraph`): a tools node that asks agentfast before running each call.

    from agentfast_client.langgraph import GatedToolNode

    graph.add_node("tools", GatedToolNode(gate, [wire_money]))

It reads the tool calls of the last AI message, gates each with its tool call id (the
session is the graph's `thread_id`), runs the approved ones once and answers with
ToolMessages; a denial or rejection is the tool message, with the reviewer's note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config

from agentfast_client._core import AsyncGate, Denied, Rejected


class GatedToolNode:
    """A LangGraph node running `tools` through the gate (async; use `ainvoke`/`astream`)."""

    def __init__(self, gate: AsyncGate, tools: Sequence[BaseTool]) -> None:
        self.gate = gate
        self.tools = {tool.name: tool for tool in tools}

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Answer each tool call of the last message."""
        session = get_config().get("configurable", {}).get("thread_id")
        calls = state["messages"][-1].tool_calls
        return {"messages": [await self._answer(call, session) for call in calls]}

    async def _answer(self, call: dict[str, Any], session: str | None) -> ToolMessage:
        tool = self.tools[call["name"]]
        try:
            permit = await self.gate.require(
                tool.name, call["args"], session=session, call_id=call["id"], description=tool.description
            )
        except (Denied, Rejected) as exc:
            return ToolMessage(f"The call was not made: {exc}", tool_call_id=call["id"], status="error")

        async def run(**approved: Any) -> Any:
            return await tool.ainvoke(approved)

        output = await self.gate.run(permit, run)
        return ToolMessage(str(output), tool_call_id=call["id"])
