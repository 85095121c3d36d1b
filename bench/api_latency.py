"""`python -m bench.api_latency`: the HTTP API and its SSE streams, end to end, timed.

One daphne process serves the API; two `celery worker --pool=solo` processes resume runs;
all on the bench's fresh database and private Redis (bench.setup). The flow is the bench's:
agent "bench" pauses on send_email (suspend); an approval runs it once.

  decide → side effect   POST /api/approvals/{id}/decide (auto_resume on) → the worker's
                         SideEffect row seen here (polled every 0.5 ms)
  pause → SSE event      a client on GET /api/runs/{id}/events; a worker drives the run to its
                         pause; RunEvent.created_at of approval_required (set at INSERT, just
                         before COMMIT) → the frame read by the client
  sustained              paused runs decided by concurrent HTTP clients as fast as the web
                         process takes them; the workers resume every run; every decision
                         must land and every side effect happen exactly once
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench import setup

POLL = 0.0005  # as bench.measure: half a millisecond of resolution


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.api_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="timed decisions and pauses (default 100)")
    parser.add_argument("--decisions", type=int, default=400, help="decisions of the sustained pass (default 400)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients deciding (default 16)")
    parser.add_argument("--workers", type=int, default=2, help="celery workers resuming runs (default 2)")
    parser.add_argument(
        "--sustained-only", action="store_true", help="only the sustained pass (decisions/s), not the latency passes"
    )
    parser.add_argument(
        "--resume-after",
        action="store_true",
        help="start the workers once every decision is taken: the web process alone on the machine",
    )
    parser.add_argument(
        "--sqlite", action="store_true", help="a fresh SQLite file in var/bench/ even if DATABASE_URL is set"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if min(args.runs, args.decisions, args.clients, args.workers) < 1:
        parser.error("--runs, --decisions, --clients and --workers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sqlite:
        os.environ.pop("DATABASE_URL", None)  # the bench's own SQLite file
    return setup.run(_main, args)


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    setup.start_redis()
    with setup.django_migrated(target):
        results = _run(args, target)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


# -- processes ---------------------------------------------------------------------------


# -- the passes --------------------------------------------------------------------------


def _run(args: argparse.Namespace, target: setup.Target) -> dict[str, Any]:
    from agents import services
    from bench import measure

    started = time.perf_counter()
    measure.check_flow()
    services.user_create(username="bench-reviewer", role="reviewer")
    token = services.token_create(username="bench-reviewer")[1]

    def start_workers() -> None:
        for n in range(1, args.workers + 1):
            setup.start_worker(setup.VAR_DIR / f"worker{n}.log")

    if not (args.sustained_only and args.resume_after):
        start_workers()
    daphne = setup.start_cli_serve(setup.VAR_DIR / "daphne.log")  # the web process as `make run` starts it
    results: dict[str, Any] = {}
    try:
        headers = {"Authorization": f"Bearer {token}"}
        if not args.sustained_only:
            with httpx.Client(base_url=daphne.url, headers=headers, timeout=30) as client:
                warmup = min(10, args.runs)
                measure.progress(f"decide → side effect over HTTP: {args.runs} decisions (+{warmup} warm-up)")
                decided = decide_to_effect(client, args.runs, warmup)
                measure.progress(f"pause → SSE event: {args.runs} pauses (+{warmup} warm-up)")
                sse = pause_to_event(client, args.runs, warmup)
            results["decide_to_effect"] = measure.summary(decided["effect"])
            results["decide_http"] = measure.summary(decided["http"])
            results["pause_to_sse_event"] = measure.summary(sse)
        measure.progress(f"sustained: {args.decisions} decisions from {args.clients} HTTP clients")
        later = start_workers if args.sustained_only and args.resume_after else None
        assert daphne.process is not None
        results["sustained"] = decisions_per_second(
            daphne.url, headers, args.decisions, args.clients, later, web_pid=daphne.process.pid
        )
    finally:
        daphne.stop()
        setup.stop_workers()
    results["effects"] = measure.effects_check()  # every approval of the whole bench ran exactly once
    return {"meta": _meta(target, args, time.perf_counter() - started), **results}


def decide_to_effect(client: httpx.Client, runs: int, warmup: int) -> dict[str, list[float]]:
    """Decide paused runs one at a time over HTTP; time until the worker's side effect exists."""
    from django.db import connection

    from bench import measure

    samples: dict[str, list[float]] = {"http": [], "effect": []}
    with connection.cursor() as cursor:
        for index in range(warmup + runs):
            run_id = measure.paused_run()  # auto_resume on: the decision enqueues the resume
            approval_id = _approval_id(run_id)
            time.sleep(0.002)  # let the workers settle after the previous run
            t0 = time.perf_counter()
            response = client.post(f"/api/approvals/{approval_id}/decide", json={"decision": "approved"})
            t1 = time.perf_counter()
            _expect(
                response.status_code == 200 and response.json()["resume_enqueued"],
                f"decide {approval_id}: {response.text}",
            )
            _poll(cursor, "SELECT 1 FROM agents_sideeffect WHERE idempotency_key = %s", approval_id)
            t2 = time.perf_counter()
            _poll(cursor, "SELECT 1 FROM agents_run WHERE id = %s AND status = 'completed'", run_id)
            if index >= warmup:
                samples["http"].append(measure.ms(t1 - t0))
                samples["effect"].append(measure.ms(t2 - t0))
    return samples


