"""The services' raw SQL: statements that return what they changed in one round trip.

Raw SQL lives here alone (with agents.sql.chain, its writes of several rows), and only where
the ORM cannot say it in one statement or costs more CPU composing a statement than the
database spends running it:

- the driver's hot path: the lease is one `UPDATE … RETURNING`, the suspend one `UPDATE` (after
  the run's row lock on PostgreSQL); its writes (a model turn, a tool's result, the final
  answer) are the run's fenced update and the rows that hang on it, one statement on
  PostgreSQL (agents.sql.chain); it reads a run's history and the grants of a proposed call
  without composing the queries each time; and the execution claim is fenced by the run's
  state, read under the run's row lock, in the same statement;
- every API decision: the token with its user and permissions, the locked read of the
  approval with its call and run (the ORM spent about 2 ms of CPU composing that one), the
  decision's writes (one statement on PostgreSQL, with the audit chain's lock) and the
  audit chain's head.

Every statement runs on SQLite (3.35+, RETURNING) and PostgreSQL; tests/agents/test_sql.py
and tests/agents/test_sql_chain.py run them on both.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.db.models import BooleanField, Expression, F, FloatField, Func, Model, QuerySet

from agents.models import ApiToken, Approval, AuditEntry, Grant, Message, Run, RunEvent, ToolCall
from agents.sql.chain import Chain

_APPROVAL = "agents_approval"
_MESSAGE = "agents_message"
_RUN = "agents_run"
_TOOLCALL = "agents_toolcall"
# EXISTS body for statements on agents_run: a pending suspend approval of that run.
_PENDING_SUSPEND = (
    "SELECT 1 FROM agents_approval WHERE agents_approval.run_id = agents_run.id"
    " AND agents_approval.mode = %s AND agents_approval.status = %s"
)
_PENDING_SUSPEND_PARAMS = [Approval.Mode.SUSPEND, Approval.Status.PENDING]
# A decided suspend call whose tool asked to run later (run_at), its time not come: its run waits for it
# too. Not a deferred one: it waits alone while its run goes on.
_HELD_CALL = (
    "SELECT 1 FROM agents_toolcall WHERE agents_toolcall.run_id = agents_run.id"
    " AND agents_toolcall.not_before > %s AND agents_toolcall.result IS NULL AND agents_toolcall.hitl_mode = %s"
)


def db_time(value: datetime | None) -> str | datetime | None:
    """Return a datetime in the form the ORM stores it (SQLite keeps text), so raw and ORM rows compare alike."""
    return connection.ops.adapt_datetimefield_value(value)


M = TypeVar("M", bound=Model)
_Converter = Callable[[Any, Any, Any], Any]


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
) -> Chain:
    """Return the chain whose head updates a run as its driver (fenced by the lease, or by not having ended).

    The head returns the last event seq it reserved (`last_event_seq`), or no row when the
    fence refused; the caller adds the rows that hang on it. `lease_until=None` releases the lease.
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
    sql = f"UPDATE {_RUN} SET {', '.join(sets)} WHERE id = %s AND {where} RETURNING last_event_seq"
    return Chain(sql, [*params, run_id, *where_params], ("last_event_seq",))


def run_history(run_id: str, *, with_calls: bool) -> tuple[list[Message], list[ToolCall]]:
    """Return what a driver reads of a run: its messages by seq and, `with_calls`, its calls with their approvals.

    What `Message.objects.filter(run_id=…).order_by("seq")` and
    `ToolCall.objects.filter(run_id=…).select_related("approval")` read, without composing
    them for every step of every run: each call's approval (or its absence) is in its cache,
    and the approval's call is the call.
    """
    with connection.cursor() as cursor:
        cursor.execute(_history_sql()[0], [run_id])
        messages = [_instance(Message, row)[0] for row in cursor.fetchall()]
        if not with_calls:
            return messages, []
        cursor.execute(_history_sql()[1], [run_id])
        rows = cursor.fetchall()
    calls = []
    for row in rows:
        call, rest = _instance(ToolCall, row)
        approval = _instance(Approval, rest)[0] if rest[0] is not None else None
        call._state.fields_cache["approval"] = approval
        if approval is not None:
            approval._state.fields_cache["tool_call"] = call
        calls.append(call)
    return messages, calls


