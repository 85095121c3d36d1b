"""agents.sql, the services' raw statements, on the database the tests run on (SQLite, and Postgres in CI)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agents import services, sql
from agents.models import Run, ToolCall
from tests.support.flows import decide, pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def _queued() -> Run:
    return services.run_create(agent="support", input="Where is order A1001?", enqueue=False)


def test_it_leases_a_run_to_one_owner_and_returns_what_the_driver_needs(db):
    run = _queued()
    now = timezone.now()

    first = sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))
    second = sql.run_lease(run_id=run.id, owner="w2", now=now, expires_at=now + timedelta(seconds=30))

    assert first is not None and first[:4] == ("support", 0, "Where is order A1001?", True)
    assert second is None
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.RUNNING, "w1")
    # Written raw, read by the ORM: the same datetime form.
    assert run.lease_expires_at == now + timedelta(seconds=30)


def test_it_takes_an_expired_lease_and_compares_it_with_orm_written_times(db):
    run = _queued()
    past = timezone.now() - timedelta(minutes=5)
    sql.run_lease(run_id=run.id, owner="w1", now=past, expires_at=past + timedelta(seconds=1))

    now = timezone.now()
    assert sql.run_lease(run_id=run.id, owner="w2", now=now, expires_at=now + timedelta(seconds=30)) is not None


def test_it_fences_a_drivers_write_by_its_lease(db):
    run = _queued()
    now = timezone.now()
    sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))
    write = {"now": now, "lease_until": now + timedelta(seconds=30), "add_steps": 1, "fields": {"output": "x"}}

    assert sql.run_write(run_id=run.id, owner="w1", events=2, **write) == 2
    assert sql.run_write(run_id=run.id, owner="w2", events=1, **write) is None
    run.refresh_from_db()
    assert (run.steps, run.last_event_seq, run.output) == (1, 2, "x")


def test_it_suspends_only_a_run_that_still_waits_on_a_person(db):
    run = _queued()
    now = timezone.now()
    sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))

    assert sql.run_suspend(run_id=run.id, owner="w1", now=now) is False  # nobody is asked anything


def test_it_leases_a_paused_run_only_once_its_approval_is_decided(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    now = timezone.now()
    until = now + timedelta(seconds=30)

    assert sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=until) is None
    decide(approval, "approved", auto_resume=False)
    assert sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=until) is not None


def test_it_claims_a_call_once(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    now = timezone.now()

    claims = [sql.toolcall_claim(tool_call_pk=approval.tool_call_id, now=now) for _ in range(3)]

    assert claims == [True, False, False]
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCall.Status.RUNNING and call.executed_at == now
