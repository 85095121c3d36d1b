"""Counting what the engine asks of the database, per phase of a run.

`Recorder` is a `connection.execute_wrapper`: it classifies every statement, times it, and
follows transactions. A statement inside an atomic block belongs to the transaction of the
outermost block; an `on_commit` hook registered at that transaction's first statement
closes it, so only committed transactions are counted. A write outside any atomic block
is its own (autocommit) transaction. A transaction is a *write transaction* when it holds at
least one INSERT, UPDATE or DELETE.

`EffectClock` notes when the SideEffect row was committed (post_save + on_commit), so the
timed passes can stop the clock there without wrapping every statement.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models.signals import post_save

WRITES = ("insert", "update", "delete")
_TABLE = re.compile(r'^\s*(?:insert\s+(?:or\s+\w+\s+)?into|update|delete\s+from)\s+"?([\w.]+)"?', re.I)


def statement_kind(sql: str) -> str:
    word = sql.lstrip().split(None, 1)[0].lower() if sql.strip() else ""
    if word in ("select", "insert", "update", "delete"):
        return word
    if word == "with":  # a CTE: whatever writes in it makes it a write
        lowered = sql.lower()
        return next((w for w in WRITES if re.search(rf"\b{w}\b", lowered)), "select")
    return "other"  # BEGIN IMMEDIATE (SQLite), SAVEPOINT, PRAGMA…


@dataclass
class Txn:
    phase: str
    statements: list[str] = field(default_factory=list)  # e.g. "UPDATE agents_run"
    autocommit: bool = False

    @property
    def writes(self) -> list[str]:
        return [s for s in self.statements if s.split()[0].lower() in WRITES]

    def describe(self) -> str:
        counted = Counter(self.writes)
        parts = [f"{s}×{n}" if n > 1 else s for s, n in counted.items()]
        reads = len(self.statements) - len(self.writes)
        kind = "autocommit" if self.autocommit else "atomic"
        return f"[{kind}] " + ", ".join(parts) + (f" (+{reads} SELECT)" if reads else "")


@dataclass
class PhaseStats:
    statements: Counter = field(default_factory=Counter)
    db_seconds: float = 0.0  # executing statements (an autocommit write includes its commit)
    commit_seconds: float = 0.0  # COMMIT of atomic blocks (connection._commit)
    push_seconds: float = 0.0  # agents.events._send: the Channels-layer push after commit
    pushes: int = 0
    enqueue_seconds: float = 0.0  # agents.queue._send: the Celery publish after commit
    wall_seconds: float = 0.0
    txns: list[Txn] = field(default_factory=list)  # committed, in commit order

    @property
    def write_txns(self) -> list[Txn]:
        return [t for t in self.txns if t.writes]


class Recorder:
    """execute_wrapper that counts statements and committed transactions per phase."""

    def __init__(self) -> None:
        self.phase = "-"
        self.phases: dict[str, PhaseStats] = {}
        self._block: object | None = None  # the outermost Atomic of the open transaction
        self._txn: Txn | None = None

    def stats(self, phase: str | None = None) -> PhaseStats:
        return self.phases.setdefault(phase or self.phase, PhaseStats())

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[PhaseStats]:
        previous, self.phase = self.phase, phase
        stats = self.stats()
        started = time.perf_counter()
        try:
            yield stats
        finally:
            stats.wall_seconds += time.perf_counter() - started
            self.phase = previous

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        conn = context["connection"]
        kind = statement_kind(sql)
        label = kind.upper()
        if kind in WRITES:
            match = _TABLE.match(sql)
            label = f"{label} {match.group(1) if match else '?'}"
        if conn.in_atomic_block and conn.atomic_blocks:
            outermost = conn.atomic_blocks[0]
            if outermost is not self._block:
                # The first statement of a new transaction: close it when it commits.
                self._block, self._txn = outermost, Txn(phase=self.phase)
                transaction.on_commit(self._committer(self._txn), using=conn.alias)
        started = time.perf_counter()
        result = execute(sql, params, many, context)
        stats = self.stats()
        stats.db_seconds += time.perf_counter() - started
        stats.statements[kind] += 1
        if conn.in_atomic_block and self._txn is not None:
            self._txn.statements.append(label)
        elif kind in WRITES:
            self.stats().txns.append(Txn(phase=self.phase, statements=[label], autocommit=True))
        return result

    def _committer(self, txn: Txn) -> Callable[[], None]:
        def committed() -> None:
            self.stats(txn.phase).txns.append(txn)
            if self._txn is txn:
                self._block, self._txn = None, None

        return committed


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Install the recorder on the default connection; time its commits and the engine's pushes."""
    from django.db import connections

    from agents import events, queue

    real_send, real_enqueue = events._send, queue._send
    wrapper = connections["default"]
    real_commit = wrapper._commit

    def timed_commit() -> None:
        stats = recorder.stats()
        started = time.perf_counter()
        try:
            real_commit()
        finally:
            stats.commit_seconds += time.perf_counter() - started

    def timed_send(groups: list[str], message: dict[str, Any]) -> None:
        stats = recorder.stats()
        started = time.perf_counter()
        try:
            real_send(groups, message)
        finally:
            stats.push_seconds += time.perf_counter() - started
            stats.pushes += len(groups)

    def timed_enqueue(task_name: str, *args: Any) -> bool:
        stats = recorder.stats()
        started = time.perf_counter()
        try:
            return real_enqueue(task_name, *args)
        finally:
            stats.enqueue_seconds += time.perf_counter() - started

    # events.publish / queue.*_on_commit look these names up at call time.
    events._send, queue._send = timed_send, timed_enqueue
    wrapper._commit = timed_commit  # this connection object only, for this pass
    try:
        with connection.execute_wrapper(recorder):
            yield recorder
    finally:
        events._send, queue._send = real_send, real_enqueue
        del wrapper._commit


class EffectClock:
    """perf_counter() of the moment the last SideEffect row was committed."""

    def __init__(self) -> None:
        self.at: float | None = None

    def reset(self) -> None:
        self.at = None

    def _mark(self) -> None:
        self.at = time.perf_counter()

    def _saved(self, sender: Any, instance: Any, created: bool, using: str, **kwargs: Any) -> None:
        if not created:
            return
        if transaction.get_connection(using).in_atomic_block:
            transaction.on_commit(self._mark, using=using)
        else:
            self._mark()  # autocommit: the INSERT has committed

    @contextmanager
    def installed(self) -> Iterator[EffectClock]:
        from agents.models import SideEffect

        post_save.connect(self._saved, sender=SideEffect, weak=False, dispatch_uid="bench-effect-clock")
        try:
            yield self
        finally:
            post_save.disconnect(sender=SideEffect, dispatch_uid="bench-effect-clock")
