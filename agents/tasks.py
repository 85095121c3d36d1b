"""Celery tasks: thin, idempotent, acks_late; each takes ids and calls one function.

Enqueue them with `delay_on_commit` (see agents.queue.OnCommitTask): after the commit,
and a broker that is down is logged for the sweeper rather than raised.
"""

from __future__ import annotations

import logging

from celery import shared_task

from agents import runtime, sweeper
from agents.queue import OnCommitTask
from agents.runtime.execution import execute_deferred

logger = logging.getLogger(__name__)

# Longer than any sane model or tool call; the lease keeper renews meanwhile. Only the prefork
# pool enforces it: on the default threads pool a model turn ends by OPENAI_TURN_TIMEOUT and a
# tool past the lease keeper's TOOL_LEASE_SECONDS loses its run to another worker.
_TIME_LIMIT = 15 * 60


@shared_task(base=OnCommitTask, acks_late=True, time_limit=_TIME_LIMIT, soft_time_limit=_TIME_LIMIT - 30)
def run_drive(run_id: str) -> str:
    """Start or resume a run; a duplicate finds the lease taken and does nothing."""
    result = runtime.drive(run_id)
    if result.driven:  # at INFO: which worker drove which run (the scale-out bench counts these lines)
        logger.info("drove %s: %s", run_id, result.status)
    return result.status


@shared_task(base=OnCommitTask, acks_late=True, time_limit=_TIME_LIMIT, soft_time_limit=_TIME_LIMIT - 30)
def run_start(run_id: str) -> str:
    """Drive a new run to its first pause or its end; queued behind decided runs (CELERY_TASK_ROUTES)."""
    return run_drive(run_id)


@shared_task(base=OnCommitTask, acks_late=True, time_limit=_TIME_LIMIT, soft_time_limit=_TIME_LIMIT - 30)
def toolcall_execute_deferred(tool_call_pk: int) -> str:
    """Run a decided deferred call once, or record its rejection."""
    return execute_deferred(tool_call_pk)


@shared_task(base=OnCommitTask, acks_late=True, time_limit=120)
def sweep() -> dict[str, int]:
    """Beat: fire overdue deadlines, send reminders, re-enqueue stranded runs and deferred calls."""
    report = sweeper.sweep()
    return {
        "expired": report.expired,
        "reminded": report.reminded,
        "runs": len(report.runs),
        "deferred": len(report.deferred),
    }


@shared_task(base=OnCommitTask, acks_late=True, time_limit=120)
def approval_deadline(approval_id: str, when: str = "") -> str:
    """Fire an approval's deadline at its eta, or send its next hop; a late or repeated message finds nothing due."""
    from agents.services.deadlines import approval_deadline_fire, deadline_hop

    fired = approval_deadline_fire(approval_id=approval_id)
    if not fired and when and deadline_hop(approval_id=approval_id, when=when):
        return "next hop sent"
    return fired or "nothing due"
