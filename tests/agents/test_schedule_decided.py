"""A decided call whose tool asks to run later (run_at): the decision stands and waits for the tool's time.

A person's approval, or the one a rule writes, is the call's one approval; the tool's own
schedule then holds the call (ToolCall.not_before), the run waits, and at that time the tool
is called once more, released, and runs once, if the policy as it stands then lets it.

The tool asks for a time hours away; "its time comes" moves the held call's time into the past
(the clock, not the tool, is what the tests stand in for), so no test sleeps or races the clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import runtime, services, sweeper
from agents.models import Approval, Run, SideEffect, ToolCall
from agents.runtime.execution import execute_deferred
from agents.services.deadlines import approval_deadline_fire
from dashboard import cli
from tests.conftest import wait_for
from tests.support.broker import take_queued
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import charge_later, decide, pending, resume, start, tool_outputs

BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours, refund_request]
tool_overrides:
  refund_request: {{risk: high}}
  charge_after_hours: {overrides}
"""
GATED = "{risk: high}"
DEFERRED = "{risk: high, hitl_mode: defer}"
ALLOWED = """
    risk: high
    rules:
      - {name: known customers, when: "args.customer in ['c1', 'c2']", action: allow}"""
DENIED = """
    risk: high
    hitl_mode: {mode}
    rules:
      - {{name: no c1, when: "args.customer == 'c1'", action: deny}}"""
SCHEDULED = """
    risk: high
    rules:
      - {name: later, action: schedule, at: 'now + duration("1h")'}"""
LATER = timedelta(hours=3)


@pytest.fixture
def billing(db, agent_config, fake_openai) -> Callable[..., Run]:
    """Configure the billing agent with these overrides and start a run the model's script drives."""

    def begin(overrides: str, script: Callable[[dict[str, Any]], Reply] | None = None) -> Run:
        agent_config(BILLING.format(base_url=fake_openai.base_url, overrides=overrides))
        fake_openai.script(script or charge_later(datetime.now(UTC) + LATER))
        return start("charge c1 tonight", agent="billing")

    return begin


def _call(run: Run, customer: str = "c1") -> ToolCall:
    return ToolCall.objects.get(run=run, name="charge_after_hours", arguments__customer=customer)


def _time_comes(call: ToolCall) -> None:
    ToolCall.objects.filter(pk=call.pk).update(not_before=timezone.now() - timedelta(milliseconds=1))


def test_a_persons_approval_waits_for_the_tools_time_and_then_runs_once(billing, alice: User):
    [approval] = pending(billing(GATED))

    decide(approval, "approved")
    run = resume(approval.run)

    call = _call(run)
    assert run.status == Run.Status.SUSPENDED  # waits for the tool's time: not failed
    assert (call.status, call.executed_at, call.result) == ("approved", None, None)
    assert call.not_before == datetime.fromisoformat(call.arguments["not_before"])
    assert resume(run).status == Run.Status.SUSPENDED  # a drive before the time leaves it waiting
    assert not SideEffect.objects.exists()

    _time_comes(call)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert tool_outputs(run)[-1] == {"ok": True, "result": {"charged": "c1"}}  # released: run_at returned
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")  # still the one decision


