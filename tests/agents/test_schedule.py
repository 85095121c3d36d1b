"""Scheduled pauses: a rule's `at` or a tool's run_at() suspends the run until a time; run now; cancel."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import services
from agents.models import Approval, AuditEntry, Run, SideEffect
from agents.policy.config import ConfigError, get_policy
from agents.services.deadlines import approval_deadline_fire, toolcall_run_now
from tests.conftest import wait_for
from tests.support.flows import charge_later, pending, resume, start, tool_outputs

REFUND = "Refund order A1001 for 25.00 USD"
SCHEDULED = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request:
    risk: high
    approvers: [finance]
    rules:
      - name: later
        action: schedule
        at: '{at}'
"""
BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_after_hours]
"""


@pytest.fixture
def scheduled(agent_config: Callable[[str], Path], alice: User, bob: User) -> Callable[[str], Path]:
    """Schedule every refund at the time the CEL expression gives; alice is in finance, bob is not."""
    services.user_set_groups(username="alice", groups=("finance",))
    return lambda at: agent_config(SCHEDULED.format(at=at))


def attempt(name: str) -> services.Attempt:
    return services.Attempt(actor=name, source="cli", origin="tests")


def test_it_suspends_a_scheduled_call_until_its_time(scheduled):
    scheduled('now + duration("1h")')
    run = start(REFUND)

    [approval] = pending(run)
    assert run.status == Run.Status.SUSPENDED
    assert approval.on_timeout == Approval.OnTimeout.RUN
    assert timezone.now() + timedelta(minutes=59) < approval.expires_at < timezone.now() + timedelta(minutes=61)
    assert approval_deadline_fire(approval_id=approval.id) == ""  # its time has not come
    assert not SideEffect.objects.exists()


def test_it_runs_a_scheduled_call_when_its_time_comes(scheduled):
    scheduled('now + duration("200ms")')
    run = start(REFUND)
    [approval] = pending(run)
    time.sleep(max(0.0, (approval.expires_at - timezone.now()).total_seconds()) + 0.01)

    assert approval_deadline_fire(approval_id=approval.id) == "run"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "schedule")
    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


def test_it_runs_a_scheduled_call_now_for_someone_who_may_decide_it_once(scheduled):
    scheduled('now + duration("1h")')
    run = start(REFUND)
    [approval] = pending(run)

    with pytest.raises(services.NotPermitted):
        toolcall_run_now(approval_id=approval.id, attempt=attempt("bob"))
    toolcall_run_now(approval_id=approval.id, attempt=attempt("alice"))
    with pytest.raises(services.WrongState):
        toolcall_run_now(approval_id=approval.id, attempt=attempt("alice"))
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")
    assert tool_outputs(run)[-1]["ok"] is True
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


def test_it_audits_a_refused_run_now_like_any_refused_decision(scheduled):
    scheduled('now + duration("1h")')
    [approval] = pending(start(REFUND))

    with pytest.raises(services.NotPermitted):
        toolcall_run_now(approval_id=approval.id, attempt=attempt("bob"))  # not in finance
    toolcall_run_now(approval_id=approval.id, attempt=attempt("alice"))
    with pytest.raises(services.WrongState):
        toolcall_run_now(approval_id=approval.id, attempt=attempt("alice"))  # it runs already

    entries = AuditEntry.objects.filter(approval_id=approval.id).order_by("id")
    assert [(e.actor, e.action, e.outcome) for e in entries] == [
        ("bob", "approved", "not_permitted"),
        ("alice", "approved", "decided"),
        ("alice", "approved", "already_decided"),
    ]
    assert "not among the approvers" in entries[0].detail["error"]
    assert entries[0].detail["note"] == entries[2].detail["note"] == "run now"
    assert entries[2].detail["existing"] == "approved"


def test_it_cancels_a_scheduled_run(scheduled):
    scheduled('now + duration("1h")')
    run = start(REFUND)
    [approval] = pending(run)

    services.run_cancel(run_id=run.id, attempt=attempt("alice"))

    approval.refresh_from_db()
    assert approval.status == "expired"
    assert approval_deadline_fire(approval_id=approval.id) == ""
    assert not SideEffect.objects.exists()


def test_it_refuses_a_schedule_rule_without_a_time(agent_config):
    agent_config(SCHEDULED.replace("        at: '{at}'\n", ""))

    with pytest.raises(ConfigError, match="a schedule rule needs `at`"):
        get_policy()


def test_it_suspends_when_a_tool_asks_to_run_later_and_runs_it_now_once(agent_config, fake_openai, alice):
    agent_config(BILLING.format(base_url=fake_openai.base_url))
    fake_openai.script(charge_later(datetime.now(UTC) + timedelta(hours=2)))
    run = start("charge c1 tonight", agent="billing")
    [approval] = pending(run)
    assert (run.status, approval.on_timeout) == (Run.Status.SUSPENDED, "run")
    assert not SideEffect.objects.exists()

    toolcall_run_now(approval_id=approval.id, attempt=attempt("alice"))
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert tool_outputs(run)[-1] == {"ok": True, "result": {"charged": "c1"}}
    assert SideEffect.objects.filter(tool="charge_after_hours").count() == 1


@pytest.mark.integration
def test_it_resumes_a_scheduled_run_by_itself(scheduled, start_worker):
    scheduled('now + duration("1s")')
    start_worker(AGENTFAST_SWEEP_SECONDS="3600")  # only the task at the scheduled time can resume it
    run = services.run_create(agent="support", input=REFUND, created_by="bob")

    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED, what="the scheduled call to run")

    assert Approval.objects.get(run=run).decided_by == "schedule"
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


def test_it_shows_a_scheduled_run_with_run_now_and_cancel_on_the_pages(scheduled, alice, bob):
    scheduled('now + duration("1h")')
    later, other = start(REFUND), start(REFUND)
    [approval] = pending(later)
    client, outsider = Client(), Client()
    client.force_login(alice)
    outsider.force_login(bob)
    htmx = {"HTTP_HX_REQUEST": "true"}

    runs_page = client.get("/runs").content.decode()
    run_page = client.get(f"/runs/{later.id}").content.decode()
    refused = outsider.post(f"/approvals/{approval.id}/run-now", **htmx)
    ran = client.post(f"/approvals/{approval.id}/run-now", **htmx)
    cancelled = client.post(f"/runs/{other.id}/cancel", **htmx)

    assert "scheduled for" in runs_page and "data-deadline" in runs_page
    assert 'data-action="run-now"' in run_page and 'data-action="cancel-run"' in run_page
    assert refused.status_code == 403 and "not among the approvers" in refused.content.decode()
    assert ran.status_code == 200 and "Runs now." in ran.content.decode()
    assert Approval.objects.get(pk=approval.pk).decided_by == "alice"
    assert cancelled.status_code == 200 and "The run was cancelled." in cancelled.content.decode()
    assert Run.objects.get(pk=other.pk).status == Run.Status.CANCELLED
