"""The Python client (clients/python) against a running agentfast: guard, require, async, errors."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from agentfast_client import AsyncGate, Denied, Gate, Rejected, StillPending
from agentfast_client._core import _after_claim, _after_wait

from agents import services
from agents.models import ToolCall
from tests.clients.conftest import Server
from tests.support import flows

pytestmark = pytest.mark.integration


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start fn in a thread; its value or exception lands in the returned dict."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except Exception as exc:  # noqa: BLE001 (the test asserts on it)
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_it_runs_a_guarded_function_once_after_a_reviewer_approves(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-1")
    wires: list[tuple[int, str]] = []

    @gate.guard(tool="wire_money")
    def wire_money(cents: int, to: str) -> dict[str, Any]:
        """Wire money to a supplier."""
        wires.append((cents, to))
        return {"wire": f"W-{len(wires)}"}

    thread, outcome = _in_thread(lambda: wire_money(2500, "ACME", call_id="c1"))
    approval_id = server.approval_id(agent="billing", session="thread-1", call_id="c1")
    server.await_pending(approval_id)
    assert wires == []
    server.decide(approval_id, "approved")
    thread.join(timeout=60)

    assert outcome == {"value": {"wire": "W-1"}}
    assert wires == [(2500, "ACME")]
    # The same call again: the stored result, not a second wire.
    assert wire_money(2500, "ACME", call_id="c1") == {"wire": "W-1"}
    assert wires == [(2500, "ACME")]


def test_it_raises_rejected_with_the_reviewers_note(server: Server) -> None:
    ran: list[int] = []

    async def flow() -> Any:
        gate = AsyncGate(server.url, server.agent_token, agent="billing", session="thread-2")

        @gate.guard(tool="wire_money")
        async def wire_money(cents: int) -> str:
            ran.append(cents)
            return "sent"

        try:
            return await wire_money(5000, call_id="c2")
        finally:
            await gate.aclose()

    thread, outcome = _in_thread(lambda: asyncio.run(flow()))
    approval_id = server.approval_id(agent="billing", session="thread-2", call_id="c2")
    server.await_pending(approval_id)
    server.decide(approval_id, "rejected", note="not this supplier", feedback="wire it to ACME instead")
    thread.join(timeout=60)

    assert isinstance(outcome["error"], Rejected)
    assert (outcome["error"].note, outcome["error"].feedback) == ("not this supplier", "wire it to ACME instead")
    # What the framework adapters hand the model, to revise with.
    assert str(outcome["error"]) == "rejected: not this supplier; the reviewer's feedback: wire it to ACME instead"
    assert (outcome["error"].decision, outcome["error"].status) == ("rejected", 0)  # status: HTTP's, as every GateError
    assert ran == []


def test_it_hands_back_the_approving_reviewers_note_and_answer(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-words")

    thread, outcome = _in_thread(lambda: gate.require("wire_money", {"cents": 2500}, call_id="w1"))
    approval_id = server.approval_id(agent="billing", session="thread-words", call_id="w1")
    server.await_pending(approval_id)
    server.decide(approval_id, "approved", note="once only", payload={"answer": "the EUR account"})
    thread.join(timeout=60)

    permit = outcome["value"]
    assert (permit.claimed, permit.note, permit.payload) == (True, "once only", {"answer": "the EUR account"})


def test_it_raises_denied_and_still_pending_and_runs_unlisted_tools_at_once(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-3")

    with pytest.raises(Denied) as denied:
        gate.require("wire_money", {"cents": 500_000}, call_id="big")
    assert denied.value.reason == "wires over 1,000.00 need a ticket"

    with pytest.raises(StillPending) as pending:
        gate.require("wire_money", {"cents": 700}, call_id="slow", timeout=0.2)
    assert pending.value.approval_id == server.approval_id(agent="billing", session="thread-3", call_id="slow")

    permit = gate.require("lookup_order", {"order": "A-1"}, call_id="look")
    assert permit.claimed and permit.arguments == {"order": "A-1"}
    assert gate.run(permit, lambda order: f"order {order}") == "order A-1"
    again = gate.require("lookup_order", {"order": "A-1"}, call_id="look")
    assert not again.claimed and again.result == {"ok": True, "result": "order A-1"}


def test_it_calls_a_guarded_function_as_it_was_called_starred_and_positional_only_arguments_too(
    server: Server,
) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-10")
    calls: list[tuple[Any, ...]] = []

    @gate.guard(tool="send_note")  # unlisted: allowed at once
    def send_note(channel: str, /, to: str, *cc: str, urgent: bool = False, **headers: str) -> str:
        calls.append((channel, to, cc, urgent, headers))
        return "sent"

    assert send_note("mail", "bob", "carol", "dan", urgent=True, topic="refund") == "sent"
    assert calls == [("mail", "bob", ("carol", "dan"), True, {"topic": "refund"})]
    [gated] = ToolCall.objects.filter(name="send_note").values_list("arguments", flat=True)
    assert gated == {
        "channel": "mail",
        "to": "bob",
        "cc": ["carol", "dan"],
        "urgent": True,
        "headers": {"topic": "refund"},
    }


def test_it_reports_a_result_json_cannot_carry_as_it_is_and_keeps_it(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-5")
    ran: list[str] = []

    @gate.guard(tool="measure")
    def measure(name: str) -> dict[str, Any]:
        ran.append(name)
        return {"ratio": float("nan"), "peak": float("-inf"), "file": "report\udce9.csv"}

    first = measure("load", call_id="m1")
    again = measure("load", call_id="m1")

    assert math.isnan(first["ratio"]) and first["file"] == "report\udce9.csv"  # what the function returned
    assert again == {"ratio": None, "peak": None, "file": "report\ufffd.csv"}  # what was stored
    assert ran == ["load"]
    assert ToolCall.objects.get(name="measure").status == ToolCall.Status.SUCCEEDED


def test_it_raises_denied_for_a_wait_that_ends_in_a_refusal_nobody_made(server: Server, alice: Any) -> None:
    # A standing grant that rejects decides the second call as it is gated: the wait on it says denied.
    gate = Gate(server.url, server.agent_token, agent="billing", session="thread-9")
    first = server.approval_id(agent="billing", session="thread-9", call_id="c1")
    with pytest.raises(StillPending):
        gate.require("wire_money", {"cents": 700}, call_id="c1", timeout=0)
    flows.decide(first, "rejected", note="never", remember=services.Remember.of("exact", 3600))

    with pytest.raises(Denied) as denied:
        gate.require("wire_money", {"cents": 700}, call_id="c2")
    assert denied.value.reason.startswith("a remembered rejection by alice")
    state = gate.wait(server.approval_id(agent="billing", session="thread-9", call_id="c2"), timeout=0)
    assert (state["status"], state["decision"]) == ("rejected", "denied")
    with pytest.raises(Denied) as waited:
        _after_wait(state)  # what require() makes of a wait's answer
    assert waited.value.reason == denied.value.reason


def test_it_runs_a_reviewers_edit_that_empties_the_arguments_not_the_proposal() -> None:
    claim = {"claimed": True, "state": "running", "arguments": {}, "idempotency_key": "k", "result": None}
    permit = _after_claim("appr_1", claim, {"to": "everyone"})
    assert permit.arguments == {}
    unedited = _after_claim("appr_1", {**claim, "arguments": None}, {"to": "everyone"})  # an older server's answer
    assert unedited.arguments == {"to": "everyone"}
