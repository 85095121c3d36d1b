"""Celery tasks of the notifications: thin, idempotent, acks_late."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from agents.queue import OnCommitTask

# A link's signature carries its time: kept an hour past its age, its nonce outlives any clock step.
LINK_CLOCK_MARGIN_SECONDS = 3600


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


@shared_task(base=OnCommitTask, acks_late=True, time_limit=600)
def housekeeping() -> dict[str, int]:
    """Beat, hourly: delete settled deliveries past AGENTFAST_DELIVERY_RETENTION_DAYS, spent link nonces, and
    the site's expired sessions (Django leaves those to a `clearsessions` cron nobody sets up).
    """
    from importlib import import_module

    from django.conf import settings
    from django.utils import timezone

    from agents.notify.channels import ONE_CLICK_MAX_AGE
    from agents.services.notify import notifications_prune

    now = timezone.now()
    days = settings.AGENTFAST_DELIVERY_RETENTION_DAYS
    pruned = notifications_prune(
        deliveries_before=now - timedelta(days=days) if days else None,
        links_before=now - timedelta(seconds=ONE_CLICK_MAX_AGE + LINK_CLOCK_MARGIN_SECONDS),
    )
    try:
        import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()
    except NotImplementedError:  # a third-party engine that cannot list its sessions
        pass
    return {"deliveries": pruned.deliveries, "links": pruned.links}
