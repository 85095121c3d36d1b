"""Server-sent events: one run's events, the reviewers' approval feed, and a drive's stream.

Every stream joins its Channels group *before* it reads the replay from RunEvent: an event
committed in between arrives live as well and is dropped as a duplicate, so none is missed.
A live event that skips a seq (a push lost while Redis hiccuped) is filled in from the
table, and an idle stream re-reads the table whenever it sends a heartbeat.

    id: 7
    event: approval_required
    data: {"run_id": "run_…", "seq": 7, "event": "approval_required", "data": {…}}

`id` is the run's event seq; `delta` frames (streamed tokens) have none, being live only.
The approval feed spans runs, so its ids are RunEvent primary keys instead. Its streams,
thousands per process, share one subscription (dashboard.live.hub): each event's frame is
encoded once, with the pk its message carries, and each stream only writes the bytes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import close_old_connections
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from agents import events, runtime, selectors, text
from agents.gateway.selectors import GATE_PERMISSION
from agents.models import Run, RunEvent
from agents.runtime.driver import DriveResult
from agents.services import tokens
from dashboard.api.auth import ApiError
from dashboard.auth import is_reviewer, session_holds
from dashboard.live.hub import Shared, Watch, read
from dashboard.live.wire import StreamWire, stream_send

T = TypeVar("T")

HEARTBEAT_SECONDS = 15.0
POLL_SECONDS = 1.0  # without a channel layer, read the table this often instead
DRAIN_SECONDS = 1.0  # after a drive, how long its last pushes may take to arrive
REPLAY_BATCH = 500
RECHECK_SHARED_SECONDS = 5.0  # a heartbeat's access re-check serves the viewer's other streams this long
SHARED_MAX_AGE = 60.0  # reads shared between streams are forgotten after this
APPROVAL_EVENTS = selectors.APPROVAL_EVENTS
# Sent once the replay is out and the stream is subscribed: a client may rely on it.
LIVE = ": live\n\n"
# The last frame of a stream whose viewer's access ended (logout, revoked token, ...).
ACCESS_ENDED = 'event: access_ended\ndata: {"error_code":"access_ended","message":"your access ended"}\n\n'
HEARTBEAT = ": heartbeat\n\n"

logger = logging.getLogger(__name__)


def frame(event: str, payload: dict[str, Any], event_id: int | None = None) -> str:
    """Return one SSE frame; JSON never contains a raw newline, so `data` is one line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    # text.dumps repairs what cannot be sent as UTF-8 (a lone surrogate stored before checks).
    return f"{head}event: {event}\ndata: {text.dumps(payload, separators=(',', ':'))}\n\n"


def response(stream: AsyncIterator[str] | AsyncIterator[str | bytes], viewer: Viewer | None = None) -> HttpResponseBase:
    """Wrap a stream; daphne serves it from its event loop, holding no thread.

    A viewer over their share of open streams (AGENTFAST_STREAMS_PER_USER in this process)
    gets a 429 instead; the slot is given back when the response closes.
    """
    body: AsyncIterable[str] | AsyncIterable[str | bytes] = stream
    if viewer is not None:
        release = _open_streams.take(viewer.user_id)
        if release is None:
            return _too_many()
        body = _Slot(stream, release)
    reply = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    reply["Cache-Control"] = "no-cache"
    reply["X-Accel-Buffering"] = "no"  # a proxy must not buffer the stream
    return reply


def _too_many() -> JsonResponse:
    limit = _open_streams.limit()
    message = f"too many open streams: at most {limit} per user; close one and retry"
    return JsonResponse(
        {"error_code": "too_many_streams", "message": message}, status=429, headers={"Retry-After": "15"}
    )


