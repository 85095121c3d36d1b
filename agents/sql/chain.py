"""A write of several rows that all hang on one first statement: a single statement on PostgreSQL.

A driver's write (a model turn, a tool's result, the final answer) updates its run, fenced by
the lease, and adds rows that may only land if that update did. Through the ORM that is a
transaction of four to seven statements, each a round trip, and composing them costs the
worker more CPU than the database spends running them. Here the statements are built from
the models' own fields once per process, and:

- on PostgreSQL they are one statement of data-modifying WITH queries: the head first, then
  every write selecting from it, so a head that returns no row (a lost lease) writes
  nothing, and the whole commits or fails as one;
- on SQLite, which has no data-modifying WITH, they run one after the other in a
  transaction, the head's values read back before the rest.

The rows are the ones the ORM would write: field defaults, `auto_now` times and each value
prepared by its field for this database. tests/agents/test_sql_chain.py compares them.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import AutoField, Field, Model
from django.utils import timezone


@dataclass(frozen=True)
class HeadValue:
    """A value the head returned, less `minus`: an event seq the head reserved (`last_event_seq - k`)."""

    column: str
    minus: int = 0


@dataclass(frozen=True)
class InsertedValue:
    """The `column` of the row an earlier insert of the chain made whose `key_column` is `key`."""

    insert: int
    key_column: str
    key: Any
    column: str = "id"


@dataclass
class ChainResult:
    head: dict[str, Any]
    inserted: list[list[tuple[Any, ...]]]  # per insert, the `returning` columns of its rows, in order


@dataclass
class _Insert:
    model: type[Model]
    rows: list[dict[str, Any]]
    returning: tuple[str, ...]


@dataclass
class _Update:
    model: type[Model]
    pk: Any
    fields: dict[str, Any]
    where: dict[str, Any]


@dataclass
class Chain:
    """A head statement returning one row (or none) and the writes that hang on it."""

    sql: str
    params: list[Any]
    columns: tuple[str, ...]
    writes: list[_Insert | _Update] = field(default_factory=list)

    def insert(self, model: type[Model], rows: list[dict[str, Any]], *, returning: tuple[str, ...] = ()) -> int:
        """Add rows (field name → value; unnamed fields get their defaults); return the insert's index."""
        self.writes.append(_Insert(model, rows, returning))
        return sum(isinstance(write, _Insert) for write in self.writes) - 1

    def update(
        self, model: type[Model], pk: Any, fields: dict[str, Any], *, where: dict[str, Any] | None = None
    ) -> None:
        """Set fields of one row, if it still has the values of `where` (a compare-and-set)."""
        self.writes.append(_Update(model, pk, fields, where or {}))

    def run(self) -> ChainResult | None:
        """Write it all, or nothing when the head returns no row (then return None)."""
        now = timezone.now()
        if connection.vendor == "postgresql":
            return _run_postgresql(self, now)
        return _run_in_steps(self, now)


def inserting(instance: Model, *, returning: tuple[str, ...]) -> Chain:
    """Return a chain whose head inserts this unsaved instance's row, returning these columns."""
    table = _table(type(instance), connection.vendor)
    row = _row(table, values_of(instance), timezone.now())
    columns = ", ".join(table.columns[name] for name in row)
    sql = (
        f"INSERT INTO {table.name} ({columns}) VALUES ({', '.join(['%s'] * len(row))}) RETURNING {', '.join(returning)}"
    )
    return Chain(sql, list(row.values()), returning)


def values_of(instance: Model) -> dict[str, Any]:
    """Return an unsaved instance's field values for `Chain.insert` (its unset `auto_now` times left to the chain)."""
    table = _table(type(instance), connection.vendor)
    values = {name: getattr(instance, name) for name in table.fields}
    return {name: value for name, value in values.items() if value is not None or name not in table.auto_now}


