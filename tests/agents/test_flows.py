"""The human-in-the-loop flows of DESIGN.md, through services and the runtime in process."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import runtime, services
from agents.models import Approval, AuditEntry, Message, Run, RunEvent, SideEffect, ToolCall
from agents.runtime.execution import execute_deferred
from tests.support.flows import decide, pending, resume, roles, start, tool_outputs

REFUND = "Refund order A1001 for 25.00 USD"


def test_it_pauses_before_a_suspend_tool_with_a_derived_approval_id(db):
    run = start(REFUND)

    assert run.status == Run.Status.SUSPENDED
    assert run.lease_owner == "" and run.lease_expires_at is None  # no process holds it
    [approval] = pending(run)
    call = approval.tool_call
    assert approval.id == f"appr_{run.id}_{call.call_id}"
    assert (call.name, call.arguments) == ("refund_request", {"order_id": "A1001", "amount_cents": 2500})
    assert approval.mode == "suspend"
    assert call.executed_at is None
    assert not SideEffect.objects.exists()
    # lookup_order (low risk) ran at once; the refund waits.
    assert tool_outputs(run)[0]["result"]["order_id"] == "A1001"


def test_it_drives_a_fresh_run_from_the_prompt_the_lease_returned(db):
    run = services.run_create(agent="support", input=REFUND, enqueue=False)

    with CaptureQueriesContext(connection) as queries:
        result = runtime.drive(run.id, stream=False)

    assert result.status == Run.Status.SUSPENDED
    [approval] = pending(run)  # the model read the prompt: it asked for the refund of A1001
    assert approval.tool_call.arguments == {"order_id": "A1001", "amount_cents": 2500}
    statements = [q["sql"] for q in queries.captured_queries]
    first_turn = next(i for i, sql in enumerate(statements) if 'INSERT INTO "agents_message"' in sql)
    # Up to the first model turn's writes, nothing read the one message the run had.
    assert not [sql for sql in statements[:first_turn] if 'FROM "agents_message"' in sql]


def test_it_runs_the_approved_call_once_and_finishes(db):
    run = start(REFUND)
    [approval] = pending(run)

    decision = decide(approval, "approved", auto_resume=False)
    assert decision.outcome == "decided" and not decision.resume_enqueued
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert "Refunded 25.00 USD for order A1001" in run.output
    [effect] = SideEffect.objects.all()
    assert effect.idempotency_key == approval.id
    assert effect.arguments == {"order_id": "A1001", "amount_cents": 2500}
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == "succeeded" and call.executed_at is not None
    assert call.executed_arguments == {"order_id": "A1001", "amount_cents": 2500}
    # A second resume finds nothing to do and never touches the effect.
    assert runtime.drive(run.id).driven is False
    assert SideEffect.objects.count() == 1


def test_it_enqueues_the_resume_on_commit_when_auto_resume_is_on(db, django_capture_on_commit_callbacks):
    run = start(REFUND)
    [approval] = pending(run)

    with django_capture_on_commit_callbacks() as callbacks:
        decision = decide(approval, "approved")

    assert decision.resume_enqueued is True
    assert len(callbacks) >= 2  # the push of approval_decided, and the resume


def test_it_publishes_the_resume_to_the_broker_once_the_decision_commits(db, django_capture_on_commit_callbacks):
    run = start(REFUND)
    [approval] = pending(run)
    broker = redis.Redis.from_url(settings.REDIS_URL)  # the broker, as redis-py spells its URL
    broker.delete("celery")

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        decide(approval, "approved")
        assert broker.llen("celery") == 0  # nothing before the commit
    for callback in callbacks:
        callback()

    [message] = broker.lrange("celery", 0, -1)
    headers = json.loads(message)["headers"]
    assert (headers["task"], headers["argsrepr"]) == ("agents.tasks.run_drive", repr((run.id,)))
    broker.delete("celery")


def test_it_queues_a_new_run_behind_decided_runs(db, django_capture_on_commit_callbacks):
    # Redis serves kombu's priority 0 list ("celery") before the priority 6 one: a decided
    # run resumes before a backlog of new runs starts.
    broker = redis.Redis.from_url(settings.REDIS_URL)
    later = "celery\x06\x166"
    broker.delete("celery", later)

    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_create(agent="support", input=REFUND, created_by="bob")

    assert broker.llen("celery") == 0
    [message] = broker.lrange(later, 0, -1)
    body = json.loads(message)
    assert (body["headers"]["task"], body["headers"]["argsrepr"]) == ("agents.tasks.run_start", repr((run.id,)))
    assert body["properties"]["priority"] == 6
    broker.delete("celery", later)


def test_it_keeps_a_committed_decision_when_the_broker_is_down(
    db, django_capture_on_commit_callbacks, redis_server, caplog
):
    run = start(REFUND)
    [approval] = pending(run)

    redis_server.stop()
    try:
        with django_capture_on_commit_callbacks(execute=True):
            decision = decide(approval, "approved")  # the resume cannot be published
    finally:
        redis_server.start()

    assert decision.outcome == "decided" and decision.resume_enqueued is True
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert "could not enqueue agents.tasks.run_drive" in caplog.text and "the sweeper will retry" in caplog.text


def test_it_gives_up_on_a_broker_that_is_down_at_once_rather_than_after_retries(
    db, django_capture_on_commit_callbacks, redis_server
):
    # kombu retried the connection for each message, sleeping 2 s then 4 s: every decision and
    # every new run took over 6 s to answer while Redis was down, and held a web thread meanwhile.
    [approval] = pending(start(REFUND))

    redis_server.stop()
    try:
        began = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            decide(approval, "approved")
            services.run_create(agent="support", input=REFUND, created_by="bob")
        took = time.monotonic() - began
    finally:
        redis_server.start()

    assert took < 2, f"two messages to a broker that is down took {took:.1f} s"
    assert Approval.objects.get(pk=approval.pk).status == "approved" and Run.objects.count() == 2


def test_it_leaves_the_resume_to_the_caller_when_the_run_says_so(db, django_capture_on_commit_callbacks):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)

    assert decide(approval, "approved").resume_enqueued is False


def test_it_tells_the_model_a_rejection_with_the_note(db):
    run = start(REFUND)
    [approval] = pending(run)

    decide(approval, "rejected", note="customer already refunded", auto_resume=False)
    run = resume(run)

    assert tool_outputs(run)[-1] == {
        "ok": False,
        "error_code": "APPROVAL_REJECTED",
        "message": "A human rejected 'refund_request': customer already refunded",
    }
    assert run.status == Run.Status.COMPLETED
    assert "sorry" in run.output.lower() and "customer already refunded" in run.output
    assert not SideEffect.objects.exists()


def test_it_revises_after_rejection_with_feedback(db):
    run = start(REFUND)
    [first] = pending(run)

    decide(first, "rejected", note="too much", feedback="make it 20.00", auto_resume=False)
    run = resume(run)

    # History reads: call, rejection, feedback; then a new call opens a new approval.
    assert roles(run)[-3:] == ["tool", "user", "assistant"]
    feedback = Message.objects.filter(run=run, role="user").last()
    assert feedback.content == "make it 20.00"
    [second] = pending(run)
    assert second.id != first.id
    assert second.tool_call.arguments == {"order_id": "A1001", "amount_cents": 2000}

    decide(second, "approved", auto_resume=False)
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    assert [e.arguments["amount_cents"] for e in SideEffect.objects.all()] == [2000]


def test_it_runs_edited_arguments_and_tells_the_model(db):
    run = start(REFUND)
    [approval] = pending(run)

    decide(approval, "approved", arguments={"order_id": "A1001", "amount_cents": 1500}, auto_resume=False)
    run = resume(run)

    [effect] = SideEffect.objects.all()
    assert effect.arguments["amount_cents"] == 1500
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.arguments["amount_cents"] == 2500  # as the model proposed
    assert call.executed_arguments["amount_cents"] == 1500  # what ran
    output = tool_outputs(run)[-1]
    assert output["edited_by_human"] is True and output["executed_arguments"]["amount_cents"] == 1500
    entry = AuditEntry.objects.get(approval_id=approval.id, outcome="decided")
    assert entry.detail["arguments_diff"] == {"amount_cents": [2500, 1500]}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"order_id": "A1001", "amount_cents": "lots"}, "amount_cents"),
        ({"order_id": "A1001"}, "amount_cents"),
        ({"order_id": "A1001", "amount_cents": 100, "extra": 1}, "extra"),
        ({"order_id": "A1001", "amount_cents": 999_999}, "at most the order total"),
    ],
)
def test_it_refuses_edited_arguments_that_fail_the_schema_or_the_check(db, arguments, message):
    run = start(REFUND)
    [approval] = pending(run)

    with pytest.raises(services.InvalidInput, match=message):
        decide(approval, "approved", arguments=arguments)

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert AuditEntry.objects.get(approval_id=approval.id).outcome == "invalid_arguments"


def test_it_gates_parallel_calls_each_and_resumes_after_the_last(db):
    run = start("Refund orders A1001 and A1002 for 20.00 USD each")

    first, second = pending(run)
    assert {first.tool_call.step} == {second.tool_call.step}  # one assistant message
    assert [a.tool_call.arguments["order_id"] for a in (first, second)] == ["A1001", "A1002"]
    stop = RunEvent.objects.filter(run=run, type="approval_required")
    assert {e.data["approval_id"] for e in stop} == {first.id, second.id}  # all listed, not the first

    decide(first, "approved", auto_resume=False)
    assert runtime.drive(run.id).driven is False  # still waiting on the second
    assert not SideEffect.objects.exists()

    decide(second, "rejected", note="not this one", auto_resume=False)
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    assert [e.arguments["order_id"] for e in SideEffect.objects.all()] == ["A1001"]
    assert "Refunded 20.00 USD for order A1001" in run.output and "not this one" in run.output


def test_it_resumes_a_parallel_step_once_both_are_decided_through_auto_resume(db, django_capture_on_commit_callbacks):
    run = start("Refund orders A1001 and A1002 for 20.00 USD each")
    first, second = pending(run)

    assert decide(first, "approved").resume_enqueued is False
    assert decide(second, "approved").resume_enqueued is True


def test_it_defers_a_call_and_runs_it_once_after_approval(db):
    run = start("Email bob@example.com that his refund is on its way")

    assert run.status == Run.Status.COMPLETED  # the run went on
    assert "queued for approval" in run.output
    [approval] = pending(run)
    assert approval.mode == "defer"
    assert tool_outputs(run)[0]["status"] == "APPROVAL_PENDING"
    assert approval.tool_call.arguments == {
        "to": "bob@example.com",
        "subject": "A message from support",
        "body": "his refund is on its way",
    }

    decide(approval, "approved")
    assert execute_deferred(approval.tool_call_id) == "succeeded"
    assert execute_deferred(approval.tool_call_id) == "already recorded"

    [effect] = SideEffect.objects.all()
    assert effect.tool == "send_email" and effect.idempotency_key == approval.id
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result["ok"] is True and call.result["result"]["to"] == "bob@example.com"


def test_it_records_a_rejected_deferred_call_without_running_it(db):
    run = start("Email bob@example.com that his refund is on its way")
    [approval] = pending(run)

    decide(approval, "rejected", note="wrong customer")
    assert execute_deferred(approval.tool_call_id) == "rejected"

    assert not SideEffect.objects.exists()
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result["error_code"] == "APPROVAL_REJECTED" and "wrong customer" in call.result["message"]


def test_it_lets_a_tool_ask_a_person_and_gives_it_the_answer(db):
    run = start("Ask a human whether to expedite order A1003")

    assert run.status == Run.Status.SUSPENDED
    [approval] = pending(run)
    assert approval.request == {"question": "Should we expedite order A1003?", "answer": "text"}
    assert approval.tool_call.executed_at is None  # no claim is held while a person thinks

    decide(approval, "approved", payload={"answer": "yes, ship it today"}, auto_resume=False)
    run = resume(run)

    assert tool_outputs(run)[-1]["result"]["answer"] == "yes, ship it today"
    assert run.output == "A person answered: yes, ship it today"


def test_it_checks_arguments_before_asking_anyone(db):
    run = start("Refund order A1001 for 80.00 USD")  # the order's total is 50.00

    assert run.status == Run.Status.COMPLETED
    assert not Approval.objects.exists()
    output = tool_outputs(run)[-1]
    assert output["ok"] is False and output["error_code"] == "CHECK_FAILED"
    assert ToolCall.objects.get(run=run, name="refund_request").status == "failed"


def test_it_keeps_the_first_decision_and_audits_every_attempt(db):
    run = start(REFUND)
    [approval] = pending(run)

    decide(approval, "approved", by="alice", auto_resume=False)
    again = decide(approval, "approved", by="alice", auto_resume=False)
    with pytest.raises(services.AlreadyDecided, match="already approved by alice"):
        decide(approval, "rejected", by="bob")

    assert again.outcome == "idempotent"
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")
    outcomes = list(AuditEntry.objects.filter(approval_id=approval.id).order_by("id").values_list("actor", "outcome"))
    assert outcomes == [("alice", "decided"), ("alice", "idempotent"), ("bob", "already_decided")]


def test_it_refuses_unknown_approvals_and_bad_decisions(db):
    run = start(REFUND)
    [approval] = pending(run)

    with pytest.raises(services.NotFound):
        decide("appr_nope", "approved")
    with pytest.raises(services.InvalidInput, match="decision must be"):
        decide(approval, "maybe")
    with pytest.raises(services.InvalidInput, match="only go with an approval"):
        decide(approval, "rejected", arguments={"order_id": "A1001", "amount_cents": 1})

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert AuditEntry.objects.filter(approval_id="appr_nope", outcome="not_found").exists()


def test_it_shows_a_claim_without_result_as_in_doubt_and_never_reruns_it(db):
    run = start(REFUND)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    # A worker claimed the call and died before recording a result.
    assert services.toolcall_claim(tool_call=approval.tool_call) is not None

    run = resume(run)

    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == "in_doubt"
    assert tool_outputs(run)[-1]["error_code"] == "IN_DOUBT"
    assert not SideEffect.objects.exists()
    assert "cannot tell whether" in run.output


def test_it_claims_a_call_exactly_once(db):
    run = start(REFUND)
    [approval] = pending(run)

    assert services.toolcall_claim(tool_call=approval.tool_call) is not None
    assert services.toolcall_claim(tool_call=approval.tool_call) is None


def test_it_stops_at_the_step_limit(db, agent_config):
    agent_config(
        """
