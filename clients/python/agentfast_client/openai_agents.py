"""OpenAI Agents SDK adapter (extra `openai-agents`): a function tool whose calls go through the gate.

    from agents import Agent, function_tool
    from agentfast_client.openai_agents import gated_tool

    agent = Agent(name="billing", tools=[gated_tool(gate, function_tool(wire_money))])

Each call is gated with the model's tool call id (a retried run finds the same approval),
waited on, claimed and run once; a denial or rejection is told to the model as the tool's
output, with the reviewer's note; so are arguments that are no JSON object, and nobody is asked.
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
        arguments = _arguments(input_json)
        if arguments is None:
            return "The call was not made: the arguments are not a JSON object; call the tool again with one."
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


def _arguments(input_json: str) -> dict[str, Any] | None:
    """Return the model's arguments as an object, None when they are not one (nor JSON: NaN, Infinity)."""
    try:
        arguments = json.loads(input_json or "{}", parse_constant=_refuse)
    except ValueError:
        return None
    return arguments if isinstance(arguments, dict) else None


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")
