"""Server-sent events: one run's events, the reviewers' approval feed, and a drive's stream.

Every stream joins its Channels group *before* it reads the replay from RunEvent: an event
committed in between arrives live as well and is dropped as a duplicate, so none is missed.
A live event that skips a seq (a push lost while Redis hiccuped) is filled in from the
table, and an idle stream re-reads the table whenever it sends a heartbeat.

    id: 7
    event: approval_required
    data: {"run_id": "run_…", "seq": 7, "event": "approval_required", "data": {…}}

`id` is the run's event seq; `delta` frames (streamed tokens) have none, being live only.
The approval feed spans runs, so its ids are cursors over RunEvent primary keys instead
(`Cursor`: every approval event up to one pk, and which ones after it were sent), since pks
are not committed in their order. Its streams, thousands per process, share one subscription
(dashboard.live.hub): each event's frame is encoded once, and once more per cursor the
streams are at (those in step share it), and each stream only writes the bytes.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self, TypeVar

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
from dashboard.api.auth import ApiError, Unauthenticated
from dashboard.auth import UNKNOWN_TOKEN, is_reviewer, session_holds
from dashboard.live.hub import BATCH, Shared, Watch, read
from dashboard.live.wire import StreamWire, stream_send

T = TypeVar("T")

HEARTBEAT_SECONDS = 15.0
POLL_SECONDS = 1.0  # without a channel layer, read the table this often instead
DRAIN_SECONDS = 1.0  # after a drive, how long its last pushes may take to arrive
REPLAY_BATCH = 500
RECHECK_SHARED_SECONDS = 5.0  # a heartbeat's access re-check serves the viewer's other streams this long
SHARED_MAX_AGE = 60.0  # reads shared between streams are forgotten after this
APPROVAL_EVENTS = selectors.APPROVAL_EVENTS
SETTLE_SECONDS = 1.0  # while approval events wait for older transactions, look this often whether they ended
FRESH_WAIT_SECONDS = 1.0  # a replay waits at most this long for the transactions in flight to end
CURSOR_PKS = 64  # an approval feed's id names at most this many events after its watermark
CURSOR_PKS_ACCEPTED = 1000  # ... and a Last-Event-ID may name this many
SETTLED = "approvals.settled"  # the message a process's approval streams get when the watermark moves
# Sent once the replay is out and the stream is subscribed: a client may rely on it.
LIVE = ": live\n\n"
# The last frame of a stream whose viewer's access ended (logout, revoked token, ...).
ACCESS_ENDED = 'event: access_ended\ndata: {"error_code":"access_ended","message":"your access ended"}\n\n'
HEARTBEAT = ": heartbeat\n\n"

logger = logging.getLogger(__name__)


def frame(event: str, payload: dict[str, Any], event_id: int | str | None = None) -> str:
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
    """How many streams (or long polls) each user has open in this process, at most the setting's number.

    Slots are taken on the event loop but given back from a thread (Django closes a
    response with sync_to_async), hence the lock.
    """

    def __init__(self, setting: str, default: int) -> None:
        self.counts: dict[int, int] = {}
        self.lock = threading.Lock()
        self.setting, self.default = setting, default

    def limit(self) -> int:
        return int(getattr(settings, self.setting, self.default))

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


_open_streams = _OpenStreams("AGENTFAST_STREAMS_PER_USER", 20)
# External calls' waits (GET /api/approvals/{id}/wait): each costs no thread but reads the database each second.
open_waits = _OpenStreams("AGENTFAST_WAITS_PER_USER", 100)


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


@dataclass(frozen=True)
class Cursor:
    """Where an approval feed's client stands: every approval event up to RunEvent `upto`, and `also` after it.

    PostgreSQL takes a RunEvent's pk from a sequence at INSERT, but commits transactions in
    another order: event 101 may be sent while event 100 is still uncommitted. A bare pk as
    the id ("everything up to 101") would then skip 100 on a reconnect. So the id is `upto`
    (the watermark: no event at or below it may still commit, and all of them were sent)
    followed by the pks of the events sent after it: `1200` or `1200:1203,1207`. A plain
    number, the id of older versions, still reads as "every event up to it".
    """

    upto: int
    also: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.upto}:{','.join(map(str, self.also))}" if self.also else str(self.upto)

    @classmethod
    def parse(cls, text: str) -> Cursor | None:
        """Return the cursor an id spells, or None when it is none this feed sends."""
        head, colon, tail = text.partition(":")
        parts = [head, *(tail.split(",") if colon else ())]
        # isdigit() alone admits "٣" and "²", which int() reads or refuses: ASCII digits only.
        if len(parts) > CURSOR_PKS_ACCEPTED + 1 or not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in parts):
            return None
        upto, *also = map(int, parts)
        if any(pk <= upto for pk in also):
            return None
        return cls(upto, tuple(sorted(set(also))))


def approval_resume_point(request: HttpRequest, after: str | None) -> Cursor | None:
    """Return where an approval feed starts: Last-Event-ID (a reconnect), else ?after=, else None (now)."""
    header = request.headers.get("Last-Event-ID", "").strip()
    text, field = (header, "Last-Event-ID") if header else (after, "after")
    if text is None:
        return None
    cursor = Cursor.parse(text.strip())
    if cursor is None:
        raise ApiError(f"{field} must be a non-negative integer or an id this feed sent", field=field)
    return cursor


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
    if token and token_id is None:
        # Revoked since it authenticated this request: a viewer without its token would never be ended by a revoke.
        raise Unauthenticated(UNKNOWN_TOKEN)
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
    """Every run's approval_required and approval_decided events; ids are `Cursor`s over RunEvent pks.

    The feed keeps the cursor its client holds: `upto`, the watermark (every approval event at
    or below it was sent, or the client had it), and `above`, the pks sent after it. An event
    is sent when it is in neither. Only a complete read of the table below a settled point
    (`_Settler`: no transaction that may still commit an id at or below it is left) moves the
    watermark; a live event, or a row read above that point, joins `above` until it does.
    A live event comes from this process's hub (`live`): its frame is encoded once for every
    stream at the same cursor, and each stream only checks that it has not sent it yet.
    """

    ended = False
    _REMEMBERED = 10_000

    def __init__(self, start: Cursor) -> None:
        self.upto = start.upto
        self._above: list[int] = list(start.also)  # ascending
        self._above_set = set(self._above)
        self._cursor: str | None = None
        self.settler = _Settler.of_loop()

    @classmethod
    async def now(cls) -> ApprovalFeed:
        """The feed of a client that has every approval event committed so far, and none still in flight.

        It starts at the settled point (`_Settler`: nothing more may commit below it) and
        counts the events committed above it as sent (call `stored` to read them): an event
        in flight now is sent when it commits, whatever its pk.
        """
        settled = await _Settler.of_loop().settled(fresh=True)
        if settled is None:  # a transaction in flight all along: after the newest approval event, as a bare pk did
            settled = await read(latest_approval_event)
        return cls(Cursor(settled))

    def cursor(self) -> str:
        """The id of the frame sent last: the watermark and (the newest CURSOR_PKS of) the pks sent after it."""
        if self._cursor is None:
            self._cursor = str(Cursor(self.upto, tuple(self._above[-CURSOR_PKS:])))
        return self._cursor

    def seen(self, pk: int) -> bool:
        return pk <= self.upto or pk in self._above_set

    def unsettled(self) -> bool:
        """Whether events were sent above the watermark (the settler then looks again)."""
        return bool(self._above)

    async def stored(self, *, shared_for: float = 0.0, fresh: bool = True) -> list[str]:
        """Frames of the stored events not sent yet: those after the watermark, but for the ones sent above it.

        `fresh` (the replay): first look how far the table is settled, waiting a moment for
        transactions in flight. `shared_for` > 0 (an idle look, not the replay): a read
        another stream of this process made from the same point within that many seconds
        serves this one too.
        """
        settled = await self.settler.settled(fresh=fresh)
        frames: list[str] = []
        position = self.upto
        while True:
            if shared_for:
                key = ("approval-events-after", position, settled)
                rows = await _shared_read(key, shared_for, _approval_events_after, position)
            else:
                rows = await read(_approval_events_after, position)
            frames += [chunk for row in rows if (chunk := self._take(row, settled)) is not None]
            if len(rows) < REPLAY_BATCH:
                if settled is not None:
                    self._advance(settled)  # every approval event up to it was in the reads
                return frames
            position = rows[-1][0]

    @staticmethod
    async def prepare(event: Shared) -> tuple[int, bytes] | None:
        """Return a hub's event as (pk, its frame encoded but its id), worked out once; None: no approval event."""
        message = event.message
        if message.get("event") not in APPROVAL_EVENTS or message.get("seq") is None:
            return None
        pk = message.get("pk")  # None: a message sent without it (a publisher of an older version)
        if pk is None:
            pk = await event.once(("sse-pk",), _event_pk, message["run_id"], message["seq"])
        return None if pk is None else (pk, event.memo(("sse-body",), _encoded_body, message))

    async def idle(self, tick: float) -> list[str]:
        """Frames of the stored events after a quiet tick; streams of this process share the read."""
        return await self.stored(shared_for=min(RECHECK_SHARED_SECONDS, tick / 2), fresh=False)

    async def live(self, event: Shared) -> list[str] | list[bytes]:
        """The frame of a hub's event, unless it is no approval event or was sent already; or a settlement's."""
        if event.message.get("type") == SETTLED:
            return await self.settle(event)
        found = await self.prepare(event)
        if found is None or self.seen(found[0]):
            return []
        return [self.take_live(event, *found)]

    def take_live(self, event: Shared, pk: int, body: bytes) -> bytes:
        """Count a live event as sent (above the watermark); return its frame, shared by the streams at this cursor.

        The cursor after it follows from the one before and the pk alone: streams in step
        (most of a process's) take the cursor and the frame the first of them worked out.
        """
        before, upto = self.cursor(), self.upto
        self._mark(pk)
        if self.upto != upto:  # the watermark was forced on (see _mark): this stream's own
            return _with_id(self.cursor(), body)
        self._cursor, data = event.memo(("sse-frame", before), self._framed, body)
        return data

    def _framed(self, body: bytes) -> tuple[str, bytes]:
        cursor = self.cursor()
        return cursor, _with_id(cursor, body)

    def forget(self, pk: int) -> None:
        """Undo `take_live`: its frame could not be written."""
        if pk in self._above_set:
            self._above_set.discard(pk)
            self._above.remove(pk)
            self._cursor = None

    async def settle(self, event: Shared) -> list[str]:
        """Move the watermark to a settlement's: send first what it names that this stream has not sent.

        The settlement lists the approval events between the last settled point and the new
        one: normally this stream sent them all live; a push that was lost, or is still on its
        way, is read from the table now (its push, should it come, is then a duplicate).
        """
        message = event.message
        upto, after = message["upto"], message["after"]
        if upto <= self.upto:
            return []
        if after is None or self.upto < after:  # behind the settlement's list: read from the table
            return await self.stored(fresh=False)
        missing = self._missing(message)
        frames: list[str] = []
        if missing:
            rows = await event.once(("sse-missing", *missing), _approval_events_in, missing)
            frames = [chunk for row in rows if (chunk := self._take(row, upto)) is not None]
        self._advance(upto)
        return frames

    def settle_quietly(self, message: dict[str, Any]) -> bool:
        """Apply a settlement that sends nothing, and say so; False: `settle` has events to send (or read)."""
        upto, after = message["upto"], message["after"]
        if upto <= self.upto:
            return True
        if after is None or self.upto < after or self._missing(message):
            return False
        self._advance(upto)
        return True

    def _missing(self, message: dict[str, Any]) -> list[int]:
        return [pk for pk in message["pks"] if self.upto < pk <= message["upto"] and pk not in self._above_set]

    def _take(self, row: tuple[int, str, int, str, dict[str, Any]], settled: int | None) -> str | None:
        """The frame of a row of a complete read of the table after the watermark; None: sent already.

        At or below the settled point, nothing below the row may still commit and the read
        had the rest: the watermark moves to it.
        """
        pk, run_id, seq, event, data = row
        fresh = not self.seen(pk)
        if fresh:
            self._mark(pk)
        if settled is not None and pk <= settled:
            self._advance(pk)
        return frame(event, _payload(run_id, seq, event, data), self.cursor()) if fresh else None

    def _mark(self, pk: int) -> None:
        bisect.insort(self._above, pk)
        self._above_set.add(pk)
        self._cursor = None
        self.settler.want()
        if len(self._above) > self._REMEMBERED:
            # The watermark has not moved for 10,000 events (a transaction open for that long):
            # forget the older half, taking it as settled.
            self._advance(self._above[-self._REMEMBERED // 2])

    def _advance(self, upto: int) -> None:
        if upto <= self.upto:
            return
        self.upto = upto
        cut = bisect.bisect_right(self._above, upto)
        if cut:
            self._above_set.difference_update(self._above[:cut])
            del self._above[:cut]
        self._cursor = None


class _Horizon:
    """How far RunEvent ids are settled: every id up to `value` is committed, or never will be.

    Each look at the table (sql.run_event_horizon) gives the newest committed id and the
    transactions that may still commit ids at or below it; that id is settled once none of
    them is left, as a later look tells.
    """

    _WAITING = 32

    def __init__(self) -> None:
        self.value: int | None = None
        self.newest = 0  # the newest committed id the last look saw
        self.waiting: list[tuple[int, frozenset[str]]] = []

    def observe(self, newest: int, holders: frozenset[str]) -> None:
        self.newest = newest
        settled = [upto for upto, held in self.waiting if not held & holders]
        self.waiting = [(upto, held) for upto, held in self.waiting if held & holders]
        if holders:
            self.waiting.append((newest, holders))
        else:
            settled.append(newest)
        if settled and (self.value is None or max(settled) > self.value):
            self.value = max(settled)
        if self.value is not None:
            self.waiting = [(upto, held) for upto, held in self.waiting if upto > self.value]
        if len(self.waiting) > self._WAITING:  # a long transaction: keep the oldest and the newest
            del self.waiting[self._WAITING // 2 : -self._WAITING // 2]


class _Settler:
    """One per event loop: the settled point of RunEvent ids, and the settlements sent to its approval streams.

    While a stream has events above its watermark, the settler looks at the table every
    SETTLE_SECONDS; when the settled point moves, it reads the approval events' pks up to it
    (once for all) and hands every stream a SETTLED message, which moves its watermark (and
    sends an event it lacks). A stream idle with nothing to send applies it without waking.
    """

    _loops: ClassVar[dict[int, _Settler]] = {}
    _REUSE = 0.1  # a look finished this recently serves a replay's ask too

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.horizon = _Horizon()
        self.members: dict[_ApprovalWatch, None] = {}  # ordered, as a hub's
        self.wanted = asyncio.Event()
        self.task: asyncio.Future[None] | None = None
        self.told: int | None = None  # the settled point the streams were told last
        self.looked_at = -math.inf
        self._looking: asyncio.Future[None] | None = None

    @classmethod
    def of_loop(cls) -> _Settler:
        loop = asyncio.get_running_loop()
        found = cls._loops.get(id(loop))
        if found is None or found.loop is not loop:  # none yet, or one of a closed loop that had this id
            found = cls._loops[id(loop)] = cls(loop)
        return found

    def join(self, member: _ApprovalWatch) -> None:
        self.members[member] = None
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    def leave(self, member: _ApprovalWatch) -> None:
        self.members.pop(member, None)
        if not self.members and self.task is not None:
            self.task.cancel()
            self.task = None

    def want(self) -> None:
        """A stream sent an event above its watermark: look again within SETTLE_SECONDS."""
        self.wanted.set()

    async def settled(self, *, fresh: bool) -> int | None:
        """Return the settled point (None: not known yet).

        `fresh`: as of now, waiting up to FRESH_WAIT_SECONDS for the transactions in flight to
        end, so that a replay moves its watermark over the events it reads.
        """
        if not fresh:
            return self.horizon.value
        await self.look(self._REUSE)
        target, pause = self.horizon.newest, 0.005
        deadline = time.monotonic() + FRESH_WAIT_SECONDS
        while (self.horizon.value or 0) < target and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
            await self.look(pause / 2)
        return self.horizon.value

    async def look(self, reuse: float = 0.0) -> None:
        """Look at the table, unless a look is under way (then wait for it) or ended within `reuse` seconds."""
        looking = self._looking
        failed = looking is not None and looking.done() and (looking.cancelled() or looking.exception() is not None)
        if looking is None or failed or (looking.done() and time.monotonic() - self.looked_at >= reuse):
            looking = self._looking = asyncio.ensure_future(self._look())
        # Shielded: a stream closing while it waits must not cancel the look for the others.
        await asyncio.shield(looking)

    async def _look(self) -> None:
        newest, holders = await read(_run_event_horizon)
        self.horizon.observe(newest, holders)
        self.looked_at = time.monotonic()

    async def _run(self) -> None:
        while True:
            await self.wanted.wait()
            await asyncio.sleep(SETTLE_SECONDS)
            self.wanted.clear()  # what streams send from now on, the look below may not cover
            # The list starts where the streams were told last: those that replayed since
            # stand further on, which it covers too; a stream further back reads the table.
            before = self.horizon.value if self.told is None else self.told
            try:
                await self.look()
                after = self.horizon.value
                if after is not None and after != before:
                    pks = [] if before is None else await read(_approval_pks_between, before, after)
                    await self._tell(Shared({"type": SETTLED, "after": before, "upto": after, "pks": pks}))
                    self.told = after
            except Exception:  # the database is away: the streams keep their ids; look again
                logger.warning("could not settle the approval feed", exc_info=True)
                self.wanted.set()
            if any(member.feed.unsettled() for member in self.members):
                self.wanted.set()

    async def _tell(self, event: Shared) -> None:
        for index, member in enumerate(list(self.members)):
            if index and not index % BATCH:
                await asyncio.sleep(0)  # let what was sent so far go out
            if member not in self.members:
                continue
            try:
                await member.deliver(event)
            except Exception:  # one member (a socket closing, say) must not stop the others
                logger.warning("could not settle an approval stream", exc_info=True)


def _encoded_body(message: dict[str, Any]) -> bytes:
    """An approval event's frame but its id line."""
    payload = _payload(message["run_id"], message["seq"], message["event"], message["data"])
    return frame(message["event"], payload).encode()


def _with_id(cursor: str, body: bytes) -> bytes:
    return f"id: {cursor}\n".encode() + body


def _run_events_after(run_id: str, seq: int) -> list[tuple[int, str, dict[str, Any]]]:
    return selectors.run_events_after(run_id=run_id, seq=seq, limit=REPLAY_BATCH)


def _run_state(run_id: str) -> tuple[str, int] | None:
    return selectors.run_state(run_id)


def _approval_events_after(pk: int) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    return selectors.approval_events_after(pk=pk, limit=REPLAY_BATCH)


def _approval_events_in(pks: Sequence[int]) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    return selectors.approval_events_in(pks)


def _approval_pks_between(after: int, upto: int) -> list[int]:
    return selectors.approval_event_pks_between(after=after, upto=upto)


def _run_event_horizon() -> tuple[int, frozenset[str]]:
    return selectors.run_event_horizon()


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
    read, an access check under way, another server) the stream takes it as usual. A
    settlement that sends nothing is applied here as well, waking nobody.
    """

    def __init__(self, groups: tuple[str, ...], *, feed: ApprovalFeed, quiet: _Quiet, connection: StreamWire | None):
        super().__init__(groups, tick=HEARTBEAT_SECONDS, poll=POLL_SECONDS)
        self.feed, self.quiet, self.connection = feed, quiet, connection

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        self.feed.settler.join(self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.feed.settler.leave(self)
        await super().__aexit__(*exc_info)

    @classmethod
    async def prepare(cls, event: Shared) -> None:
        await ApprovalFeed.prepare(event)

    async def deliver(self, event: Shared) -> None:
        if event.message.get("type") == SETTLED:
            if not (self.idle and self.feed.settle_quietly(event.message)):
                await super().deliver(event)
            return
        connection = self.connection if self.idle else None
        found = await ApprovalFeed.prepare(event) if connection is not None else None
        if connection is None or found is None or not self.idle:  # a stream busy or starting, another server, ...
            await super().deliver(event)
            return
        pk, body = found
        if self.feed.seen(pk):
            return  # replayed already
        data = self.feed.take_live(event, pk, body)
        if not connection.write(data):  # the response is closing: the stream finds out
            self.feed.forget(pk)
            await super().deliver(event)
            return
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


async def approval_stream(after: Cursor | None, viewer: Viewer | None = None) -> AsyncIterator[str | bytes]:
    """Yield the approval events of all runs the cursor `after` lacks (None: from now), then live ones, forever.

    1. Join this process's hubs (the approvals group, the viewer's access groups) before
       reading the table: an event committed during the replay arrives live as well and is
       dropped as a duplicate, so none is missed.
    2. Replay from the table, say `: live`, then send what the hubs hand over, a heartbeat
       after each quiet spell, and `access_ended` once the viewer's access ends. Each
       frame's id is the cursor after it (`Cursor`): a client reconnecting with it gets
       every event it lacks, once, even one committed after a newer one it has.
    """
    feed, quiet = (ApprovalFeed(after) if after is not None else await ApprovalFeed.now()), _Quiet()
    connection = StreamWire.of(stream_send.get())
    async with _ApprovalWatch(
        _groups(events.APPROVALS_GROUP, viewer), feed=feed, quiet=quiet, connection=connection
    ) as watch:
        replayed = await feed.stored()
        for chunk in replayed if after is not None else ():  # from now: what is committed counts as sent
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
