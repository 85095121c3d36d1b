"""Deadlines with a defined end (reject, approve, escalate), extensions, reminders; on time and after restarts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import current_app
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import services
from agents.models import Approval, AuditEntry, Run, SideEffect
from agents.notify.models import Delivery
from agents.policy.config import ConfigError, get_policy
from agents.services.deadlines import approval_deadline_fire, approval_extend, approval_remind_due
from agents.tasks import approval_deadline
from dashboard import cli
from tests.conftest import wait_for
from tests.support.broker import take_queued
from tests.support.flows import decide, pending, resume, start, tool_outputs

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {refund}
notifications:
  - kind: email
    to: [group:finance, group:managers]
"""


@pytest.fixture
def deadline(agent_config: Callable[[str], Path], alice: User, bob: User) -> Callable[..., Path]:
    """Configure refund_request with these deadline keys; alice is in finance, bob in managers.

    fiona (finance) and max (managers) have mail addresses: the notifications reach them.
    """
    services.user_set_groups(username="alice", groups=("finance",))
    services.user_set_groups(username="bob", groups=("managers",))
    services.user_create(username="fiona", role="reviewer", email="fiona@example.com", groups=("finance",))
    services.user_create(username="max", role="reviewer", email="max@example.com", groups=("managers",))

    def configure(**keys: Any) -> Path:
        return agent_config(CONFIG.format(refund=json.dumps({"risk": "high", "approvers": ["finance"], **keys})))

    return configure


def past_deadline(approval: Approval) -> Approval:
    """Move the approval's deadline to a moment ago, as if its time had gone by; return it fresh.

    Rather than a deadline of a fraction of a second and a sleep: on a busy machine such a
    deadline passed before the decisions a test makes first, and they were refused.
    """
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(milliseconds=1))
    approval.refresh_from_db()
    return approval


def deliveries(approval: Approval, event_type: str) -> list[Delivery]:
    return list(Delivery.objects.filter(approval_id=approval.id, event_type=event_type))


def test_it_reads_durations_and_keeps_timeout_seconds_as_an_alias(deadline):
    deadline(timeout="4h", remind_every="30m")
    refund = get_policy().tool_policy("refund_request")
    assert (refund.deadline_seconds, refund.remind_every) == (14400, 1800)
    deadline(timeout_seconds=90)
    assert get_policy().tool_policy("refund_request").deadline_seconds == 90
    deadline(timeout="90s", on_timeout="escalate", escalate_to=["managers"])
    assert get_policy().tool_policy("refund_request").on_timeout == "escalate"


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"timeout": "soon"}, "refund_request.timeout: must be a duration like 90s"),
        ({"timeout": "1h", "on_timeout": "escalate"}, "on_timeout: escalate needs escalate_to"),
        ({"on_timeout": "approve"}, "on_timeout: approve needs a timeout"),
        ({"timeout": "1h", "timeout_seconds": 60}, "timeout_seconds is the older name of timeout"),
        ({"timeout": "1h", "on_timeout": "later"}, "must be one of reject, approve, escalate"),
    ],
)
def test_it_refuses_deadline_keys_that_cannot_work(deadline, keys, problem):
    deadline(**keys)

    with pytest.raises(ConfigError, match=problem):
        get_policy()


def test_it_rejects_at_the_deadline_and_the_model_reads_approval_expired(deadline):
    deadline(timeout="1h")
    run = start(REFUND)
    [approval] = pending(run)
    assert approval_deadline_fire(approval_id=approval.id) == ""  # not due yet

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "system")
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"
    assert run.status == Run.Status.COMPLETED
    assert not SideEffect.objects.exists()


def test_it_approves_at_the_deadline_audited_as_the_deadlines_decision(deadline):
    deadline(timeout="1h", on_timeout="approve")
    run = start(REFUND)
    [approval] = pending(run)

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "approved"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "deadline")
    entry = AuditEntry.objects.get(approval_id=approval.id, action="approved")
    assert (entry.actor, entry.source, entry.outcome) == ("deadline", "system", "decided")
    assert tool_outputs(run)[-1]["ok"] is True
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


@pytest.mark.parametrize("on_timeout", ["approve", "run"])
def test_it_never_lets_the_clock_run_a_call_the_policy_has_come_to_deny(deadline, on_timeout):
    deadline(timeout="1h", on_timeout="approve")
    run = start(REFUND)
    [approval] = pending(run)
    Approval.objects.filter(pk=approval.pk).update(on_timeout=on_timeout)  # "run": a schedule rule's call
    frozen = {"name": "frozen", "when": "true", "action": "deny", "reason": "refunds are frozen"}
    deadline(timeout="1h", on_timeout="approve", rules=[frozen])  # the operator adds a deny rule meanwhile

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.note) == ("expired", "the policy now refuses it: refunds are frozen")
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"
    assert not SideEffect.objects.exists()