# -- the models' fields, prepared once --------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    name: str
    fields: dict[str, Field[Any, Any]]  # by attname, every concrete field but an automatic pk
    columns: dict[str, str]  # attname → quoted column
    casts: dict[str, str]  # attname → the column's type without its length (a cast must not truncate)
    auto_now: frozenset[str]  # the fields a new row gets the time of its write in, when not given
    pk_column: str


@functools.cache
def _table(model: type[Model], vendor: str) -> _Table:
    quote = connection.ops.quote_name
    fields = {f.attname: f for f in model._meta.concrete_fields if not isinstance(f, AutoField)}
    columns = {name: quote(cast(str, f.column)) for name, f in fields.items()}
    casts = {name: re.sub(r"\(.*\)", "", f.db_type(connection) or "") for name, f in fields.items()}
    auto_now = frozenset(
        name for name, f in fields.items() if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
    )
    pk = quote(cast(str, model._meta.pk.column))
    return _Table(quote(model._meta.db_table), fields, columns, casts, auto_now, pk)


def _prepared(table: _Table, name: str, value: Any) -> Any:
    """Return a value as its field writes it (a marker is kept, for the caller to place)."""
    if isinstance(value, HeadValue | InsertedValue):
        return value
    return table.fields[name].get_db_prep_save(value, connection)


def _row(table: _Table, values: dict[str, Any], now: Any) -> dict[str, Any]:
    """Return every field's value for a new row: the given ones, else `auto_now` times and defaults."""
    row = {}
    for name, f in table.fields.items():
        if name in values:
            value = values[name]
        elif name in table.auto_now:
            value = now
        else:
            value = f.get_default()
        row[name] = _prepared(table, name, value)
    return row


# -- PostgreSQL: one statement ---------------------------------------------------------------


def _run_postgresql(chain: Chain, now: Any) -> ChainResult | None:
    parts, params = [f"h AS ({chain.sql})"], list(chain.params)
    outputs = []
    inserts = [write for write in chain.writes if isinstance(write, _Insert)]
    numbers = itertools.count()
    for write in chain.writes:
        # An insert is w<its index among the inserts> (what InsertedValue names), an update u<place>.
        name = f"w{next(numbers)}" if isinstance(write, _Insert) else f"u{len(parts)}"
        if isinstance(write, _Insert) and not write.rows:
            continue  # nothing to add (no approval in this turn, say): the insert's result stays empty
        sql, write_params = _pg_insert(write, now) if isinstance(write, _Insert) else _pg_update(write)
        parts.append(f"{name} AS ({sql})")
        params += write_params
        if isinstance(write, _Insert) and write.returning:
            columns = ", ".join(write.returning)
            outputs.append(f"(SELECT json_agg(json_build_array({columns})) FROM {name})")
    select = ", ".join([*(f"h.{column}" for column in chain.columns), *outputs])
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT {select} FROM h", params)
        row = cursor.fetchone()
    if row is None:
        return None
    head = dict(zip(chain.columns, row, strict=False))
    inserted = iter(row[len(chain.columns) :])
    results = [
        [tuple(values) for values in (next(inserted) or [])] if write.returning and write.rows else []
        for write in inserts
    ]
    return ChainResult(head, results)


def _pg_value(table: _Table, name: str, value: Any) -> tuple[str, list[Any]]:
    if isinstance(value, HeadValue):
        return f"h.{value.column} - %s", [value.minus]
    if isinstance(value, InsertedValue):
        return f"(SELECT {value.column} FROM w{value.insert} WHERE {value.key_column} = %s)", [value.key]
    # Typed: an untyped NULL would be text, which no JSON or time column takes.
    return f"CAST(%s AS {table.casts[name]})", [value]


