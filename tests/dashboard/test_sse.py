"""The SSE machinery in process: frames, heartbeats, gap filling, and life without Redis."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client

from agents import events, runtime, services
from agents.models import RunEvent
from dashboard.live import hub, sse
from dashboard.live.hub import Shared, Watch
from tests.support import flows

REFUND = "Refund order A1001 for 25.00 USD"
T = TypeVar("T")


async def _next(stream: AsyncIterator[str], timeout: float = 5.0) -> str:
    return await asyncio.wait_for(anext(stream), timeout)


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking ORM code off the event loop, closing the thread's connection after."""
    return await database_sync_to_async(func)(*args, **kwargs)


def test_it_writes_one_data_line_per_frame() -> None:
    text = sse.frame("message", {"content": "two\nlines"}, 7)
    assert text == 'id: 7\nevent: message\ndata: {"content":"two\\nlines"}\n\n'
    assert sse.frame("delta", {"text": "hi"}).startswith("event: delta\n")


def test_it_repairs_a_lone_surrogate_in_a_frame_instead_of_failing() -> None:
    text = sse.frame("message", {"content": "bad \ud800 text"}, 3)

    assert text.encode() == 'id: 3\nevent: message\ndata: {"content":"bad \ufffd text"}\n\n'.encode()


@pytest.mark.django_db(transaction=True)
async def test_it_sends_heartbeats_while_a_run_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT_SECONDS", 0.2)
    run = await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False)
    stream = sse.run_stream(run.id, 0)
    try:
        assert await _next(stream) == sse.LIVE
        assert await _next(stream) == sse.HEARTBEAT
    finally:
        await stream.aclose()


@pytest.mark.django_db(transaction=True)
async def test_it_fills_a_lost_push_from_the_table_and_drops_duplicates() -> None:
    run = await in_thread(flows.start, REFUND)
    stored = await in_thread(lambda: list(RunEvent.objects.filter(run=run).order_by("seq")))
    feed = sse.RunFeed(run.id, 1)
    last = stored[-1]
    # Only the last push arrived: the ones between come from the table, in order.
    frames = await feed.live(Shared({"run_id": run.id, "seq": last.seq, "event": last.type, "data": last.data}))
    assert [int(f.split("\n")[0].removeprefix("id: ")) for f in frames] == [e.seq for e in stored[1:]]
    assert await feed.live(Shared({"run_id": run.id, "seq": 2, "event": stored[1].type, "data": stored[1].data})) == []


async def test_it_follows_a_run_retried_after_it_failed_instead_of_ending_there() -> None:
    # A resume retries a failed run: its events then say it is queued again, and the stream goes on.
    feed = sse.RunFeed("run_retried", 0)

    def status(seq: int, value: str) -> Shared:
        return Shared(
            {"run_id": "run_retried", "seq": seq, "event": RunEvent.Type.RUN_STATUS, "data": {"status": value}}
        )

    await feed.live(status(1, "failed"))
    assert feed.ended
    await feed.live(status(2, "queued"))
    assert not feed.ended
    await feed.live(status(3, "completed"))
    assert feed.ended


@pytest.mark.django_db(transaction=True)
async def test_it_streams_from_the_table_when_the_channel_layer_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(hub, "get_channel_layer", broken)
    monkeypatch.setattr(sse, "POLL_SECONDS", 0.05)
    run = await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False)
    stream = sse.run_stream(run.id, 0)
    try:
        assert await _next(stream) == sse.LIVE
        driver = threading.Thread(target=runtime.drive, args=(run.id,), kwargs={"stream": False})
        driver.start()
        frames = [await _next(stream) for _ in range(4)]
        await in_thread(driver.join)
    finally:
        await stream.aclose()
    events = [json.loads(f.split("data: ")[1]) for f in frames]
    assert [e["event"] for e in events] == ["message", "tool_call", "tool_result", "approval_required"]


