"""The driver and a database that drops its connections (a restart, a failover, an idle timeout).

PostgreSQL only: the pool of connections is what keeps a dead one. Nothing is mocked: the
server really ends every session of the test database while the model thinks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from asgiref.sync import SyncToAsync
from django.db import connection, connections

from agents import services
from agents.models import Run
from agents.runtime import drive
from agents.runtime.driver import _DATABASE_RETRY_PAUSES
from tests.support.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the connection pool is PostgreSQL's")


def _end_every_session() -> int:
    """End every session of the test database from a connection of our own, as a restart would."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    with psycopg.connect(**{k: v for k, v in params.items() if v not in (None, "")}, autocommit=True) as own:
        rows = own.execute(f"SELECT pg_terminate_backend(pid) {others}").fetchall()
        # pg_terminate_backend only signals: wait until the sessions are gone, as after a restart
        # (a busy machine could otherwise answer the driver's next check before its session ends).
        deadline = time.monotonic() + 10
        while own.execute(f"SELECT count(*) {others}").fetchone() != (0,) and time.monotonic() < deadline:
            time.sleep(0.01)
    return len(rows)


@pytest.fixture(autouse=True)
def _no_ended_connection_left() -> Iterator[None]:
    """Let later tests in this process find no connection these tests' database restart ended.

    The thread that runs this process's thread-sensitive sync_to_async calls keeps its connection
    from one async test to the next (no request ends there): a later test read through the ended
    one ("terminating connection due to administrator command"). It is closed, and the pool
    drops what ended, once the test is over: not before, which would spare the driver the failure
    under test.
    """
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)
    connection.pool.check()


@pytest.fixture
def support(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    settings.OPENAI_MAX_RETRIES = 0
    config = {
        "agents": {
            "support": {"model": "openai:test-model", "base_url": fake_openai.base_url, "tools": ["lookup_order"]}
        }
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
    return fake_openai


def test_it_finishes_a_run_when_the_database_dropped_every_connection_while_the_model_thought(
    transactional_db: None, support: FakeOpenAI
) -> None:
    ended: list[int] = []

    def respond(body: dict[str, Any]) -> Reply:
        if not ended:  # once: a restart, not a database that stays down
            ended.append(_end_every_session())
        return Reply(content="Order A1001 was delivered.")

    support.script(respond)
    run_id = services.run_create(agent="support", input="Where is order A1001?", enqueue=False).id

    result = drive(run_id)

    run = Run.objects.get(pk=run_id)
    assert ended and ended[0] >= 1  # the pool's connections were really ended
    assert (result.status, run.status, run.error) == ("completed", "completed", "")
    assert run.output == "Order A1001 was delivered."


def test_it_finishes_a_run_when_the_pool_held_more_ended_connections_than_it_retries(
    transactional_db: None, support: FakeOpenAI
) -> None:
    """A restart ends every idle connection of the pool: each retry must not take the next dead one."""
    pool = connection.pool
    idle = [pool.getconn() for _ in range(len(_DATABASE_RETRY_PAUSES) + 3)]
    for held in idle:
        pool.putconn(held)
    ended: list[int] = []

    def respond(body: dict[str, Any]) -> Reply:
        if not ended:
            ended.append(_end_every_session())
        return Reply(content="Order A1001 was delivered.")

    support.script(respond)
    run_id = services.run_create(agent="support", input="Where is order A1001?", enqueue=False).id

    result = drive(run_id)

    assert ended and ended[0] > len(_DATABASE_RETRY_PAUSES)  # more ended than the driver retries
    assert (result.status, Run.objects.get(pk=run_id).status) == ("completed", "completed")