@pytest.mark.parametrize(
    "now",
    [
        {"timeout": "1h"},  # the operator turns the clock's approval off
        {"timeout": "1h", "on_timeout": "escalate", "escalate_to": ["managers"]},
        {  # or adds a stricter rule for such calls, with a deadline of its own that rejects
            "timeout": "1h",
            "on_timeout": "approve",
            "rules": [{"name": "any refund", "when": "true", "action": "ask", "quorum": 2, "on_timeout": "reject"}],
        },
    ],
    ids=["reject", "escalate", "stricter-rule"],
)
def test_it_never_lets_the_clock_approve_a_call_once_the_policy_no_longer_approves_when_nobody_decides(deadline, now):
    deadline(timeout="1h", on_timeout="approve")
    run = start(REFUND)
    [approval] = pending(run)
    deadline(**now)

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "system")
    assert approval.note.startswith("the policy no longer approves it when nobody decides")
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"
    assert not SideEffect.objects.exists()


def test_it_approves_nothing_by_the_clock_while_the_policy_cannot_be_read(deadline):
    path = deadline(timeout="1h", on_timeout="approve")
    [approval] = pending(start(REFUND))
    path.write_text("agents: [")  # an edit half-saved

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == ""

    approval.refresh_from_db()
    assert approval.status == "pending"
    path.write_text(CONFIG.format(refund=json.dumps({"risk": "high", "timeout": "1h", "on_timeout": "approve"})))
    assert approval_deadline_fire(approval_id=approval.id) == "approved"  # once it reads again


def test_it_runs_no_edit_that_a_vote_short_of_its_quorum_made_when_the_deadline_approves(deadline):
    # Two of finance must approve; alice's vote changes the amount, then nobody else decides. The
    # deadline's approve would otherwise run arguments only alice approved (or overrule her edit).
    services.user_create(username="carol", role="reviewer", groups=("finance",))
    deadline(timeout="1h", on_timeout="approve", quorum=2)
    run = start(REFUND)
    [approval] = pending(run)
    edited = {**approval.tool_call.arguments, "amount_cents": 4999}
    assert decide(approval, "approved", arguments=edited).outcome == AuditEntry.Outcome.VOTED

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    run = resume(run)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "system")
    assert "edited arguments" in approval.note
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"
    assert not SideEffect.objects.exists()


def test_it_escalates_once_then_rejects_at_the_second_expiry(deadline, django_capture_on_commit_callbacks):
    deadline(timeout="1h", on_timeout="escalate", escalate_to=["managers", "user:carol"])
    run = start(REFUND)
    [approval] = pending(run)

    with django_capture_on_commit_callbacks(execute=True):
        assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "escalated"

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert approval.approvers == ["finance", "managers", "user:carol"]
    assert approval.escalated_at is not None and approval.expires_at > approval.escalated_at
    assert AuditEntry.objects.filter(approval_id=approval.id, action="escalated").count() == 1
    assert {d.target for d in deliveries(approval, "approval.escalated")} == {"fiona", "max"}

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    approval.refresh_from_db()
    assert approval.status == "expired"
    assert "escalated" in approval.note
    assert tool_outputs(resume(run))[-1]["error_code"] == "APPROVAL_EXPIRED"


def test_it_gives_the_escalation_the_policys_timeout_not_the_extension_the_first_approvers_had(deadline):
    deadline(timeout="10m", on_timeout="escalate", escalate_to=["managers"])
    [approval] = pending(start(REFUND))
    approval_extend(approval_id=approval.id, by_seconds=3600, attempt=services.Attempt(actor="alice", source="cli"))
    approval.refresh_from_db()
    # 71 minutes pass: the 10 minutes and the hour alice asked for are over.
    passed = timedelta(minutes=71)
    Approval.objects.filter(pk=approval.pk).update(
        created_at=approval.created_at - passed, expires_at=approval.expires_at - passed
    )

    assert approval_deadline_fire(approval_id=approval.id) == "escalated"

    approval.refresh_from_db()
    assert approval.expires_at - approval.escalated_at == timedelta(minutes=10)