@pytest.mark.parametrize("header", ["abc", "-1", "1.5", "9" * 30, "٣", "²", "１"])
def test_it_refuses_a_malformed_last_event_id(client: Client, alice: User, header: str) -> None:
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    client.force_login(alice)
    response = client.get(f"/api/runs/{run.id}/events", headers={"Last-Event-ID": header})
    assert response.status_code == 400
    assert response.json()["field"] == "Last-Event-ID"


def _subscribed() -> set[bytes]:
    return set(redis.Redis.from_url(settings.REDIS_URL).pubsub_channels())


@pytest.mark.django_db(transaction=True)
async def test_it_lets_go_of_its_channels_when_a_stream_ends() -> None:
    finished = await in_thread(flows.start, "Refund order Z9999 for 1.00 USD")
    waiting = await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False)
    before = await in_thread(_subscribed)
    for _ in range(3):
        assert [chunk async for chunk in sse.run_stream(finished.id, 0)]  # replayed, then closed
    stream = sse.run_stream(waiting.id, 0)
    assert await _next(stream) == sse.LIVE
    await stream.aclose()  # a client that went away
    left = await in_thread(_subscribed) - before
    assert all(b"sse-anchor." in channel for channel in left), left


@pytest.mark.django_db(transaction=True)
async def test_it_ends_a_stream_at_a_heartbeat_when_the_end_of_access_went_unannounced(
    monkeypatch: pytest.MonkeyPatch, alice: User
) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT_SECONDS", 0.2)
    run = await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False)
    token, secret = await in_thread(services.token_create, username="alice")
    await in_thread(services.token_revoke, prefix=secret)  # told before the stream listened: missed
    stream = sse.run_stream(run.id, 0, sse.Viewer(user_id=alice.pk, token_id=token.pk))
    try:
        assert await _next(stream) == sse.LIVE
        assert await _next(stream) == sse.ACCESS_ENDED
        with pytest.raises(StopAsyncIteration):
            await _next(stream)
    finally:
        await stream.aclose()


@pytest.mark.django_db(transaction=True)
async def test_it_feeds_every_stream_of_one_run_from_one_subscription() -> None:
    run = await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False)
    before = await in_thread(_subscribed)
    streams = [sse.run_stream(run.id, 0) for _ in range(3)]
    try:
        for stream in streams:
            assert await _next(stream) == sse.LIVE
        channels = await in_thread(_subscribed) - before
        assert f"asgi__group__{events.run_group(run.id)}".encode() in channels
        assert len([c for c in channels if b"__group__" not in c]) <= 2  # the run's hub, an anchor
        await in_thread(runtime.drive, run.id)
        seen = [await _until_approval_required(stream) for stream in streams]
        assert seen[0] == seen[1] == seen[2]  # every stream got every event, deltas too, in order
        assert any(chunk.startswith("event: delta") for chunk in seen[0])
    finally:
        for stream in streams:
            await stream.aclose()


async def _until_approval_required(stream: AsyncIterator[str | bytes]) -> list[str]:
    chunks: list[str] = []
    while not chunks or "event: approval_required" not in chunks[-1]:
        chunks.append(_text(await _next(stream)))
    return chunks


async def test_a_watch_wakes_for_a_message_a_deadline_or_a_finished_task() -> None:
    async with Watch((), tick=30.0, poll=30.0) as watch:  # no groups: fed by hand
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await watch.next(0.05) is None  # `within`, long before the tick
        assert 0.04 <= loop.time() - started < 1.0
        done = loop.create_future()
        loop.call_later(0.05, done.set_result, None)
        assert await watch.next(until=done) is None and done.done()
        loop.call_later(0.05, lambda: asyncio.ensure_future(watch.deliver(Shared({"n": 1}))))
        event = await watch.next(5.0)
        assert event is not None and event.message == {"n": 1}
    async with Watch((), tick=0.05, poll=0.05) as ticking:
        started = loop.time()
        assert await ticking.next() is None  # the tick
        assert 0.04 <= loop.time() - started < 1.0


# -- the approval feed: one subscription per process ---------------------------------------


