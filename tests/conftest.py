"""Shared fixtures: a real Redis, named users, real Celery worker processes (with beat)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.db import OperationalError, connection

from agents import services
from dashboard import processes
from tests.support.processes import ROOT, Worker
from tests.support.receiver import Receiver

# The `fake_openai` fixture: a real local OpenAI-compatible server in place of a model.
pytest_plugins = ["tests.support.fake_openai"]


class RedisControl:
    """The test run's own redis-server, which a test may stop and start again."""

    def __init__(self, sock: Path, workdir: Path) -> None:
        self.sock, self.workdir = sock, workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        processes.stop(self.sock)  # a leftover from an interrupted run
        self.process = processes.start(self.sock, workdir=self.workdir, daemonize=False)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            client.flushall()
        finally:
            client.close()


@pytest.fixture(scope="session", autouse=True)
def _empty_tables_by_delete() -> Iterator[None]:
    """Empty PostgreSQL's tables after a transactional test with DELETE, not Django's TRUNCATE.

    TRUNCATE gives each of the ~40 tables (and its indexes) new files: about 0.15 s after each
    such test, where DELETE of their few rows takes milliseconds. The foreign keys Django
    creates are deferred to the flush's commit (one transaction), so the order of the tables
    does not matter.
    A test asking for its sequences reset still gets TRUNCATE … RESTART IDENTITY.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations
    from psycopg.errors import DeadlockDetected

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations, style: Any, tables: Any, *, reset_sequences: bool = False, allow_cascade: bool = False
    ) -> list[str]:
        if reset_sequences:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        names = [self.quote_name(table) for table in tables]
        # Locked first, as TRUNCATE locks them: row by row, a DELETE deadlocked with a server
        # process of the test still updating a run, and the flush failed, leaving the rows.
        return [f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE;", *(f"DELETE FROM {name};" for name in names)]

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        # The tables are locked one after the other, as TRUNCATE locks them: a request of the
        # test's live server still reading two of them can hold one and wait for another, and
        # PostgreSQL then ends the flush as a deadlock's loser. Its transaction rolled back;
        # once the request is over, the same flush goes through.
        for attempt in range(_FLUSH_ATTEMPTS):
            try:
                return flush(self, sql_list)
            except OperationalError as exc:
                if not isinstance(exc.__cause__, DeadlockDetected) or attempt == _FLUSH_ATTEMPTS - 1:
                    raise
                time.sleep(0.2)

    flush = DatabaseOperations.execute_sql_flush
    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    DatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]
    yield
    DatabaseOperations.sql_flush = truncate  # type: ignore[method-assign]
    DatabaseOperations.execute_sql_flush = flush  # type: ignore[method-assign]


_FLUSH_ATTEMPTS = 5


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's var/ folder (with pytest-xdist, the controller's, which holds the workers')."""
    if not hasattr(config, "workerinput") and settings.configured:
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _end_sessions_left_open(
    redis_server: RedisControl, django_db_setup: None, django_db_blocker: Any
) -> Iterator[None]:
    """Before the test database is dropped, end the sessions of processes the tests killed.

    PostgreSQL notices a killed daphne's or worker's closed socket a moment later; a DROP
    DATABASE in that moment failed ("being accessed by other users") and left it behind.
    `redis_server` first: it is torn down last, and removes the var folder that holds SQLite's
    test database, which must still be there when the database is torn down.
    """
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisControl]:
    control = RedisControl(processes.socket_path(settings.VAR_DIR), settings.VAR_DIR)
    control.start()
    yield control
    control.stop()
    shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """A client of the test Redis, the Celery broker (tests.support.broker reads its messages)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def chat() -> Iterator[Receiver]:
    """A local server standing for Slack: its incoming webhook and the response_url of a press."""
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _redis(redis_server: RedisControl) -> RedisControl:
    """Every test gets a running, empty Redis (a test that stopped it gets it back).

    Empty: tasks that earlier tests queued with no worker running would otherwise reach the
    next test's worker, which then holds them unacknowledged (a "Redis lost" test's worker
    dies on closing such a channel, in kombu's restore of unacknowledged messages).
    """
    if not processes.is_up(redis_server.sock):
        redis_server.start()
    redis_server.flush()  # Django's cache too: no limit an earlier test reached
    caches["local"].clear()
    return redis_server


@pytest.fixture
def alice(db):  # noqa: ANN001, ANN201
    user, _ = services.user_create(username="alice", role="reviewer", password="alice-password")
    return user


@pytest.fixture
def bob(db):  # noqa: ANN001, ANN201
    user, _ = services.user_create(username="bob", role="reviewer", password="bob-password")
    return user


@pytest.fixture
def carol(db):  # noqa: ANN001, ANN201
    user, _ = services.user_create(username="carol", role="admin", password="carol-password")
    return user


def database_url() -> str:
    """Return a DATABASE_URL naming the test database, for processes the tests start."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """Return the environment for a worker or CLI process of this test run."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        PYTHONPATH=str(ROOT),
        AGENTFAST_LEASE_SECONDS="2",
        AGENTFAST_SWEEP_SECONDS="0.5",
        AGENTFAST_SWEEP_GRACE_SECONDS="1",
        PYTHONUNBUFFERED="1",
        AGENTFAST_WEB_THREADS="4",
    )
    env.update(extra)
    return env


@pytest.fixture
def start_worker(
    transactional_db,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Worker]]:
    """Start real worker processes against the test database; all are stopped afterwards."""
    if not any(request.node.get_closest_marker(name) for name in ("integration", "browser")):
        # `make test-fast` deselects by these markers; an unmarked worker test would slip in.
        pytest.fail("a test that starts workers is marked integration (or browser)")
    workers: list[Worker] = []

    def start(**env: str) -> Worker:
        worker = Worker(log=tmp_path / f"worker{len(workers)}.log", env=child_env(**env), beat=True)
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    # SIGKILL rather than a warm shutdown, which takes about 2 s per worker for nothing the
    # test checks: the test is over. Killed, a worker also cannot hand messages it holds back
    # to the queue for a later test's worker.
    for worker in workers:
        worker.kill()


def wait_for(predicate: Callable[[], object], *, timeout: float = 30, what: str = "condition") -> object:
    """Poll until predicate() is truthy; fail the test with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def agent_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Point the engine at a config file with the given YAML text; return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "agentfast.yaml"
        path.write_text(text)
        monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
        return path

    return write
