"""A decision (or a deadline) under way while the driver gives up its run: the run is resumed either way."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import transaction

from agents import services
from agents.models import Approval, Run
from tests.support.flows import decide, pending, start
from tests.support.threads import started

REFUND = "Refund order A1001 for 25.00 USD"


def _driven_with_a_pending_call(owner: str) -> tuple[Run, Approval]:
    """Return a run that `owner` drives while one suspend approval of it waits (as while a low-risk call runs)."""
    run = start(REFUND)
    [approval] = pending(run)
    services.run_fail(run_id=run.id, owner=None, error="the model endpoint was down")
    services.run_request_resume(run_id=run.id, enqueue=False)
    assert services.run_lease(run_id=run.id, owner=owner) is not None
    return run, approval


def _suspend_while(under_way: Callable[[], object], run: Run, owner: str) -> bool:
    """Ask to suspend the run while `under_way` holds its transaction open; return what run_suspend answered."""
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                under_way()
                holding.set()
                release.wait(10)
        except BaseException as exc:  # noqa: BLE001 — re-raised in the test's thread
            failures.append(exc)
            holding.set()

    answers: list[bool] = []
    holder = started(hold)
    assert holding.wait(10)
    suspender = started(lambda: answers.append(services.run_suspend(run_id=run.id, owner=owner)))
    suspender.join(0.5)
    assert suspender.is_alive()  # waiting for the run's row (PostgreSQL) or the write lock (SQLite)
    release.set()
    holder.join(10)
    suspender.join(10)
    assert not failures, failures
    return answers[0]


def test_it_keeps_driving_a_run_whose_last_approval_was_decided_while_it_suspended(transactional_db, alice):
    # The decision saw the run still driven, so it enqueued no resume: the driver must go on itself.
    run, approval = _driven_with_a_pending_call("worker-1")
    decisions: list[services.Decision] = []

    suspended = _suspend_while(lambda: decisions.append(decide(approval, "approved")), run, "worker-1")

    assert decisions[0].resume_enqueued is False
    assert suspended is False
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.RUNNING, "worker-1")


def test_it_keeps_driving_a_run_whose_last_approval_expired_while_it_suspended(transactional_db):
    run, approval = _driven_with_a_pending_call("worker-1")

    def expire() -> None:
        assert services.approval_expire(approval=approval, actor="system", reason="no decision before the deadline")

    assert _suspend_while(expire, run, "worker-1") is False
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.RUNNING, "worker-1")
