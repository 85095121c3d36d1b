"""Every end of a deferred call (in doubt, rejected, failed, expired, ran) reaches the model once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents import services
from agents.models import Approval, Message, Run, RunEvent, ToolCall
from agents.runtime import outputs
from agents.runtime.execution import execute_deferred
from agents.services.deadlines import approval_deadline_fire
from agents.sweeper import DEFERRED_CLAIM_TIMEOUT, sweep
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import decide, pending, resume, start

CONFIG = """
agents:
  ops:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [send_email, explode, refund_request]
tool_overrides:
  send_email: {{risk: high, hitl_mode: defer, timeout: {timeout}}}
  explode: {{risk: high, hitl_mode: defer}}
  refund_request: {{risk: high, hitl_mode: suspend}}
"""
UPDATE = "Update on a deferred call: "


def script(deferred_tool: str) -> Callable[[dict[str, Any]], Reply]:
    """Turn 1: the deferred call and a refund; turn 2: a second refund (the run pauses again); then an answer."""
    deferred_arguments = {
        "send_email": {"to": "bob@example.com", "subject": "Refund", "body": "on its way"},
        "explode": {"reason": "the mail server is down"},
    }[deferred_tool]

    def respond(body: dict[str, Any]) -> Reply:
        told = len(tool_messages(body))
        if told == 0:
            return Reply(
                tool_calls=[
                    ("call_later", deferred_tool, json.dumps(deferred_arguments)),
                    ("call_refund", "refund_request", json.dumps({"order_id": "A1002", "amount_cents": 700})),
                ]
            )
        if told == 2:
            refund = {"order_id": "A1003", "amount_cents": 500}
            return Reply(tool_calls=[("call_refund_2", "refund_request", json.dumps(refund))])
        return Reply(content="done")

    return respond


def updates(request: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Return the deferred-call updates the model read in one request: (the call, the outcome it was told)."""
    told = [m["content"] for m in request["messages"] if m["role"] == "system" and m["content"].startswith(UPDATE)]
    return [(call.removeprefix(UPDATE), json.loads(outcome)) for call, outcome in (t.split(" → ", 1) for t in told)]


def die_after_claiming(approval: Approval) -> dict[str, Any]:
    """Approve; a worker claims the call and dies before storing a result; the sweeper marks it in doubt."""
    decide(approval, "approved")
    assert services.toolcall_claim(tool_call=approval.tool_call) is not None
    claimed_long_ago = timezone.now() - DEFERRED_CLAIM_TIMEOUT - timedelta(minutes=1)
    ToolCall.objects.filter(pk=approval.tool_call_id).update(executed_at=claimed_long_ago)
    assert sweep().in_doubt == [approval.tool_call_id]
    assert ToolCall.objects.get(pk=approval.tool_call_id).result is None
    return outputs.in_doubt(approval.tool)


def reject(approval: Approval) -> dict[str, Any]:
    decide(approval, "rejected", note="not to bob")
    assert execute_deferred(approval.tool_call_id) == "rejected"
    return outputs.rejected(approval.tool, "not to bob")


def fail(approval: Approval) -> dict[str, Any]:
    decide(approval, "approved")
    assert execute_deferred(approval.tool_call_id) == "failed"
    return outputs.error("TOOL_FAILED", "RuntimeError: the mail server is down")


def expire(approval: Approval) -> dict[str, Any]:
    time.sleep(max(0.0, (approval.expires_at - timezone.now()).total_seconds()) + 0.01)
    assert approval_deadline_fire(approval_id=approval.id) == "expired"
    assert execute_deferred(approval.tool_call_id) == "expired"
    return outputs.expired(approval.tool, "no decision before the deadline")


def run_it(approval: Approval) -> dict[str, Any]:
    decide(approval, "approved")
    assert execute_deferred(approval.tool_call_id) == "succeeded"
    return ToolCall.objects.get(pk=approval.tool_call_id).result


