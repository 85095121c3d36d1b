"""Find work whose Celery message was lost or whose worker died, and enqueue it again.

Redis is never the source of truth (invariant 6): everything the sweeper needs is in the
database. Enqueueing twice is harmless because the lease and the claim are compare-and-sets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils import timezone

from agents import queue, services
from agents.gateway.services import external_claims_mark_in_doubt
from agents.models import Approval, Run, ToolCall
from agents.services.runs import pending_suspend_approvals

logger = logging.getLogger(__name__)

# A deferred call claimed longer ago than this, with no result, lost its worker.
DEFERRED_CLAIM_TIMEOUT = timedelta(minutes=15)


@dataclass
class SweepReport:
    expired: int = 0  # deadlines fired (expired, approved, escalated or run)
    reminded: int = 0
    runs: list[str] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    in_doubt: list[int] = field(default_factory=list)


def sweep() -> SweepReport:
    """Fire overdue deadlines (their eta message was lost), remind, then re-enqueue stranded runs and deferred calls."""
    now = timezone.now()
    grace = now - timedelta(seconds=settings.AGENTFAST_SWEEP_GRACE_SECONDS)
    report = SweepReport(expired=services.approval_deadlines_due(), reminded=services.approval_remind_due())
    stranded, never_started = _stranded_runs(now, grace)
    for run_id in stranded:
        queue.drive_on_commit(run_id)
    for run_id in never_started:
        # As it was first sent: behind decided runs. A backlog of new runs waiting past the
        # grace period would otherwise jump ahead of decisions waiting for their effect.
        queue.start_on_commit(run_id)
    report.runs += [*stranded, *never_started]
    # Sent now: the next sweep leaves them to this message for a grace period. A backlog that
    # keeps runs waiting longer than the grace would otherwise get a copy of each run's message
    # at every sweep, each a no-op for the lease but all of them work for the broker and the workers.
    Run.objects.filter(pk__in=report.runs).update(updated_at=now)
    report.deferred = _stranded_deferred_calls(now, grace)
    for call_pk in report.deferred:
        queue.deferred_on_commit(call_pk)
    # As for runs: sent now, each waits a grace period on this message before the next copy.
    ToolCall.objects.filter(pk__in=report.deferred).update(resent_at=now)
    for call in ToolCall.objects.filter(
        hitl_mode=Approval.Mode.DEFER, result__isnull=True, executed_at__lt=now - DEFERRED_CLAIM_TIMEOUT
    ):
        if services.toolcall_mark_in_doubt(tool_call=call):
            report.in_doubt.append(call.pk)
    report.in_doubt += external_claims_mark_in_doubt()
    if report.runs or report.deferred or report.expired or report.in_doubt or report.reminded:
        logger.info("sweep: %s", report)
    return report


def _stranded_deferred_calls(now: datetime, grace: datetime) -> list[int]:
    """Return deferred calls decided before the grace period and not yet run, not sent again within it.

    Not one its tool put off (not_before) while its time has not come: its own message is due then.
    """
    return list(
        ToolCall.objects.filter(
            Q(resent_at__isnull=True) | Q(resent_at__lt=grace),
            ToolCall.due(now),
            hitl_mode=Approval.Mode.DEFER,
            result__isnull=True,
            executed_at__isnull=True,
            approval__status__in=[Approval.Status.APPROVED, Approval.Status.REJECTED, Approval.Status.EXPIRED],
            approval__decided_at__lt=grace,
        ).values_list("pk", flat=True)
    )


def _stranded_runs(now: datetime, grace: datetime) -> tuple[list[str], list[str]]:
    """Return runs that should be moving and are not: those to drive again, and those never started.

    - running with an expired lease: its worker died mid-step;
    - queued past the grace period with no lease and auto_resume on: its start message
      was lost (a run with auto_resume off, the playground's, is driven by its caller,
      and a worker taking it would race that caller's streamed drive);
    - suspended with every suspend approval decided, auto_resume on, the last decision
      past the grace period: its resume message was lost. Unless that decision, the one that
      unblocked the run, said not to resume it (`auto_resume: false`, `--no-resume`): its
      decider resumes it, as for a run started with auto_resume off.

    The last kind starts from the suspend calls decided and not yet run (a small partial
    index), not from every suspended run: a run suspends only while one of its suspend
    approvals is pending, and deciding that one leaves its call approved or rejected with
    no result until a drive settles it, which takes the lease and leaves `suspended`. So
    a stranded run always has such a call, and the check costs as much as there are
    decisions waiting for their resume, however many runs wait on a person.

    Each kind also waits a grace period after the run's last change (`updated_at`): that is when
    it was queued again (a retry), or sent again by an earlier sweep.
    """
    dead = Run.objects.filter(status=Run.Status.RUNNING, lease_expires_at__lt=now, updated_at__lt=grace)
    lost_start = Run.objects.filter(
        status=Run.Status.QUEUED, auto_resume=True, lease_expires_at__isnull=True, updated_at__lt=grace
    )
    decided_unrun = ToolCall.objects.filter(
        ToolCall.due(now),  # a call its tool put off waits for its time
        hitl_mode=Approval.Mode.SUSPEND,
        result__isnull=True,
        status__in=[ToolCall.Status.APPROVED, ToolCall.Status.REJECTED],
    ).values("run_id")
    held_due = ToolCall.objects.filter(
        not_before__lte=now, hitl_mode=Approval.Mode.SUSPEND, result__isnull=True, status=ToolCall.Status.APPROVED
    ).values("run_id")
    unblocked_by = Approval.objects.filter(run=OuterRef("pk"), mode=Approval.Mode.SUSPEND, decided_at__isnull=False)
    decided = (
        Run.objects.filter(pk__in=decided_unrun, status=Run.Status.SUSPENDED, auto_resume=True)
        .filter(~pending_suspend_approvals())
        .annotate(
            last_decision=Max("approvals__decided_at"),
            left_to_caller=Subquery(unblocked_by.order_by("-decided_at").values("resume_by_caller")[:1]),
        )
        .filter(last_decision__lt=grace, updated_at__lt=grace)
        # A decider who resumes the run itself resumed it already if a call of it is held: its driver
        # sent the wake-up for the call's time, which is the system's to repeat once lost.
        .exclude(Q(left_to_caller=True) & ~Q(pk__in=held_due))
    )
    stranded = [*dead.values_list("id", flat=True), *decided.values_list("id", flat=True)]
    return stranded, list(lost_start.values_list("id", flat=True))
