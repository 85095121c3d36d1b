"""The one way the engine announces what happens: agents.events.publish.

A stored event is appended to RunEvent inside the caller's transaction and sent to the
Channels layer only once that transaction commits (invariant 7), so a viewer never sees
an event that was rolled back, and SSE can replay anything it missed from the table.

Ending access (logout, a revoked token, deactivation, a role removed) is announced the
same way, to the user's (or token's) access group: open websockets and streams re-check
and close.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib.auth.models import Group, User
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver

from agents import sql, text
from agents.models import RunEvent
from agents.sql.chain import Chain, ChainResult, HeadValue

logger = logging.getLogger(__name__)

APPROVALS_GROUP = "approvals"
_MAX_DEPTH = 64  # event data wraps arguments (nested at most 32 deep) in a few levels
# Events that reviewers' inboxes care about, whichever run they belong to.
_APPROVAL_EVENTS = {RunEvent.Type.APPROVAL_REQUIRED, RunEvent.Type.APPROVAL_VOTED, RunEvent.Type.APPROVAL_DECIDED}


def run_group(run_id: str) -> str:
    """Return the Channels group of one run's viewers."""
    return f"run.{run_id}"


def user_group(user_id: int) -> str:
    """Return the group of a user's open websockets and streams (told when their access may have ended)."""
    return f"access.user.{user_id}"


def token_group(token_id: int) -> str:
    """Return the group of the streams a bearer token opened."""
    return f"access.token.{token_id}"