@pytest.mark.parametrize(
    ("deferred_tool", "settle"),
    [
        ("send_email", die_after_claiming),
        ("send_email", reject),
        ("explode", fail),
        ("send_email", expire),
        ("send_email", run_it),
    ],
    ids=["in_doubt", "rejected", "failed", "expired", "succeeded"],
)
def test_it_tells_the_model_the_end_of_a_deferred_call_once(
    db, agent_config, fake_openai, deferred_tool: str, settle: Callable[[Approval], dict[str, Any]]
):
    # A deadline that passes within the test for the expiry only: on a busy machine 0.2 s can
    # pass before the other cases decide, and a decision after the deadline is refused.
    timeout = 0.2 if settle is expire else 600
    agent_config(CONFIG.format(base_url=fake_openai.base_url, timeout=timeout))
    fake_openai.script(script(deferred_tool))
    run = start("send the email and refund", agent="ops")
    assert run.status == Run.Status.SUSPENDED  # the refund waits; the deferred call only queued
    later = next(a for a in pending(run) if a.mode == Approval.Mode.DEFER)
    told = settle(later)

    decide(next(a for a in pending(run) if a.tool == "refund_request"), "approved", auto_resume=False)
    run = resume(run)
    assert run.status == Run.Status.SUSPENDED  # on the second refund
    decide(pending(run)[0], "approved", auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    first, second, third = fake_openai.requests
    expected = (f"{deferred_tool} (call_later)", told)
    assert updates(first) == []
    assert updates(second) == [expected]
    assert updates(third) == [expected]  # the same message in the history: never told again
    assert Message.objects.filter(run=run, role=Message.Role.SYSTEM).count() == 1
    assert ToolCall.objects.get(pk=later.tool_call_id).reported_at is not None


def test_it_does_not_tell_a_late_result_of_a_call_already_reported_in_doubt(db, agent_config, fake_openai):
    agent_config(CONFIG.format(base_url=fake_openai.base_url, timeout=600))
    fake_openai.script(script("send_email"))
    run = start("send the email and refund", agent="ops")
    later = next(a for a in pending(run) if a.mode == Approval.Mode.DEFER)
    die_after_claiming(later)
    decide(next(a for a in pending(run) if a.tool == "refund_request"), "approved", auto_resume=False)
    run = resume(run)

    # The worker was only slow: its result arrives after the model was told the outcome is unknown.
    call = ToolCall.objects.get(pk=later.tool_call_id)
    assert services.toolcall_record_result(tool_call=call, status=ToolCall.Status.SUCCEEDED, output=outputs.ok({}))
    decide(pending(run)[0], "approved", auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert updates(fake_openai.requests[-1]) == [("send_email (call_later)", outputs.in_doubt("send_email"))]
    assert Message.objects.filter(run=run, role=Message.Role.SYSTEM).count() == 1


def test_it_keeps_a_late_result_of_a_call_in_doubt_on_a_cancelled_run_and_never_drives_it_again(
    db, agent_config, fake_openai, client, carol
):
    agent_config(CONFIG.format(base_url=fake_openai.base_url, timeout=600))
    fake_openai.script(script("send_email"))
    run = start("send the email and refund", agent="ops")
    later = next(a for a in pending(run) if a.mode == Approval.Mode.DEFER)
    in_doubt = die_after_claiming(later)
    attempt = services.Attempt(actor="carol", source="cli", origin="tests")
    services.run_cancel(run_id=run.id, attempt=attempt)  # nothing runs any more: the call's claim ran out
    history = list(Message.objects.filter(run=run).values_list("seq", "content"))

    # The worker was only slow: what it did is a fact, kept and shown after the cancel.
    call = ToolCall.objects.get(pk=later.tool_call_id)
    sent = outputs.ok({"message_id": "m-1"})
    assert services.toolcall_record_result(tool_call=call, status=ToolCall.Status.SUCCEEDED, output=sent)

    call.refresh_from_db()
    assert (call.status, call.result) == (ToolCall.Status.SUCCEEDED, sent)
    told = [
        e.data
        for e in RunEvent.objects.filter(run=run, type__in=["tool_result", "run_status"]).order_by("seq")
        if e.data.get("call_id", "call_later") == "call_later"
    ]
    assert told == [
        {"call_id": "call_later", "tool": "send_email", "output": outputs.pending("send_email", later.id)},
        {"call_id": "call_later", "tool": "send_email", "output": in_doubt, "in_doubt": True, "deferred": True},
        {"status": "cancelled", "by": "carol"},
        {"call_id": "call_later", "tool": "send_email", "output": sent, "deferred": True},
    ]
    # Nothing drives the cancelled run again, and the model is never told.
    report = sweep()
    assert (report.runs, report.deferred, report.in_doubt) == ([], [], [])
    assert resume(run).status == Run.Status.CANCELLED
    assert list(Message.objects.filter(run=run).values_list("seq", "content")) == history
    client.force_login(carol)
    page = client.get(f"/runs/{run.id}").content.decode()
    assert "no result came back from its worker" in page
    assert "m-1" in page