@functools.cache
def _history_sql() -> tuple[str, str]:
    messages = f"SELECT {_columns(Message, 'm')} FROM {_MESSAGE} m WHERE m.run_id = %s ORDER BY m.seq"
    calls = f"""
        SELECT {_columns(ToolCall, "t")}, {_columns(Approval, "a")} FROM {_TOOLCALL} t
        LEFT JOIN {_APPROVAL} a ON a.tool_call_id = t.id WHERE t.run_id = %s ORDER BY t.step, t.id"""
    return messages, calls


def grants_for(*, tool: str, agent: str, kind: str, account: str, digest: str, now: datetime) -> list[Grant]:
    """Return the live grants of this tool, agent and principal for any arguments or these (digest), rejections first.

    The principal is the run's kind and, for an external run, its account (Grant.kind,
    Grant.account). Asked for every gated call, and almost always empty: read by the
    `grant_lookup` index without composing the query each time.
    """
    params = [tool, agent, kind, account, db_time(now), Grant.Scope.TOOL, Grant.Scope.EXACT, digest]
    with connection.cursor() as cursor:
        cursor.execute(_grants_sql(), params)
        return [_instance(Grant, row)[0] for row in cursor.fetchall()]


@functools.cache
def _grants_sql() -> str:
    return f"""
        SELECT {_columns(Grant, "g")} FROM {Grant._meta.db_table} g
        WHERE g.tool = %s AND g.agent = %s AND g.kind = %s AND g.account = %s
          AND g.expires_at > %s AND g.revoked_at IS NULL
          AND (g.scope = %s OR (g.scope = %s AND g.arguments_digest = %s))
        ORDER BY g.decision DESC, g.created_at DESC"""


