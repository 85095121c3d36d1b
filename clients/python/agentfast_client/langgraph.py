"""LangGraph adapter (extra `langgraph`): a tools node that asks agentfast before running each call.

    from agentfast_client.langgraph import GatedToolNode

    graph.add_node("tools", GatedToolNode(gate, [wire_money]))

It reads the tool calls of the last AI message, gates each with its tool call id (the
session is the graph's `thread_id`), runs the approved ones once and answers with
ToolMessages; a denial or rejection is the tool message, with the reviewer's note. The
calls of one message are gated together, so reviewers see them all at once; a call of a
tool the node has not, or with arguments its schema refuses, is answered as an error
without asking anyone. A call id the model already used in an earlier turn of the thread
is gated as `<id>#<n>`, a call of its own rather than a repeat of the earlier one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from pydantic import BaseModel, ValidationError

from agentfast_client._core import AsyncGate, Denied, Rejected


class GatedToolNode:
    """A LangGraph node running `tools` through the gate (async; use `ainvoke`/`astream`)."""

    def __init__(self, gate: AsyncGate, tools: Sequence[BaseTool]) -> None:
        self.gate = gate
        self.tools = {tool.name: tool for tool in tools}

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Answer each tool call of the last message."""
        thread = get_config().get("configurable", {}).get("thread_id")
        # Any value names a thread (an int, a UUID), as LangGraph's savers read it: the session is its text.
        session = None if thread is None else str(thread)
        *earlier, last = state["messages"]
        calls = [self._answer(call, _gated_id(call["id"], earlier), session) for call in last.tool_calls]
        # Every call finishes (and reports) before one's error is raised: a call cut off
        # between its claim and its report would stay in doubt, never to run again.
        answers = await asyncio.gather(*calls, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return {"messages": answers}

    async def _answer(self, call: dict[str, Any], call_id: str, session: str | None) -> ToolMessage:
        tool = self.tools.get(call["name"])
        problem = f"there is no tool {call['name']!r}" if tool is None else _misfit(tool, call["args"])
        if tool is None or problem:
            return _not_made(call, problem)
        try:
            permit = await self.gate.require(
                tool.name, call["args"], session=session, call_id=call_id, description=tool.description
            )
        except (Denied, Rejected) as exc:
            return _not_made(call, str(exc))

        async def run(**approved: Any) -> Any:
            return await tool.ainvoke(approved)

        output = await self.gate.run(permit, run)
        return ToolMessage(str(output), tool_call_id=call["id"])


def _gated_id(call_id: str, earlier: list[BaseMessage]) -> str:
    """Return the id to gate a call with: its own, or `<id>#<n>` when `n` earlier turns used it.

    The history is the graph's checkpoint, so a retried node derives the same id again.
    """
    reused = sum(
        call["id"] == call_id for message in earlier if isinstance(message, AIMessage) for call in message.tool_calls
    )
    return f"{call_id}#{reused}" if reused else call_id


def _misfit(tool: BaseTool, arguments: dict[str, Any]) -> str:
    """Return why the arguments do not fit the tool's schema ("" when they do, or it has no pydantic schema)."""
    schema = tool.tool_call_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return ""
    try:
        schema.model_validate(arguments)
    except ValidationError as exc:
        return f"the arguments do not fit {tool.name}: {exc}"
    return ""


def _not_made(call: dict[str, Any], why: str) -> ToolMessage:
    return ToolMessage(f"The call was not made: {why}", tool_call_id=call["id"], status="error")