def _text(chunk: str | bytes) -> str:
    return chunk.decode() if isinstance(chunk, bytes) else chunk


def _cursor(chunk: str | bytes) -> sse.Cursor:
    """The approval frame's id, a cursor."""
    cursor = sse.Cursor.parse(_text(chunk).split("\n")[0].removeprefix("id: "))
    assert cursor is not None, chunk
    return cursor


def _event_key(chunk: str | bytes) -> tuple[str, int]:
    """The (run_id, seq) of the event a frame carries."""
    payload = json.loads(_text(chunk).split("data: ")[1])
    return payload["run_id"], payload["seq"]


def _approval_event_keys() -> list[tuple[str, int]]:
    rows = RunEvent.objects.filter(type__in=sse.APPROVAL_EVENTS).order_by("pk")
    return list(rows.values_list("run_id", "seq"))


def _covers(cursor: sse.Cursor, pk: int) -> bool:
    return pk <= cursor.upto or pk in cursor.also


async def _until_frame(stream: AsyncIterator[str | bytes], timeout: float = 5.0) -> str | bytes:
    """Return the next event frame, passing over heartbeats."""
    while True:
        chunk = await _next(stream, timeout)
        if _text(chunk) != sse.HEARTBEAT:
            return chunk


def _approval_event_pks() -> list[int]:
    rows = RunEvent.objects.filter(type__in=sse.APPROVAL_EVENTS).order_by("pk")
    return list(rows.values_list("pk", flat=True))


@pytest.mark.django_db(transaction=True)
async def test_it_feeds_every_approval_stream_from_one_subscription_and_one_encoded_frame(alice: User) -> None:
    token, _ = await in_thread(services.token_create, username="alice")
    viewer = sse.Viewer(user_id=alice.pk, token_id=token.pk)
    before = await in_thread(_subscribed)
    streams = [sse.approval_stream(sse.Cursor(0), viewer) for _ in range(5)]
    try:
        assert await _next(streams[0]) == sse.LIVE
        with_one = await in_thread(_subscribed)
        for stream in streams[1:]:
            assert await _next(stream) == sse.LIVE
        # Four more streams of the same viewer: not one more channel subscribed.
        assert await in_thread(_subscribed) == with_one
        groups = {channel for channel in with_one - before if b"__group__" in channel}
        names = {f"asgi__group__{name}".encode() for name in ("approvals", *viewer.groups)}
        assert groups == names
        assert len(with_one - before - groups) <= 4  # a channel per hub, an anchor

        run = await in_thread(flows.start, REFUND)
        frames = [await _until_frame(stream) for stream in streams]
    finally:
        for stream in streams:
            await stream.aclose()
    assert all(chunk is frames[0] for chunk in frames)  # encoded once, written by each
    assert isinstance(frames[0], bytes)
    payload = json.loads(_text(frames[0]).split("data: ")[1])
    assert (payload["event"], payload["run_id"]) == ("approval_required", run.id)
    assert _event_key(frames[0]) == (await in_thread(_approval_event_keys))[-1]
    assert _covers(_cursor(frames[0]), (await in_thread(_approval_event_pks))[-1])
    left = await in_thread(_subscribed) - before
    assert all(b"sse-anchor." in channel for channel in left), left  # the hubs let go


@pytest.mark.django_db(transaction=True)
async def test_it_takes_a_live_events_pk_from_the_message_without_a_read(
    monkeypatch: pytest.MonkeyPatch, alice: User
) -> None:
    def no_read(run_id: str, seq: int) -> None:
        raise AssertionError("the pk came with the message: no read")

    monkeypatch.setattr(sse, "_event_pk", no_read)
    stream = sse.approval_stream(sse.Cursor(0), sse.Viewer(user_id=alice.pk))
    try:
        assert await _next(stream) == sse.LIVE
        await in_thread(flows.start, REFUND)
        chunk = await _until_frame(stream)
    finally:
        await stream.aclose()
    assert _event_key(chunk) == (await in_thread(_approval_event_keys))[-1]
    assert _covers(_cursor(chunk), (await in_thread(_approval_event_pks))[-1])


