"""Cancel vs decide: one of them wins, and no effect ever runs on a cancelled run (issue 7, item 8)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from agents import runtime, services
from agents.models import AuditEntry, Run, SideEffect, ToolCall
from tests.support.flows import decide, pending, resume, start
from tests.support.threads import started

REFUND = "Refund order A1001 for 25.00 USD"
TRIES = 12


def cancel(run: Run, *, by: str = "carol") -> Run:
    return services.run_cancel(run_id=run.id, attempt=services.Attempt(actor=by, source="api", origin="10.0.0.9"))


def both_at_once(*tasks: Any) -> list[Any]:
    """Run the tasks in threads released together; return their results (or exceptions)."""
    barrier = threading.Barrier(len(tasks))
    results: list[Any] = [None] * len(tasks)

    def body(index: int) -> None:
        try:
            barrier.wait()
            results[index] = tasks[index]()
        except Exception as exc:  # noqa: BLE001 — the test inspects it
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_it_never_runs_an_effect_on_a_run_cancelled_while_it_is_approved_and_resumed(transactional_db):
    """A reviewer approves and the worker resumes, while an admin cancels: one of them wins, every time."""
    for _ in range(TRIES):
        run = start(REFUND, auto_resume=False)
        [approval] = pending(run)

        def approve_and_resume(approval=approval, run=run) -> object:
            decided = decide(approval, "approved", auto_resume=False)
            runtime.drive(run.id, stream=False)
            return decided

        cancelled, approved = both_at_once(lambda run=run: cancel(run), approve_and_resume)

        run.refresh_from_db()
        effects = SideEffect.objects.filter(idempotency_key=approval.id).count()
        for result in (cancelled, approved):
            assert not isinstance(result, Exception) or isinstance(result, services.WrongState), result
        call = ToolCall.objects.get(pk=approval.tool_call_id)
        if run.status != Run.Status.CANCELLED:
            assert isinstance(cancelled, services.WrongState) and effects == 1
        elif effects:
            # The call ran to its end before the cancel: the cancel came after, never during or before.
            effect = SideEffect.objects.get(idempotency_key=approval.id)
            cancelled_at = AuditEntry.objects.get(run_id=run.id, action="cancelled").created_at
            assert call.status == ToolCall.Status.SUCCEEDED and effect.created_at <= cancelled_at
        else:
            assert call.result["error_code"] in ("RUN_CANCELLED", "APPROVAL_EXPIRED") and call.executed_at is None


def test_it_gives_an_approved_call_of_a_cancelled_run_a_clear_outcome_and_never_runs_it(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    assert services.run_lease(run_id=run.id, owner="worker-1") is not None  # a worker took the run to resume it

    cancel(run)
    resume(run)

    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result["error_code"] == "RUN_CANCELLED" and call.executed_at is None
    assert services.toolcall_claim(tool_call=call) is None
    assert SideEffect.objects.count() == 0


def test_it_refuses_to_cancel_while_a_claimed_call_runs(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    assert services.toolcall_claim(tool_call=ToolCall.objects.get(pk=approval.tool_call_id)) is not None

    with pytest.raises(services.WrongState, match="running refund_request") as refused:
        cancel(run)
    claimed_at = ToolCall.objects.get(pk=approval.tool_call_id).executed_at
    # A hurried admin learns when it was claimed, and what ends a claim whose worker died.
    assert f"claimed at {claimed_at:%H:%M:%S} UTC" in refused.value.message
    assert "if its worker died, it is marked in doubt once its claim runs out" in refused.value.message

    assert Run.objects.get(pk=run.id).status != Run.Status.CANCELLED


def test_it_refuses_a_decision_after_the_cancel(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    cancel(run)

    with pytest.raises(services.WrongState, match="expired"):
        decide(approval, "approved")


def test_it_audits_who_cancelled_and_from_where(db):
    run = start(REFUND, auto_resume=False)

    cancel(run, by="carol")

    entry = AuditEntry.objects.get(run_id=run.id, action="cancelled")
    assert (entry.actor, entry.source, entry.origin) == ("carol", "api", "10.0.0.9")
    expired = AuditEntry.objects.get(run_id=run.id, action="expired")
    assert expired.actor == "carol"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serializes writers: no cancel can be under way")
def test_it_waits_for_a_cancel_under_way_before_it_claims_a_call(transactional_db):
    """The claim's statement reads the run under its lock: a cancel that has begun (locked the run) stops it."""
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    cancelling, release = threading.Event(), threading.Event()
    claims: list[object] = []

    def cancel_and_wait() -> None:
        try:
            with transaction.atomic():
                # run_cancel's first step, then a pause before its checks: the claim must not slip in here.
                Run.objects.select_for_update().get(pk=run.id)
                cancelling.set()
                release.wait(10)
                cancel(run)
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_and_wait)
    canceller.start()
    assert cancelling.wait(10)
    claimer = started(lambda: claims.append(services.toolcall_claim(tool_call=call)))
    claimer.join(0.5)
    assert claimer.is_alive()  # waiting on the run's row lock
    release.set()
    canceller.join(10)
    claimer.join(10)

    assert claims == [None]
    assert Run.objects.get(pk=run.id).status == Run.Status.CANCELLED
    assert ToolCall.objects.get(pk=call.pk).executed_at is None
