"""One channel-layer subscription per group and process, shared by every live connection in it.

Thousands of inboxes and SSE streams may be open on one web process. When each joined the
approvals group on its own channel, every event became a channel-layer message per
connection: a decode, a queue, a task and a dispatch each. A `Hub` receives each message of
its group once and hands it, as one `Shared` event, to every member in turn, in the order
the messages were published; what members derive from it (a table read, a rendered frame)
is worked out once through `Shared.once` and `Shared.memo`.

Members are served a batch at a time, with a yield to the event loop between batches, so
the first connections' bytes are on the wire while the later ones are still being served.
A `Watch` is the member a stream holds: the messages of its groups, taken in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Self, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

T = TypeVar("T")
logger = logging.getLogger(__name__)

BATCH = 100  # members served between two yields to the event loop
AHEAD = 64  # messages received and being prepared ahead of the one being served


class Member(Protocol):
    @classmethod
    async def prepare(cls, event: Shared) -> None:
        """Work out, once per event and kind of member, the parts every member will want."""

    async def deliver(self, event: Shared) -> None:
        """Take one message of the group (a member must not block: the others wait)."""

    def lost(self) -> None:
        """The hub lost its channel layer: no further message will come."""


async def read(func: Callable[..., T], *args: Any, spread: bool = False) -> T:
    """Run one short blocking read off the event loop, then let its thread's connection go as a request's does.

    A stream lasts hours: holding a connection (or a thread) for each would run the database
    (and the process) out of them. The reads run on a few shared threads instead, and each
    thread's connection is kept or closed as at the end of a request (CONN_MAX_AGE: on
    PostgreSQL it goes back to the pool; a SQLite connection is kept, not opened again, with
    its PRAGMAs, for each read of each stream). `spread`: on any pool thread rather than the
    one Django keeps for thread-sensitive calls (outside a request, one for the whole
    process), where a busy group's reads queued one behind the other.
    """
    return await sync_to_async(_releasing(func), thread_sensitive=not spread)(*args)


def _releasing(func: Callable[..., T]) -> Callable[..., T]:
    def run(*args: Any) -> T:
        try:
            return func(*args)
        finally:
            if not connection.in_atomic_block:
                connection.close_if_unusable_or_obsolete()

    return run


class Shared:
    """One message of a group, as every member of this process sees it: each part worked out once.

    `once` runs a blocking call (a table read) in a thread on first use and hands its result
    to every member that asks; `memo` does the same for a quick call on the event loop (a
    rendered frame). Parts are keyed by what they depend on.
    """

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self._parts: dict[tuple[Any, ...], Any] = {}

    async def once(self, key: tuple[Any, ...], func: Callable[..., T], *args: Any) -> T:
        return await self.once_async(key, lambda: read(func, *args, spread=True))

    async def once_async(self, key: tuple[Any, ...], make: Callable[[], Awaitable[T]]) -> T:
        """`once` for a coroutine: the first member to ask runs it, as a task, for all."""
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = asyncio.ensure_future(make())
        elif part.done():  # the usual case: another member asked first
            return part.result()
        # Shielded: a member closing while it waits must not cancel the part for the others.
        return await asyncio.shield(part)

    def memo(self, key: tuple[Any, ...], func: Callable[..., T], *args: Any) -> T:
        if key not in self._parts:
            self._parts[key] = func(*args)
        return self._parts[key]


class Hub:
    """The members of one group in this process (one event loop), fed by one subscription."""

    _hubs: dict[tuple[int, str], Hub] = {}

    def __init__(self, layer: Any, group: str) -> None:
        self.layer, self.group = layer, group
        self.loop = asyncio.get_running_loop()
        self.members: dict[Member, None] = {}  # ordered: the oldest member is served first
        self.channel = ""
        self._task: asyncio.Future[None] | None = None
        self._ready = asyncio.ensure_future(self._subscribe())

    @classmethod
    async def join(cls, group: str, member: Member, layer: Any = None) -> None:
        """Add a member; return once the group's messages reach this process (raise if they cannot)."""
        loop = asyncio.get_running_loop()
        key = (id(loop), group)
        hub = cls._hubs.get(key)
        if hub is None or hub.loop is not loop:  # none yet, or one of a closed loop that had this id
            layer = layer if layer is not None else get_channel_layer()
            if layer is None:
                raise RuntimeError("no channel layer is configured")
            hub = cls._hubs[key] = cls(layer, group)
        hub.members[member] = None
        try:
            await asyncio.shield(hub._ready)
        except BaseException:
            hub.members.pop(member, None)
            failed = hub._ready.done() and (hub._ready.cancelled() or hub._ready.exception() is not None)
            if failed and cls._hubs.get(key) is hub:  # the next member tries again
                del cls._hubs[key]
            raise

    @classmethod
    async def leave(cls, group: str, member: Member) -> None:
        key = (id(asyncio.get_running_loop()), group)
        hub = cls._hubs.get(key)
        if hub is None or member not in hub.members:
            return
        del hub.members[member]
        if not hub.members:  # the last one: let go of the subscription (a new hub takes over)
            del cls._hubs[key]
            await hub._stop()

    @classmethod
    def subscribed(cls, group: str) -> bool:
        """Return whether this event loop has a hub on `group` (for tests and the bench)."""
        hub = cls._hubs.get((id(asyncio.get_running_loop()), group))
        return hub is not None and hub.loop is asyncio.get_running_loop()

    async def _subscribe(self) -> None:
        await keep_receiving(self.layer)
        self.channel = await self.layer.new_channel("hub.")
        await self.layer.group_add(self.group, self.channel)
        self._task = asyncio.ensure_future(self._run())

    async def _stop(self) -> None:
        with contextlib.suppress(BaseException):
            await self._ready
        if self._task is not None:
            self._task.cancel()  # cancelling the pending receive also unsubscribes the channel
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            await self.layer.group_discard(self.group, self.channel)

    async def _run(self) -> None:
        """Receive the group's messages while the ones before are served, in the order they came.

        Each message's parts (`prepare`: a table read, say) are worked out as it arrives, not
        when the one before it has been served: at a few reads' time apart, one slow read
        used to hold up every later receive, and under load the group fell seconds behind.
        """
        received: asyncio.Queue[tuple[Shared, asyncio.Future[None]]] = asyncio.Queue(AHEAD)
        serving = asyncio.ensure_future(self._serve(received))
        try:
            while True:
                try:
                    message = await self.layer.receive(self.channel)
                except Exception as exc:  # noqa: BLE001 — the layer broke: tell the members, let a new hub try
                    logger.warning("live %s lost the channel layer: %s", self.group, exc)
                    self._drop()
                    return
                event = Shared(message)
                await received.put((event, asyncio.ensure_future(self._prepare(event))))
        finally:
            serving.cancel()

    async def _prepare(self, event: Shared) -> None:
        """Work out each kind of member's parts, so that members then find them done and only send."""
        for kind in dict.fromkeys(type(member) for member in self.members):
            try:
                await kind.prepare(event)
            except Exception:  # a member works it out itself (and logs why it cannot)
                logger.warning("could not prepare %s for live connections", event.message.get("type"), exc_info=True)

    async def _serve(self, received: asyncio.Queue[tuple[Shared, asyncio.Future[None]]]) -> None:
        while True:
            event, prepared = await received.get()
            await prepared  # it never raises: _prepare logs what failed
            members = list(self.members)
            for index, member in enumerate(members):
                if index and not index % BATCH:
                    await asyncio.sleep(0)  # let what was sent so far go out
                if member not in self.members:
                    continue  # left while the batch before was served
                try:
                    await member.deliver(event)
                except Exception:  # one member (a socket closing, say) must not stop the others
                    logger.warning("could not hand %s to a live connection", event.message.get("type"), exc_info=True)

    def _drop(self) -> None:
        for key, hub in list(self._hubs.items()):
            if hub is self:
                del self._hubs[key]
        for member in list(self.members):
            with contextlib.suppress(Exception):
                member.lost()
        self.members.clear()


