"""The timed passes. Every clock is time.perf_counter(); every sample is in milliseconds.

In process (this process drives the run; run_create(enqueue=False), drive(stream=False)):
  pause        run_create → drive() returned with the run suspended and committed
  resume       approval_decide(auto_resume=False) → drive() → SideEffect INSERT committed
  round trip   pause + resume of the same run
Through Celery (a real `celery worker --pool=solo` subprocess; the run is paused in process):
  approval_decide() (auto_resume → resume enqueued on commit) → SideEffect row visible here
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from agents import ids, services
from agents.models import Approval, AuditEntry, Run, SideEffect
from agents.runtime import drive
from bench import setup, storage
from bench.instrument import EffectClock, PhaseStats, Recorder, recording
from bench.setup import AGENT, PROMPT, BenchError
from tests.support.processes import Worker

ATTEMPT = services.Attempt(actor="bench-reviewer", source=AuditEntry.Source.API)
CALL_ID = "call_1_1"  # the demo model's id for the first call of its first turn
PHASES = ("create", "pause", "decide", "resume")


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return seconds * 1000.0


# -- the flow -----------------------------------------------------------------------


def create() -> str:
    return services.run_create(agent=AGENT, input=PROMPT, enqueue=False).id


def pause(run_id: str) -> None:
    result = drive(run_id, stream=False)
    if result.status != Run.Status.SUSPENDED:
        raise BenchError(f"{run_id}: expected the run to suspend on send_email, it is {result.status}")


def decide(run_id: str, *, auto_resume: bool | None) -> str:
    approval_id = ids.approval_id(run_id, CALL_ID)
    services.approval_decide(approval_id=approval_id, decision="approved", attempt=ATTEMPT, auto_resume=auto_resume)
    return approval_id


def resume(run_id: str) -> None:
    result = drive(run_id, stream=False)
    if result.status != Run.Status.COMPLETED:
        raise BenchError(f"{run_id}: expected the run to complete after the approval, it is {result.status}")


def paused_run() -> str:
    run_id = create()
    pause(run_id)
    return run_id


def check_flow() -> str:
    """Fail early if the flow is not the one measured: one gated call, one effect. Return the completed run."""
    run_id = paused_run()
    approvals = list(Approval.objects.filter(run_id=run_id).values_list("id", "tool", "mode"))
    expected = [(ids.approval_id(run_id, CALL_ID), "send_email", Approval.Mode.SUSPEND)]
    if approvals != expected:
        raise BenchError(f"unexpected approvals of the bench run: {approvals}, expected {expected}")
    approval_id = decide(run_id, auto_resume=False)
    resume(run_id)
    effects = SideEffect.objects.filter(idempotency_key=approval_id).count()
    if effects != 1:
        raise BenchError(f"{run_id}: {effects} side effects after one approval, expected exactly 1")
    return run_id


# -- in process -----------------------------------------------------------------------


@dataclass
class InProcess:
    pause: list[float] = field(default_factory=list)
    decide: list[float] = field(default_factory=list)
    resume: list[float] = field(default_factory=list)  # decision → side effect committed
    round_trip: list[float] = field(default_factory=list)
    completed: list[float] = field(default_factory=list)  # decision → drive() returned, run completed
    last_run_id: str = ""


def in_process(runs: int, warmup: int) -> InProcess:
    result = InProcess()
    clock = EffectClock()
    gc.collect()
    with clock.installed():
        for index in range(warmup + runs):
            t0 = time.perf_counter()
            run_id = create()
            pause(run_id)
            t1 = time.perf_counter()
            clock.reset()
            t2 = time.perf_counter()
            decide(run_id, auto_resume=False)
            t3 = time.perf_counter()
            resume(run_id)
            t4 = time.perf_counter()
            if clock.at is None:
                raise BenchError(f"{run_id}: no SideEffect was committed during the resume")
            if index < warmup:
                continue
            result.pause.append(ms(t1 - t0))
            result.decide.append(ms(t3 - t2))
            result.resume.append(ms(clock.at - t2))
            result.round_trip.append(ms(t1 - t0 + clock.at - t2))
            result.completed.append(ms(t4 - t2))
            result.last_run_id = run_id
    return result


@contextmanager
def pushes_stubbed() -> Iterator[None]:
    """What-if only: replace the Channels push after commit (agents.events._send) by a no-op."""
    from agents import events

    real = events._send
    events._send = lambda groups, message: None
    try:
        yield
    finally:
        events._send = real


# -- the database's own floor ------------------------------------------------------------


@dataclass
class Floor:
    select: list[float] = field(default_factory=list)  # SELECT 1
    write_txn: list[float] = field(default_factory=list)  # atomic(): one INSERT, COMMIT


def floor(runs: int, warmup: int = 20) -> Floor:
    """Time the cheapest statement and the cheapest write transaction, through Django."""
    result = Floor()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_floor (id integer PRIMARY KEY, x integer NOT NULL)")
    try:
        for index in range(warmup + runs):
            t0 = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
            t1 = time.perf_counter()
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("INSERT INTO bench_floor (id, x) VALUES (%s, %s)", [index, index])
            t2 = time.perf_counter()
            if index >= warmup:
                result.select.append(ms(t1 - t0))
                result.write_txn.append(ms(t2 - t1))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bench_floor")
    return result


# -- queries and transactions per phase ------------------------------------------------


@dataclass
class Counted:
    runs: int
    phases: dict[str, PhaseStats]
    sample: dict[str, list[str]]  # phase → transactions of the last run, described


def instrumented(runs: int) -> Counted:
    recorder = Recorder()
    sample: dict[str, list[str]] = {}
    with recording(recorder):
        for _ in range(runs):
            marks = {phase: len(recorder.stats(phase).txns) for phase in PHASES}
            with recorder.in_phase("create"):
                run_id = create()
            with recorder.in_phase("pause"):
                pause(run_id)
            with recorder.in_phase("decide"):
                decide(run_id, auto_resume=False)
            with recorder.in_phase("resume"):
                resume(run_id)
            sample = {phase: [t.describe() for t in recorder.stats(phase).txns[marks[phase] :]] for phase in PHASES}
    return Counted(runs=runs, phases={p: recorder.stats(p) for p in PHASES}, sample=sample)


# -- storage per paused run ------------------------------------------------------------


@dataclass
class Storage:
    runs: int
    rows: dict[str, float]  # table → mean rows per paused run
    bytes: dict[str, float]  # table → mean bytes per paused run
    growth: dict[str, float]  # storage_totals delta per paused run
    completed_rows: dict[str, int]
    completed_bytes: dict[str, int]
    unattributed: list[str]


def storage_pass(runs: int, completed_run_id: str) -> Storage:
    before = storage.storage_totals()
    run_ids = [paused_run() for _ in range(runs)]
    after = storage.storage_totals()
    rows: Counter[str] = Counter()
    size: Counter[str] = Counter()
    unattributed: list[str] = []
    for run_id in run_ids:
        usage, unattributed = storage.run_usage(run_id)
        for table, use in usage.items():
            rows[table] += use.rows
            size[table] += use.bytes
    done, _ = storage.run_usage(completed_run_id)
    return Storage(
        runs=runs,
        rows={t: rows[t] / runs for t in sorted(rows)},
        bytes={t: size[t] / runs for t in sorted(size)},
        growth={k: (after[k] - before[k]) / runs for k in after if k in before},
        completed_rows={t: u.rows for t, u in done.items()},
        completed_bytes={t: u.bytes for t, u in done.items()},
        unattributed=unattributed,
    )


# -- through Celery ----------------------------------------------------------------------


@dataclass
class ThroughCelery:
    visible: list[float] = field(default_factory=list)  # decision → SideEffect seen by polling
    db_clock: list[float] = field(default_factory=list)  # SideEffect.created_at − Approval.decided_at
    decide_call: list[float] = field(default_factory=list)  # approval_decide() incl. the publish
    poll_interval_ms: float = 0.5
    polls: list[int] = field(default_factory=list)


def through_celery(runs: int, warmup: int, poll_interval: float = 0.0005) -> ThroughCelery:
    result = ThroughCelery(poll_interval_ms=ms(poll_interval))
    worker = setup.start_worker(setup.VAR_DIR / "worker.log")
    try:
        with connection.cursor() as cursor:
            for index in range(warmup + runs):
                run_id = paused_run()
                time.sleep(0.002)  # let the worker settle after the previous task
                t0 = time.perf_counter()
                approval_id = decide(run_id, auto_resume=None)  # the run's auto_resume: on
                t1 = time.perf_counter()
                polls = _poll(
                    cursor,
                    "SELECT 1 FROM agents_sideeffect WHERE idempotency_key = %s",
                    approval_id,
                    poll_interval,
                    worker,
                )
                t2 = time.perf_counter()
                _wait_completed(cursor, run_id, worker)
                if index < warmup:
                    continue
                decided_at = Approval.objects.values_list("decided_at", flat=True).get(pk=approval_id)
                created_at = SideEffect.objects.values_list("created_at", flat=True).get(idempotency_key=approval_id)
                result.visible.append(ms(t2 - t0))
                result.decide_call.append(ms(t1 - t0))
                result.db_clock.append((created_at - decided_at).total_seconds() * 1000.0)
                result.polls.append(polls)
    finally:
        worker.stop()
    return result


def _poll(cursor, sql: str, key: str, interval: float, worker: Worker, timeout: float = 30) -> int:  # noqa: ANN001
    deadline = time.perf_counter() + timeout
    polls = 0
    while True:
        polls += 1
        cursor.execute(sql, [key])
        if cursor.fetchone() is not None:
            return polls
        if time.perf_counter() > deadline or not worker.alive:
            raise BenchError(f"no SideEffect for {key} after {timeout}s; see {worker.log_path}")
        time.sleep(interval)


def _wait_completed(cursor, run_id: str, worker: Worker, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.perf_counter() + timeout
    while True:
        cursor.execute("SELECT status FROM agents_run WHERE id = %s", [run_id])
        status = cursor.fetchone()[0]
        if status == Run.Status.COMPLETED:
            return
        if status in Run.TERMINAL or time.perf_counter() > deadline or not worker.alive:
            raise BenchError(f"{run_id} is {status} after the worker resumed it; see {worker.log_path}")
        time.sleep(0.001)


# -- exactly once, and a profile --------------------------------------------------------


def effects_check() -> dict[str, int]:
    """Every approved suspend call ran exactly once: one SideEffect per approval."""
    approved = Approval.objects.filter(status=Approval.Status.APPROVED).count()
    effects = SideEffect.objects.count()
    keys = SideEffect.objects.values("idempotency_key").distinct().count()
    if not (approved == effects == keys):
        raise BenchError(f"{approved} approvals approved, {effects} side effects, {keys} distinct keys")
    return {"approved": approved, "side_effects": effects}


def profile(runs: int, top: int = 25) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        run_id = paused_run()
        decide(run_id, auto_resume=False)
        resume(run_id)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- statistics ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": percentile(values, 0.50),
        "p95_ms": percentile(values, 0.95),
        "mean_ms": statistics.fmean(values) if values else float("nan"),
        "max_ms": max(values) if values else float("nan"),
    }