def session_digest(session_key: str | None) -> str:
    """Return how a session is named on the channel layer (never the key itself)."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()[:24] if session_key else ""


def access_changed(*, group: str, session_key: str | None = None) -> None:
    """Tell a user's (or token's) live connections to re-check their access after commit.

    With `session_key` (a logout) the connections of that session close outright: the
    session still exists until logout flushes it, so a re-check would find it valid.
    """
    message = {"type": "access.check", "session": session_digest(session_key)}
    transaction.on_commit(lambda: _send([group], message))


@receiver(user_logged_out)
def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None and request is not None:
        access_changed(group=user_group(user.pk), session_key=request.session.session_key)


# A save that may narrow access: deactivated, no longer a superuser, a password set (the site's
# password change and reset pages too, which end the user's other sessions). A login's save
# (last_login) cannot.
_ACCESS_FIELDS = frozenset({"is_active", "is_superuser", "password"})


@receiver(post_save, sender=User)
def _on_user_saved(
    sender: Any, instance: User, created: bool, update_fields: Any = None, raw: bool = False, **kwargs: Any
) -> None:
    if not (created or raw) and (update_fields is None or _ACCESS_FIELDS & set(update_fields)):
        access_changed(group=user_group(instance.pk))


# Where pre_save leaves a user's name as it was, for post_save once the new one is saved.
_RENAMED_FROM = "_agentfast_renamed_from"


@receiver(pre_save, sender=User)
def _on_user_renaming(sender: Any, instance: User, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    instance.__dict__.pop(_RENAMED_FROM, None)  # left by an earlier save that failed
    if raw or instance.pk is None or (update_fields is not None and "username" not in update_fields):
        return  # a new user, a fixture, or a save that leaves the name (a login's last_login)
    old = User.objects.filter(pk=instance.pk).values_list("username", flat=True).first()
    if old is not None and old != instance.username:
        instance.__dict__[_RENAMED_FROM] = old


@receiver(post_save, sender=User)
def _on_user_renamed(sender: Any, instance: User, **kwargs: Any) -> None:
    # Acted on after the UPDATE, not before: a save that fails (the new name is taken) hands
    # nothing on, and the admin's transaction holds both.
    old = instance.__dict__.pop(_RENAMED_FROM, None)
    if old is not None:
        from agents.services.users import user_records_rename  # the services import this module

        _name_left(old, f"{old} was renamed {instance.username}")
        user_records_rename(old=old, new=instance.username)


@receiver(post_delete, sender=User)
def _on_user_deleted(sender: Any, instance: User, **kwargs: Any) -> None:
    from agents.services.users import user_records_orphan  # the services import this module

    access_changed(group=user_group(instance.pk))
    _name_left(instance.username, f"{instance.username} was deleted")
    user_records_orphan(username=instance.username)


def _name_left(username: str, why: str) -> None:
    """Grants name their creator, and an external agent's account, by user name: once it is no longer
    theirs, whoever takes it next (a new account, another renamed one) would decide with them, or have
    its calls decided by them. They are revoked, audited."""
    from agents.services.grants import grants_revoke_of  # the services import this module

    grants_revoke_of(username=username, reason=why)


@receiver(m2m_changed, sender=User.groups.through)
@receiver(m2m_changed, sender=User.user_permissions.through)
@receiver(m2m_changed, sender=Group.permissions.through)
def _on_access_taken(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **kwargs: Any
) -> None:
    """A group left, or a permission taken from a user or from a group: whoever had it re-checks now.

    A clear is read before it happens (pre_clear), while its rows still say whom it concerns;
    either way the message goes out once the change commits.
    """
    if action in ("post_remove", "pre_clear"):
        for user_id in _users_losing(sender, instance, pk_set if action == "post_remove" else None):
            access_changed(group=user_group(user_id))


@receiver(pre_delete, sender=Group)
def _on_group_deleted(sender: Any, instance: Group, **kwargs: Any) -> None:
    # Its rows go by cascade, which sends no m2m_changed.
    for user_id in instance.user_set.values_list("pk", flat=True):
        access_changed(group=user_group(user_id))


def _users_losing(sender: Any, instance: Any, removed: set[int] | None) -> Iterable[int]:
    """Return who may lose access when `removed` (the pks taken, or every one on a clear) leave `instance`."""
    if isinstance(instance, User):
        return [instance.pk]
    if sender is not Group.permissions.through:  # a group's users, or a permission's, seen from its side
        return removed if removed is not None else instance.user_set.values_list("pk", flat=True)
    if isinstance(instance, Group):
        groups: Iterable[int] = [instance.pk]
    else:  # a permission, taken from groups
        groups = removed if removed is not None else instance.group_set.values_list("pk", flat=True)
    return User.objects.filter(groups__in=groups).values_list("pk", flat=True).distinct()


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
    return sql.run_reserve_events(run_id=run_id, count=count)[0]


def record(*, run_id: str, last_seq: int, items: list[tuple[str, dict[str, Any]]]) -> None:
    """Store events whose seqs end at `last_seq` (reserved) and push them, in order, after commit."""
    first = last_seq - len(items) + 1
    items = _repaired(items)
    rows = RunEvent.objects.bulk_create(
        RunEvent(run_id=run_id, seq=first + offset, type=type, data=data) for offset, (type, data) in enumerate(items)
    )
    _push_after_commit(run_id, [(row.pk, row.seq, row.type, row.data) for row in rows])


def record_in(chain: Chain, *, run_id: str, items: list[tuple[str, dict[str, Any]]]) -> Callable[[ChainResult], None]:
    """Add events to a chain whose head reserved their seqs (it returns `last_event_seq`); return their push.

    Call what it returns with the chain's result: it pushes the events, in order, after commit.
    """
    items = _repaired(items)
    count = len(items)
    rows = [
        {"run_id": run_id, "seq": HeadValue("last_event_seq", count - 1 - offset), "type": type, "data": data}
        for offset, (type, data) in enumerate(items)
    ]
    index = chain.insert(RunEvent, rows, returning=("id", "seq")) if rows else -1

    def push(result: ChainResult) -> None:
        if index < 0:
            return
        pks = {seq: pk for pk, seq in result.inserted[index]}
        first = result.head["last_event_seq"] - count + 1
        _push_after_commit(run_id, [(pks[first + n], first + n, type, data) for n, (type, data) in enumerate(items)])

    return push


def _repaired(items: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    # What models and tools said is repaired, never refused: a lone surrogate would fail
    # PostgreSQL's jsonb, and every later SSE frame or push of the event.
    return [(type, text.repair(data, max_depth=_MAX_DEPTH)) for type, data in items]


def _push_after_commit(run_id: str, events: list[tuple[int | None, int, str, dict[str, Any]]]) -> None:
    for pk, seq, type, data in events:
        message = _message(run_id, seq, type, data, pk=pk)
        transaction.on_commit(functools.partial(_send, _groups(run_id, type), message))


def _message(run_id: str, seq: int | None, type: str, data: dict[str, Any], *, pk: int | None = None) -> dict[str, Any]:
    """The channel-layer message of an event; `pk`, the RunEvent's primary key, saves readers a read."""
    return {"type": "run.event", "run_id": run_id, "seq": seq, "event": type, "data": data, "pk": pk}