agents:
  support:
    tools: [lookup_order, refund_request]
    max_steps: 1
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
"""
    )
    run = start(REFUND)

    assert run.status == Run.Status.FAILED
    assert "step limit" in run.error
    assert not ToolCall.objects.filter(name="refund_request").exists()  # the call past the limit never opened


def test_it_completes_with_the_final_answer_after_the_last_allowed_tool_turn(db, agent_config):
    agent_config("agents:\n  support:\n    tools: [lookup_order, refund_request]\n    max_steps: 2\n")

    run = start(REFUND)  # lookup (turn 1), refund (turn 2, low risk here), then the answer

    assert run.status == Run.Status.COMPLETED, run.error
    assert run.steps == 2
    assert run.output.startswith("Refunded 25.00 USD for order A1001")


def test_it_reports_a_crashing_tool_to_the_model(db, agent_config):
    agent_config("agents:\n  support:\n    tools: [explode]\n")
    run = services.run_create(agent="support", input="hello", enqueue=False)
    lease = services.run_lease(run_id=run.id, owner="t")
    assert lease is not None
    services.step_open(
        run_id=run.id,
        owner="t",
        seq=2,
        content="",
        suspend=False,
        tool_calls=[
            {"id": "call_x", "type": "function", "function": {"name": "explode", "arguments": '{"reason": "boom"}'}}
        ],
        calls=[services.PlannedCall(call_id="call_x", name="explode", arguments={"reason": "boom"}, status="proposed")],
    )
    Run.objects.filter(pk=run.id).update(lease_owner="", lease_expires_at=None)

    run = resume(run)

    assert tool_outputs(run)[0] == {"ok": False, "error_code": "TOOL_FAILED", "message": "RuntimeError: boom"}
    assert run.status == Run.Status.COMPLETED


def test_it_cancels_a_run_and_expires_its_approvals(db):
    run = start(REFUND)
    [approval] = pending(run)

    services.run_cancel(run_id=run.id, attempt=services.Attempt(actor="carol", source="cli"))

    approval.refresh_from_db()
    assert approval.status == "expired"
    with pytest.raises(services.WrongState, match="expired"):
        decide(approval, "approved")
    assert Run.objects.get(pk=run.id).status == "cancelled"
    assert runtime.drive(run.id).driven is False


def test_it_expires_overdue_approvals_and_tells_the_model(db, agent_config):
    agent_config(
        """
