"""The services' raw SQL: statements that return what they changed in one round trip.

Raw SQL lives here alone, and only where the ORM cannot say it in one statement: the
driver's hot path (lease, write, suspend) is one `UPDATE … RETURNING` each instead of an
update and a read, and the execution claim is fenced by the run's state, read under the
run's row lock, in the same statement. Every statement runs on SQLite (3.35+, RETURNING)
and PostgreSQL; tests/agents/test_sql.py runs them on both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import BooleanField, F, Func

from agents.models import Approval, Run, ToolCall

_RUN = "agents_run"
_TOOLCALL = "agents_toolcall"
# EXISTS body for statements on agents_run: a pending suspend approval of that run.
_PENDING_SUSPEND = (
    "SELECT 1 FROM agents_approval WHERE agents_approval.run_id = agents_run.id"
    " AND agents_approval.mode = %s AND agents_approval.status = %s"
)
_PENDING_SUSPEND_PARAMS = [Approval.Mode.SUSPEND, Approval.Status.PENDING]


def db_time(value: datetime | None) -> str | datetime | None:
    """Return a datetime in the form the ORM stores it (SQLite keeps text), so raw and ORM rows compare alike."""
    return connection.ops.adapt_datetimefield_value(value)


def _one(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def run_lease(*, run_id: str, owner: str, now: datetime, expires_at: datetime) -> tuple[Any, ...] | None:
    """Take a free lease of a run with work to do; return (agent, steps, input, auto_resume, own agent, creator, kind)."""
    sql = f"""
        UPDATE {_RUN} SET status = %s, lease_owner = %s, lease_expires_at = %s, updated_at = %s
        WHERE id = %s AND (lease_expires_at IS NULL OR lease_expires_at < %s)
          AND (status IN (%s, %s) OR (status = %s AND NOT EXISTS ({_PENDING_SUSPEND})))
        RETURNING agent, steps, input, auto_resume, agent_config IS NOT NULL, created_by, kind"""
    params = [
        Run.Status.RUNNING,
        owner,
        db_time(expires_at),
        db_time(now),
        run_id,
        db_time(now),
        Run.Status.QUEUED,
        Run.Status.RUNNING,
        Run.Status.SUSPENDED,
        *_PENDING_SUSPEND_PARAMS,
    ]
    row = _one(sql, params)
    if row is None:
        return None
    agent, steps, prompt, auto_resume, has_own_agent, created_by, kind = row
    # SQLite answers 0 and 1; and in RETURNING (3.40) may say a NULL JSON column IS NOT NULL,
    # which only costs the caller a read that finds no agent definition.
    return agent, steps, prompt, bool(auto_resume), bool(has_own_agent), created_by, kind


def run_write(
    *,
    run_id: str,
    owner: str | None,
    now: datetime,
    events: int,
    lease_until: datetime | None,
    add_steps: int,
    fields: dict[str, str],
) -> int | None:
    """Update a run as its driver (fenced by the lease, or by not having ended); return the last event seq.

    `lease_until=None` releases the lease. None is returned when the fence refused.
    """
    sets = ["updated_at = %s", "last_event_seq = last_event_seq + %s"]
    params: list[object] = [db_time(now), events]
    if lease_until is None:
        sets += ["lease_owner = ''", "lease_expires_at = NULL"]
    else:
        sets.append("lease_expires_at = %s")
        params.append(db_time(lease_until))
    if add_steps:
        sets.append("steps = steps + %s")
        params.append(add_steps)
    for column, value in fields.items():
        sets.append(f"{connection.ops.quote_name(column)} = %s")
        params.append(value)
    where, where_params = (
        ("lease_owner = %s", [owner]) if owner is not None else ("status NOT IN (%s, %s, %s)", list(Run.TERMINAL))
    )
    row = _one(
        f"UPDATE {_RUN} SET {', '.join(sets)} WHERE id = %s AND {where} RETURNING last_event_seq",
        [*params, run_id, *where_params],
    )
    return None if row is None else row[0]


def run_reserve_events(
    *, run_id: str, count: int, columns: tuple[str, ...] = (), pending_suspend: bool = False
) -> tuple[Any, ...]:
    """Reserve `count` event seqs of a run; return the last one and these columns, read under its row lock.

    With `pending_suspend`, the last value says whether a suspend approval of the run is
    still pending, as this transaction sees it (a decision asks in the same round trip).
    """
    returning = ", ".join(["last_event_seq", *(connection.ops.quote_name(c) for c in columns)])
    params: list[Any] = [count, run_id]
    if pending_suspend:
        returning += f", EXISTS ({_PENDING_SUSPEND})"
        params += _PENDING_SUSPEND_PARAMS
    row = _one(f"UPDATE {_RUN} SET last_event_seq = last_event_seq + %s WHERE id = %s RETURNING {returning}", params)
    if row is None:
        raise LookupError(f"no run {run_id}")
    return tuple(row)


def run_suspend(*, run_id: str, owner: str, now: datetime) -> bool:
    """Suspend and release a run this owner drives, if a suspend approval of it is still pending."""
    sql = f"""
        UPDATE {_RUN} SET status = %s, lease_owner = '', lease_expires_at = NULL, updated_at = %s
        WHERE id = %s AND lease_owner = %s AND EXISTS ({_PENDING_SUSPEND})"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [Run.Status.SUSPENDED, db_time(now), run_id, owner, *_PENDING_SUSPEND_PARAMS])
        return bool(cursor.rowcount)


