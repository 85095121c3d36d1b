"""OpenAI Agents SDK adapter (extra `openai-agents`): a function tool whose calls go through the gate.

    from agents import Agent, function_tool
    from agentfast_client.openai_agents import gated_tool

    agent = Agent(name="billing", tools=[gated_tool(gate, function_tool(wire_money))])

Each call is gated with the model's tool call id (a retried run finds the same approval),
waited on, claimed and run once; a denial or rejection is told to the model as the tool's
output, with the reviewer's note.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agentfast_client._core import AsyncGate, Denied, Rejected
from agents import FunctionTool  # the OpenAI Agents SDK's package is named `agents`


def gated_tool(
    gate: AsyncGate, tool: FunctionTool, *, session: str | None = None, name: str | None = None
) -> FunctionTool:
    """Return a copy of `tool` that asks agentfast (as tool `name`, default the tool's) before each call."""
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(context: Any, input_json: str) -> Any:
        arguments = json.loads(input_json or "{}")
        try:
            permit = await gate.require(
                name or tool.name,
                arguments,
                session=session,
                call_id=context.tool_call_id,
                description=tool.description,
            )
        except (Denied, Rejected) as exc:
            return f"The call was not made: {exc}"

        async def run(**approved: Any) -> Any:
            return await invoke(context, json.dumps(approved))

        return await gate.run(permit, run)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
