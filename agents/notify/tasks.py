"""Celery tasks of the notifications: thin, idempotent, acks_late."""

from __future__ import annotations

from celery import shared_task

from agents.queue import OnCommitTask


@shared_task(base=OnCommitTask, acks_late=True, time_limit=120, soft_time_limit=90)
def deliver(delivery_id: int) -> str:
    """Make one attempt at a delivery; a duplicate message finds it claimed or done and does nothing."""
    from agents.notify.dispatch import send

    return send(delivery_id)


@shared_task(base=OnCommitTask, acks_late=True, time_limit=120)
def deliveries_sweep() -> int:
    """Beat: enqueue again the deliveries overdue by a grace period (their message was lost, or their worker died)."""
    from agents.services.notify import deliveries_resend_due

    due = deliveries_resend_due()
    for delivery_id in due:
        deliver.delay_on_commit(delivery_id)
    return len(due)