def test_it_lets_an_escalation_approver_decide(deadline):
    deadline(timeout="1h", on_timeout="escalate", escalate_to=["managers"])
    [approval] = pending(start(REFUND))
    with pytest.raises(services.NotPermitted):
        services.approval_decide(
            approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="bob", source="cli")
        )

    approval_deadline_fire(approval_id=past_deadline(approval).id)

    decision = services.approval_decide(
        approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="bob", source="cli")
    )
    assert decision.approval.status == "approved"


def test_it_lets_a_decision_before_the_deadline_win(deadline):
    deadline(timeout="1h", on_timeout="approve")
    [approval] = pending(start(REFUND))
    services.approval_decide(
        approval_id=approval.id, decision="rejected", attempt=services.Attempt(actor="alice", source="cli")
    )

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == ""
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("rejected", "alice")


def test_it_gives_a_passed_deadline_its_outcome_before_a_late_decision(deadline):
    """A deadline whose task is late (a busy or stopped worker) still decides: a decision after it meets its outcome."""
    deadline(timeout="1h", on_timeout="approve")
    [approval] = pending(start(REFUND))
    past_deadline(approval)  # passed, and no task fired it

    with pytest.raises(services.AlreadyDecided, match="already approved by deadline"):
        services.approval_decide(
            approval_id=approval.id, decision="rejected", attempt=services.Attempt(actor="alice", source="cli")
        )

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "deadline")
    assert SideEffect.objects.count() == 0
    resume(approval.run)
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


def test_it_refuses_a_late_approval_once_the_deadline_rejected(deadline):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))
    past_deadline(approval)

    with pytest.raises(services.WrongState, match="already expired"):
        services.approval_decide(
            approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="alice", source="cli")
        )
    approval.refresh_from_db()
    assert approval.status == "expired"


def test_it_escalates_a_passed_deadline_before_an_escalation_approver_decides(deadline):
    deadline(timeout="1h", on_timeout="escalate", escalate_to=["managers"])
    [approval] = pending(start(REFUND))
    past_deadline(approval)

    decision = services.approval_decide(
        approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="bob", source="cli")
    )

    assert (decision.approval.status, decision.approval.decided_by) == ("approved", "bob")
    assert AuditEntry.objects.filter(approval_id=approval.id, action="escalated").count() == 1


def test_it_does_not_extend_a_deadline_that_has_passed(deadline):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))
    past_deadline(approval)

    with pytest.raises(services.WrongState, match="is expired"):
        approval_extend(approval_id=approval.id, by_seconds=60, attempt=services.Attempt(actor="alice", source="cli"))
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "system")


def test_it_extends_a_deadline_for_an_eligible_approver_only_audited(deadline):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))
    before = approval.expires_at

    extended = approval_extend(
        approval_id=approval.id, by_seconds=1800, attempt=services.Attempt(actor="alice", source="cli")
    )
    with pytest.raises(services.NotPermitted, match="not among the approvers"):
        approval_extend(approval_id=approval.id, by_seconds=1800, attempt=services.Attempt(actor="bob", source="cli"))

    assert (extended.expires_at - before).total_seconds() == 1800
    approval.refresh_from_db()
    assert approval.expires_at == extended.expires_at  # bob's refusal changed nothing
    outcomes = dict(
        AuditEntry.objects.filter(approval_id=approval.id, action="extended").values_list("actor", "outcome")
    )
    assert outcomes == {"alice": "decided", "bob": "not_permitted"}


def test_it_refuses_to_extend_nothing_or_by_nonsense(deadline):
    deadline()  # no timeout
    [approval] = pending(start(REFUND))
    alice = services.Attempt(actor="alice", source="cli")

    with pytest.raises(services.WrongState, match="no deadline"):
        approval_extend(approval_id=approval.id, by_seconds=60, attempt=alice)
    with pytest.raises(services.InvalidInput, match="by_seconds"):
        approval_extend(approval_id=approval.id, by_seconds=-5, attempt=alice)


def test_it_extends_from_the_cli_and_the_api(deadline, alice, capsys):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))

    code = cli.main(["approvals", "extend", approval.id, "--by", "alice", "--for", "30m"])
    out = capsys.readouterr().out
    client = Client()
    client.force_login(alice)
    response = client.post(f"/api/approvals/{approval.id}/extend", {"by_seconds": 600}, content_type="application/json")
    refused = cli.main(["approvals", "extend", approval.id, "--by", "bob", "--for", "soon"])
    err = capsys.readouterr().err

    assert code == 0 and "until" in out
    assert response.status_code == 200, response.content
    assert response.json()["expires_at"]
    assert refused == 1 and "--for" in err
    assert AuditEntry.objects.filter(approval_id=approval.id, action="extended", outcome="decided").count() == 2