def pause_to_event(client: httpx.Client, runs: int, warmup: int) -> list[float]:
    """Listen on a run's SSE stream while a worker drives it to its pause; time the frame."""
    from agents.models import RunEvent
    from bench import measure

    samples: list[float] = []
    for index in range(warmup + runs):
        run_id = measure.create()  # queued, not enqueued: the resume below hands it to a worker
        with client.stream("GET", f"/api/runs/{run_id}/events", headers={"Accept": "text/event-stream"}) as stream:
            lines = stream.iter_lines()
            _read_until(lines, ": live")
            _expect(client.post(f"/api/runs/{run_id}/resume").status_code == 200, f"resume {run_id}")
            _read_until(lines, "event: approval_required")
            received = time.time()
        created = RunEvent.objects.get(run_id=run_id, type=RunEvent.Type.APPROVAL_REQUIRED).created_at.timestamp()
        if index >= warmup:
            samples.append(measure.ms(received - created))
    return samples


def decisions_per_second(
    url: str,
    headers: dict[str, str],
    decisions: int,
    clients: int,
    start_workers: Callable[[], None] | None = None,
    *,
    web_pid: int | None = None,
) -> dict[str, Any]:
    """Decide many paused runs at once over HTTP; wait for every run to complete; count.

    Each client holds one keep-alive connection and sends its next decision as soon as the
    last is answered. With `start_workers`, the workers start only after the last decision
    (the web process alone on the machine while it is timed), and the resume rate is timed
    from their start.
    """
    from agents.models import Approval, Run, SideEffect
    from bench import measure

    measure.progress(f"pausing {decisions} runs")
    run_ids = [measure.paused_run() for _ in range(decisions)]
    approval_ids = [_approval_id(run_id) for run_id in run_ids]
    local = threading.local()
    address = urllib.parse.urlsplit(url)
    # The standard library's client, one keep-alive connection per client thread: on this
    # machine it spends 0.5 ms of CPU per request where httpx spent 1.9 ms, on the cores the
    # web process needs.
    body = json.dumps({"decision": "approved"}).encode()
    request_headers = {**headers, "Content-Type": "application/json"}

    def decide(approval_id: str) -> tuple[int, float]:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=60)
        t = time.perf_counter()
        local.connection.request("POST", f"/api/approvals/{approval_id}/decide", body, request_headers)
        answer = local.connection.getresponse()
        answer.read()
        return answer.status, measure.ms(time.perf_counter() - t)

    measure.progress(f"deciding {decisions} approvals from {clients} HTTP clients")
    load = os.getloadavg()[0]
    cpu0, client0, machine0 = _cpu_seconds(web_pid), time.process_time(), _machine_cpu_seconds()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(decide, approval_ids))
    t_http = time.perf_counter()
    cpu1, client1, machine1 = _cpu_seconds(web_pid), time.process_time(), _machine_cpu_seconds()
    statuses = [status for status, _ in answers]
    taken = measure.summary([ms for _, ms in answers])
    rate = decisions / (t_http - t0)
    measure.progress(
        f"taken: {rate:.1f} decisions/s, p50 {taken['p50_ms']:.1f} ms, p95 {taken['p95_ms']:.1f} ms;"
        " waiting for the workers to resume every run"
    )
    t_resume = t0
    if start_workers is not None:
        t_resume = time.perf_counter()
        start_workers()
    deadline = time.monotonic() + 300
    while Run.objects.filter(pk__in=run_ids, status=Run.Status.COMPLETED).count() < decisions:
        _expect(time.monotonic() < deadline, "runs did not all complete within 300 s; see var/bench/worker*.log")
        time.sleep(0.005)
    t_done = time.perf_counter()
    effects = SideEffect.objects.filter(idempotency_key__in=approval_ids)
    result = {
        "decisions": decisions,
        "clients": clients,
        "http_errors": sum(status != 200 for status in statuses),
        "decided": Approval.objects.filter(pk__in=approval_ids, status=Approval.Status.APPROVED).count(),
        "side_effects": effects.count(),
        "distinct_effects": effects.values("idempotency_key").distinct().count(),
        "http_seconds": t_http - t0,
        "decide_http": taken,
        "web_cpu_ms_per_decision": measure.ms(cpu1 - cpu0) / decisions
        if cpu0 is not None and cpu1 is not None
        else None,
        # Where the machine's CPU went while the decisions were taken: this process is the
        # HTTP clients; the rest is the database, Redis and anything else running.
        "client_cpu_ms_per_decision": measure.ms(client1 - client0) / decisions,
        "machine_cpu_ms_per_decision": measure.ms(machine1 - machine0) / decisions
        if machine0 is not None and machine1 is not None
        else None,
        "loadavg_1m_before": load,
        "workers_started_after": start_workers is not None,
        "end_to_end_seconds": t_done - t_resume,
    }
    lost = decisions - result["distinct_effects"]
    doubled = result["side_effects"] - result["distinct_effects"]
    _expect(result["http_errors"] == 0 and result["decided"] == decisions, f"decisions did not all land: {result}")
    _expect(lost == 0 and doubled == 0, f"{lost} side effects lost, {doubled} doubled: {result}")
    return result


