"""`python -m bench.watchers`: many open inboxes on one web process, and how fast a new card reaches them.

One daphne process, started as `agentfast serve` starts it, a real Celery worker that
drives runs until they pause, and a private Redis. This process is the client: it signs in
--users reviewers (one session each, made through Django's session engine; an SSE client
gets a bearer token each), opens --connections live channels spread evenly over them, with
the site's own Origin, on one asyncio loop, then pauses --pauses runs one at a time.

  connect            how long the N handshakes took (--concurrency at a time)
  RSS / connection   the web process's resident memory after opening them, minus before, / N
  pause → frame      for each connection and each pause: from the Approval row's created_at
                     (its INSERT inside the suspending transaction, so a moment before the
                     commit: the figure errs high) to the frame naming that approval read by
                     this process. A connection that has not read it --timeout s later is missed.

Both ends raise their open-file limit to the hard limit first (one descriptor a connection).
The client shares the machine's CPUs with the server and the worker: its own CPU time is
printed too, since on a small machine it is part of the delay measured. So by default
(--client raw) each connection is a bare asyncio protocol that notes the time its bytes
arrive and searches them for approval ids, answering the server's pings; --client library
reads through the websockets and httpx clients instead (a frame parsed into a message, an
SSE stream into lines, and an httpx client per stream), which costs this process several
times the CPU per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import setup
from dashboard.processes import raise_open_files_limit
from tests.support.processes import Daphne

VAR_DIR = setup.ROOT / "var" / "bench-watchers"
CALL_ID = "call_1_1"  # the demo model's first call: the bench agent's send_email
WS_CARD = re.compile(r'data-approval="([^"]+)"')
TRIES = 3  # a refused or timed-out handshake is tried again, twice
SSE_CARD = re.compile(r'"event":"approval_required","data":\{[^\n]*?"approval_id":"([^"]+)"')
WS_CARD_BYTES = re.compile(WS_CARD.pattern.encode())
SSE_CARD_BYTES = re.compile(SSE_CARD.pattern.encode())


@dataclass
class Results:
    transport: str
    connections: int = 0
    users: int = 0
    refused: int = 0
    retries: int = 0
    connect_seconds: float = 0.0
    handshake_ms: list[float] = field(default_factory=list)
    rss_before: int = 0
    rss_after: int = 0
    delays_ms: list[float] = field(default_factory=list)
    received: int = 0
    missed: int = 0
    pauses: int = 0
    client_cpu_seconds: float = 0.0
    server_cpu_seconds: float = 0.0
    loads: list[float] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.watchers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=5000, help="live channels to open (default 5000)")
    parser.add_argument(
        "--per-user", type=int, default=20, help="connections per reviewer (default 20, the per-user stream cap)"
    )
    parser.add_argument("--pauses", type=int, default=20, help="runs paused one at a time, each timed (default 20)")
    parser.add_argument("--transport", choices=("ws", "sse"), default="ws", help="websocket inbox or SSE /api/events")
    parser.add_argument("--concurrency", type=int, default=50, help="handshakes in flight at once (default 50)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds after a pause a frame counts as missed")
    parser.add_argument(
        "--client",
        choices=("raw", "library"),
        default="raw",
        help="raw: read each connection's bytes as they arrive and search them (the default: the client's "
        "own CPU per frame stays small); library: the websockets and httpx clients, parsing every frame",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.connections < 1 or args.per_user < 1 or args.pauses < 1 or args.concurrency < 1:
        parser.error("--connections, --per-user, --pauses and --concurrency must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    limit = raise_open_files_limit()  # this process, and the web process it starts
    if limit < args.connections + 200:
        print(f"bench: the open-file limit is {limit}: too low for {args.connections} connections", file=sys.stderr)
        return 1
    setup.VAR_DIR = VAR_DIR  # its own folder: other benches may run at the same time
    return setup.run(_main, args)


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    setup.start_redis()
    users = _django(target, args)
    server = setup.start_cli_serve(VAR_DIR / "watchers-daphne.log", DJANGO_ALLOWED_HOSTS="127.0.0.1")
    try:
        results = asyncio.run(_measure(args, server, users))
    finally:
        server.stop()
    print(json.dumps(_summary(results, target, args), indent=2) if args.json else _report(results, target, args))
    return 0 if results.refused == 0 else 1


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# -- the reviewers -----------------------------------------------------------------------


def _django(target: setup.Target, args: argparse.Namespace) -> list[str]:
    """Migrate, start the worker, and return one credential per reviewer (session key or token)."""
    import django

    django.setup()
    from django.core.management import call_command

    _progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    count = math.ceil(args.connections / args.per_user)
    _progress(f"signing in {count} reviewers")
    credentials = _reviewers(count, sse=args.transport == "sse")
    _progress("starting a Celery worker")
    setup.start_worker(VAR_DIR / "watchers-worker.log")
    return credentials


def _reviewers(count: int, *, sse: bool) -> list[str]:
    """Create `count` reviewers and sign each in once: a session key each, or a bearer token."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.hashers import make_password
    from django.contrib.auth.models import User

    from agents import services
    from agents.services.users import role_groups_ensure

    reviewers = role_groups_ensure()["reviewer"]
    # One password hash shared by all (hashing is slow on purpose); nobody signs in with it.
    password = make_password(None)
    users = User.objects.bulk_create(User(username=f"watcher-{index:05d}", password=password) for index in range(count))
    users = list(User.objects.filter(username__startswith="watcher-").order_by("username"))
    reviewers.user_set.add(*users)
    if sse:
        return [services.token_create(username=user.username, name="bench")[1] for user in users]
    store = import_module(settings.SESSION_ENGINE).SessionStore
    keys = []
    for user in users:
        session = store()
        session[SESSION_KEY] = str(user.pk)
        # The backend a password sign-in ends at (the first ones only refuse): a session naming a
        # backend the settings no longer list is anonymous.
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[-1]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        keys.append(session.session_key)
    return keys