class _OpenStreams:
    """How many streams each user has open in this process.

    Slots are taken on the event loop but given back from a thread (Django closes a
    response with sync_to_async), hence the lock.
    """

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.lock = threading.Lock()

    def limit(self) -> int:
        return int(getattr(settings, "AGENTFAST_STREAMS_PER_USER", 20))

    def take(self, user_id: int) -> Callable[[], None] | None:
        """Take a slot; return how to give it back (once), or None when the user has none left."""
        with self.lock:
            if self.counts.get(user_id, 0) >= self.limit():
                return None
            self.counts[user_id] = self.counts.get(user_id, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            with self.lock:
                if not released:
                    released = True
                    self.counts[user_id] -= 1
                    if not self.counts[user_id]:
                        del self.counts[user_id]

        return release


_open_streams = _OpenStreams()


class _Slot:
    """A stream holding a slot; StreamingHttpResponse calls close() when the response ends."""

    def __init__(self, stream: AsyncIterator[str] | AsyncIterator[str | bytes], release: Callable[[], None]) -> None:
        self.stream, self.close = stream, release

    def __aiter__(self) -> AsyncIterator[str] | AsyncIterator[str | bytes]:
        return self.stream


def resume_point(request: HttpRequest, after: int | None, *, default: int) -> int:
    """Return the id after which to stream: Last-Event-ID (a reconnect), else ?after=, else default."""
    header = request.headers.get("Last-Event-ID", "").strip()
    if not header:
        return default if after is None else after
    # isdigit() alone admits "٣" and "²", which int() reads or refuses: ASCII digits only.
    if not (header.isascii() and header.isdigit()) or len(header) > 18:
        raise ApiError("Last-Event-ID must be a non-negative integer", field="Last-Event-ID")
    return int(header)


def wants_stream(request: HttpRequest) -> bool:
    # Explicitly: curl's "*/*" gets JSON.
    return "text/event-stream" in request.headers.get("Accept", "")


# -- who is watching ----------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """Whoever opened a stream: access is re-checked while it lasts, and it ends when access does."""

    user_id: int
    token_id: int | None = None  # a bearer token's stream ends when the token is revoked
    session_key: str | None = None  # a session's stream ends at its logout
    # An agent account watching its own external session's run; its stream ends with its role.
    own_session: bool = False

    @property
    def groups(self) -> tuple[str, ...]:
        groups = [events.user_group(self.user_id)]
        if self.token_id is not None:
            groups.append(events.token_group(self.token_id))
        return tuple(groups)

    async def still_allowed(self, message: dict[str, Any] | None = None) -> bool:
        """Return whether the viewer may still watch (after an access.check message, or at a heartbeat).

        At a heartbeat the viewer's other streams in this process share one re-check made in
        the last RECHECK_SHARED_SECONDS (a user's 20 streams: one read, not 20); after an
        access.check message each stream reads afresh.
        """
        ended_session = (message or {}).get("session")
        if ended_session and ended_session == events.session_digest(self.session_key):
            return False
        if message is None:
            return await _shared_read(("allowed", self), RECHECK_SHARED_SECONDS, _may_still_watch, self)
        return await read(_may_still_watch, self)


async def viewer_of(request: HttpRequest, *, own_session: bool = False) -> Viewer:
    """Return the viewer of an authenticated API request (its token, else its session)."""
    user = request.auth  # type: ignore[attr-defined]  # what ninja's authentication returned: the user, resolved already
    token = _bearer(request)
    token_id = await read(_token_id, token) if token else None
    session_key = None if token else request.session.session_key
    return Viewer(user_id=user.pk, token_id=token_id, session_key=session_key, own_session=own_session)


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _token_id(token: str) -> int | None:
    found = tokens.token_find(token)
    return found.pk if found else None


def _may_still_watch(viewer: Viewer) -> bool:
    user = signed_in_user(viewer)
    if user is None:
        return False
    # Whose session a run is never changes: an agent may watch its own for as long as it is an agent.
    return user.has_perm(GATE_PERMISSION) if viewer.own_session else is_reviewer(user)


def signed_in_user(viewer: Viewer) -> User | None:
    """Return the viewer's user while it is active and its token (or session) still holds, else None."""
    user = selectors.user_get_active(viewer.user_id)
    if user is None:
        return None
    if viewer.token_id is not None:
        return user if selectors.token_is_live(viewer.token_id) else None
    if viewer.session_key is not None:
        return user if session_holds(user, viewer.session_key) else None
    return user


_shared: dict[tuple[Any, ...], tuple[int, float, asyncio.Future[Any]]] = {}


async def _shared_read(key: tuple[Any, ...], max_age: float, func: Callable[..., T], *args: Any) -> T:
    """`read`, made once for every stream of this process asking the same within `max_age` seconds.

    With thousands of streams open, one event (or one heartbeat round) made as many reads
    of the same row, each a thread hop and a database connection.
    """
    loop, now = id(asyncio.get_running_loop()), time.monotonic()
    found = _shared.get(key)
    if found is None or found[0] != loop or now - found[1] > max_age or (found[2].done() and found[2].exception()):
        if len(_shared) > 10_000:  # forget what is too old to be shared
            for stale in [k for k, (_, at, _f) in _shared.items() if now - at > SHARED_MAX_AGE]:
                del _shared[stale]
        found = _shared[key] = (loop, now, asyncio.ensure_future(read(func, *args)))
    if found[2].done():
        return found[2].result()
    # Shielded: a stream closing while it waits must not cancel the read for the others.
    return await asyncio.shield(found[2])


# -- feeds: what a stream has sent, and what follows -------------------------------------


class _Feed(Protocol):
    ended: bool

    async def stored(self) -> list[str]: ...

    async def idle(self, tick: float) -> list[str]: ...

    async def live(self, event: Shared) -> list[str] | list[bytes]: ...


def _payload(run_id: str, seq: int | None, event: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": run_id, "seq": seq, "event": event, "data": data}


class RunFeed:
    """One run's events, ids by seq; ends after its run_status completed/failed/cancelled."""

    def __init__(self, run_id: str, after: int) -> None:
        self.run_id = run_id
        self.last = after
        self.ended = False

    async def stored(self) -> list[str]:
        """Frames of the stored events after the last one sent (replay, gaps, idle checks)."""
        frames: list[str] = []
        while True:
            rows = await read(_run_events_after, self.run_id, self.last)
            frames += [self._sent(seq, type, data) for seq, type, data in rows]
            if len(rows) < REPLAY_BATCH:
                return frames

    async def idle(self, tick: float) -> list[str]:
        """Frames of the stored events after a quiet tick (a push lost, or no channel layer)."""
        return await self.stored()

    async def live(self, event: Shared) -> list[str]:
        message = event.message
        seq = message["seq"]
        if seq is None:
            return [frame(message["event"], _payload(self.run_id, None, message["event"], message["data"]))]
        if seq <= self.last:
            return []  # replayed already
        if seq > self.last + 1:
            return await self.stored()  # a push went missing: the table has it
        return [self._sent(seq, message["event"], message["data"])]

    async def has_ended(self) -> bool:
        """Return whether the run ended and every stored event was sent (a late Last-Event-ID)."""
        state = await read(_run_state, self.run_id)
        return state is None or (state[0] in Run.TERMINAL and state[1] <= self.last)

    def _sent(self, seq: int, event: str, data: dict[str, Any]) -> str:
        self.last = seq
        if event == RunEvent.Type.RUN_STATUS:
            # The last status counts: a failed run that was retried is queued again, not over.
            self.ended = data.get("status") in Run.TERMINAL
        return frame(event, _payload(self.run_id, seq, event, data), seq)


class ApprovalFeed:
    """Every run's approval_required and approval_decided events; ids are RunEvent pks.

    Primary keys are handed out at INSERT and transactions may commit out of that order
    (PostgreSQL), so live events are deduplicated by the pks sent rather than by the highest.
    A live event comes from this process's hub (`live`): its frame is encoded once for every
    stream, which only checks that it has not sent it yet.
    """

    ended = False
    _REMEMBERED = 10_000

    def __init__(self, after: int) -> None:
        self.last = after
        self._sent: set[int] = set()

    async def stored(self, *, shared_for: float = 0.0) -> list[str]:
        """Frames of the stored events after the last one sent.

        `shared_for` > 0 (an idle look, not the replay): a read another stream of this
        process made from the same point within that many seconds serves this one too.
        """
        frames: list[str] = []
        while True:
            if shared_for:
                key = ("approval-events-after", self.last)
                rows = await _shared_read(key, shared_for, _approval_events_after, self.last)
            else:
                rows = await read(_approval_events_after, self.last)
            frames += [self._frame(*row) for row in rows]  # all newer than any pk sent
            if len(rows) < REPLAY_BATCH:
                return frames

    @staticmethod
    async def prepare(event: Shared) -> tuple[int, bytes] | None:
        """Return a hub's event as (pk, encoded frame), read and encoded once; None: not an approval event."""
        message = event.message
        if message.get("event") not in APPROVAL_EVENTS or message.get("seq") is None:
            return None
        pk = message.get("pk")  # None: a message sent without it (a publisher of an older version)
        if pk is None:
            pk = await event.once(("sse-pk",), _event_pk, message["run_id"], message["seq"])
        return None if pk is None else (pk, event.memo(("sse-frame",), _encoded_frame, pk, message))

    async def idle(self, tick: float) -> list[str]:
        """Frames of the stored events after a quiet tick; streams of this process share the read."""
        return await self.stored(shared_for=min(RECHECK_SHARED_SECONDS, tick / 2))

    async def live(self, event: Shared) -> list[bytes]:
        """The frame of a hub's event, unless it is no approval event or was sent already (replayed)."""
        found = await self.prepare(event)
        if found is None or not self.unsent(found[0]):
            return []
        self.note(found[0])
        return [found[1]]

    def unsent(self, pk: int) -> bool:
        return pk not in self._sent

    def _frame(self, pk: int, run_id: str, seq: int, event: str, data: dict[str, Any]) -> str:
        self.note(pk)
        return frame(event, _payload(run_id, seq, event, data), pk)

    def note(self, pk: int) -> None:
        """Count the event as sent (by `live`, the replay, or its frame written straight to the connection)."""
        self._sent.add(pk)
        self.last = max(self.last, pk)
        if len(self._sent) > self._REMEMBERED:  # a late commit is seconds old, not thousands of events
            self._sent = {sent for sent in self._sent if sent > self.last - self._REMEMBERED // 2}


def _encoded_frame(pk: int, message: dict[str, Any]) -> bytes:
    payload = _payload(message["run_id"], message["seq"], message["event"], message["data"])
    return frame(message["event"], payload, pk).encode()


def _run_events_after(run_id: str, seq: int) -> list[tuple[int, str, dict[str, Any]]]:
    return selectors.run_events_after(run_id=run_id, seq=seq, limit=REPLAY_BATCH)


def _run_state(run_id: str) -> tuple[str, int] | None:
    return selectors.run_state(run_id)


def _approval_events_after(pk: int) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    return selectors.approval_events_after(pk=pk, limit=REPLAY_BATCH)


def _event_pk(run_id: str, seq: int) -> int | None:
    return selectors.run_event_pk(run_id=run_id, seq=seq)


def latest_approval_event() -> int:
    """Return the pk the approval feed starts after when the client names none: now."""
    return selectors.approval_event_latest()


# -- streams -----------------------------------------------------------------------------


class _Quiet:
    """When a stream last sent something: a heartbeat, and a re-check of access, after each quiet spell."""

    def __init__(self) -> None:
        self.since = time.monotonic()

    async def after(self, *, sent: bool, viewer: Viewer | None) -> str | None:
        """Return what to send after a tick: nothing, a heartbeat, or `access_ended` (then stop)."""
        now = time.monotonic()
        if sent:
            self.since = now
            return None
        if now - self.since < HEARTBEAT_SECONDS:
            return None
        self.since = now
        if viewer is not None and not await viewer.still_allowed():
            return ACCESS_ENDED
        return HEARTBEAT


async def _follow(
    watch: Watch,
    feed: _Feed,
    viewer: Viewer | None = None,
    *,
    until: asyncio.Future[Any] | None = None,
    quiet: _Quiet | None = None,
) -> AsyncIterator[str | bytes]:
    """Yield live frames, and a heartbeat after each quiet spell, until the feed ends or `until` is done.

    A quiet tick re-reads the table (a lost push; no channel layer). The stream ends with an
    `access_ended` frame when its viewer's access ends: told so on the access groups, or
    found so by the re-check at each heartbeat (a lost message).
    """
    quiet = quiet or _Quiet()
    while not feed.ended:
        event = await watch.next(until=until)
        frames: list[str] | list[bytes]
        if event is None and until is not None and until.done():
            return  # the caller drains: pushes still in flight first, then the table
        if event is None:
            frames = await feed.idle(watch.tick)
        elif event.message.get("type") == "access.check":
            if viewer is not None and not await viewer.still_allowed(event.message):
                yield ACCESS_ENDED
                return
            continue
        else:
            frames = await feed.live(event)
        for chunk in frames:
            yield chunk
        extra = await quiet.after(sent=bool(frames), viewer=viewer)
        if extra is not None:
            yield extra
            if extra == ACCESS_ENDED:
                return


class _ApprovalWatch(Watch):
    """An approval stream's watch: each event's frame encoded once per process, and written by the hub.

    With thousands of streams open, waking each stream's task to pass the same bytes down
    Django's response loop to twisted's write cost more than the rest of a push. So while
    the stream waits with everything it was handed sent (and under daphne), the hub writes
    the frame to the connection itself and notes it as sent; otherwise (the replay, an idle
    read, an access check under way, another server) the stream takes it as usual.
    """

    def __init__(self, groups: tuple[str, ...], *, feed: ApprovalFeed, quiet: _Quiet, connection: StreamWire | None):
        super().__init__(groups, tick=HEARTBEAT_SECONDS, poll=POLL_SECONDS)
        self.feed, self.quiet, self.connection = feed, quiet, connection

    @classmethod
    async def prepare(cls, event: Shared) -> None:
        await ApprovalFeed.prepare(event)

    async def deliver(self, event: Shared) -> None:
        connection = self.connection if self.idle else None
        found = await ApprovalFeed.prepare(event) if connection is not None else None
        if connection is None or found is None:  # a stream busy or starting, another server, an access check
            await super().deliver(event)
            return
        pk, data = found
        if not self.feed.unsent(pk):
            return  # replayed already
        if not connection.write(data):  # the response is closing: the stream finds out
            await super().deliver(event)
            return
        self.feed.note(pk)
        self.quiet.since = time.monotonic()
        self.sent_now()


def _groups(group: str, viewer: Viewer | None) -> tuple[str, ...]:
    """A stream's group and, when it has a viewer, the viewer's access groups."""
    return (group, *(viewer.groups if viewer else ()))


def _watch(group: str, viewer: Viewer | None = None) -> Watch:
    """A stream's watch on `group` and, when it has a viewer, the viewer's access groups."""
    return Watch(_groups(group, viewer), tick=HEARTBEAT_SECONDS, poll=POLL_SECONDS)


async def run_stream(run_id: str, after: int, viewer: Viewer | None = None) -> AsyncIterator[str | bytes]:
    """Yield a run's events after seq `after`, then live ones, until the run ends."""
    feed = RunFeed(run_id, after)
    async with _watch(events.run_group(run_id), viewer) as watch:
        for chunk in await feed.stored():
            yield chunk
        if feed.ended or await feed.has_ended():
            return
        yield LIVE
        async for part in _follow(watch, feed, viewer):
            yield part


async def approval_stream(after: int, viewer: Viewer | None = None) -> AsyncIterator[str | bytes]:
    """Yield the approval events of all runs after RunEvent pk `after`, then live ones, forever.

    1. Join this process's hubs (the approvals group, the viewer's access groups) before
       reading the table: an event committed during the replay arrives live as well and is
       dropped as a duplicate, so none is missed.
    2. Replay from the table, say `: live`, then send what the hubs hand over, a heartbeat
       after each quiet spell, and `access_ended` once the viewer's access ends.
    """
    feed, quiet = ApprovalFeed(after), _Quiet()
    connection = StreamWire.of(stream_send.get())
    async with _ApprovalWatch(
        _groups(events.APPROVALS_GROUP, viewer), feed=feed, quiet=quiet, connection=connection
    ) as watch:
        for chunk in await feed.stored():
            yield chunk
        yield LIVE
        async for part in _follow(watch, feed, viewer, quiet=quiet):
            yield part


async def drive_stream(run_id: str, after: int) -> AsyncIterator[str | bytes]:
    """Drive a run in this process and yield its events until the drive returns.

    1. Join the run's group, then replay what followed `after` (the decision that led here).
    2. Drive in a worker thread (the lease makes it the only driver); its tokens and events
       reach this stream through the group, in the order the driver published them.
    3. When the drive returns, wait briefly for its last pushes, fill any gap from the
       table, and end with an `end` frame saying where the run stands.
    """
    feed = RunFeed(run_id, after)
    async with _watch(events.run_group(run_id)) as watch:
        for chunk in await feed.stored():
            yield chunk
        yield LIVE
        drive = asyncio.ensure_future(sync_to_async(_drive, thread_sensitive=False)(run_id))
        async for part in _follow(watch, feed, until=drive):
            yield part
        try:
            result = await drive
        except Exception as exc:  # the 200 is sent: report it on the stream
            logger.exception("driving %s from a request failed", run_id)
            yield frame("error", {"error_code": "internal_error", "message": f"{type(exc).__name__}: {exc}"})
            return
        async for chunk in _drain(watch, feed):
            yield chunk
    if not result.driven:
        yield frame("error", await read(_lease_error, run_id))
    yield frame("end", {"run_id": run_id, "status": result.status, "driven": result.driven})


async def _drain(watch: Watch, feed: RunFeed) -> AsyncIterator[str]:
    """Yield what the finished drive published and this stream has not sent yet."""
    state = await read(_run_state, feed.run_id)
    target = state[1] if state else feed.last
    deadline = time.monotonic() + DRAIN_SECONDS
    while feed.last < target and watch.live and (left := deadline - time.monotonic()) > 0:
        event = await watch.next(left)
        if event is None:
            continue  # a tick, or the time is up (the loop's condition says which)
        for chunk in await feed.live(event):
            yield chunk
    for chunk in await feed.stored():
        yield chunk


def _drive(run_id: str) -> DriveResult:
    try:
        return runtime.drive(run_id, stream=True)
    finally:
        close_old_connections()  # this pool thread is not a request: nobody else closes it


def _lease_error(run_id: str) -> dict[str, Any]:
    run = selectors.run_lease(run_id)
    owner, until = run.get("lease_owner") or None, run.get("lease_expires_at")
    return {
        "error_code": "lease_held",
        "message": f"run {run_id} is being driven by {owner or 'another process'}",
        "lease_owner": owner,
        "lease_expires_at": until.isoformat() if until else None,
    }
