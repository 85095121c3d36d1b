"""The one way the engine announces what happens: agents.events.publish.

A stored event is appended to RunEvent inside the caller's transaction and sent to the
Channels layer only once that transaction commits (invariant 7), so a viewer never sees
an event that was rolled back, and SSE can replay anything it missed from the table.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connection, transaction

from agents.models import RunEvent

logger = logging.getLogger(__name__)

APPROVALS_GROUP = "approvals"
# Events that reviewers' inboxes care about, whichever run they belong to.
_APPROVAL_EVENTS = {RunEvent.Type.APPROVAL_REQUIRED, RunEvent.Type.APPROVAL_DECIDED}


def run_group(run_id: str) -> str:
    """Return the Channels group of one run's viewers."""
    return f"run.{run_id}"


def publish(*, run_id: str, type: str, data: dict[str, Any], persist: bool = True) -> int | None:
    """Record an event of a run and push it to its viewers after commit; return its seq.

    `persist=False` is for live-only events (streamed tokens): no row, no seq, sent now.
    """
    seq = _append(run_id=run_id, type=type, data=data) if persist else None
    message = {"type": "run.event", "run_id": run_id, "seq": seq, "event": type, "data": data}
    groups = [run_group(run_id)]
    if type in _APPROVAL_EVENTS:
        groups.append(APPROVALS_GROUP)
    if persist:
        transaction.on_commit(lambda: _send(groups, message))
    else:
        _send(groups, message)
    return seq


def _append(*, run_id: str, type: str, data: dict[str, Any]) -> int:
    # One statement allocates the next seq and row-locks the run until commit, so concurrent
    # publishers of one run (the driver and a reviewer's decision) never share a seq.
    table = connection.ops.quote_name("agents_run")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_event_seq = last_event_seq + 1 WHERE id = %s RETURNING last_event_seq",
            [run_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"no run {run_id}")
    RunEvent.objects.create(run_id=run_id, seq=row[0], type=type, data=data)
    return row[0]


def _send(groups: list[str], message: dict[str, Any]) -> None:
    # The row is the truth; a push that fails (Redis down) is logged, and viewers catch up
    # by replaying RunEvent.
    from channels.layers import get_channel_layer

    global _layer_down
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for group in groups:
            async_to_sync(layer.group_send)(group, message)
    except Exception as exc:  # noqa: BLE001 — any transport failure is non-fatal here
        # Say it once per outage, not once per streamed token.
        log = logger.debug if _layer_down else logger.warning
        log("could not push %s events to the channel layer (viewers will replay them): %s", message["event"], exc)
        _layer_down = True
    else:
        _layer_down = False


_layer_down = False