# -- the measurement ---------------------------------------------------------------------


class Watchers:
    """N open connections; notes when each read the frame of each approval."""

    def __init__(self, url: str, credentials: list[str], *, transport: str, count: int, client: str = "raw") -> None:
        self.url, self.credentials, self.transport, self.count = url, credentials, transport, count
        self.client = client
        self.seen: dict[str, dict[int, float]] = {}
        self.open = 0
        self.retries = 0
        self.refused: list[str] = []
        self.handshake_ms: list[float] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.ready: dict[int, asyncio.Event] = {}

    async def open_all(self, concurrency: int) -> None:
        gate = asyncio.Semaphore(concurrency)
        for index in range(self.count):
            self.ready[index] = asyncio.Event()
            self.tasks.append(asyncio.create_task(self._watch(index, gate)))
        await asyncio.gather(*(event.wait() for event in self.ready.values()))

    async def close_all(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _note(self, index: int, text: str, pattern: re.Pattern[str]) -> None:
        now = time.time()
        for approval_id in pattern.findall(text):
            self.seen.setdefault(approval_id, {}).setdefault(index, now)

    async def _watch(self, index: int, gate: asyncio.Semaphore) -> None:
        credential = self.credentials[index % len(self.credentials)]
        for attempt in range(1, TRIES + 1):
            try:
                async with gate:
                    started = time.perf_counter()
                    opened = await self._open(credential)
                    self.handshake_ms.append((time.perf_counter() - started) * 1000)
                break
            except Exception as exc:  # noqa: BLE001 — counted and reported, the bench goes on
                if attempt == TRIES:
                    self.refused.append(f"{type(exc).__name__}: {exc}")
                    self.ready[index].set()
                    return
                self.retries += 1  # as a browser's inbox reconnects, after a moment
                await asyncio.sleep(attempt)
        self.open += 1
        self.ready[index].set()
        try:
            await opened(index)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.refused.append(f"closed: {type(exc).__name__}: {exc}")

    def _open(self, credential: str) -> Any:
        if self.client == "raw":
            return self._raw(credential)
        return self._ws(credential) if self.transport == "ws" else self._sse(credential)

    async def _raw(self, credential: str) -> Any:
        """Open one connection over a bare asyncio protocol; return the coroutine that reads it until closed."""
        from django.conf import settings

        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        if self.transport == "ws":
            key = base64.b64encode(os.urandom(16)).decode()
            head = {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": key,
                "Sec-WebSocket-Version": "13",
                "Origin": self.url,
                "Cookie": f"{settings.SESSION_COOKIE_NAME}={credential}",
            }
            path, ready = "/ws/inbox/", b"HTTP/1.1 101"
        else:
            head = {"Accept": "text/event-stream", "Authorization": f"Bearer {credential}"}
            path, ready = "/api/events", b": live"
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
        loop = asyncio.get_running_loop()
        transport, reader = await loop.create_connection(
            lambda: _RawReader(self, self.transport, ready), host, int(port)
        )
        transport.write((request + "\r\n").encode())
        try:
            await asyncio.wait_for(asyncio.shield(reader.opened), 60)
        except BaseException:
            transport.close()
            raise

        async def read(index: int) -> None:
            reader.index = index
            try:
                await reader.closed
            finally:
                transport.close()

        return read

    async def _ws(self, session_key: str) -> Any:
        import websockets
        from django.conf import settings

        socket = await websockets.connect(
            self.url.replace("http://", "ws://") + "/ws/inbox/",
            additional_headers={"Origin": self.url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={session_key}"},
            ping_interval=None,  # the server pings; the client only answers
            open_timeout=60,
            max_size=None,
            compression=None,
        )

        async def read(index: int) -> None:
            try:
                async for message in socket:
                    self._note(index, message if isinstance(message, str) else message.decode(), WS_CARD)
            finally:
                await socket.close()

        return read

    async def _sse(self, token: str) -> Any:
        import httpx

        client = httpx.AsyncClient(timeout=httpx.Timeout(60, read=None))
        request = client.build_request(
            "GET", self.url + "/api/events", headers={"Accept": "text/event-stream", "Authorization": f"Bearer {token}"}
        )
        response = await client.send(request, stream=True)
        if response.status_code != 200:
            body = await response.aread()
            await client.aclose()
            raise RuntimeError(f"{response.status_code} {body[:200]!r}")
        lines = response.aiter_lines()
        async for line in lines:  # the stream is live once it says so: nothing is missed after
            if line == ": live":
                break

        async def read(index: int) -> None:
            try:
                async for line in lines:
                    if line.startswith("data: "):
                        self._note(index, line, SSE_CARD)
            finally:
                await response.aclose()
                await client.aclose()

        return read


class _RawReader(asyncio.Protocol):
    """One connection's bytes, searched for approval ids the moment they arrive.

    A websocket's frames are split by their headers only (the server sends them unmasked and
    whole), its pings answered; an SSE stream's chunks are searched as they come, keeping
    what follows the last complete frame for the next read.
    """

    def __init__(self, watchers: Watchers, transport: str, ready: bytes) -> None:
        self.watchers, self.kind, self.ready = watchers, transport, ready
        self.index = -1
        self.buffer = bytearray()
        self.head_done = False
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.closed):
            if not future.done():
                future.set_exception(ConnectionError(f"closed: {exc or 'by the server'}"))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self.buffer += data
        if not self.head_done and not self._head():
            return
        found = self._frames() if self.kind == "ws" else self._events()
        if found and self.index >= 0:
            seen = self.watchers.seen
            for approval_id in found:
                seen.setdefault(approval_id.decode(), {}).setdefault(self.index, now)

    def _head(self) -> bool:
        """Wait for the response head (and, on SSE, `: live`); refuse anything but a success."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        status = bytes(self.buffer[: self.buffer.find(b"\r\n")])
        if not status.startswith(b"HTTP/1.1 101" if self.kind == "ws" else b"HTTP/1.1 200"):
            self.opened.set_exception(
                RuntimeError(f"{status.decode('latin1')} {bytes(self.buffer[end : end + 200])!r}")
            )
            self.transport.close()  # type: ignore[union-attr]
            return False
        cut = end + 4
        if self.kind == "sse":
            live = self.buffer.find(b": live\n\n", end)
            if live < 0:
                return False
            cut = live + len(b": live\n\n")
        self.head_done = True
        del self.buffer[:cut]
        self.opened.set_result(None)
        return True

    def _frames(self) -> list[bytes]:
        found: list[bytes] = []
        buffer = self.buffer
        while len(buffer) >= 2:
            opcode, length, start = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length == 126:
                length, start = int.from_bytes(buffer[2:4]), 4
            elif length == 127:
                length, start = int.from_bytes(buffer[2:10]), 10
            if len(buffer) < start + length:
                break
            if opcode in (0x0, 0x1):
                found += WS_CARD_BYTES.findall(buffer, start, start + length)
            elif opcode == 0x9:  # a ping: answer it, masked as a client must
                self._send(0xA, bytes(buffer[start : start + length]))
            elif opcode == 0x8:
                self.transport.close()  # type: ignore[union-attr]
            del buffer[: start + length]
        return found

    def _events(self) -> list[bytes]:
        end = self.buffer.rfind(b"\n\n")
        if end < 0:
            return []
        found = SSE_CARD_BYTES.findall(self.buffer, 0, end)
        del self.buffer[: end + 2]
        return found

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(byte ^ mask[offset % 4] for offset, byte in enumerate(payload))
        self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)  # type: ignore[union-attr]


async def _measure(args: argparse.Namespace, server: Daphne, credentials: list[str]) -> Results:
    import psutil

    results = Results(transport=args.transport, users=len(credentials), pauses=args.pauses)
    web = psutil.Process(server.process.pid)  # type: ignore[union-attr]
    me = psutil.Process()
    watchers = Watchers(server.url, credentials, transport=args.transport, count=args.connections, client=args.client)
    await _pause_one(args, watchers, warmup=True)  # the first push pays for imports and templates
    results.rss_before = web.memory_info().rss
    _progress(f"opening {args.connections} {args.transport} connections as {len(credentials)} reviewers")
    started = time.perf_counter()
    await watchers.open_all(args.concurrency)
    results.connect_seconds = time.perf_counter() - started
    results.connections, results.handshake_ms = watchers.open, watchers.handshake_ms
    results.refused, results.retries = len(watchers.refused), watchers.retries
    if watchers.refused:
        _progress(f"{len(watchers.refused)} refused, e.g. {watchers.refused[0]}")
    await asyncio.sleep(2)  # let the server settle (group joins) before weighing it
    results.rss_after = web.memory_info().rss
    _progress(f"pausing {args.pauses} runs, one at a time")
    client_cpu, server_cpu = _cpu(me), _cpu(web)
    for _ in range(args.pauses):
        results.loads.append(os.getloadavg()[0])
        delays, missed = await _pause_one(args, watchers)
        results.delays_ms += delays
        results.received += len(delays)
        results.missed += missed
    results.client_cpu_seconds, results.server_cpu_seconds = _cpu(me) - client_cpu, _cpu(web) - server_cpu
    if watchers.refused and len(watchers.refused) > results.refused:
        _progress(f"{len(watchers.refused) - results.refused} closed while measuring, e.g. {watchers.refused[-1]}")
    await watchers.close_all()
    return results


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def _pause_one(args: argparse.Namespace, watchers: Watchers, *, warmup: bool = False) -> tuple[list[float], int]:
    """Start one run, wait until every open connection read its card (or --timeout); return delays, missed."""
    approval_id, created = await asyncio.to_thread(_start_and_wait_for_pause, args.timeout)
    deadline = created + args.timeout
    while not warmup and len(watchers.seen.get(approval_id, {})) < watchers.open and time.time() < deadline:
        await asyncio.sleep(0.02)
    seen = watchers.seen.pop(approval_id, {})
    delays = [(at - created) * 1000 for at in seen.values()]
    return delays, max(0, watchers.open - len(seen))


def _start_and_wait_for_pause(timeout: float) -> tuple[str, float]:
    from django.db import close_old_connections

    from agents import ids, services
    from agents.models import Approval

    try:
        run = services.run_create(agent=setup.AGENT, input=setup.PROMPT, created_by="bench")
        approval_id = ids.approval_id(run.id, CALL_ID)
        deadline = time.monotonic() + timeout + 30
        while time.monotonic() < deadline:
            created = Approval.objects.filter(pk=approval_id).values_list("created_at", flat=True).first()
            if created is not None:
                return approval_id, created.timestamp()
            time.sleep(0.005)
        raise setup.BenchError(f"run {run.id} did not pause within {timeout + 30:.0f}s")
    finally:
        close_old_connections()


# -- the report --------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: the smallest sample with at least `fraction` of the samples at or below it."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _summary(results: Results, target: setup.Target, args: argparse.Namespace) -> dict[str, Any]:
    per_connection = (results.rss_after - results.rss_before) / max(1, results.connections)
    return {
        "transport": results.transport,
        "client": args.client,
        "database": target.engine,
        "connections": results.connections,
        "refused": results.refused,
        "retries": results.retries,
        "users": results.users,
        "connect_seconds": round(results.connect_seconds, 2),
        "handshake_ms_p50": round(_percentile(results.handshake_ms, 0.5), 1),
        "handshake_ms_p95": round(_percentile(results.handshake_ms, 0.95), 1),
        "rss_before_mib": round(results.rss_before / 2**20, 1),
        "rss_after_mib": round(results.rss_after / 2**20, 1),
        "rss_per_connection_kib": round(per_connection / 1024, 1),
        "pauses": results.pauses,
        "frames_expected": results.pauses * results.connections,
        "received": results.received,
        "missed": results.missed,
        "delay_ms_p50": round(_percentile(results.delays_ms, 0.5), 1),
        "delay_ms_p95": round(_percentile(results.delays_ms, 0.95), 1),
        "delay_ms_max": round(max(results.delays_ms, default=math.nan), 1),
        "delay_ms_mean": round(statistics.fmean(results.delays_ms), 1) if results.delays_ms else math.nan,
        "client_cpu_seconds": round(results.client_cpu_seconds, 2),
        "server_cpu_seconds": round(results.server_cpu_seconds, 2),
        "load_1min": round(statistics.fmean(results.loads), 2) if results.loads else math.nan,
        "cpus": os.cpu_count(),
    }


def _report(results: Results, target: setup.Target, args: argparse.Namespace) -> str:
    s = _summary(results, target, args)
    what = "websocket /ws/inbox/" if results.transport == "ws" else "SSE /api/events"
    return "\n".join(
        [
            f"agentfast watchers: {s['connections']} {what} connections on one daphne process, "
            f"{s['users']} reviewers; {target.engine} ({target.label}), Celery worker --pool=solo; "
            f"{s['cpus']} CPUs, load {s['load_1min']}",
            f"connect          {s['connect_seconds']} s for all ({args.concurrency} at a time); handshake p50 "
            f"{s['handshake_ms_p50']} ms, p95 {s['handshake_ms_p95']} ms; tried again {s['retries']}, "
            f"refused {s['refused']} (after {TRIES} tries)",
            f"memory           daphne RSS {s['rss_before_mib']} → {s['rss_after_mib']} MiB: "
            f"{s['rss_per_connection_kib']} KiB per connection",
            f"pause → frame    {s['pauses']} pauses × {s['connections']} connections: received {s['received']}, "
            f"missed {s['missed']} (> {args.timeout:g} s)",
            f"  ms             p50 {s['delay_ms_p50']}  p95 {s['delay_ms_p95']}  max {s['delay_ms_max']}  "
            f"mean {s['delay_ms_mean']}",
            f"cpu              client ({s['client']}) {s['client_cpu_seconds']} s, daphne "
            f"{s['server_cpu_seconds']} s while pausing (both on the same CPUs)",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
