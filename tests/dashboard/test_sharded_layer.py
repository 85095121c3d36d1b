"""Live pushes with two Redis hosts: Channels shards groups across them, and no event is lost.

Two real redis-servers; the test process (which publishes, and holds the websockets) and a
real daphne (which serves the SSE streams) both use them as the channel layer's hosts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from agents import events, services
from agents.models import Run
from dashboard import processes as embedded_redis
from dashboard.asgi import application
from tests.conftest import child_env
from tests.support.processes import Daphne

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def second_redis(tmp_path: Path) -> Iterator[str]:
    sock = embedded_redis.socket_path(tmp_path / "redis2")
    process = embedded_redis.start(sock, workdir=tmp_path / "redis2", daemonize=False)
    assert process is not None
    yield embedded_redis.url(sock)
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def two_hosts(settings, second_redis: str) -> list[str]:
    """Make both Redis servers the channel layer's hosts, here and in a daphne; return their URLs."""
    hosts = [settings.REDIS_URL, second_redis]
    layer = {**settings.CHANNEL_LAYERS["default"], "CONFIG": {"hosts": [{"address": url} for url in hosts]}}
    settings.CHANNEL_LAYERS = {"default": layer}  # channels drops its cached layer on the change
    return hosts


@pytest.fixture
def daphne(two_hosts: list[str], tmp_path: Path) -> Iterator[Daphne]:
    server = Daphne(log=tmp_path / "daphne.log", env=child_env(AGENTFAST_CHANNEL_HOSTS=two_hosts[1]))
    server.start()
    server.wait_ready()
    yield server
    server.stop()


def _host_of(group: str, hosts: list[str]) -> int | None:
    """Return which Redis holds the subscription of a group (what a viewer's join made)."""
    for index, url in enumerate(hosts):
        if any(group.encode() in channel for channel in redis.Redis.from_url(url).pubsub_channels()):
            return index
    return None


def _cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_it_delivers_events_of_groups_on_either_host_to_websockets_and_streams(
    alice: User, two_hosts: list[str], daphne: Daphne
) -> None:
    token = (await database_sync_to_async(services.token_create)(username="alice"))[1]
    cookie = await database_sync_to_async(_cookie)(alice)
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    found: dict[int, tuple[Run, WebsocketCommunicator]] = {}
    for _ in range(40):  # groups hash to hosts: open timelines until each host holds one
        run = await database_sync_to_async(services.run_create)(agent="support", input="hi", enqueue=False)
        socket = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)
        assert (await socket.connect(timeout=5))[0]
        host = _host_of(events.run_group(run.id), two_hosts)
        if host is None or host in found:
            await socket.disconnect()
            continue
        found[host] = (run, socket)
        if len(found) == 2:
            break
    assert set(found) == {0, 1}

    async with httpx.AsyncClient(timeout=10) as client:
        for run, socket in found.values():
            url = f"{daphne.url}/api/runs/{run.id}/events"
            sse_headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
            async with client.stream("GET", url, headers=sse_headers) as response:
                lines = response.aiter_lines()
                assert await anext(lines) == ": live"
                await database_sync_to_async(events.publish)(run_id=run.id, type="message", data={"content": "hi"})
                pushed = await socket.receive_from(timeout=5)
                assert 'class="event type-message"' in pushed
                frame = [await anext(lines)]
                while not frame[-1].startswith("data: "):
                    frame.append(await anext(lines))
                assert "id: 1" in frame and "event: message" in frame
                assert json.loads(frame[-1].removeprefix("data: "))["data"] == {"content": "hi"}
            await socket.disconnect()
