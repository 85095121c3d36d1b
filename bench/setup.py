"""What the bench needs before and around Django: env, a fresh database, Redis, a worker.

Nothing here imports Django (prepare() runs before django.setup()).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from dashboard import processes as embedded_redis
from tests.support.processes import CliServe, Daphne, ServerProcess, Worker

ROOT = Path(__file__).resolve().parent.parent
VAR_DIR = ROOT / "var" / "bench"
AGENT = "bench"
PROMPT = "Email bob@example.com that his refund is on its way"

# One agent, one tool, gated and suspending: the demo model calls send_email at once.
CONFIG = """\
# Written by `python -m bench`; overwritten on every run.
agents:
  bench:
    description: Benchmark agent (one gated tool call, no lookups).
    model: demo
    system_prompt: You are a customer-support agent.
    tools: [send_email]
    max_steps: 10
tool_overrides:
  send_email: {risk: high, hitl_mode: suspend}
"""


class BenchError(RuntimeError):
    """The bench cannot run, or the engine did not do what the flow expects."""


@dataclass(frozen=True)
class Target:
    engine: str  # "sqlite" or "postgresql"
    label: str  # where the data lives, for the report
    database_url: str | None  # what DATABASE_URL the worker gets (None: the settings default)


def prepare(*, fresh: bool = True) -> Target:
    """Set the environment Django will read and create a fresh bench database (or keep the one there: fresh=False)."""
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    config = VAR_DIR / "bench.yaml"
    config.write_text(CONFIG)
    os.environ["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    os.environ["AGENTFAST_VAR_DIR"] = str(VAR_DIR)
    os.environ["AGENTFAST_CONFIG"] = str(config)
    os.environ.pop("REDIS_URL", None)  # the bench's own embedded Redis, never a shared one
    os.environ.pop("AGENTFAST_TOOL_MODULES", None)
    # Production-like: no connection.queries bookkeeping on every statement.
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("AGENTFAST_LOG_LEVEL", "WARNING")
    url = os.environ.get("DATABASE_URL")
    if not url:
        path = VAR_DIR / "agentfast.sqlite3"
        if fresh:
            _remove_sqlite(path)
        return Target("sqlite", _relative(path), None)
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = Path(unquote(parts.path))
        _require_bench_name(path.name, url)
        if fresh:
            _remove_sqlite(path)
        return Target("sqlite", _relative(path), url)
    if parts.scheme in {"postgres", "postgresql"}:
        name = unquote(parts.path.lstrip("/"))
        _require_bench_name(name, url)
        if fresh:
            _recreate_postgres(parts, name)
        where = f"{name} @ {parts.hostname or 'localhost'}:{parts.port or 5432}"
        return Target("postgresql", where, url)
    raise BenchError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (use postgres:// or sqlite://)")


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _require_bench_name(name: str, url: str) -> None:
    # The bench deletes its database first: never let it near a database of other use.
    if "bench" not in name.lower():
        raise BenchError(
            f"refusing to recreate {name!r} from DATABASE_URL={url}: the bench drops its database "
            "first, so its name must contain 'bench' (e.g. postgres://postgres@127.0.0.1:5432/agentfast_bench)"
        )


def recreate_postgres(url: str) -> None:
    """Drop and create the Postgres database of `url` (its name must contain "bench")."""
    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    _require_bench_name(name, url)
    _recreate_postgres(parts, name)


def _remove_sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _recreate_postgres(parts, name: str) -> None:  # noqa: ANN001
    import psycopg
    from psycopg import sql

    params = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5432,
        "user": unquote(parts.username or "postgres"),
        "dbname": "postgres",
        "autocommit": True,
        "connect_timeout": 5,
    }
    if parts.password:
        params["password"] = unquote(parts.password)
    try:
        with psycopg.connect(**params) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BenchError(f"cannot recreate the PostgreSQL database {name!r}: {exc}") from None


# -- Redis --------------------------------------------------------------------------


def run(body: Callable[..., int], *args: object) -> int:
    """Run a bench's main part, `body(*args)`, and return its exit status.

    A SIGTERM unwinds it through its finally blocks, a BenchError ends it with one line and
    status 1, and whatever way it ends, every worker and Redis this process started stops.
    """
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return body(*args)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_workers()
        stop_redis()


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


_redis: list[subprocess.Popen[bytes]] = []


def start_redis() -> subprocess.Popen[bytes]:
    """Start a private redis-server on var/bench's socket; `run` (or stop_redis) stops it."""
    sock = embedded_redis.socket_path(VAR_DIR)
    embedded_redis.stop(sock)  # a leftover of an interrupted bench
    process = embedded_redis.start(sock, workdir=VAR_DIR, daemonize=False)
    if process is None:
        raise BenchError(f"a Redis still answers on {sock}; stop it first")
    _redis.append(process)
    return process


