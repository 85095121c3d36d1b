"""An OpenAI Agents SDK agent whose `wire_money` tool asks agentfast first (run by test_adapters.py).

Usage: python openai_agents_flow.py AGENTFAST_URL TOKEN MODEL_BASE_URL LEDGER_FILE [RUNS]; runs the agent RUNS
times (default 1: importing the SDK takes seconds), in sessions oa-1, oa-2, …, and prints each final output
on a line of its own.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentfast_client import AsyncGate
from agentfast_client.openai_agents import gated_tool
from openai import AsyncOpenAI

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled


async def main(url: str, token: str, base_url: str, ledger: Path, session: str) -> str:
    set_tracing_disabled(True)

    @function_tool
    def wire_money(cents: int, to: str) -> str:
        """Wire money to a supplier."""
        with ledger.open("a") as file:
            file.write(f"{cents} {to}\n")
        return f"wire W-1 of {cents} to {to}"

    gate = AsyncGate(url, token, agent="openai-agents", session=session)
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=AsyncOpenAI(base_url=base_url, api_key="test"))
    agent = Agent(name="billing", instructions="Pay suppliers.", model=model, tools=[gated_tool(gate, wire_money)])
    try:
        result = await Runner.run(agent, "Pay ACME 25.00")
    finally:
        await gate.aclose()
    return str(result.final_output)


if __name__ == "__main__":
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    for run in range(1, runs + 1):
        print(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), f"oa-{run}")), flush=True)
