"""The sweeper finds stranded work from the database alone (Redis is never the truth)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agents import services
from agents.models import Approval, Run
from agents.sweeper import sweep
from tests.support.flows import decide, pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def age(run: Run, seconds: float) -> None:
    """Pretend the run's last activity was `seconds` ago."""
    past = timezone.now() - timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(created_at=past)
    Approval.objects.filter(run=run).exclude(decided_at=None).update(decided_at=past)


def test_it_re_enqueues_a_run_whose_worker_died(db, django_capture_on_commit_callbacks):
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    assert services.run_lease(run_id=run.id, owner="dead-worker", ttl=-1) is not None  # already expired

    assert sweep().runs == [run.id]


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
    decide(pending(decided)[0], "approved", auto_resume=False)
    waiting = start(REFUND)
    manual = start(REFUND, auto_resume=False)
    decide(pending(manual)[0], "approved")
    for run in (decided, waiting, manual):
        age(run, 60)

    assert sweep().runs == [decided.id]


def test_it_re_enqueues_decided_deferred_calls_not_yet_run(db, settings):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 10
    run = start("Email bob@example.com that his refund is on its way")
    [approval] = pending(run)
    decide(approval, "approved")
    assert sweep().deferred == []  # within the grace period its own message may arrive
    age(run, 60)

    assert sweep().deferred == [approval.tool_call_id]