def _pg_insert(write: _Insert, now: Any) -> tuple[str, list[Any]]:
    table = _table(write.model, "postgresql")
    selects, params = [], []
    for values in write.rows:
        row = _row(table, values, now)
        expressions = []
        for name, value in row.items():
            sql, value_params = _pg_value(table, name, value)
            expressions.append(sql)
            params += value_params
        selects.append(f"SELECT {', '.join(expressions)} FROM h")
    columns = ", ".join(table.columns.values())
    returning = f" RETURNING {', '.join(write.returning)}" if write.returning else ""
    return f"INSERT INTO {table.name} ({columns}) {' UNION ALL '.join(selects)}{returning}", params


def _pg_update(write: _Update) -> tuple[str, list[Any]]:
    table = _table(write.model, "postgresql")
    sets, params = [], []
    for name, value in write.fields.items():
        sql, value_params = _pg_value(table, name, _prepared(table, name, value))
        sets.append(f"{table.columns[name]} = {sql}")
        params += value_params
    where, where_params = _where(table, write)
    return f"UPDATE {table.name} SET {', '.join(sets)} WHERE {where} AND EXISTS (SELECT 1 FROM h)", [
        *params,
        *where_params,
    ]


def _where(table: _Table, write: _Update) -> tuple[str, list[Any]]:
    conditions, params = [f"{table.pk_column} = %s"], [write.pk]
    for name, value in write.where.items():
        if value is None:
            conditions.append(f"{table.columns[name]} IS NULL")
        else:
            conditions.append(f"{table.columns[name]} = %s")
            params.append(_prepared(table, name, value))
    return " AND ".join(conditions), params


# -- SQLite: the same writes, one statement after another -------------------------------------


@dataclass
class _Steps:
    """What the statements run so far returned: the head's row, and each insert's rows and their columns."""

    head: dict[str, Any]
    inserts: list[_Insert] = field(default_factory=list)
    inserted: list[list[tuple[Any, ...]]] = field(default_factory=list)

    def place(self, value: Any) -> Any:
        if isinstance(value, HeadValue):
            return self.head[value.column] - value.minus
        if isinstance(value, InsertedValue):
            returning = self.inserts[value.insert].returning
            key_at, column_at = returning.index(value.key_column), returning.index(value.column)
            return next(row[column_at] for row in self.inserted[value.insert] if row[key_at] == value.key)
        return value


def _run_in_steps(chain: Chain, now: Any) -> ChainResult | None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(chain.sql, chain.params)
        row = cursor.fetchone()
        if row is None:
            return None
        steps = _Steps(dict(zip(chain.columns, row, strict=False)))
        for write in chain.writes:
            if isinstance(write, _Insert):
                steps.inserted.append(_insert_step(cursor, write, steps, now))
                steps.inserts.append(write)
            else:
                _update_step(cursor, write, steps)
    return ChainResult(steps.head, steps.inserted)


def _insert_step(cursor: Any, write: _Insert, steps: _Steps, now: Any) -> list[tuple[Any, ...]]:
    if not write.rows:
        return []
    table = _table(write.model, connection.vendor)
    rows, params = [], []
    for values in write.rows:
        row = _row(table, values, now)
        rows.append(f"({', '.join(['%s'] * len(row))})")
        params += [steps.place(value) for value in row.values()]
    returning = f" RETURNING {', '.join(write.returning)}" if write.returning else ""
    columns = ", ".join(table.columns.values())
    cursor.execute(f"INSERT INTO {table.name} ({columns}) VALUES {', '.join(rows)}{returning}", params)
    return [tuple(row) for row in cursor.fetchall()] if write.returning else []


def _update_step(cursor: Any, write: _Update, steps: _Steps) -> None:
    table = _table(write.model, connection.vendor)
    sets = [f"{table.columns[name]} = %s" for name in write.fields]
    values = [steps.place(_prepared(table, name, value)) for name, value in write.fields.items()]
    where, where_params = _where(table, write)
    cursor.execute(f"UPDATE {table.name} SET {', '.join(sets)} WHERE {where}", [*values, *where_params])