def grant_use(*, grant_id: str, now: datetime) -> str | None:
    """Count one use of a grant if it is still live (neither revoked nor expired at `now`); return its creator.

    A compare-and-set on the grant's row: a revoke that commits first makes it change
    nothing (None); one that comes second waits until the caller's transaction ends.
    """
    row = _one(
        f"""UPDATE {Grant._meta.db_table} SET uses = uses + 1, last_used_at = %s
        WHERE id = %s AND revoked_at IS NULL AND expires_at > %s RETURNING created_by""",
        [db_time(now), grant_id, db_time(now)],
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


def decision(*, run_id: str, approval_id: str, audit_lock: int) -> Chain:
    """Return the chain of a decision; its head reserves the decision event's seq and reads the run.

    The head returns `last_event_seq`, the run's `status` and `auto_resume`, and `others`:
    whether a suspend approval of the run other than this one is still pending (the caller holds
    the run's row lock, so nothing else decides meanwhile). On PostgreSQL it also takes the audit
    chain's lock (`audit_lock`, held to the commit), which the decision's audit entry needs next:
    a statement saved.
    """
    returning = (
        f"last_event_seq, status, auto_resume, EXISTS ({_PENDING_SUSPEND} AND agents_approval.id <> %s) AS others"
    )
    params: list[Any] = [run_id, *_PENDING_SUSPEND_PARAMS, approval_id]
    columns: tuple[str, ...] = ("last_event_seq", "status", "auto_resume", "others")
    if connection.vendor == "postgresql":
        returning += ", pg_advisory_xact_lock(%s) IS NULL AS audit_locked"
        params.append(audit_lock)
        columns += ("audit_locked",)
    sql = f"UPDATE {_RUN} SET last_event_seq = last_event_seq + 1 WHERE id = %s RETURNING {returning}"
    return Chain(sql, params, columns)


def run_suspend(*, run_id: str, owner: str, now: datetime) -> bool:
    """Suspend and release a run this owner drives, if a suspend approval of it is still pending
    (or a decided call of it is held until a time still to come).

    On PostgreSQL the run's row is locked first, by a statement of its own: a decision (or a
    deadline) under way holds that lock to its commit, and the check that follows, a new
    statement, sees what it decided. Alone, the UPDATE would wait for the row and then judge
    the approvals as they were when it began (READ COMMITTED re-reads only the row it updates),
    suspending a run whose last approval that decision settled while it saw the run driven, and
    so enqueued no resume.
    """
    sql = f"""
        UPDATE {_RUN} SET status = %s, lease_owner = '', lease_expires_at = NULL, updated_at = %s
        WHERE id = %s AND lease_owner = %s AND (EXISTS ({_PENDING_SUSPEND}) OR EXISTS ({_HELD_CALL}))"""
    lock = connection.features.has_select_for_update
    with transaction.atomic() if lock else contextlib.nullcontext(), connection.cursor() as cursor:
        if lock:
            cursor.execute(f"SELECT 1 FROM {_RUN} WHERE id = %s FOR UPDATE", [run_id])
        params = [
            Run.Status.SUSPENDED,
            db_time(now),
            run_id,
            owner,
            *_PENDING_SUSPEND_PARAMS,
            db_time(now),
            Approval.Mode.SUSPEND,
        ]
        cursor.execute(sql, params)
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


@functools.cache
def _token_user_sql() -> str:
    user, token = User._meta.db_table, ApiToken._meta.db_table
    permission, content_type = Permission._meta.db_table, ContentType._meta.db_table
    own = User.user_permissions.through._meta.db_table
    member, granted = User.groups.through._meta.db_table, Group.permissions.through._meta.db_table
    named = f"JOIN {permission} p ON p.id = x.permission_id JOIN {content_type} ct ON ct.id = p.content_type_id"
    # UNION ALL, not UNION: each branch is then filtered by the join's user id (an index probe),
    # where a UNION would be computed for every user first. Python drops the duplicates.
    return f"""
        SELECT {_columns(User, "u")}, t.id, (t.last_used_at IS NULL OR t.last_used_at < %s),
               perms.app_label, perms.codename
        FROM {token} t
        JOIN {user} u ON u.id = t.user_id
        LEFT JOIN (
            SELECT x.user_id AS user_id, ct.app_label AS app_label, p.codename AS codename FROM {own} x {named}
            UNION ALL
            SELECT m.user_id, ct.app_label, p.codename FROM {member} m JOIN {granted} x ON x.group_id = m.group_id {named}
        ) perms ON perms.user_id = u.id AND u.is_active AND NOT u.is_superuser
        WHERE t.token_hash = %s AND t.revoked_at IS NULL"""


def token_user(*, token_hash: str, used_before: datetime) -> tuple[User, int, bool] | None:
    """Return a live token's user, with the user's permissions read; its pk; whether its last use is older.

    One statement for what Django reads in three (the token with its user; the user's own
    permissions; their groups'). The permissions go where ModelBackend keeps them
    (`_perm_cache`), as ModelBackend would have read them, so `has_perm` answers from memory.
    An inactive user or a superuser reads none: the first has none, the second all.
    """
    with connection.cursor() as cursor:
        cursor.execute(_token_user_sql(), [db_time(used_before), token_hash])
        rows = cursor.fetchall()
    if not rows:
        return None
    user, (token_pk, stale, *_) = _instance(User, rows[0])
    if user.is_active and not user.is_superuser:
        user._perm_cache = {f"{row[-2]}.{row[-1]}" for row in rows if row[-1] is not None}  # type: ignore[attr-defined]
    return user, token_pk, bool(stale)


def approval_for_decision(approval_id: str) -> Approval | None:
    """Return the approval with its call and run, locked: the run's row first, then the approval's.

    The run's row first, as run_cancel takes it, so a decision and a cancel never interleave:
    a cancel that came first has expired the approval, and the decision's compare-and-set
    fails. Then the approval's: concurrent votes count one at a time. What
    `Approval.objects.select_for_update().select_related("tool_call", "run")` reads, with
    the run's lock taken before by a sub-select (a one-time filter on PostgreSQL, evaluated
    before the approval is read; the approval's run never changes, so its id is read there
    unlocked). SQLite's BEGIN IMMEDIATE already holds the one write lock.
    """
    lock = connection.features.has_select_for_update
    row = _one(_approval_for_decision_sql(lock), [approval_id] * (2 if lock else 1))
    if row is None:
        return None
    found, rest = _instance(Approval, row)
    found.tool_call, rest = _instance(ToolCall, rest)
    found.run, _ = _instance(Run, rest)
    return found


@functools.cache
def _approval_for_decision_sql(lock: bool) -> str:
    approval, call, run = (_columns(m, alias) for m, alias in ((Approval, "a"), (ToolCall, "t"), (Run, "r")))
    sql = f"""
        SELECT {approval}, {call}, {run} FROM {_APPROVAL} a
        JOIN {_TOOLCALL} t ON t.id = a.tool_call_id JOIN {_RUN} r ON r.id = a.run_id
        WHERE a.id = %s"""
    if lock:
        sql += f"""
          AND EXISTS (SELECT 1 FROM {_RUN} WHERE id = (SELECT run_id FROM {_APPROVAL} WHERE id = %s) FOR UPDATE)
        FOR UPDATE"""
    return sql


def _columns(model: type[Model], alias: str) -> str:
    """Every column of the model, in its fields' order, as `alias.column` (what `_instance` reads back)."""
    columns = (cast(str, field.column) for field in model._meta.concrete_fields)  # concrete: each has one
    return ", ".join(f"{alias}.{connection.ops.quote_name(column)}" for column in columns)


@functools.cache
def _readers(vendor: str, model: type[Model]) -> tuple[list[str], list[tuple[Any, list[_Converter]]]]:
    """The model's field names, and each column with the converters the ORM applies to it on this database."""
    fields = model._meta.concrete_fields
    columns = [field.get_col(model._meta.db_table) for field in fields]
    converters = [(c, connection.ops.get_db_converters(c) + c.get_db_converters(connection)) for c in columns]
    return [field.attname for field in fields], converters


def _instance(model: type[M], row: tuple[Any, ...]) -> tuple[M, tuple[Any, ...]]:
    """Build the model's instance from the row's first columns, converted as the ORM converts them; return the rest."""
    names, columns = _readers(connection.vendor, model)
    values = []
    for value, (column, converters) in zip(row, columns, strict=False):
        for converter in converters:
            value = converter(value, column, connection)
        values.append(value)
    return model.from_db(connection.alias, names, values), row[len(names) :]


def audit_insert(entry: AuditEntry, *, canonical: str, genesis: str) -> tuple[int, str, str]:
    """Insert an audit entry after the chain's head, hashed by PostgreSQL; return its id, prev_hash and hash.

    The head is read by the insert itself (the caller holds the chain's lock, taken by an
    earlier statement, so this statement's snapshot holds the last writer's commit), and the
    hash is sha256 of the head followed by `canonical`, the entry's canonical JSON: one
    statement where reading the head first took two. The caller checks the hash against its own.
    """
    fields = [f for f in AuditEntry._meta.concrete_fields if f.attname not in ("id", "prev_hash", "hash")]
    columns = ", ".join(connection.ops.quote_name(cast(str, f.column)) for f in fields)
    values = [f.get_db_prep_save(getattr(entry, f.attname), connection) for f in fields]
    table = AuditEntry._meta.db_table
    sql = f"""
        INSERT INTO {table} ({columns}, prev_hash, hash)
        SELECT {", ".join(["%s"] * len(fields))}, head.hash, encode(sha256(convert_to(head.hash || %s, 'UTF8')), 'hex')
        FROM (SELECT COALESCE((SELECT hash FROM {table} ORDER BY id DESC LIMIT 1), %s) AS hash) head
        RETURNING id, prev_hash, hash"""
    row = _one(sql, [*values, canonical, genesis])
    assert row is not None  # an INSERT … SELECT of one row returns it
    return row[0], row[1], row[2]


def run_event_horizon() -> tuple[int, frozenset[str]]:
    """Return the newest RunEvent id committed now, and the transactions that may still commit ids at or below it.

    PostgreSQL hands ids out from a sequence at INSERT, and transactions commit in another
    order: id 100 may commit after id 101. An INSERT holds RowExclusiveLock on the table from
    before it takes its id until its transaction ends, so the transactions holding that lock
    when this statement reads the locks (after its snapshot, which saw the newest id) are the
    only ones that may still add a row with an id at or below the newest: once none of them
    holds it any more, every such row is committed, or never will be. They are named by their
    virtual transaction ids (one reused would only make the wait longer). Other writers of the
    table (a purge's DELETE) are named too: they only delay. This takes the sequence's default
    CACHE 1: with a cache, a session would hand out ids it took before.

    SQLite admits one writer at a time, whose ids come after every committed one: none is held.
    """
    table = RunEvent._meta.db_table
    if connection.vendor != "postgresql":
        row = _one(f"SELECT max(id) FROM {table}", [])
        return (row[0] if row and row[0] is not None else 0), frozenset()
    sql = f"""
        SELECT (SELECT max(id) FROM {table}),
               ARRAY(SELECT DISTINCT virtualtransaction FROM pg_locks
                     WHERE locktype = 'relation' AND relation = %s::regclass AND mode = 'RowExclusiveLock'
                       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"""
    row = _one(sql, [table])
    assert row is not None  # a SELECT without FROM returns its one row
    return (row[0] or 0), frozenset(row[1])


def audit_head() -> str | None:
    """Return the newest audit entry's hash (None: the chain is empty); the caller holds the chain's lock."""
    row = _one(f"SELECT hash FROM {AuditEntry._meta.db_table} ORDER BY id DESC LIMIT 1", [])
    return None if row is None else row[0]


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


def _seconds_between(
    vendor: str, start: tuple[str, Sequence[Any]], end: tuple[str, Sequence[Any]]
) -> tuple[str, list[Any]]:
    """Return the SQL (and its params) of the seconds from one timestamp expression to another, as a float."""
    (start_sql, start_params), (end_sql, end_params) = start, end
    if vendor == "postgresql":
        # date_part, not EXTRACT: EXTRACT returns numeric (PostgreSQL 14+), 2.5 times the CPU per row.
        return f"date_part('epoch', {end_sql} - {start_sql})", [*end_params, *start_params]
    # SQLite keeps "YYYY-MM-DD HH:MM:SS[.ffffff]" text: whole seconds from strftime, then the
    # fractions from the text after them, so a wait at a bucket's bound stays exact (julianday's
    # floats were some microseconds off).
    sql = (
        f"((strftime('%%s', {end_sql}) - strftime('%%s', {start_sql}))"
        f" + (CAST(substr({end_sql}, 20) AS REAL) - CAST(substr({start_sql}, 20) AS REAL)))"
    )
    return sql, [*end_params, *start_params, *end_params, *start_params]


class SecondsBetween(Func):
    """The seconds from one timestamp column to another, as a float (how long an approval waited).

    Django's own difference is an interval, which each database spells and returns in its own way
    (PostgreSQL's is parsed into a timedelta per row); a float costs neither.
    """

    output_field = FloatField()

    def __init__(self, start: str, end: str) -> None:
        super().__init__(F(start), F(end))

    def as_sql(self, compiler: Any, connection: Any, *args: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        start, end = (compiler.compile(each) for each in self.source_expressions)
        sql, params = _seconds_between(connection.vendor, start, end)
        return sql, tuple(params)

    as_sqlite = as_sql  # not SQLiteNumericMixin's, which would wrap it in a cast for decimals


class SecondsApart(Func):
    """True when a timestamp is at least a column's number of seconds before another (a reminder is due).

    Django cannot say it on both databases: SQLite multiplies no interval by a column of floats.
    PostgreSQL subtracts the seconds as an interval, which is cheaper per row than taking the
    seconds between the two (60 ms against 105 ms over 100,000 rows here); SQLite compares the
    seconds between.
    """

    output_field = BooleanField()

    def __init__(self, start: Expression, end: Expression, seconds: str) -> None:
        super().__init__(start, end, F(seconds))

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        (start, start_params), (end, end_params), (seconds, seconds_params) = (
            compiler.compile(each) for each in self.source_expressions
        )
        sql = f"({start} <= {end} - {seconds} * interval '1 second')"
        return sql, (*start_params, *end_params, *seconds_params)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:
        start, end, (seconds, seconds_params) = (compiler.compile(each) for each in self.source_expressions)
        between, params = _seconds_between(connection.vendor, start, end)
        return f"({between} >= {seconds})", (*params, *seconds_params)


def seconds_histogram(rows: QuerySet[Any], bounds: Sequence[float]) -> list[tuple[str, int, float, tuple[int, ...]]]:
    """Count `rows` (approvals) by tool: how many, their seconds from asked to decided, and how many within each bound.

    The seconds are computed once per row, in an inner query the OFFSET keeps apart: both
    databases would otherwise put its expression in place of every bucket's use of it and
    compute it again there (fourteen times a row for twelve bounds). A negative wait (clocks
    apart) adds nothing to the sum.
    """
    waited = rows.order_by().annotate(waited=SecondsBetween("created_at", "decided_at")).values_list("tool", "waited")
    inner, params = waited.query.sql_with_params()
    fence = "OFFSET 0" if connection.vendor == "postgresql" else "LIMIT -1 OFFSET 0"
    counts = "".join(", SUM(CASE WHEN w.waited <= %s THEN 1 ELSE 0 END)" for _ in bounds)
    sql = f"""
        SELECT w.tool, COUNT(*), SUM(CASE WHEN w.waited > 0 THEN w.waited ELSE 0 END){counts}
        FROM ({inner} {fence}) w
        GROUP BY w.tool ORDER BY w.tool"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bounds, *params])  # the bounds come first in the text
        return [(tool, count, float(total), tuple(within)) for tool, count, total, *within in cursor.fetchall()]


def nearest_rank_percentiles(waits: QuerySet[Any], shares: tuple[float, float]) -> list[tuple[str, Any, float, float]]:
    """PostgreSQL: two nearest-rank percentiles (percentile_disc) of `waits` rows (tool, day, seconds).

    A row per tool (day None) and per tool and day, from one grouped statement.
    """
    inner, params = waits.query.sql_with_params()
    sql = f"""
        SELECT w.tool, w.day, percentile_disc(CAST(%s AS double precision[])) WITHIN GROUP (ORDER BY w.waited)
        FROM ({inner}) w
        GROUP BY GROUPING SETS ((w.tool), (w.tool, w.day))"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(shares), *params])
        return [(tool, day, low, high) for tool, day, (low, high) in cursor.fetchall()]


def approvals_open_by_period(*, start: datetime, seconds: float) -> dict[int, tuple[int, int]]:
    """Return, for each period of `seconds` from `start`, the most approvals open at once in it and its net change.

    Over the approvals still pending or decided since `start`. Each becomes +1 when it was
    asked and -1 when it was decided; the database sorts these by time (a decision first at a
    tie) and keeps a running sum, the number open after each, so the page reads a row per
    period instead of two times per approval. Period -1 holds everything up to `start` (its
    net change is the number open then); a period in which nothing happened has no row.
    """
    when = db_time(start)
    since, since_params = _seconds_between(connection.vendor, ("%s", [when]), ("at", []))
    # The period's number: FLOOR on PostgreSQL, whose cast rounds; SQLite's cast truncates (at > start).
    period = f"FLOOR({since} / %s)::integer" if connection.vendor == "postgresql" else f"CAST({since} / %s AS INTEGER)"
    sql = f"""
        SELECT period, MAX(open_now), SUM(change) FROM (
            SELECT CASE WHEN at <= %s THEN -1 ELSE {period} END AS period, change,
                   SUM(change) OVER (ORDER BY at, change ROWS UNBOUNDED PRECEDING) AS open_now
            FROM (
                SELECT created_at AS at, 1 AS change FROM {_APPROVAL} WHERE decided_at IS NULL OR decided_at >= %s
                UNION ALL
                SELECT decided_at, -1 FROM {_APPROVAL} WHERE decided_at >= %s
            ) AS changes
        ) AS running
        GROUP BY period
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [when, *since_params, seconds, when, when])
        return {period: (peak, net) for period, peak, net in cursor.fetchall()}


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
