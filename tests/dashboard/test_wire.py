"""Live bytes written straight to a connection, and what lets thousands of streams open quickly."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from twisted.internet.testing import StringTransport
from twisted.web import http

from agents import selectors
from dashboard.live import hub
from dashboard.live.wire import StreamWire
from dashboard.middleware import StaticFilesMiddleware


def _response(version: bytes = b"HTTP/1.1") -> tuple[http.Request, StringTransport]:
    """A twisted HTTP response on an in-memory transport (one that is no plain TCP socket)."""
    channel = http.HTTPChannel()
    transport = StringTransport()
    channel.makeConnection(transport)
    request = http.Request(channel)
    channel.requests.append(request)  # as the channel does when the request line arrives
    request.method, request.clientproto = b"GET", version
    return request, transport


@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/1.0"])
def test_it_writes_a_body_part_as_twisteds_own_write_would(version: bytes) -> None:
    ours, ours_sent = _response(version)
    theirs, theirs_sent = _response(version)
    for request in (ours, theirs):
        request.write(b": live\n\n")  # the stream's first part, the normal way: the head goes out with it
    frame = b'id: 7\nevent: approval_required\ndata: {"a":"\xc3\xa9"}\n\n'

    assert StreamWire(ours).write(frame)
    theirs.write(frame)

    assert ours_sent.value() == theirs_sent.value()  # chunked on HTTP/1.1, as is on 1.0
    assert ours.sentLength == theirs.sentLength


def test_it_leaves_a_part_to_the_stream_before_the_head_is_out_and_after_the_end() -> None:
    request, sent = _response()
    wire = StreamWire(request)
    assert not wire.write(b"data\n\n")  # no head yet: the stream sends it (and the head) itself
    assert sent.value() == b""
    request.write(b": live\n\n")
    request.finish()
    before = sent.value()
    assert not wire.write(b"data\n\n")
    assert sent.value() == before


async def test_it_finds_no_connection_to_write_to_outside_daphne() -> None:
    async def send(message: dict[str, object]) -> None:
        """An ASGI send of another server."""

    assert StreamWire.of(None) is None
    assert StreamWire.of(send) is None


async def test_static_files_pass_an_async_request_on_without_a_thread() -> None:
    called_in: list[int] = []

    async def view(request: HttpRequest) -> HttpResponse:
        called_in.append(threading.get_ident())
        return HttpResponse("from the view")

    middleware = StaticFilesMiddleware(view)
    assert iscoroutinefunction(middleware)  # Django then calls it on the event loop, not on a thread

    response = await middleware(RequestFactory().get("/api/events"))

    assert response.content == b"from the view"
    assert called_in == [threading.get_ident()]  # on this loop's own thread


@pytest.mark.django_db(transaction=True)
async def test_a_streams_reads_keep_their_threads_connection_as_a_request_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[object] = []

    def note(sender: object, connection: object, **kwargs: object) -> None:
        opened.append(connection)

    def read_something() -> bool:
        return selectors.run_exists("run_none")

    # An earlier test's call on this thread may have left its connection open: start from none.
    await sync_to_async(connections.close_all)()
    connection_created.connect(note)
    try:
        # As the tests' own settings (and PostgreSQL's pool): each read lets its connection go.
        for _ in range(3):
            await hub.read(read_something)
        assert len(opened) == 3
        # As settings that keep connections (SQLite, or PostgreSQL without the pool): one a thread, not one a read.
        monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 600)
        for _ in range(3):
            await hub.read(read_something)
        assert len(opened) == 4
    finally:
        connection_created.disconnect(note)