def test_a_rules_allowance_waits_for_the_tools_time_and_then_runs_once(billing):
    run = billing(ALLOWED)

    call = _call(run)
    assert run.status == Run.Status.SUSPENDED
    assert (call.status, call.hitl_mode, call.not_before is not None) == ("approved", "suspend", True)
    assert Approval.objects.get(run=run).decided_by == "policy:known customers"

    _time_comes(call)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_a_decided_deferred_call_waits_for_the_tools_time_and_then_runs_once(billing, alice: User):
    run = billing(DEFERRED)
    [approval] = pending(run)
    decide(approval, "approved")
    call = _call(run)

    assert execute_deferred(call.pk) == "held"
    assert execute_deferred(call.pk) == "held"  # a second message before the time: still held
    call.refresh_from_db()
    assert (call.status, call.executed_at, call.result, call.not_before is not None) == ("approved", None, None, True)
    assert not SideEffect.objects.exists()

    _time_comes(call)

    assert execute_deferred(call.pk) == "succeeded"
    assert execute_deferred(call.pk) == "already recorded"
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_the_sweeper_leaves_a_held_call_alone_until_its_time(billing, alice: User, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    [approval] = pending(billing(GATED))
    decide(approval, "approved")
    run = resume(approval.run)

    assert run.id not in sweeper.sweep().runs

    _time_comes(_call(run))

    assert run.id in sweeper.sweep().runs


def test_a_released_call_is_not_held_again_by_a_later_time(billing, alice: User):
    """Once its time came the call runs: run_at returns, whatever time the arguments name."""
    [approval] = pending(billing(GATED))
    decide(approval, "approved")
    call = _call(resume(approval.run))
    _time_comes(call)  # the arguments still say three hours from now

    run = resume(call.run)

    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


@pytest.mark.parametrize("mode", ["suspend", "defer"])
def test_a_held_call_does_not_run_once_a_deny_rule_matches_it(billing, agent_config, fake_openai, alice, mode):
    """Like a scheduled call's, a held call's time runs only what the policy as it stands then lets through."""
    run = billing(DEFERRED if mode == "defer" else GATED)
    [approval] = pending(run)
    decide(approval, "approved")
    call = _call(run)
    assert (execute_deferred(call.pk) if mode == "defer" else resume(run).status) in ("held", "suspended")

    agent_config(BILLING.format(base_url=fake_openai.base_url, overrides=DENIED.format(mode=mode)))
    _time_comes(call)
    if mode == "defer":
        assert execute_deferred(call.pk) == "denied"
    else:
        resume(run)

    call.refresh_from_db()
    assert (call.status, call.result["error_code"]) == ("rejected", "POLICY_DENIED")
    assert not SideEffect.objects.exists()


def _charge_two_later(body: dict[str, Any]) -> Reply:
    if tool_messages(body):
        return Reply(content="done")
    soon, later = datetime.now(UTC) + LATER, datetime.now(UTC) + 2 * LATER
    return Reply(
        tool_calls=[
            ("call_a", "charge_after_hours", json.dumps({"customer": "c1", "not_before": soon.isoformat()})),
            ("call_b", "charge_after_hours", json.dumps({"customer": "c2", "not_before": later.isoformat()})),
        ]
    )


def test_each_drive_of_a_run_holding_two_calls_sends_one_wake_up(transactional_db, billing):
    """A message per held call would multiply at each hop: every drive they start sends as many again."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    take_queued(broker, "agents.tasks.run_drive")
    run = billing(ALLOWED, _charge_two_later)
    assert run.status == Run.Status.SUSPENDED

    sent = [take_queued(broker, "agents.tasks.run_drive")]
    for _hop in range(2):  # each wake-up delivered before the calls' time (a hop of a far time)
        for _message in sent[-1]:
            runtime.drive(run.id, stream=False)
        sent.append(take_queued(broker, "agents.tasks.run_drive"))

    assert [len(messages) for messages in sent] == [1, 1, 1]
    [(args, _, eta)] = sent[0]
    assert args == [run.id]
    assert eta <= _call(run, "c1").not_before  # the earlier time, or a hop before it (a broker holds an eta ≤ 30 min)


def test_a_held_deferred_call_does_not_keep_its_run_suspended(transactional_db, billing, alice: User):
    """A run whose last approval was decided while it was driven (so no resume was sent) goes on."""

    def charge_and_refund(body: dict[str, Any]) -> Reply:
        if tool_messages(body):
            return Reply(content="done")
        charge = {"customer": "c1", "not_before": (datetime.now(UTC) + LATER).isoformat()}
        refund = {"order_id": "A1001", "amount_cents": 2500}
        return Reply(
            tool_calls=[
                ("call_charge", "charge_after_hours", json.dumps(charge)),
                ("call_refund", "refund_request", json.dumps(refund)),
            ]
        )

    run = billing(DEFERRED, charge_and_refund)
    charge, refund = _call(run), Approval.objects.get(run=run, tool="refund_request")
    decide(charge.approval, "approved")
    assert execute_deferred(charge.pk) == "held"  # waits alone for its time
    # A worker drives the run (as while another call of the step runs) when the refund is decided.
    services.run_fail(run_id=run.id, owner=None, error="the model endpoint was down")
    services.run_request_resume(run_id=run.id, enqueue=False)
    assert services.run_lease(run_id=run.id, owner="worker-1") is not None
    assert decide(refund, "approved").resume_enqueued is False  # it saw the run driven

    # The driver, having seen the refund pending, asks to suspend: nothing waits on a person now.
    assert services.run_suspend(run_id=run.id, owner="worker-1") is False


def test_the_pages_and_the_api_say_until_when_a_held_call_waits(billing, alice: User):
    [approval] = pending(billing(GATED))
    decide(approval, "approved")
    run = resume(approval.run)
    later = _call(run).not_before
    client = Client()
    client.force_login(alice)

    page = client.get(f"/runs/{run.id}").content.decode()
    runs_page = client.get("/runs").content.decode()
    shown = client.get(f"/api/runs/{run.id}").json()["tool_calls"][0]

    moment = timezone.localtime(later)
    assert f"waits until {moment:%Y-%m-%d %H:%M:%S}" in page
    assert f"approved; runs at {moment:%Y-%m-%d %H:%M}" in runs_page
    assert datetime.fromisoformat(shown["not_before"]) == later


@pytest.mark.integration
def test_a_worker_runs_a_held_call_at_its_time_by_itself(billing, alice: User, start_worker):
    later = datetime.now(UTC) + timedelta(seconds=2)
    [approval] = pending(billing(GATED, charge_later(later)))
    start_worker(AGENTFAST_SWEEP_SECONDS="3600")  # only the message sent for the time can resume it

    decide(approval, "approved")

    wait_for(lambda: Run.objects.get(pk=approval.run_id).status == Run.Status.COMPLETED, what="the held call to run")
    assert SideEffect.objects.get(tool="charge_after_hours").created_at >= later


def test_runs_resume_inline_of_a_held_run_does_not_ask_for_a_decision(billing, alice: User, capsys) -> None:
    [approval] = pending(billing(GATED))
    decide(approval, "approved")
    capsys.readouterr()

    code = cli.main(["runs", "resume", approval.run_id, "--inline"])
    out = capsys.readouterr().out

    assert code == 0
    assert Run.objects.get(pk=approval.run_id).status == Run.Status.SUSPENDED
    # Nobody can decide anything: the one approval is decided, the call waits for its tool's time.
    assert "decide with" not in out, out
    assert f"{_call(approval.run).not_before:%Y-%m-%d %H:%M:%S}" in out, out


def test_runs_start_inline_of_a_run_a_rule_allowed_and_its_tool_held(billing, capsys) -> None:
    billing(ALLOWED)  # the agent as configured; this run of it is the CLI's
    capsys.readouterr()

    code = cli.main(["runs", "start", "--agent", "billing", "--inline", "--by", "bob", "charge c1 tonight"])
    out = capsys.readouterr().out

    run = Run.objects.get(pk=out.split()[0])
    assert code == 0
    assert run.status == Run.Status.SUSPENDED
    assert "decide with" not in out, out
    assert f"{_call(run).not_before:%Y-%m-%d %H:%M:%S}" in out, out


def test_runs_show_says_until_when_a_held_call_waits(billing, alice: User, capsys) -> None:
    """The page says "waits until …" and the API gives not_before; the CLI said only "approved"."""
    [approval] = pending(billing(GATED))
    decide(approval, "approved")
    run = Run.objects.get(pk=approval.run_id)
    cli.main(["runs", "resume", run.id, "--inline"])
    capsys.readouterr()

    assert cli.main(["runs", "show", run.id]) == 0
    out = capsys.readouterr().out

    assert f"waits until {_call(run).not_before:%Y-%m-%d %H:%M:%S}" in out, out


def test_resumes_before_the_time_do_not_add_wake_up_chains(transactional_db, billing, alice: User) -> None:
    """Its wake-up is already on its way: each resume before the time added one more, hopping until then."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    take_queued(broker, "agents.tasks.run_drive")
    run = billing(ALLOWED)
    assert run.status == Run.Status.SUSPENDED
    assert len(take_queued(broker, "agents.tasks.run_drive")) == 1  # the one wake-up, kept aside
    client = Client()
    client.force_login(alice)

    for _ in range(3):
        response = client.post(f"/api/runs/{run.id}/resume")
        assert response.status_code in (200, 409, 422), response.content
    for _message in take_queued(broker, "agents.tasks.run_drive"):  # the worker takes what the resumes sent
        runtime.drive(run.id, stream=False)

    assert Run.objects.get(pk=run.id).status == Run.Status.SUSPENDED
    # Besides the one wake-up above, nothing more is due: one chain, not four.
    assert take_queued(broker, "agents.tasks.run_drive") == []


def test_the_sweeper_wakes_a_held_call_whose_decision_left_the_first_resume_to_its_decider(
    billing, alice: User, settings
):
    """A reviewer decides with --no-resume and resumes the run; the tool then holds the call.

    The driver sends the wake-up for the held time (the run's auto_resume is on): the system,
    not the decider, owns that wake-up. Once that message is lost (Redis restarted empty),
    the sweeper must find the run when the time comes; it excluded it for ever.
    """
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    [approval] = pending(billing(GATED))
    decide(approval, "approved", auto_resume=False)  # the decider resumes it itself
    run = resume(approval.run)  # ... and does: the tool asks for its time, the call is held
    assert run.status == Run.Status.SUSPENDED
    call = _call(run)
    assert call.not_before is not None and call.result is None

    # The time comes; the wake-up message the driver sent is gone.
    _time_comes(call)
    Run.objects.filter(pk=run.id).update(updated_at=timezone.now() - timedelta(seconds=5))

    assert run.id in sweeper.sweep().runs, "the held run is stranded: nothing will ever wake it"
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_a_schedule_rules_time_does_not_run_a_tool_before_its_own_run_at(billing):
    """A schedule rule puts the call at +1 h; the tool itself says not before +3 h (run_at).

    When the rule's time comes the clock approves the call: the tool's own time has not come,
    so its run_at must hold the call (as it does after any other decision), not return.
    """
    run = billing(SCHEDULED)
    [approval] = pending(run)
    tool_time = datetime.fromisoformat(_call(run).arguments["not_before"])
    assert approval.expires_at < tool_time - timedelta(hours=1)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(milliseconds=1))
    assert approval_deadline_fire(approval_id=approval.id) == "run"  # the rule's time came

    run = resume(run)

    assert not SideEffect.objects.filter(tool="charge_after_hours").exists(), "charged 2 h before the tool's time"
    assert run.status == Run.Status.SUSPENDED
    assert _call(run).not_before == tool_time


