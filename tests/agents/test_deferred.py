"""Deferred calls: the run goes on; after approval the call runs once and the model is told."""

from __future__ import annotations

import json
from typing import Any

from agents.models import Message, SideEffect, ToolCall
from agents.runtime.execution import execute_deferred
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import decide, pending, resume, start

CONFIG = """
agents:
  ops:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [send_email, refund_request]
tool_overrides:
  send_email: {{risk: high, hitl_mode: defer}}
  refund_request: {{risk: high, hitl_mode: suspend}}
"""


def respond(body: dict[str, Any]) -> Reply:
    """Turn 1: an email (deferred) and a refund (suspend) together; then a summary."""
    if not tool_messages(body):
        email = {"to": "bob@example.com", "subject": "Refund", "body": "on its way"}
        refund = {"order_id": "A1002", "amount_cents": 700}
        return Reply(
            tool_calls=[
                ("call_mail", "send_email", json.dumps(email)),
                ("call_refund", "refund_request", json.dumps(refund)),
            ]
        )
    updates = [m["content"] for m in body["messages"] if m["role"] == "system" and "deferred" in m["content"]]
    return Reply(content=f"done; {len(updates)} deferred update(s)")


def test_it_tells_an_active_run_the_outcome_of_its_deferred_call_once(db, agent_config, fake_openai):
    agent_config(CONFIG.format(base_url=fake_openai.base_url))
    fake_openai.script(respond)
    run = start("send the email and refund", agent="ops")
    assert run.status == "suspended"  # the refund waits; the email only queued
    mail = next(a for a in pending(run) if a.tool == "send_email")
    refund = next(a for a in pending(run) if a.tool == "refund_request")

    decide(mail, "approved")
    assert execute_deferred(mail.tool_call_id) == "succeeded"
    assert ToolCall.objects.get(pk=mail.tool_call_id).reported_at is None
    decide(refund, "approved", auto_resume=False)
    run = resume(run)

    last_request = fake_openai.requests[-1]["messages"]
    [update] = [m for m in last_request if m["role"] == "system" and "deferred" in m["content"]]
    assert "send_email (call_mail)" in update["content"] and '"status": "sent"' in update["content"]
    assert run.output == "done; 1 deferred update(s)"
    assert ToolCall.objects.get(pk=mail.tool_call_id).reported_at is not None
    assert Message.objects.filter(run=run, role="system").count() == 1


def test_it_fails_a_deferred_call_its_tool_no_longer_takes_once_instead_of_retrying_forever(
    db, agent_config, fake_openai
):
    agent_config(CONFIG.format(base_url=fake_openai.base_url))
    fake_openai.script(respond)
    run = start("send the email and refund", agent="ops")
    mail = next(a for a in pending(run) if a.tool == "send_email")
    # As after a deploy whose send_email needs more than the proposal holds.
    ToolCall.objects.filter(pk=mail.tool_call_id).update(arguments={"to": "bob@example.com"})
    decide(mail, "approved")

    assert execute_deferred(mail.tool_call_id) == "invalid arguments"
    call = ToolCall.objects.get(pk=mail.tool_call_id)
    assert call.status == ToolCall.Status.FAILED and call.executed_at is None
    assert call.result["error_code"] == "INVALID_ARGUMENTS"
    assert execute_deferred(mail.tool_call_id) == "already recorded"  # a redelivered task finds the outcome
    assert not SideEffect.objects.filter(idempotency_key=mail.pk).exists()
