"""The one way the engine announces what happens: agents.events.publish.

A stored event is appended to RunEvent inside the caller's transaction and sent to the
Channels layer only once that transaction commits (invariant 7), so a viewer never sees
an event that was rolled back, and SSE can replay anything it missed from the table.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import redis
from asgiref.sync import async_to_sync
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings
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
    if not persist:
        _send(_groups(run_id, type), _message(run_id, None, type, data))
        return None
    seq = reserve(run_id=run_id, count=1)
    record(run_id=run_id, last_seq=seq, items=[(type, data)])
    return seq


def reserve(*, run_id: str, count: int) -> int:
    """Reserve `count` event seqs of a run; return the last one.

    One statement allocates them and row-locks the run until commit, so concurrent
    publishers of one run (the driver and a reviewer's decision) never share a seq. The
    driver reserves inside its own fenced update of the run instead (services.runs).
    """
    return reserve_returning(run_id=run_id, count=count)[0]


def reserve_returning(*, run_id: str, count: int, columns: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """Reserve like `reserve` and also return these columns of the run, read under its row lock."""
    table = connection.ops.quote_name("agents_run")
    returning = ", ".join(["last_event_seq", *(connection.ops.quote_name(c) for c in columns)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_event_seq = last_event_seq + %s WHERE id = %s RETURNING {returning}",
            [count, run_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"no run {run_id}")
    return tuple(row)


def record(*, run_id: str, last_seq: int, items: list[tuple[str, dict[str, Any]]]) -> None:
    """Store events whose seqs end at `last_seq` (reserved) and push them, in order, after commit."""
    first = last_seq - len(items) + 1
    RunEvent.objects.bulk_create(
        RunEvent(run_id=run_id, seq=first + offset, type=type, data=data) for offset, (type, data) in enumerate(items)
    )
    for offset, (type, data) in enumerate(items):
        message = _message(run_id, first + offset, type, data)
        groups = _groups(run_id, type)
        transaction.on_commit(lambda groups=groups, message=message: _send(groups, message))


def _message(run_id: str, seq: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": "run.event", "run_id": run_id, "seq": seq, "event": type, "data": data}


def _groups(run_id: str, type: str) -> list[str]:
    return [run_group(run_id), APPROVALS_GROUP] if type in _APPROVAL_EVENTS else [run_group(run_id)]


def _send(groups: list[str], message: dict[str, Any]) -> None:
    _publisher.send(groups, message)


class _Publisher:
    """Send events to the channel layer from the caller's thread, cheaply.

    With Channels' Redis pub/sub layer a group send is one PUBLISH of the layer's own
    serialization to the group's channel; doing it on a kept, synchronous connection costs
    a few tens of microseconds, where async_to_sync per event opened a loop and a
    connection each time (milliseconds) and a background sender fought the caller for the
    GIL. Other layers go through their async API. A failed push is logged once per outage
    and pushes pause for a second; the RunEvent row is the truth and viewers replay it.
    """

    _PAUSE_AFTER_FAILURE = 1.0

    def __init__(self) -> None:
        self._pid: int | None = None
        self._client: redis.Redis | None = None
        self._down_until = 0.0
        self._warned = False

    def send(self, groups: list[str], message: dict[str, Any]) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None or time.monotonic() < self._down_until:
            return
        try:
            if isinstance(layer, RedisPubSubChannelLayer):
                payload = layer.serialize(message)
                client = self._redis()
                for group in groups:
                    client.publish(_group_channel(group), payload)
            else:
                for group in groups:
                    async_to_sync(layer.group_send)(group, message)
        except Exception as exc:  # noqa: BLE001 — any transport failure is non-fatal here
            self._down_until = time.monotonic() + self._PAUSE_AFTER_FAILURE
            if not self._warned:
                logger.warning(
                    "could not push %s events to the channel layer (viewers will replay them): %s",
                    message["event"],
                    exc,
                )
            self._warned = True
        else:
            self._warned = False

    def _redis(self) -> redis.Redis:
        # One connection per process, made again after a fork (Celery's prefork children).
        if self._client is None or self._pid != os.getpid():
            self._client = redis.Redis.from_url(
                _layer_config()["hosts"][0]["address"], socket_connect_timeout=1, socket_timeout=2
            )
            self._pid = os.getpid()
        return self._client


def _layer_config() -> dict[str, Any]:
    return settings.CHANNEL_LAYERS["default"].get("CONFIG", {})


def _group_channel(group: str) -> str:
    # The Redis channel RedisPubSubChannelLayer subscribes a group's members to
    # (tests/agents/test_events.py checks that a layer subscriber receives what we publish).
    return f"{_layer_config().get('prefix', 'asgi')}__group__{group}"


_publisher = _Publisher()