def stop_redis() -> None:
    """Stop every Redis this process started."""
    while _redis:
        process = _redis.pop()
        if process.poll() is not None:
            continue
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


# -- the Celery worker --------------------------------------------------------------

_workers: list[Worker] = []


class ThreadsWorker(Worker):
    """`celery worker --pool=threads --concurrency=N`, as `agentfast worker` starts it."""

    def __init__(self, *, log: Path, env: dict[str, str], concurrency: int) -> None:
        args = [
            *(sys.executable, "-m", "celery", "-A", "dashboard", "worker", "--loglevel=INFO"),
            *("--pool=threads", f"--concurrency={concurrency}"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
        ServerProcess.__init__(self, args, log=log, env=env)
        self.start()


def start_worker(log_path: Path, *, concurrency: int = 1) -> Worker:
    """Start a real celery worker on the bench DB and Redis (solo pool, or `concurrency` threads); remember it."""
    # prepare() already put the bench's settings, database and config in os.environ.
    env = dict(os.environ)
    worker = (
        Worker(log=log_path, env=env)
        if concurrency == 1
        else ThreadsWorker(log=log_path, env=env, concurrency=concurrency)
    )
    _workers.append(worker)
    try:
        worker.wait_ready(timeout=60)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    return worker


class CliWorker(Worker):
    """`agentfast worker` as `make run` and the Procfile start it: its default pool, threads and log level.

    Only a node name (two on one machine must differ) is added; `env` says which database,
    Redis and var/ folder. At `make run`'s log level the log has no "ready." line, and logging
    every task at INFO would cost the worker CPU `make run`'s does not spend: the worker is
    ready once it answers a ping.
    """

    def __init__(self, *, log: Path, env: dict[str, str], name: str, extra: tuple[str, ...] = ()) -> None:
        self.node = f"{name}@{socket.gethostname()}"
        args = [sys.executable, "-m", "dashboard.cli", "worker", "-n", self.node, *extra]
        ServerProcess.__init__(self, args, log=log, env=env)
        self.start()

    def is_ready(self) -> bool:
        from dashboard.celery import app  # Django is set up by the time a worker starts

        return bool(app.control.ping(destination=[self.node], timeout=0.5))


def start_cli_worker(log_path: Path, *, name: str, extra: tuple[str, ...] = (), **env: str) -> Worker:
    """Start `agentfast worker` on the bench's settings (plus `env`); remember it."""
    worker = CliWorker(log=log_path, env={**os.environ, **env}, name=name, extra=extra)
    _workers.append(worker)
    try:
        worker.wait_ready(timeout=90)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    return worker


def start_cli_serve(log_path: Path, **env: str) -> Daphne:
    """Start `agentfast serve`, the web process `make run` starts, on the bench DB and Redis."""
    return _serve(CliServe(log=log_path, env={**os.environ, **env}))


def start_daphne(log_path: Path, **env: str) -> Daphne:
    """Start the one web process on the bench DB and Redis, on a free port."""
    return _serve(Daphne(log=log_path, env={**os.environ, **env}))


def _serve(server: Daphne) -> Daphne:
    server.start()
    try:
        server.wait_ready()
    except RuntimeError as exc:
        server.stop()
        raise BenchError(str(exc)) from None
    return server


def stop_workers() -> None:
    """Stop every worker this process started (the bench's last line of defence)."""
    for worker in list(_workers):
        worker.stop()


@contextmanager
def django_migrated(target: Target) -> Iterator[None]:
    """Set Django up on the bench database and migrate it; close every connection at the end."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    print(f"bench: migrating the {target.engine} database ({target.label})", file=sys.stderr, flush=True)
    call_command("migrate", verbosity=0, interactive=False)
    try:
        yield
    finally:
        connections.close_all()