def test_a_duplicate_message_at_a_held_calls_time_does_not_refuse_a_call_already_running(
    billing, agent_config, fake_openai, alice: User
):
    """A deferred held call's message comes twice at its time; a deny rule lands between the two.

    The first worker claimed the call and its tool is charging the card. The second must find
    it claimed, not store "the policy now refuses it" over a charge under way (whose result is
    then dropped: the card is charged, the call says it was refused).
    """
    run = billing(DEFERRED)
    [approval] = pending(run)
    decide(approval, "approved")
    call = _call(run)
    assert execute_deferred(call.pk) == "held"
    _time_comes(call)

    # Worker 1, at the time: claims, and its tool is under way (the charge is made).
    call.refresh_from_db()
    assert services.toolcall_claim(tool_call=call) is not None
    SideEffect.objects.create(tool="charge_after_hours", idempotency_key=approval.id, arguments={"c": "c1"})
    # Meanwhile a deny rule is added, and the duplicate message reaches worker 2.
    agent_config(BILLING.format(base_url=fake_openai.base_url, overrides=DENIED.format(mode="defer")))
    assert execute_deferred(call.pk) == "claimed elsewhere"
    # Worker 1's tool returns: its result is the call's.
    assert services.toolcall_record_result(
        tool_call=call, status=ToolCall.Status.SUCCEEDED, output={"ok": True, "result": {"charged": "c1"}}
    )
    call.refresh_from_db()
    assert call.status == ToolCall.Status.SUCCEEDED