def _groups(run_id: str, type: str) -> list[str]:
    return [run_group(run_id), APPROVALS_GROUP] if type in _APPROVAL_EVENTS else [run_group(run_id)]


def _send(groups: list[str], message: dict[str, Any]) -> None:
    _publisher.send(groups, message)


class _Publisher:
    """Hand events to one background event loop per process, which sends them with `group_send`.

    Channels' public API is the only way to reach a group wherever the layer keeps it: with
    several Redis hosts channels_redis shards groups across them, so a PUBLISH to the first
    host (what this did before) lost the events of every group hashed to another. Awaiting
    `group_send` in the caller (async_to_sync) costs a loop and milliseconds per event, so
    the caller only enqueues (a few microseconds: `call_soon_threadsafe`) and returns; one
    daemon thread per process sends in order, fire and forget. A failed push is logged once
    per outage and pushes pause for a second; the RunEvent row is the truth and viewers
    replay it. At exit (the CLI, a worker) what is queued is sent first, for a moment.
    """

    _PAUSE_AFTER_FAILURE = 1.0
    _SEND_TIMEOUT = 2.0
    _FLUSH_AT_EXIT = 2.0

    def __init__(self) -> None:
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[list[str], dict[str, Any]]] | None = None
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._warned = False

    def send(self, groups: list[str], message: dict[str, Any]) -> None:
        """Queue a message for these groups; never blocks on the channel layer."""
        loop, queue = self._started()
        loop.call_soon_threadsafe(queue.put_nowait, (groups, message))

    def flush(self, timeout: float = _FLUSH_AT_EXIT) -> None:
        """Wait until everything queued so far was sent (or `timeout` passed)."""
        if self._loop is None or self._queue is None or self._pid != os.getpid():
            return
        done = asyncio.run_coroutine_threadsafe(self._queue.join(), self._loop)
        with contextlib.suppress(Exception):
            done.result(timeout)

    def _started(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[list[str], dict[str, Any]]]]:
        # One loop per process, made again after a fork (Celery's prefork children).
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    loop = asyncio.new_event_loop()
                    queue: asyncio.Queue[tuple[list[str], dict[str, Any]]] = asyncio.Queue()
                    threading.Thread(target=self._run, args=(loop, queue), name="agentfast-events", daemon=True).start()
                    self._loop, self._queue, self._pid = loop, queue, os.getpid()
        assert self._loop is not None and self._queue is not None
        return self._loop, self._queue

    def _run(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[list[str], dict[str, Any]]]) -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._deliver(queue))

    async def _deliver(self, queue: asyncio.Queue[tuple[list[str], dict[str, Any]]]) -> None:
        from channels.layers import get_channel_layer

        while True:
            groups, message = await queue.get()
            try:
                if time.monotonic() >= self._down_until:
                    await self._group_send(get_channel_layer, groups, message)
            finally:
                queue.task_done()

    async def _group_send(self, get_layer: Any, groups: list[str], message: dict[str, Any]) -> None:
        try:
            layer = get_layer()
            if layer is None:
                return
            # A stored string may predate text checks; msgpack refuses lone surrogates.
            safe = text.repair(message, max_depth=_MAX_DEPTH)
            for group in groups:
                await asyncio.wait_for(layer.group_send(group, safe), self._SEND_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 — any transport failure is non-fatal here
            self._down_until = time.monotonic() + self._PAUSE_AFTER_FAILURE
            if not self._warned:
                logger.warning(
                    "could not push %s events to the channel layer (viewers will replay them): %s",
                    message.get("event", message.get("type")),
                    exc,
                )
            self._warned = True
        else:
            self._warned = False


_publisher = _Publisher()
atexit.register(_publisher.flush)
