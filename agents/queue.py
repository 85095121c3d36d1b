"""Enqueue Celery work after commit; a lost message is never fatal (invariant 6).

The project's tasks are `OnCommitTask`s: `task.delay_on_commit(...)` publishes once the
current transaction commits (Celery's Django idiom), and a publish that fails (the broker
is down) is logged, never raised: the row that asked for the work is already committed,
and the sweeper finds it and enqueues again once Redis is back.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from celery.contrib.django.task import DjangoTask
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger(__name__)


class OnCommitTask(DjangoTask):
    """A task enqueued after commit, whose failure to publish is logged for the sweeper to repair."""

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        # `_send` is looked up when the callback runs, so the benchmarks can time it.
        transaction.on_commit(lambda: _send(self, *args, **kwargs))


def start_on_commit(run_id: str) -> None:
    """Start a new run in a worker once the current transaction commits, after any decided run waiting."""
    from agents.tasks import run_start

    run_start.delay_on_commit(run_id)


def drive_on_commit(run_id: str) -> None:
    """Start or resume a run in a worker once the current transaction commits (ahead of new runs)."""
    from agents.tasks import run_drive  # the tasks import the runtime, whose services import this module

    run_drive.delay_on_commit(run_id)


def deferred_on_commit(tool_call_pk: int) -> None:
    """Execute (or record the rejection of) a deferred call once the transaction commits."""
    from agents.tasks import toolcall_execute_deferred

    toolcall_execute_deferred.delay_on_commit(tool_call_pk)


def drive_at_on_commit(run_id: str, when: datetime) -> None:
    """Resume a run at `when` (a held call's time) once the current transaction commits.

    A message due later than the broker can hold goes for its last hop: the drive it starts
    finds the call still held and sends the next. A lost one is found by the sweeper.
    """
    from agents.tasks import run_drive

    transaction.on_commit(lambda: _send_at(run_drive, when, run_id))


def deferred_at_on_commit(tool_call_pk: int, when: datetime) -> None:
    """Execute a held deferred call at `when` once the current transaction commits (in hops, as above)."""
    from agents.tasks import toolcall_execute_deferred

    transaction.on_commit(lambda: _send_at(toolcall_execute_deferred, when, tool_call_pk))


def longest_eta_seconds() -> float:
    """Return how far ahead a message may be scheduled: half the broker's visibility timeout.

    A worker holds a message with an eta unacknowledged until then, and Redis hands an
    unacknowledged message out again after its visibility timeout (and again each timeout):
    a 6 h eta would arrive six times. Work due later is sent in hops, or found by the sweeper.
    """
    options = current_app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", 3600)) / 2  # kombu's default timeout: 1 h


def _send(task: OnCommitTask, *args: Any, **kwargs: Any) -> bool:
    try:
        # The arguments are ids: their plain repr is what monitoring shows, without Celery's
        # bounded `saferepr` walk, which cost a tenth of a send.
        task.apply_async(args, kwargs, argsrepr=repr(args), kwargsrepr=repr(kwargs))
    except Exception as exc:  # noqa: BLE001 — kombu raises many kinds for an unreachable broker
        logger.warning("could not enqueue %s%r (the sweeper will retry): %s", task.name, args, exc)
        return False
    return True


def _send_at(task: OnCommitTask, when: datetime, *args: Any) -> bool:
    eta = min(when, timezone.now() + timedelta(seconds=longest_eta_seconds()))
    try:
        task.apply_async(args, eta=eta, argsrepr=repr(args))
    except Exception as exc:  # noqa: BLE001 — as in _send
        logger.warning("could not schedule %s%r for %s (the sweeper will retry): %s", task.name, args, when, exc)
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
