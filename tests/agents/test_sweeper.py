"""The sweeper finds stranded work from the database alone (Redis is never the truth)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from agents import services
from agents.models import Approval, Run, ToolCall
from agents.sweeper import sweep
from tests.support.broker import take_queued
from tests.support.flows import decide, pending, resume, start

REFUND = "Refund order A1001 for 25.00 USD"


def age(run: Run, seconds: float) -> None:
    """Pretend the run's last activity was `seconds` ago; its decisions as long before, in their order."""
    past = timezone.now() - timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(created_at=past, updated_at=past)
    Approval.objects.filter(run=run).exclude(decided_at=None).update(
        decided_at=F("decided_at") - timedelta(seconds=seconds)
    )


def test_it_re_enqueues_a_run_whose_worker_died(db, django_capture_on_commit_callbacks):
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    assert services.run_lease(run_id=run.id, owner="dead-worker", ttl=-1) is not None  # already expired
    age(run, 60)

    assert sweep().runs == [run.id]


def test_it_sends_a_stranded_run_again_once_per_grace_period_not_at_every_sweep(db, settings):
    # A backlog longer than the grace period keeps the message the last sweep sent waiting:
    # a copy at every sweep (each 5 s) would pile up in the broker, each a no-op for the lease.
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    lost = services.run_create(agent="support", input=REFUND, enqueue=False)
    dead = services.run_create(agent="support", input=REFUND, enqueue=False)
    services.run_lease(run_id=dead.id, owner="dead-worker", ttl=-1)
    decided = start(REFUND)
    decide(pending(decided)[0], "approved")
    for run in (lost, dead, decided):
        age(run, 60)

    assert sorted(sweep().runs) == sorted([lost.id, dead.id, decided.id])
    assert sweep().runs == []  # their messages may still be on the way

    for run in (lost, dead, decided):
        age(run, 11)
    assert sorted(sweep().runs) == sorted([lost.id, dead.id, decided.id])


def test_it_leaves_a_run_with_a_live_lease_alone(db):
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    services.run_lease(run_id=run.id, owner="live-worker", ttl=60)

    assert sweep().runs == []


def test_it_re_enqueues_a_queued_run_whose_start_message_was_lost(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    fresh = services.run_create(agent="support", input=REFUND, enqueue=False)
    lost = services.run_create(agent="support", input=REFUND, enqueue=False)
    age(lost, 60)

    assert sweep().runs == [lost.id]  # the fresh one may still get its message
    assert fresh.id not in sweep().runs


def test_it_starts_a_lost_run_behind_decided_ones_and_resumes_a_dead_one_ahead(
    db, settings, broker, django_capture_on_commit_callbacks
):
    # A backlog of new runs past the grace period must not jump ahead of decisions waiting
    # for their effect: a lost start goes out as a start (priority 6), a dead drive as a drive.
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    lost = services.run_create(agent="support", input=REFUND, enqueue=False)
    age(lost, 60)
    dead = services.run_create(agent="support", input=REFUND, enqueue=False)
    services.run_lease(run_id=dead.id, owner="dead-worker", ttl=-1)
    age(dead, 60)

    with django_capture_on_commit_callbacks(execute=True):
        assert sorted(sweep().runs) == sorted([lost.id, dead.id])

    assert [args for args, _, _ in take_queued(broker, "agents.tasks.run_start")] == [[lost.id]]
    assert [args for args, _, _ in take_queued(broker, "agents.tasks.run_drive")] == [[dead.id]]


def test_it_leaves_a_queued_run_its_caller_drives_alone(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    handed_to_a_worker = services.run_create(agent="support", input=REFUND, enqueue=False)
    driven_by_its_caller = services.run_create(agent="support", input=REFUND, auto_resume=False, enqueue=False)
    age(handed_to_a_worker, 60)
    age(driven_by_its_caller, 60)  # the playground page has not started its streamed drive yet

    assert sweep().runs == [handed_to_a_worker.id]


def test_it_resumes_decided_runs_but_not_waiting_or_manual_ones(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    decided = start(REFUND)
    decide(pending(decided)[0], "approved")  # its resume message is lost: the test's transaction never commits
    waiting = start(REFUND)
    manual = start(REFUND, auto_resume=False)
    decide(pending(manual)[0], "approved")
    for run in (decided, waiting, manual):
        age(run, 60)

    assert sweep().runs == [decided.id]


def test_it_leaves_a_run_whose_decision_left_the_resume_to_its_decider(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    approved = start(REFUND)
    decide(pending(approved)[0], "approved", auto_resume=False)
    rejected = start(REFUND)
    decide(pending(rejected)[0], "rejected", note="no", auto_resume=False)
    for run in (approved, rejected):
        age(run, 60)

    assert sweep().runs == []
    assert resume(approved).status == Run.Status.COMPLETED  # the decider resumes it when they mean to


def test_it_re_enqueues_decided_deferred_calls_not_yet_run(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    run = start("Email bob@example.com that his refund is on its way")
    [approval] = pending(run)
    decide(approval, "approved")
    assert sweep().deferred == []  # within the grace period its own message may arrive
    age(run, 60)

    assert sweep().deferred == [approval.tool_call_id]
    # A backlog of tool executions keeps that message waiting: one more copy per grace period, not one per sweep.
    assert sweep().deferred == []
    ToolCall.objects.filter(pk=approval.tool_call_id).update(resent_at=timezone.now() - timedelta(seconds=11))
    assert sweep().deferred == [approval.tool_call_id]


def test_it_resumes_a_parallel_step_only_once_its_last_approval_is_decided(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    run = start("Refund orders A1001 and A1002 for 20.00 USD each")
    first, second = pending(run)
    decide(first, "approved", auto_resume=False)
    age(run, 60)
    assert sweep().runs == []  # one call decided, the other still waits on a person

    decide(second, "rejected", note="not this one")  # the decision that unblocks the run asks for its resume
    age(run, 60)
    assert sweep().runs == [run.id]


def test_it_follows_the_decision_that_unblocked_a_parallel_step(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    run = start("Refund orders A1001 and A1002 for 20.00 USD each")
    first, second = pending(run)
    decide(first, "approved")
    decide(second, "approved", auto_resume=False)
    age(run, 60)

    assert sweep().runs == []


def test_it_resumes_a_run_whose_call_was_rejected_or_expired(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    rejected = start(REFUND)
    decide(pending(rejected)[0], "rejected", note="no")
    expired = start(REFUND)
    assert services.approval_expire(approval=pending(expired)[0], actor="deadline", reason="late", resume=False)
    for run in (rejected, expired):
        age(run, 60)

    assert sorted(sweep().runs) == sorted([rejected.id, expired.id])


def test_it_leaves_a_run_alone_once_a_drive_settled_its_decisions(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    revised = start(REFUND)
    decide(pending(revised)[0], "rejected", note="too much", feedback="make it 20.00", auto_resume=False)
    revised = resume(revised)  # the model drafts again: a new call waits on a person
    assert revised.status == Run.Status.SUSPENDED
    finished = start(REFUND)
    decide(pending(finished)[0], "approved", auto_resume=False)
    finished = resume(finished)
    assert finished.status == Run.Status.COMPLETED
    for run in (revised, finished):
        age(run, 60)
    assert sweep().runs == []

    decide(pending(revised)[0], "approved")
    age(revised, 60)
    assert sweep().runs == [revised.id]
