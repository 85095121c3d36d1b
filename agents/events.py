"""The one way the engine announces what happens: agents.events.publish.

A stored event is appended to RunEvent inside the caller's transaction and sent to the
Channels layer only once that transaction commits (invariant 7), so a viewer never sees
an event that was rolled back, and SSE can replay anything it missed from the table.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any

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
    _pusher.submit(groups, message)


def flush(timeout: float = 5.0) -> None:
    """Wait until every event handed to the channel layer so far has been sent."""
    _pusher.flush(timeout)


class _Pusher:
    """Send events to the channel layer from one background event loop per process.

    The caller (a request, a worker mid-step) never waits on Redis: a push costs a queue
    put. One loop keeps one connection pool (async_to_sync per push would open a new loop
    and connection every time) and one queue keeps the events of a process in order.
    A failed push is logged; the RunEvent row is the truth and viewers replay it.
    """

    def __init__(self) -> None:
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[list[str], dict[str, Any]]] | None = None
        self._layer_down = False

    def submit(self, groups: list[str], message: dict[str, Any]) -> None:
        loop = self._ensure_started()
        loop.call_soon_threadsafe(self._queue.put_nowait, (groups, message))  # type: ignore[union-attr]

    def flush(self, timeout: float) -> None:
        if self._pid != os.getpid() or self._loop is None or self._queue is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._queue.join(), self._loop).result(timeout)
        except Exception:  # noqa: BLE001 — at exit, a slow Redis must not hang the process
            logger.warning("gave up waiting for %d event(s) to reach the channel layer", self._queue.qsize())

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        # Started lazily and again after a fork (Celery's prefork children), since threads
        # do not survive fork.
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._start()
        return self._loop  # type: ignore[return-value]

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._queue = asyncio.Queue()
            loop.create_task(self._drain())
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="agentfast-events", daemon=True).start()
        ready.wait()
        self._loop, self._pid = loop, os.getpid()

    async def _drain(self) -> None:
        from channels.layers import get_channel_layer

        assert self._queue is not None
        while True:
            groups, message = await self._queue.get()
            try:
                layer = get_channel_layer()
                if layer is not None:
                    for group in groups:
                        await layer.group_send(group, message)
                self._layer_down = False
            except Exception as exc:  # noqa: BLE001 — any transport failure is non-fatal here
                # Say it once per outage, not once per streamed token.
                log = logger.debug if self._layer_down else logger.warning
                log("could not push %s events to the channel layer (viewers will replay them): %s", message["event"], exc)
                self._layer_down = True
            finally:
                self._queue.task_done()


_pusher = _Pusher()
atexit.register(flush, 2.0)