class Watch:
    """One stream's place in this process's hubs: the messages of its groups, taken in order.

    The hubs append their messages here and the stream takes them with `next`. Waiting costs
    no timer per message: one timer per quiet spell says when a tick is due, and a message
    only moves the due time. Without a channel layer (or once a hub lost it) `live` is False
    and the ticks come every `poll` seconds instead, for the stream to read the table.
    Subclasses may override `prepare` to work out their parts of an event once per process.
    """

    def __init__(self, groups: tuple[str, ...], *, tick: float, poll: float) -> None:
        self.groups = groups
        self.joined: list[str] = []
        self.live = False
        self._tick, self._poll = tick, poll
        self._items: list[Shared] = []
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def tick(self) -> float:
        return self._tick if self.live else self._poll

    @property
    def idle(self) -> bool:
        """Whether the stream waits in `next` with nothing left to take: all it was handed is sent."""
        return self._waiter is not None and not self._items

    def sent_now(self) -> None:
        """Count a message the member sent itself (not through `next`) as activity: the next tick moves."""
        self._due = time.monotonic() + self.tick

    async def __aenter__(self) -> Self:
        try:
            for group in self.groups:
                await Hub.join(group, self)
                self.joined.append(group)
            self.live = True
        except Exception as exc:  # noqa: BLE001 — any transport failure: fall back to polling the table
            logger.warning("live %s without the channel layer (polling the table): %s", self.groups[0], exc)
            await self._leave()
        self._due = time.monotonic() + self.tick
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self._leave()

    async def _leave(self) -> None:
        for group in self.joined:
            try:
                await Hub.leave(group, self)
            except Exception:  # the stream is over either way
                logger.debug("could not leave %s", group, exc_info=True)
        self.joined = []

    @classmethod
    async def prepare(cls, event: Shared) -> None:
        """Nothing to work out ahead: a stream reads the message itself."""

    async def deliver(self, event: Shared) -> None:
        self._items.append(event)
        self._wake()

    def lost(self) -> None:
        self.live = False  # poll from now on
        self._due = min(self._due, time.monotonic() + self._poll)
        if self._timer is not None:  # armed for the later due time
            self._timer.cancel()
            self._timer = None
        self._wake()

    async def next(self, within: float | None = None, *, until: asyncio.Future[Any] | None = None) -> Shared | None:
        """Return the next message, or None: at the tick due after a quiet spell, after `within`
        seconds if sooner, or once `until` is done."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else time.monotonic() + within
        if until is not None:
            until.add_done_callback(self._woken)
        try:
            while not self._items:
                now = time.monotonic()
                if now >= self._due:
                    self._due = now + self.tick
                    return None
                if (deadline is not None and now >= deadline) or (until is not None and until.done()):
                    return None
                self._arm(loop, min(self._due, deadline or self._due) - now)
                self._waiter = loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            if until is not None:
                until.remove_done_callback(self._woken)
        self._due = time.monotonic() + self.tick
        return self._items.pop(0)

    def _arm(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        """Have a timer ring within `delay`: the one armed already if it rings by then."""
        at = loop.time() + delay
        if self._timer is not None and self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._ring)

    def _ring(self) -> None:
        self._timer = None
        self._wake()

    def _woken(self, _: object) -> None:
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


_anchors: dict[int, str] = {}  # event loop id → a channel this process never leaves


async def keep_receiving(layer: Any) -> None:
    """Keep the channel layer's receiver reading at once, from the first connection on.

    channels_redis' pub/sub receiver sleeps 100 ms between looks while its process
    subscribes to nothing, so the first push to a new connection of an idle process waited
    up to 100 ms. One channel that is never left keeps it subscribed.
    """
    loop = id(asyncio.get_running_loop())
    if loop not in _anchors:
        _anchors[loop] = await layer.new_channel("sse-anchor.")
