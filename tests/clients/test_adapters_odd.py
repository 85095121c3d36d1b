"""The LangGraph adapter on the paths a model takes when it misbehaves: several calls, unknown tools, bad arguments, reused ids.

A real LangGraph graph, a local OpenAI-compatible model (tests/support/fake_openai.py) and
a running agentfast; a reviewer decides over the API.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agentfast_client import AsyncGate, StillPending
from agentfast_client.langgraph import GatedToolNode
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

from agents.models import Approval, ToolCall
from tests.clients.conftest import Server
from tests.support.fake_openai import Reply, tool_messages

pytestmark = pytest.mark.integration
FLOW = Path(__file__).with_name("openai_agents_flow.py")
Script = Callable[[dict[str, Any]], Reply]


class Graph:
    """A graph (agent → gated tools → agent) run in a thread, its wires and its final state."""

    def __init__(
        self, server: Server, fake_openai: Any, script: Script, *, thread_id: str, wait: float = 60, slow: float = 0
    ) -> None:
        fake_openai.script(script)
        self.wires: list[tuple[int, str]] = []
        self.outcome: dict[str, Any] = {}

        @tool
        def wire_money(cents: int, to: str) -> str:
            """Wire money to a supplier."""
            time.sleep(slow)
            self.wires.append((cents, to))
            return f"wire W-{len(self.wires)} of {cents} to {to}"

        model = ChatOpenAI(model="test-model", base_url=fake_openai.base_url, api_key="test").bind_tools([wire_money])

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        def route(state: MessagesState) -> str:
            return "tools" if state["messages"][-1].tool_calls else END

        async def run() -> Any:
            gate = AsyncGate(server.url, server.agent_token, agent="langgraph", timeout=wait)
            graph = StateGraph(MessagesState)
            graph.add_node("agent", agent)
            graph.add_node("tools", GatedToolNode(gate, [wire_money]))
            graph.add_edge(START, "agent")
            graph.add_conditional_edges("agent", route)
            graph.add_edge("tools", "agent")
            try:
                config = {"configurable": {"thread_id": thread_id}}
                return await graph.compile().ainvoke({"messages": [("user", "Pay ACME")]}, config)
            finally:
                await gate.aclose()

        def main() -> None:
            try:
                self.outcome["state"] = asyncio.run(run())
            except Exception as exc:  # noqa: BLE001 (the test asserts on it)
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=main)
        self.thread.start()

    def final(self) -> str:
        self.thread.join(timeout=60)
        assert "error" not in self.outcome, self.outcome["error"]
        return str(self.outcome["state"]["messages"][-1].content)


def _propose(*calls: tuple[str, str, dict[str, Any]]) -> Script:
    """Propose `calls` in one turn; once answered, say what the tools answered."""

    def respond(body: dict[str, Any]) -> Reply:
        outputs = tool_messages(body)
        if not outputs:
            return Reply(tool_calls=[(call_id, name, json.dumps(args)) for call_id, name, args in calls])
        return Reply(content=" | ".join(str(output["content"]) for output in outputs))

    return respond


def test_it_asks_for_every_call_of_one_turn_at_once(server: Server, fake_openai: Any) -> None:
    script = _propose(
        ("call_a", "wire_money", {"cents": 100, "to": "ACME"}),
        ("call_b", "wire_money", {"cents": 200, "to": "Initech"}),
    )
    graph = Graph(server, fake_openai, script, thread_id="lg-two")
    first = server.approval_id(agent="langgraph", session="lg-two", call_id="call_a")
    second = server.approval_id(agent="langgraph", session="lg-two", call_id="call_b")
    server.await_pending(first)
    # The reviewer sees both before deciding either: the second is not hidden behind the first.
    server.await_pending(second, within=10)
    server.decide(second, "approved")
    for _ in range(200):  # the second runs while the first still waits
        if graph.wires:
            break
        graph.thread.join(timeout=0.05)
    server.decide(first, "approved")

    # Answered in the message's order, each with its own wire.
    assert graph.final() == "wire W-2 of 100 to ACME | wire W-1 of 200 to Initech"
    assert graph.wires == [(200, "Initech"), (100, "ACME")]


def test_it_lets_every_call_of_a_turn_report_before_the_node_fails(server: Server, fake_openai: Any) -> None:
    script = _propose(
        ("call_a", "wire_money", {"cents": 100, "to": "ACME"}),
        ("call_b", "wire_money", {"cents": 200, "to": "Initech"}),
    )
    graph = Graph(server, fake_openai, script, thread_id="lg-fail", wait=3, slow=4)
    first = server.approval_id(agent="langgraph", session="lg-fail", call_id="call_a")
    server.await_pending(first)
    server.decide(first, "approved")  # call_b is never decided: its wait gives up while call_a's wire runs
    graph.thread.join(timeout=60)

    assert isinstance(graph.outcome["error"], StillPending)
    assert graph.wires == [(100, "ACME")]
    # call_a reported what it did, so a retried node replays it instead of finding it in doubt.
    assert ToolCall.objects.get(call_id="call_a").result == {"ok": True, "result": "wire W-1 of 100 to ACME"}


def test_it_tells_the_model_a_tool_it_has_not_does_not_exist(server: Server, fake_openai: Any) -> None:
    script = _propose(("call_x", "drop_database", {}), ("call_w", "wire_money", {"cents": 100, "to": "ACME"}))
    graph = Graph(server, fake_openai, script, thread_id="lg-unknown")
    approval_id = server.approval_id(agent="langgraph", session="lg-unknown", call_id="call_w")
    server.await_pending(approval_id)
    server.decide(approval_id, "approved")

    assert graph.final() == "The call was not made: there is no tool 'drop_database' | wire W-1 of 100 to ACME"
    assert graph.wires == [(100, "ACME")]


def test_it_returns_arguments_that_do_not_fit_the_tool_to_the_model_without_asking(
    server: Server, fake_openai: Any
) -> None:
    script = _propose(("call_bad", "wire_money", {"cents": "lots", "to": "ACME"}))
    graph = Graph(server, fake_openai, script, thread_id="lg-bad", wait=3)

    final = graph.final()
    assert final.startswith("The call was not made: the arguments do not fit wire_money: "), final
    assert "cents" in final
    assert not Approval.objects.exists()
    assert graph.wires == []


def test_it_asks_again_for_a_call_id_the_model_reuses_in_a_later_turn(server: Server, fake_openai: Any) -> None:
    wire = ("call_0", "wire_money", json.dumps({"cents": 100, "to": "ACME"}))

    def respond(body: dict[str, Any]) -> Reply:
        """Some OpenAI-compatible servers number calls per message: the second wire is call_0 too."""
        outputs = tool_messages(body)
        if len(outputs) < 2:
            return Reply(tool_calls=[wire])
        return Reply(content=" | ".join(str(output["content"]) for output in outputs))

    graph = Graph(server, fake_openai, respond, thread_id="lg-reuse")
    first = server.approval_id(agent="langgraph", session="lg-reuse", call_id="call_0")
    server.await_pending(first)
    server.decide(first, "approved")
    pending = Approval.objects.filter(status=Approval.Status.PENDING)
    for _ in range(200):
        if pending.exists():
            break
        graph.thread.join(timeout=0.05)
    second = pending.get()  # the second wire is a call of its own, asked for again
    server.decide(second.pk, "approved")

    assert graph.final() == "wire W-1 of 100 to ACME | wire W-2 of 100 to ACME"
    assert graph.wires == [(100, "ACME"), (100, "ACME")]


def test_it_returns_arguments_that_are_no_json_object_to_an_openai_agents_sdk_model(
    server: Server, fake_openai: Any, tmp_path: Path, openai_agents_python: Path
) -> None:
    odd = ["{not json", "[2500]", '{"cents": NaN, "to": "ACME"}']
    asked = iter(odd)  # one run of the agent each, in one process (the SDK's import takes seconds)

    def respond(body: dict[str, Any]) -> Reply:
        outputs = tool_messages(body)
        if not outputs:
            return Reply(tool_calls=[("call_bad", "wire_money", next(asked))])
        return Reply(content=f"Read: {outputs[-1]['content']}")

    fake_openai.script(respond)
    ledger = tmp_path / "wires.txt"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    args = [str(openai_agents_python), str(FLOW), server.url, server.agent_token, fake_openai.base_url, str(ledger)]
    args.append(str(len(odd)))
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False)

    assert done.returncode == 0, done.stderr
    finals = done.stdout.splitlines()
    assert len(finals) == len(odd), done.stdout
    for final in finals:
        assert final.startswith("Read: The call was not made: the arguments are not a JSON object"), final
    assert not Approval.objects.exists()
    assert not ledger.exists()
