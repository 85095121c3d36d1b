"""The web process's sync lane: a sync view's request is handled whole on one long-lived pool thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core import signals

from agents import services
from dashboard.threaded import ThreadedSyncViews
from tests.support.asgi import http_scope

pytestmark = pytest.mark.django_db(transaction=True)  # the pool's threads have connections of their own


@pytest.fixture
def threads_seen() -> Iterator[list[tuple[str, str]]]:
    """Record on which thread each request starts and finishes."""
    seen: list[tuple[str, str]] = []

    def started(**kwargs: Any) -> None:
        seen.append(("started", threading.current_thread().name))

    def finished(**kwargs: Any) -> None:
        seen.append(("finished", threading.current_thread().name))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        yield seen
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)


async def _get(app: ThreadedSyncViews, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    scope = http_scope(path, headers)
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=10)
    body = b""
    while True:
        message = await communicator.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=10)
    return start["status"], body


def _token(username: str) -> list[tuple[bytes, bytes]]:
    services.user_create(username=username, role="reviewer")
    return [(b"authorization", f"Bearer {services.token_create(username=username)[1]}".encode())]


async def test_it_serves_a_sync_views_request_start_to_finish_on_one_pool_thread(
    threads_seen: list[tuple[str, str]],
) -> None:
    from asgiref.sync import sync_to_async

    headers = await sync_to_async(_token)("dora")
    app = ThreadedSyncViews(threads=1)
    for _ in range(2):
        status, body = await _get(app, "/api/approvals", headers)
        assert status == 200, body
        assert json.loads(body)["items"] == []
    assert [event for event, _ in threads_seen] == ["started", "finished", "started", "finished"]
    names = {name for _, name in threads_seen}
    assert len(names) == 1 and names.pop().startswith("web"), threads_seen  # one thread, kept between requests


async def test_it_leaves_async_views_to_djangos_own_handling(threads_seen: list[tuple[str, str]]) -> None:
    from asgiref.sync import sync_to_async

    headers = await sync_to_async(_token)("erin")
    status, _ = await _get(ThreadedSyncViews(threads=1), "/api/runs/run_nope/events", headers)  # an async view
    assert status == 404
    assert threads_seen and not any(name.startswith("web") for _, name in threads_seen), threads_seen


async def test_it_serves_every_view_djangos_way_with_no_threads(threads_seen: list[tuple[str, str]]) -> None:
    status, _ = await _get(ThreadedSyncViews(threads=0), "/healthz", [])
    assert status == 200
    assert threads_seen and not any(name.startswith("web") for _, name in threads_seen), threads_seen


def _session_cookie(username: str) -> list[tuple[bytes, bytes]]:
    from django.conf import settings
    from django.test import Client

    user, _ = services.user_create(username=username, role="admin")
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode())]


async def test_it_sends_a_sync_views_streamed_answer_from_the_event_loop(threads_seen: list[tuple[str, str]]) -> None:
    from asgiref.sync import sync_to_async

    headers = await sync_to_async(_session_cookie)("fred")
    status, body = await _get(ThreadedSyncViews(threads=1), "/audit.csv", headers)
    assert status == 200, body[:300]
    assert body.decode().splitlines()[0].startswith("created_at,actor,")  # the header row, then the rows
    assert threads_seen[0][1].startswith("web"), threads_seen  # the view ran on the pool; its rows were streamed