agents:
  support:
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend, timeout_seconds: 60}
"""
    )
    run = start(REFUND)
    [approval] = pending(run)
    assert approval.expires_at is not None
    Approval.objects.filter(pk=approval.pk).update(expires_at=approval.created_at)  # the deadline passes

    assert services.approval_expire_due() == 1
    run = resume(run)

    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"
    assert run.status == Run.Status.COMPLETED


def test_it_answers_anything_else_with_what_it_can_do(db):
    run = start("What is the weather like?")

    assert run.status == Run.Status.COMPLETED
    assert "demo model" in run.output and "Refund order A1001" in run.output
    assert not ToolCall.objects.filter(run=run).exists()


def test_it_drives_a_run_that_carries_its_own_agent(db):
    config = {
        "model": "demo",
        "tools": ["lookup_order", "refund_request"],
        "tool_overrides": {"lookup_order": {"risk": "high", "hitl_mode": "suspend"}},
    }
    run = services.run_create(agent="one-off", input=REFUND, agent_config=config, enqueue=False)

    run = resume(run)

    assert run.status == Run.Status.SUSPENDED  # its own rules add a gate the file does not have
    assert [approval.tool_call.name for approval in pending(run)] == ["lookup_order"]


@pytest.mark.parametrize(
    "own",
    [{"risk": "low"}, {"risk": "low", "hitl_mode": "defer"}, {"hitl_mode": "defer"}],
    ids=["low", "low-defer", "defer"],
)
def test_it_keeps_the_files_gate_whatever_a_runs_own_agent_says(db, own):
    config = {"tools": ["lookup_order", "refund_request"], "tool_overrides": {"refund_request": own}}
    run = services.run_create(agent="one-off", input=REFUND, agent_config=config, enqueue=False)

    run = resume(run)

    assert run.status == Run.Status.SUSPENDED  # agentfast.yaml says refund_request suspends: it does
    [approval] = pending(run)
    assert (approval.tool_call.name, approval.mode) == ("refund_request", "suspend")
    assert not SideEffect.objects.exists()


def test_it_keeps_the_files_gate_whatever_a_configured_agent_says(db, agent_config):
    agent_config(
        """
agents:
  support:
    tools: [lookup_order, refund_request]
    tool_overrides:
      refund_request: {risk: low}
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
"""
    )
    run = start(REFUND)

    assert run.status == Run.Status.SUSPENDED
    assert [approval.tool_call.name for approval in pending(run)] == ["refund_request"]
    assert not SideEffect.objects.exists()


def test_it_refuses_a_run_whose_own_agent_is_invalid(db):
    with pytest.raises(services.InvalidInput, match="unknown tool 'nope'"):
        services.run_create(agent="one-off", input=REFUND, agent_config={"tools": ["nope"]}, enqueue=False)
    with pytest.raises(services.InvalidInput, match="max_steps"):
        services.run_create(agent="one-off", input=REFUND, agent_config={"max_steps": 0}, enqueue=False)

    assert not Run.objects.exists()
