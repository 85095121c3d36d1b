"""A decided call whose tool asks to run later (run_at): the decision stands and waits for the tool's time.

A person's approval, or the one a rule writes, is the call's one approval; the tool's own
schedule then holds the call (ToolCall.not_before), the run waits, and at that time the tool
is called once more, released, and runs once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import sweeper
from agents.models import Approval, Run, SideEffect, ToolCall
from agents.runtime.execution import execute_deferred
from tests.conftest import wait_for
from tests.support.flows import charge_later, decide, pending, resume, start, tool_outputs

BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours]
tool_overrides:
  charge_after_hours: {overrides}
"""
GATED = "{risk: high}"
DEFERRED = "{risk: high, hitl_mode: defer}"
ALLOWED = """
    risk: high
    rules:
      - {name: known customer, when: "args.customer == 'c1'", action: allow}"""


@pytest.fixture
def billing(db, agent_config, fake_openai) -> Callable[[str, datetime], Run]:
    """Configure the billing agent with these overrides and start a run charging c1 not before a time."""

    def begin(overrides: str, not_before: datetime) -> Run:
        agent_config(BILLING.format(base_url=fake_openai.base_url, overrides=overrides))
        fake_openai.script(charge_later(not_before))
        return start("charge c1 tonight", agent="billing")

    return begin


def _call(run: Run) -> ToolCall:
    return ToolCall.objects.get(run=run, name="charge_after_hours")


def _sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()) + 0.02)


def test_a_persons_approval_waits_for_the_tools_time_and_then_runs_once(billing, alice: User):
    later = datetime.now(UTC) + timedelta(milliseconds=600)
    [approval] = pending(billing(GATED, later))

    decide(approval, "approved")
    run = resume(approval.run)

    call = _call(run)
    assert run.status == Run.Status.SUSPENDED  # waits for the tool's time: not failed
    assert (call.status, call.executed_at, call.result, call.not_before) == ("approved", None, None, later)
    assert not SideEffect.objects.exists()
    assert resume(run).status == Run.Status.SUSPENDED  # a drive before the time leaves it waiting
    assert not SideEffect.objects.exists()

    _sleep_until(later)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert tool_outputs(run)[-1] == {"ok": True, "result": {"charged": "c1"}}
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")  # still the one decision


def test_a_rules_allowance_waits_for_the_tools_time_and_then_runs_once(billing):
    later = datetime.now(UTC) + timedelta(milliseconds=600)
    run = billing(ALLOWED, later)

    call = _call(run)
    assert run.status == Run.Status.SUSPENDED
    assert (call.status, call.hitl_mode, call.not_before) == ("approved", "suspend", later)
    assert Approval.objects.get(run=run).decided_by == "policy:known customer"

    _sleep_until(later)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_a_decided_deferred_call_waits_for_the_tools_time_and_then_runs_once(billing, alice: User):
    later = datetime.now(UTC) + timedelta(milliseconds=600)
    run = billing(DEFERRED, later)
    [approval] = pending(run)
    decide(approval, "approved")
    call = _call(run)

    assert execute_deferred(call.pk) == "held"
    assert execute_deferred(call.pk) == "held"  # a second message before the time: still held
    call.refresh_from_db()
    assert (call.status, call.executed_at, call.result, call.not_before) == ("approved", None, None, later)
    assert not SideEffect.objects.exists()

    _sleep_until(later)

    assert execute_deferred(call.pk) == "succeeded"
    assert execute_deferred(call.pk) == "already recorded"
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_the_sweeper_leaves_a_held_call_alone_until_its_time(billing, alice: User, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    later = datetime.now(UTC) + timedelta(milliseconds=800)
    [approval] = pending(billing(GATED, later))
    decide(approval, "approved")
    run = resume(approval.run)

    assert run.id not in sweeper.sweep().runs

    _sleep_until(later)

    assert run.id in sweeper.sweep().runs


def test_a_released_call_is_not_held_again_by_a_later_time(billing, alice: User):
    """Once its time came the call runs: run_at returns, whatever time the arguments now name."""
    later = datetime.now(UTC) + timedelta(milliseconds=300)
    [approval] = pending(billing(GATED, later))
    decide(approval, "approved")
    run = resume(approval.run)
    _sleep_until(later)
    ToolCall.objects.filter(pk=_call(run).pk).update(
        arguments={"customer": "c1", "not_before": "2999-01-01T00:00:00+00:00"}
    )

    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert tool_outputs(run)[-1]["ok"] is True  # released: the call's own later time does not hold it again
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


def test_the_run_page_says_until_when_a_held_call_waits(billing, alice: User):
    later = datetime.now(UTC) + timedelta(hours=3)
    [approval] = pending(billing(GATED, later))
    decide(approval, "approved")
    run = resume(approval.run)
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
    [approval] = pending(billing(GATED, later))
    start_worker(AGENTFAST_SWEEP_SECONDS="3600")  # only the message sent for the time can resume it

    decide(approval, "approved")

    wait_for(lambda: Run.objects.get(pk=approval.run_id).status == Run.Status.COMPLETED, what="the held call to run")
    assert SideEffect.objects.get(tool="charge_after_hours").created_at >= later
