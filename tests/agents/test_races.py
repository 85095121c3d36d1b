"""Exactly once under races: 32 concurrent resumes, executions and decisions.

From threads and from separate processes, on SQLite and (CI's second pass) Postgres.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from agents import runtime, services
from agents.models import AuditEntry, Run, SideEffect
from agents.runtime.execution import execute_deferred
from tests.support.flows import decide, pending, start

N = 32
REFUND = "Refund order A1001 for 25.00 USD"


def in_threads(task: Callable[[int], Any]) -> list[Any]:
    """Run task(i) in N threads released together; return results (or exceptions)."""
    barrier = threading.Barrier(N)
    results: list[Any] = [None] * N

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = task(i)
        except Exception as exc:  # noqa: BLE001 — the test inspects it
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(N)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _forget_connections() -> None:
    """Close every connection, and on PostgreSQL the pool too: a forked child must not share its sockets."""
    connections.close_all()
    for wrapper in connections.all(initialized_only=True):
        close_pool = getattr(wrapper, "close_pool", None)
        if close_pool is not None:
            close_pool()


def in_processes(task: Callable[[int], Any]) -> list[Any]:
    """Run task(i) in N forked processes released together; return their results."""
    _forget_connections()  # children must open their own database connections
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(N)
    queue = context.Queue()

    def body(i: int) -> None:
        try:
            barrier.wait()
            queue.put((i, _portable(task(i))))
        except Exception as exc:  # noqa: BLE001
            queue.put((i, f"{type(exc).__name__}: {exc}"))
        finally:
            connections.close_all()

    processes = [context.Process(target=body, args=(i,)) for i in range(N)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    return [results[i] for i in range(N)]


def _portable(value: Any) -> Any:
    return value if isinstance(value, (str, int, bool, type(None))) else repr(value)


RUNNERS = {"threads": in_threads, "processes": in_processes}


@pytest.mark.parametrize("runner", RUNNERS)
def test_it_resumes_an_approved_run_once_under_32_concurrent_resumes(transactional_db, runner):
    run = start(REFUND)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)

    results = RUNNERS[runner](lambda i: runtime.drive(run.id, stream=False).driven)

    assert results.count(True) == 1, results
    assert results.count(False) == N - 1, results
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1
    assert Run.objects.get(pk=run.id).status == "completed"


@pytest.mark.parametrize("runner", RUNNERS)
def test_it_executes_a_deferred_call_once_under_32_concurrent_executions(transactional_db, runner):
    run = start("Email bob@example.com that his refund is on its way")
    [approval] = pending(run)
    decide(approval, "approved")

    results = RUNNERS[runner](lambda i: execute_deferred(approval.tool_call_id))

    counts = Counter(results)
    assert counts["succeeded"] == 1, results
    assert counts["claimed elsewhere"] + counts["already recorded"] == N - 1, results
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1


@pytest.mark.parametrize("runner", RUNNERS)
def test_it_keeps_exactly_one_of_32_concurrent_decisions(transactional_db, runner):
    run = start(REFUND)
    [approval] = pending(run)

    def attempt(i: int) -> str:
        decision = "approved" if i % 2 else "rejected"
        try:
            return decide(approval.id, decision, by=f"reviewer{i}", auto_resume=False).outcome
        except services.AlreadyDecided:
            return "refused"

    results = RUNNERS[runner](attempt)

    counts = Counter(results)
    assert counts["decided"] == 1, results
    assert counts["decided"] + counts["idempotent"] + counts["refused"] == N, results
    approval.refresh_from_db()
    winner = AuditEntry.objects.get(approval_id=approval.id, outcome="decided")
    assert (approval.status, approval.decided_by) == (winner.action, winner.actor)
    assert AuditEntry.objects.filter(approval_id=approval.id).count() == N
    # Idempotent repeats are exactly the losers who asked for the winning decision.
    same = sum(1 for i in range(N) if ("approved" if i % 2 else "rejected") == approval.status)
    assert counts["idempotent"] == same - 1