def test_it_refuses_an_api_extend_by_someone_who_may_not_decide(deadline, bob):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))
    client = Client()
    client.force_login(bob)

    response = client.post(f"/api/approvals/{approval.id}/extend", {"by_seconds": 600}, content_type="application/json")

    assert response.status_code == 403
    assert response.json()["error_code"]


def test_it_sends_reminders_while_a_call_waits(deadline, django_capture_on_commit_callbacks):
    deadline(remind_every=0.2)
    [approval] = pending(start(REFUND))
    assert approval_remind_due() == 0  # the first interval has not passed

    time.sleep(0.25)
    with django_capture_on_commit_callbacks(execute=True):
        assert approval_remind_due() == 1
        assert approval_remind_due() == 0  # once per interval

    assert {d.target for d in deliveries(approval, "approval.reminder")} == {"fiona", "max"}
    services.approval_decide(
        approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="alice", source="cli")
    )
    time.sleep(0.25)
    assert approval_remind_due() == 0  # decided: no more reminders


def test_it_reminds_exactly_the_approvals_whose_own_interval_has_passed(deadline, django_capture_on_commit_callbacks):
    # The database picks them: each approval's interval from its last reminder, or from when it was asked.
    deadline(remind_every="1h")
    asked, reminded, recent, fractional, quick = (pending(start(REFUND))[0] for _ in range(5))
    now = timezone.now()
    moves = {
        asked: {"created_at": now - timedelta(minutes=61)},  # never reminded, asked over an hour ago
        reminded: {"created_at": now - timedelta(hours=5), "last_reminded_at": now - timedelta(minutes=61)},
        recent: {"created_at": now - timedelta(hours=5), "last_reminded_at": now - timedelta(minutes=59)},
        fractional: {"remind_every_seconds": 90.5, "created_at": now - timedelta(seconds=89.5)},  # 1 s to go
        quick: {"remind_every_seconds": 90.5, "created_at": now - timedelta(seconds=91)},
    }
    for approval, changes in moves.items():
        Approval.objects.filter(pk=approval.pk).update(**changes)

    with django_capture_on_commit_callbacks(execute=True):
        assert approval_remind_due() == 3

    assert {a.pk for a in moves if deliveries(a, "approval.reminder")} == {asked.pk, reminded.pk, quick.pk}


@pytest.mark.integration
def test_it_fires_a_deadline_on_time_through_its_eta_task(deadline, start_worker):
    # The sweeper is slowed to once an hour: only the task scheduled at the deadline can fire it.
    deadline(timeout=1)
    start_worker(AGENTFAST_SWEEP_SECONDS="3600")
    run = services.run_create(agent="support", input=REFUND, created_by="bob")

    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED, what="the deadline to end the run")

    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("expired", "system")
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_EXPIRED"


@pytest.mark.integration
def test_it_fires_deadlines_after_the_worker_and_beat_restarted(deadline, start_worker):
    # The first worker holds the eta message and dies before the deadline; its sweeper never runs.
    deadline(timeout=2, on_timeout="approve")
    first = start_worker(AGENTFAST_SWEEP_SECONDS="3600")
    run = services.run_create(agent="support", input=REFUND, created_by="bob")
    wait_for(lambda: Approval.objects.filter(run=run).exists(), what="the pause")
    first.kill()

    start_worker()  # a fresh worker and beat: the sweeper finds the overdue deadline in the database

    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED, what="the deadline to approve")
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("approved", "deadline")
    assert SideEffect.objects.filter(tool="refund_request").count() == 1


def test_it_shows_the_countdown_and_extends_from_the_card(deadline, alice, bob):
    deadline(timeout="1h")
    [approval] = pending(start(REFUND))
    client, outsider = Client(), Client()
    client.force_login(alice)
    outsider.force_login(bob)
    htmx = {"HTTP_HX_REQUEST": "true"}

    inbox = client.get("/").content.decode()
    refused = outsider.post(f"/approvals/{approval.id}/extend", {"by_seconds": "600"}, **htmx)
    extended = client.post(f"/approvals/{approval.id}/extend", {"by_seconds": "600"}, **htmx)

    assert f'id="deadline-{approval.id}"' in inbox and "data-deadline" in inbox
    assert 'data-action="extend"' in inbox
    assert refused.status_code == 403
    assert extended.status_code == 200 and "data-deadline" in extended.content.decode()
    actors = list(AuditEntry.objects.filter(approval_id=approval.id, action="extended").values_list("actor", "source"))
    assert sorted(actors) == [("alice", "web"), ("bob", "web")]