def toolcall_claim(*, tool_call_pk: int, now: datetime) -> bool:
    """Claim a call's execution unless it was claimed, has a result, or its run was cancelled.

    The run's state is read, under its row lock, in the claim's own statement: on
    PostgreSQL the sub-select's FOR UPDATE waits for a cancel (or decision) under way, as
    run_cancel's lock does, and then reads the run as that transaction left it; a cancel
    that comes second waits for this statement and sees the claim. SQLite serializes its
    writers, so there the statement alone is enough. One statement, no transaction of its own.
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    sql = f"""
        UPDATE {_TOOLCALL} SET executed_at = %s, status = %s
        WHERE id = %s AND executed_at IS NULL AND result IS NULL
          AND EXISTS (SELECT 1 FROM {_RUN} WHERE {_RUN}.id = {_TOOLCALL}.run_id AND {_RUN}.status <> %s{lock})"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_time(now), ToolCall.Status.RUNNING, tool_call_pk, Run.Status.CANCELLED])
        return bool(cursor.rowcount)


class JsonArrayHasAny(Func):
    """True when a JSON array column holds any of these strings as an element (the approvers of a call).

    Django's `has_any_keys` asks PostgreSQL the right question (`?|` matches array elements)
    but SQLite a different one (object keys), so each database gets its own spelling here.
    """

    output_field = BooleanField()

    def __init__(self, column: str, strings: list[str]) -> None:
        if not strings:
            raise ValueError("JsonArrayHasAny needs at least one string")
        super().__init__(F(column))
        self.strings = list(strings)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.source_expressions[0])
        return f"({column} ?| %s::text[])", [*params, self.strings]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.source_expressions[0])
        marks = ", ".join(["%s"] * len(self.strings))
        sql = f"EXISTS (SELECT 1 FROM json_each({column}) WHERE json_each.value IN ({marks}))"
        return sql, (*params, *self.strings)


def distinct_values(*columns: tuple[str, str]) -> list[list[str]]:
    """Return the distinct non-empty values of each indexed text column (table, column), sorted: a probe per value.

    A loose index scan (each step asks the index for the next value above the last), so ten
    agents among 100,000 runs cost ten probes rather than a DISTINCT over every row. The
    columns share one statement: a page's filter lists cost one round trip, not one each.
    Only for the project's own tables and columns: the names are not parameters.
    """
    quote = connection.ops.quote_name
    scans, rows = [], []
    for index, (table, column) in enumerate(columns):
        table, column, found = quote(table), quote(column), f"found{index}"
        scans.append(f"""
        {found}(value, step) AS (
            SELECT MIN({column}), 0 FROM {table} WHERE {column} > ''
            UNION ALL
            SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > {found}.value), step + 1 FROM {found}
            WHERE {found}.value IS NOT NULL
        )""")
        rows.append(f"SELECT {index}, step, value FROM {found} WHERE value IS NOT NULL")
    sql = f"\n        WITH RECURSIVE{','.join(scans)}\n        {' UNION ALL '.join(rows)} ORDER BY 1, 2"
    values: list[list[str]] = [[] for _ in columns]
    with connection.cursor() as cursor:
        cursor.execute(sql)
        for index, _, value in cursor.fetchall():
            values[index].append(value)
    return values
