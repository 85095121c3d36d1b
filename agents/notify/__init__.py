"""Notifications: tell reviewers about approvals where they are (webhooks, email, chat).

`announce(event_type, approval_id)` is the one entry point. Services call it inside their
transaction; it does its work after the commit, stores one delivery per receiver and
enqueues each to Celery. It never raises into the caller and never delays it: a broken
config or an unreachable broker is logged, and the sweeper sends what is stored.
"""

from __future__ import annotations

import logging

from django.db import transaction

logger = logging.getLogger(__name__)


def announce(event_type: str, approval_id: str) -> None:
    """Notify every configured channel that wants this event, once the current transaction commits."""
    transaction.on_commit(lambda: _fan_out(event_type, approval_id))


def _fan_out(event_type: str, approval_id: str) -> None:
    try:
        from agents.notify.dispatch import fan_out

        fan_out(event_type, approval_id)
    except Exception:
        logger.exception("could not announce %s for %s", event_type, approval_id)


def announce_all(event_type: str, approval_ids: list[str]) -> None:
    """Announce the same event for several approvals (the calls of one model turn)."""
    for approval_id in approval_ids:
        announce(event_type, approval_id)