# A deadline further off than the broker keeps a message travels in hops, each well inside its visibility timeout.


def _paused(deadline: Callable[..., Path], capture: Callable[..., object], **keys: object) -> Approval:
    deadline(**keys)
    with capture(execute=True):
        [approval] = pending(start(REFUND))
    return approval


def _hops(broker: redis.Redis, approval: Approval) -> list[tuple[str, datetime]]:
    """Take the approval's deadline messages from the broker: the deadline each is for, and its eta."""
    queued = take_queued(broker, approval_deadline.name)
    assert all(args == [approval.pk] for args, _, _ in queued)
    return [(kwargs["when"], eta) for _, kwargs, eta in queued]


def test_it_sends_a_far_deadline_in_hops_inside_the_visibility_timeout(
    db, broker, deadline, django_capture_on_commit_callbacks
):
    half = current_app.conf.broker_transport_options["visibility_timeout"] / 2
    before = timezone.now()
    approval = _paused(deadline, django_capture_on_commit_callbacks, timeout="4h")
    approval.refresh_from_db()

    [(when, eta)] = _hops(broker, approval)
    assert datetime.fromisoformat(when) == approval.expires_at  # the message knows the deadline it is for
    assert before + timedelta(seconds=half) <= eta <= timezone.now() + timedelta(seconds=half)

    # The hop wakes at its eta, finds the deadline still ahead and sends the next hop.
    with django_capture_on_commit_callbacks(execute=True):
        assert approval_deadline(approval.pk, when) == "next hop sent"
    [(again, next_eta)] = _hops(broker, approval)
    assert again == when and next_eta <= timezone.now() + timedelta(seconds=half)
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING


def test_it_drops_the_hops_of_a_deadline_that_was_extended_or_decided(
    db, alice, broker, deadline, django_capture_on_commit_callbacks
):
    approval = _paused(deadline, django_capture_on_commit_callbacks, timeout="4h")
    [(first, _)] = _hops(broker, approval)
    attempt = services.Attempt(actor="alice", source="api")

    with django_capture_on_commit_callbacks(execute=True):
        services.approval_extend(approval_id=approval.pk, by_seconds=3600, attempt=attempt)
    [(extended, _)] = _hops(broker, approval)  # the extension's own message
    assert datetime.fromisoformat(extended) - datetime.fromisoformat(first) == timedelta(hours=1)
    assert approval_deadline(approval.pk, first) == "nothing due"  # the old chain ends here
    assert _hops(broker, approval) == []

    services.approval_decide(approval_id=approval.pk, decision="rejected", attempt=attempt)
    assert approval_deadline(approval.pk, extended) == "nothing due"
    assert _hops(broker, approval) == []


def test_it_fires_the_deadline_at_the_end_of_its_hops(
    db, broker, deadline, django_capture_on_commit_callbacks, monkeypatch
):
    # A broker that keeps an unacknowledged message one second: hops of half a second.
    monkeypatch.setitem(current_app.conf.broker_transport_options, "visibility_timeout", 1)
    approval = _paused(deadline, django_capture_on_commit_callbacks, timeout=2)
    outcomes = []
    while (hops := _hops(broker, approval)) and len(outcomes) < 20:
        [(when, eta)] = hops
        time.sleep(max(0.0, (eta - timezone.now()).total_seconds()))
        with django_capture_on_commit_callbacks(execute=True):
            outcomes.append(approval_deadline(approval.pk, when))

    # At least one hop before the deadline (how many depends on how long the pause took to record:
    # on a loaded machine a second of the two may be gone before the first hop is read).
    assert outcomes[-1] == "expired" and set(outcomes[:-1]) == {"next hop sent"} and len(outcomes) >= 2
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    assert approval.decided_at - approval.expires_at < timedelta(seconds=1)  # on time, not at a sweep


def test_it_fires_a_message_sent_before_deadlines_had_hops(db, broker, deadline, django_capture_on_commit_callbacks):
    # Messages already queued by an older version carry no deadline: they fire when due, as before.
    approval = _paused(deadline, django_capture_on_commit_callbacks, timeout=1)
    _hops(broker, approval)
    assert approval_deadline(approval.pk) == "nothing due"
    time.sleep(1.05)
    assert approval_deadline(approval.pk) == "expired"
    assert _hops(broker, approval) == []