def _cpu_seconds(pid: int | None) -> float | None:
    """Return the user + system CPU time of a process so far (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def _machine_cpu_seconds() -> float | None:
    """Return the CPU time every core of the machine spent busy so far (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user … steal; guest time is in user already


def _approval_id(run_id: str) -> str:
    from agents import ids
    from bench import measure

    return ids.approval_id(run_id, measure.CALL_ID)


def _poll(cursor: Any, sql: str, key: str, timeout: float = 30) -> None:
    deadline = time.perf_counter() + timeout
    while True:
        cursor.execute(sql, [key])
        if cursor.fetchone() is not None:
            return
        _expect(time.perf_counter() < deadline, f"timed out on {sql} [{key}]; see var/bench/worker*.log")
        time.sleep(POLL)


def _read_until(lines: Iterator[str], wanted: str) -> None:
    for line in lines:
        if line == wanted:
            return
    raise setup.BenchError(f"the SSE stream ended before {wanted!r}")


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise setup.BenchError(problem)


def _meta(target: setup.Target, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    return {
        "database": f"{target.engine} ({target.label})",
        "processes": f"1 daphne web process, {args.workers} celery workers (--pool=solo), this process deciding",
        "runs": args.runs,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "seconds": seconds,
    }


def render(results: dict[str, Any]) -> str:
    meta, sustained = results["meta"], results["sustained"]
    rows = [
        ("decide → side effect over HTTP", results.get("decide_to_effect")),
        ("  of which the HTTP decide itself", results.get("decide_http")),
        ("pause committed → SSE event received", results.get("pause_to_sse_event")),
        ("sustained: one decide request", sustained["decide_http"]),
    ]
    out = [
        f"agentfast API bench · {meta['database']} · {meta['processes']}",
        f"{meta['cpus']} CPUs, load average {meta['loadavg_1m']:.2f}; bench time {meta['seconds']:.1f} s",
        "",
        f"{'LATENCY':<40}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}",
    ]
    out += [
        f"{label:<40}{s['n']:>6}{s['p50_ms']:>10.2f}{s['p95_ms']:>10.2f}{s['max_ms']:>10.2f}"
        for label, s in rows
        if s is not None
    ]
    workers = (
        f"{meta['workers']} workers, started after the last decision"
        if sustained["workers_started_after"]
        else f"{meta['workers']} workers, during the decisions"
    )
    n = sustained["decisions"]
    lost = n - sustained["distinct_effects"]
    doubled = sustained["side_effects"] - sustained["distinct_effects"]
    http_s, done_s = sustained["http_seconds"], sustained["end_to_end_seconds"]
    effects = results["effects"]
    out += [
        "",
        f"SUSTAINED  {n} paused runs decided by {sustained['clients']} concurrent HTTP clients",
        f"  decisions taken by the web process   {n / http_s:8.1f} /s  ({http_s:.2f} s,"
        f" load average {sustained['loadavg_1m_before']:.2f} before)",
        f"  decided → resumed → effect → done    {n / done_s:8.1f} /s  ({done_s:.2f} s, {workers})",
        *_cpu_line(sustained.get("web_cpu_ms_per_decision")),
        *_machine_line(sustained),
        f"  landed {sustained['decided']}/{n} decisions, {sustained['side_effects']} side effects:"
        f" lost {lost}, doubled {doubled}, HTTP errors {sustained['http_errors']}",
        f"  whole bench: {effects['approved']} approvals, {effects['side_effects']} side effects (exactly once each)",
        (
            "  target (issue 12, information): ≥ 200 decisions/s taken by one web process,"
            " one request's p95 ≤ 50 ms, none lost or doubled"
        ),
    ]
    return "\n".join(out)


def _cpu_line(cpu_ms: float | None) -> list[str]:
    if cpu_ms is None:
        return []
    return [f"  web process CPU per decision         {cpu_ms:8.2f} ms (one core's worth: {1000 / cpu_ms:.0f} /s)"]


def _machine_line(sustained: dict[str, Any]) -> list[str]:
    machine, web = sustained.get("machine_cpu_ms_per_decision"), sustained.get("web_cpu_ms_per_decision")
    if machine is None or web is None:
        return []
    client = sustained["client_cpu_ms_per_decision"]
    cores = os.cpu_count() or 1
    return [
        (
            f"  machine CPU per decision             {machine:8.2f} ms"
            f" (all {cores} cores' worth: {cores * 1000 / machine:.0f} /s):"
            f" web {web:.2f}, HTTP clients {client:.2f}, database, Redis and the rest {machine - web - client:.2f}"
        )
    ]


if __name__ == "__main__":
    raise SystemExit(main())
