"""Held calls (ToolCall.not_before) under lost messages, schedule rules and duplicate messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from agents import sweeper
from agents.models import Run, SideEffect, ToolCall
from tests.support.flows import charge_later, decide, pending, resume, start

BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours, refund_request]
tool_overrides:
  charge_after_hours: {{risk: high}}
"""


def test_the_sweeper_wakes_a_held_call_whose_decision_left_the_first_resume_to_its_decider(
    db, agent_config, fake_openai, settings
):
    """A reviewer decides with --no-resume and resumes the run; the tool then holds the call.

    The driver sends the wake-up for the held time (the run's auto_resume is on): the system,
    not the decider, owns that wake-up. Once that message is lost (Redis restarted empty),
    the sweeper must find the run when the time comes; it excluded it for ever.
    """
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    agent_config(BILLING.format(base_url=fake_openai.base_url))
    fake_openai.script(charge_later(datetime.now(UTC) + timedelta(hours=3)))
    run = start("charge c1 tonight", agent="billing")
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)  # the decider resumes it itself
    run = resume(run)  # ... and does: the tool asks for its time, the call is held
    assert run.status == Run.Status.SUSPENDED
    call = ToolCall.objects.get(run=run)
    assert call.not_before is not None and call.result is None

    # The time comes; the wake-up message the driver sent is gone.
    ToolCall.objects.filter(pk=call.pk).update(not_before=timezone.now() - timedelta(milliseconds=1))
    Run.objects.filter(pk=run.id).update(updated_at=timezone.now() - timedelta(seconds=5))

    assert run.id in sweeper.sweep().runs, "the held run is stranded: nothing will ever wake it"
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


SCHEDULED_BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours]
tool_overrides:
  charge_after_hours:
    risk: high
    rules:
      - {{name: later, action: schedule, at: 'now + duration("1h")'}}
"""


def test_a_schedule_rules_time_does_not_run_a_tool_before_its_own_run_at(db, agent_config, fake_openai):
    """A schedule rule puts the call at +1 h; the tool itself says not before +3 h (run_at).

    When the rule's time comes the clock approves the call: the tool's own time has not come,
    so its run_at must hold the call (as it does after any other decision), not return.
    """
    from agents.services.deadlines import approval_deadline_fire

    agent_config(SCHEDULED_BILLING.format(base_url=fake_openai.base_url))
    tool_time = datetime.now(UTC) + timedelta(hours=3)
    fake_openai.script(charge_later(tool_time))
    run = start("charge c1 tonight", agent="billing")
    [approval] = pending(run)
    assert approval.expires_at < tool_time - timedelta(hours=1)
    from agents.models import Approval

    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(milliseconds=1))
    assert approval_deadline_fire(approval_id=approval.id) == "run"  # the rule's time came

    run = resume(run)

    assert not SideEffect.objects.filter(tool="charge_after_hours").exists(), "charged 2 h before the tool's time"
    assert run.status == Run.Status.SUSPENDED
    call = ToolCall.objects.get(run=run)
    assert call.not_before is not None and abs((call.not_before - tool_time).total_seconds()) < 1


DEFERRED_BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours]
tool_overrides:
  charge_after_hours:
    risk: high
    hitl_mode: defer{rules}
"""
DENY_C1 = """
    rules:
      - {name: no c1, when: "args.customer == 'c1'", action: deny}"""


def test_a_duplicate_message_at_a_held_calls_time_does_not_refuse_a_call_already_running(db, agent_config, fake_openai):
    """A deferred held call's message comes twice at its time; a deny rule lands between the two.

    The first worker claimed the call and its tool is charging the card. The second must find
    it claimed, not store "the policy now refuses it" over a charge under way (whose result is
    then dropped: the card is charged, the call says it was refused).
    """
    from agents import services
    from agents.runtime.execution import execute_deferred

    agent_config(DEFERRED_BILLING.format(base_url=fake_openai.base_url, rules=""))
    fake_openai.script(charge_later(datetime.now(UTC) + timedelta(hours=3)))
    run = start("charge c1 tonight", agent="billing")
    [approval] = pending(run)
    decide(approval, "approved")
    call = ToolCall.objects.get(run=run)
    assert execute_deferred(call.pk) == "held"
    ToolCall.objects.filter(pk=call.pk).update(not_before=timezone.now() - timedelta(milliseconds=1))

    # Worker 1, at the time: claims, and its tool is under way (the charge is made).
    call.refresh_from_db()
    claimed_at = services.toolcall_claim(tool_call=call)
    assert claimed_at is not None
    SideEffect.objects.create(tool="charge_after_hours", idempotency_key=approval.id, arguments={"c": "c1"})
    # Meanwhile a deny rule is added, and the duplicate message reaches worker 2.
    agent_config(DEFERRED_BILLING.format(base_url=fake_openai.base_url, rules=DENY_C1))
    assert execute_deferred(call.pk) == "claimed elsewhere"
    # Worker 1's tool returns: its result is the call's.
    assert services.toolcall_record_result(
        tool_call=call, status=ToolCall.Status.SUCCEEDED, output={"ok": True, "result": {"charged": "c1"}}
    )
    call.refresh_from_db()
    assert call.status == ToolCall.Status.SUCCEEDED