class _Slow(Watch):
    """A member whose first message takes until the second one's parts are being worked out."""

    started: list[int] = []
    second: asyncio.Event

    @classmethod
    async def prepare(cls, event: Shared) -> None:
        cls.started.append(event.message["n"])
        if event.message["n"] == 2:
            cls.second.set()
        if event.message["n"] == 1:
            await cls.second.wait()


async def test_a_hub_prepares_a_message_while_the_one_before_is_still_being_prepared() -> None:
    _Slow.started, _Slow.second = [], asyncio.Event()
    group = "test.hub.ahead"
    async with _Slow((group,), tick=30.0, poll=30.0) as watch:
        assert watch.live
        layer = get_channel_layer()
        for n in (1, 2, 3):
            await layer.group_send(group, {"type": "test.message", "n": n})
        got = [await asyncio.wait_for(watch.next(), 5.0) for _ in range(3)]
    assert [event.message["n"] for event in got if event] == [1, 2, 3]  # served in the order sent
    assert _Slow.started[:2] == [1, 2]


@pytest.mark.django_db(transaction=True)
async def test_it_sends_an_event_committed_during_the_replay_once(monkeypatch: pytest.MonkeyPatch) -> None:
    first = await in_thread(flows.start, REFUND)
    [after] = await in_thread(_approval_event_pks)
    read = sse._approval_events_after
    started: list[str] = []

    def pause_while_replaying(pk: int) -> list[tuple[int, str, int, str, dict[str, Any]]]:
        if not started:  # the replay: an agent pauses after the stream joined, before the read
            started.append(flows.start("Refund order A1002 for 15.00 USD").id)
            sse.events._publisher.flush()  # its push is on the way to the hub as the table is read
        return read(pk)

    monkeypatch.setattr(sse, "_approval_events_after", pause_while_replaying)
    stream = sse.approval_stream(sse.Cursor(0))
    try:
        replayed = []
        while (chunk := await _next(stream)) != sse.LIVE:
            replayed.append(chunk)
        later = await in_thread(flows.start, "Refund order A1003 for 35.00 USD")
        live = await _until_frame(stream)
        assert await asyncio.wait_for(_next_or_none(stream, 0.5), 1.0) is None  # the duplicate was dropped
    finally:
        await stream.aclose()
    pks = await in_thread(_approval_event_pks)
    assert [_event_key(chunk) for chunk in [*replayed, live]] == await in_thread(_approval_event_keys)  # once each
    assert all(_covers(_cursor(chunk), pk) for chunk, pk in zip([*replayed, live], pks, strict=True))
    assert after == pks[0]
    assert [json.loads(_text(c).split("data: ")[1])["run_id"] for c in [*replayed, live]] == [
        first.id,
        started[0],
        later.id,
    ]


async def _next_or_none(stream: AsyncIterator[str | bytes], timeout: float) -> str | bytes | None:
    """The next event frame within `timeout`, else None (heartbeats are passed over)."""
    try:
        return await _until_frame(stream, timeout)
    except TimeoutError:
        return None


@pytest.mark.django_db(transaction=True)
async def test_it_ends_the_approval_streams_of_a_revoked_token_and_no_others(alice: User, bob: User) -> None:
    token, secret = await in_thread(services.token_create, username="alice")
    other, _ = await in_thread(services.token_create, username="bob")
    alices = [sse.approval_stream(sse.Cursor(0), sse.Viewer(user_id=alice.pk, token_id=token.pk)) for _ in range(2)]
    bobs = sse.approval_stream(sse.Cursor(0), sse.Viewer(user_id=bob.pk, token_id=other.pk))
    try:
        for stream in [*alices, bobs]:
            assert await _next(stream) == sse.LIVE
        await in_thread(services.token_revoke, prefix=secret)
        for stream in alices:
            assert await _next(stream) == sse.ACCESS_ENDED
            with pytest.raises(StopAsyncIteration):
                await _next(stream)
        run = await in_thread(flows.start, REFUND)
        assert json.loads(_text(await _until_frame(bobs)).split("data: ")[1])["run_id"] == run.id
    finally:
        for stream in [*alices, bobs]:
            await stream.aclose()


