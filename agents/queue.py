"""Enqueue Celery work after commit; a lost message is never fatal (invariant 6).

If the broker is down the row that asked for the work is already committed, and the
sweeper finds it and enqueues again once Redis is back. The Celery app is the current
one (the project's, set up with the Django settings), so the engine names no site module.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)


def drive_on_commit(run_id: str) -> None:
    """Start or resume a run in a worker once the current transaction commits."""
    transaction.on_commit(lambda: _send("agents.tasks.run_drive", run_id))


def deferred_on_commit(tool_call_pk: int) -> None:
    """Execute (or record the rejection of) a deferred call once the transaction commits."""
    transaction.on_commit(lambda: _send("agents.tasks.toolcall_execute_deferred", tool_call_pk))


def _send(task_name: str, *args: Any) -> bool:
    try:
        current_app.send_task(task_name, args=args)
    except Exception as exc:  # noqa: BLE001 — kombu raises many kinds for an unreachable broker
        logger.warning("could not enqueue %s%r (the sweeper will retry): %s", task_name, args, exc)
        return False
    return True


def broker_reachable(timeout: float = 2.0) -> tuple[bool, str]:
    """Return whether the broker answers, and its URL with any password hidden."""
    with current_app.connection_for_write() as connection:
        url = connection.as_uri()
        try:
            connection.ensure_connection(max_retries=1, timeout=timeout)
            # A pooled Redis connection can look established after the server died: ping it.
            client = getattr(connection.default_channel, "client", None)
            if client is not None:
                client.ping()
        except Exception as exc:  # noqa: BLE001
            return False, f"{url} ({exc})"
    return True, url