@pytest.mark.django_db(transaction=True)
async def test_it_sends_heartbeats_on_a_quiet_approval_stream(monkeypatch: pytest.MonkeyPatch, alice: User) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT_SECONDS", 0.2)
    stream = sse.approval_stream(sse.Cursor(0), sse.Viewer(user_id=alice.pk))
    try:
        assert await _next(stream) == sse.LIVE
        assert await _next(stream) == sse.HEARTBEAT
        assert await _next(stream) == sse.HEARTBEAT
    finally:
        await stream.aclose()


@pytest.mark.django_db(transaction=True)
async def test_it_streams_approvals_from_the_table_when_the_channel_layer_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken() -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(hub, "get_channel_layer", broken)
    monkeypatch.setattr(sse, "POLL_SECONDS", 0.05)
    stream = sse.approval_stream(sse.Cursor(0))
    try:
        assert await _next(stream) == sse.LIVE
        run = await in_thread(flows.start, REFUND)
        chunk = await _until_frame(stream)
    finally:
        await stream.aclose()
    assert json.loads(_text(chunk).split("data: ")[1])["run_id"] == run.id


# -- the approval feed's cursor: events commit out of their pks' order ----------------------


def test_an_approval_cursor_reads_back_as_written_and_a_bare_pk_as_before() -> None:
    assert str(sse.Cursor(1200)) == "1200"
    assert str(sse.Cursor(1200, (1203, 1207))) == "1200:1203,1207"
    assert sse.Cursor.parse("1200") == sse.Cursor(1200)  # the id of older versions: every event up to it
    assert sse.Cursor.parse("1200:1207,1203,1203") == sse.Cursor(1200, (1203, 1207))
    too_many = "1:" + ",".join(map(str, range(2, sse.CURSOR_PKS_ACCEPTED + 3)))
    for text in ["", "abc", "-1", "1:", "1:1", "5:3", "1:2,,3", "1: 2", "1;2", "٣", "9" * 19, too_many]:
        assert sse.Cursor.parse(text) is None, text


def test_the_horizon_settles_an_id_once_the_transactions_that_might_commit_below_it_ended() -> None:
    horizon = sse._Horizon()
    horizon.observe(100, frozenset({"3/7"}))  # 3/7 holds an id it may still commit, at or below 100
    assert horizon.value is None
    horizon.observe(104, frozenset({"3/7", "4/2"}))
    assert horizon.value is None
    horizon.observe(106, frozenset({"4/2"}))  # 3/7 ended: 100 is settled; 104 waits for 4/2 too
    assert horizon.value == 100
    horizon.observe(106, frozenset())
    assert (horizon.value, horizon.waiting) == (106, [])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Last-Event-ID", "abc"),
        ("Last-Event-ID", "٣"),
        ("Last-Event-ID", "7:7"),
        ("after", "7:3"),
        ("after", "\ud800"),
        ("after", "7\x00"),
        ("after", "NaN"),
        ("after", "1:" + ",".join(map(str, range(2, 5_000)))),  # longer than any id the feed sends
    ],
)
def test_the_approval_feed_refuses_an_id_it_never_sent(client: Client, alice: User, name: str, value: str) -> None:
    client.force_login(alice)
    headers = {"Accept": "text/event-stream"}
    if name == "after":
        # As a client's bytes arrive: a lone surrogate too (its UTF-8 form, %ED%A0%80).
        response = client.get(f"/api/events?after={quote(value, safe='', errors='surrogatepass')}", headers=headers)
    else:
        response = client.get("/api/events", headers={**headers, name: value})
    assert response.status_code == 400
    assert response.json()["field"] == name


def _publish_approval(run_id: str) -> int:
    """Record an approval_required event of a run in a transaction of its own; return its pk."""
    with transaction.atomic():
        events.publish(run_id=run_id, type=RunEvent.Type.APPROVAL_REQUIRED, data={"approval_id": f"appr_{run_id}"})
        return RunEvent.objects.filter(run_id=run_id, type=RunEvent.Type.APPROVAL_REQUIRED).latest("pk").pk


def _store_unpushed_approval(run_id: str) -> int:
    """Store an approval_required event of a run whose push never comes (its publisher lost Redis); return its pk.

    The row is written as events.record writes it, under the run's seq reservation, and nothing is sent.
    """
    with transaction.atomic():
        seq = events.reserve(run_id=run_id, count=1)
        data = {"approval_id": f"appr_{run_id}"}
        return RunEvent.objects.create(run_id=run_id, seq=seq, type=RunEvent.Type.APPROVAL_REQUIRED, data=data).pk


def _run_of(chunk: str | bytes) -> str:
    return _event_key(chunk)[0]


@pytest.mark.django_db(transaction=True)
async def test_it_sends_an_event_whose_push_was_lost_after_a_newer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The push of an older event never comes (Redis hiccuped): the settlement of the newer one brings it."""
    monkeypatch.setattr(sse, "SETTLE_SECONDS", 0.05)
    older, newer = [await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False) for _ in "ab"]
    stream = sse.approval_stream(None)
    try:
        assert await _next(stream) == sse.LIVE
        pks = [await in_thread(_store_unpushed_approval, older.id), await in_thread(_publish_approval, newer.id)]
        first, second = await _until_frame(stream), await _until_frame(stream)
        assert await _next_or_none(stream, 0.5) is None  # and nothing twice
    finally:
        await stream.aclose()
    assert [_run_of(first), _run_of(second)] == [newer.id, older.id]
    assert all(_covers(_cursor(second), pk) for pk in pks)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite admits one writer at a time: pks commit in order")
@pytest.mark.django_db(transaction=True)
async def test_it_keeps_its_watermark_below_an_event_still_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event inserted first but committed last, its push lost: the watermark waits for it, then it is sent."""
    monkeypatch.setattr(sse, "SETTLE_SECONDS", 0.05)
    held, other = [await in_thread(services.run_create, agent="support", input=REFUND, enqueue=False) for _ in "ab"]
    inserted, release, held_pk = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with transaction.atomic():
                held_pk.append(_store_unpushed_approval(held.id))  # a savepoint: the outer transaction stays open
                inserted.set()
                release.wait(30)
        finally:
            connection.close()

    stream = sse.approval_stream(None)
    holder = threading.Thread(target=hold)
    try:
        assert await _next(stream) == sse.LIVE
        holder.start()
        assert await asyncio.to_thread(inserted.wait, 10)
        other_pk = await in_thread(_publish_approval, other.id)
        first = await _until_frame(stream)
        assert _run_of(first) == other.id and held_pk[0] < other_pk
        coming = asyncio.ensure_future(_until_frame(stream, 30))
        await asyncio.sleep(0.5)  # the settler looks at the table meanwhile: none may settle past the held event
        assert not coming.done()
        assert _cursor(first).upto < held_pk[0]
        release.set()
        second = await asyncio.wait_for(coming, 10)
        assert await _next_or_none(stream, 0.5) is None
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 10)
        await stream.aclose()
    assert _run_of(second) == held.id
    assert _covers(_cursor(second), held_pk[0]) and _covers(_cursor(second), other_pk)


@pytest.mark.django_db
def test_it_keeps_an_agents_own_session_stream_only_while_it_is_an_agent() -> None:
    robot, _ = services.user_create(username="robot", role="agent")
    watching_its_session = sse.Viewer(user_id=robot.pk, own_session=True)

    assert sse._may_still_watch(watching_its_session)
    assert not sse._may_still_watch(sse.Viewer(user_id=robot.pk))  # any other stream is a reviewer's
    robot.groups.clear()  # the agent role taken away
    assert not sse._may_still_watch(watching_its_session)
