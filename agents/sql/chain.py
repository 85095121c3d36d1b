"""A write of several rows that all hang on one first statement: a single statement on PostgreSQL.

A driver's write (a model turn, a tool's result, the final answer) updates its run, fenced by
the lease, and adds rows that may only land if that update did. Through the ORM that is a
transaction of four to seven statements, each a round trip, and composing them costs the
worker more CPU than the database spends running them. Here the statements are built from
the models' own fields once per process, and:

- on PostgreSQL they are one statement of data-modifying WITH queries: the head first, then
  every write selecting from it, so a head that returns no row (a lost lease) writes
  nothing, and the whole commits or fails as one. The rows of an insert travel as one JSON
  array, read back by `jsonb_to_recordset` into the columns' types: a parameter per insert
  rather than one per value, which the driver would otherwise quote one by one;
- on SQLite, which has no data-modifying WITH, they run one after the other in a
  transaction, the head's values read back before the rest.

The rows are the ones the ORM would write: field defaults, `auto_now` times and each value
prepared by its field. tests/agents/test_sql_chain.py compares them.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, DateTimeField, Field, JSONField, Model
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
        db = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up again
        if db.vendor == "postgresql":
            return _run_postgresql(self, db, timezone.now())
        return _run_in_steps(self, db, timezone.now())


def inserting(instance: Model, *, returning: tuple[str, ...]) -> Chain:
    """Return a chain whose head inserts this unsaved instance's row, returning these columns."""
    db = connections[DEFAULT_DB_ALIAS]
    table = _table(type(instance))
    row = _row(table, values_of(instance), timezone.now())
    columns = ", ".join(table.columns[name] for name in row)
    marks = ", ".join(["%s"] * len(row))
    sql = f"INSERT INTO {table.name} ({columns}) VALUES ({marks}) RETURNING {', '.join(returning)}"
    return Chain(sql, [table.fields[name].get_db_prep_save(value, db) for name, value in row.items()], returning)


def values_of(instance: Model) -> dict[str, Any]:
    """Return an unsaved instance's field values for `Chain.insert` (its unset `auto_now` times left to the chain)."""
    table = _table(type(instance))
    values = {name: getattr(instance, name) for name in table.fields}
    return {name: value for name, value in values.items() if value is not None or name not in table.auto_now}


# -- the models' fields, read once ------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    name: str
    fields: dict[str, Field[Any, Any]]  # by attname, every concrete field but an automatic pk
    columns: dict[str, str]  # attname → quoted column
    types: dict[str, str]  # attname → the column's type without its length (a cast must not truncate)
    auto_now: frozenset[str]  # the fields a new row gets the time of its write in, when not given
    pk_column: str


@functools.cache
def _table(model: type[Model]) -> _Table:
    db = connections[DEFAULT_DB_ALIAS]
    quote = db.ops.quote_name
    fields = {f.attname: f for f in model._meta.concrete_fields if not isinstance(f, AutoField)}
    columns = {name: quote(cast(str, f.column)) for name, f in fields.items()}
    types = {name: re.sub(r"\(.*\)", "", f.db_type(db) or "") for name, f in fields.items()}
    auto_now = frozenset(
        name for name, f in fields.items() if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
    )
    pk = quote(cast(str, model._meta.pk.column))
    return _Table(quote(model._meta.db_table), fields, columns, types, auto_now, pk)


def _row(table: _Table, values: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Return every field's value for a new row: the given ones, else `auto_now` times and defaults."""
    row = {}
    for name, f in table.fields.items():
        if name in values:
            row[name] = values[name]
        elif name in table.auto_now:
            row[name] = now
        else:
            row[name] = f.get_default()
    return row


def _prepared(table: _Table, name: str, value: Any, db: BaseDatabaseWrapper) -> Any:
    """Return a value as its field writes it (a marker is kept, for the caller to place)."""
    if isinstance(value, HeadValue | InsertedValue):
        return value
    return table.fields[name].get_db_prep_save(value, db)


# -- PostgreSQL: one statement ---------------------------------------------------------------


def _run_postgresql(chain: Chain, db: BaseDatabaseWrapper, now: datetime) -> ChainResult | None:
    parts, params = [f"h AS ({chain.sql})"], list(chain.params)
    outputs = []
    inserts = [write for write in chain.writes if isinstance(write, _Insert)]
    numbers = itertools.count()
    for write in chain.writes:
        # An insert is w<its index among the inserts> (what InsertedValue names), an update u<place>.
        name = f"w{next(numbers)}" if isinstance(write, _Insert) else f"u{len(parts)}"
        if isinstance(write, _Insert) and not write.rows:
            continue  # nothing to add (no approval in this turn, say): the insert's result stays empty
        sql, write_params = _pg_insert(write, now) if isinstance(write, _Insert) else _pg_update(write, db)
        parts.append(f"{name} AS ({sql})")
        params += write_params
        if isinstance(write, _Insert) and write.returning:
            columns = ", ".join(write.returning)
            outputs.append(f"(SELECT json_agg(json_build_array({columns})) FROM {name})")
    select = ", ".join([*(f"h.{column}" for column in chain.columns), *outputs])
    with db.cursor() as cursor:
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


def _pg_insert(write: _Insert, now: datetime) -> tuple[str, list[Any]]:
    """Return the insert reading its rows from one JSON array (`jsonb_to_recordset`), markers placed in SQL."""
    table = _table(write.model)
    rows = [_row(table, values, now) for values in write.rows]
    expressions, declared = [], []
    for name in table.fields:
        column = f'"{name}"'  # an attname is an identifier: the recordset's column names
        marker = rows[0][name]
        if isinstance(marker, HeadValue):
            expressions.append(f"h.{marker.column} - v.{column}")
            declared.append(f"{column} integer")
        elif isinstance(marker, InsertedValue):
            found = f"w{marker.insert}"
            expressions.append(f"(SELECT {marker.column} FROM {found} WHERE {marker.key_column} = v.{column})")
            declared.append(f"{column} {'bigint' if isinstance(marker.key, int) else 'text'}")
        else:
            expressions.append(f"v.{column}")
            declared.append(f"{column} {table.types[name]}")
    data = [
        {name: _json_value(table, name, value, marker=rows[0][name]) for name, value in row.items()} for row in rows
    ]
    columns = ", ".join(table.columns.values())
    returning = f" RETURNING {', '.join(write.returning)}" if write.returning else ""
    recordset = f"jsonb_to_recordset(%s::jsonb) AS v({', '.join(declared)})"
    sql = f"INSERT INTO {table.name} ({columns}) SELECT {', '.join(expressions)} FROM h, {recordset}{returning}"
    return sql, [json.dumps(data, ensure_ascii=False)]


def _json_value(table: _Table, name: str, value: Any, *, marker: Any) -> Any:
    """Return a row's value as JSON carries it to its recordset column."""
    if isinstance(marker, HeadValue | InsertedValue):
        if type(value) is not type(marker) or (isinstance(value, HeadValue) and value.column != marker.column):
            raise ValueError(f"{name}: every row of an insert places its value the same way")
        return value.minus if isinstance(value, HeadValue) else value.key
    if value is None:
        return None
    f = table.fields[name]
    if isinstance(f, JSONField):
        return value  # the JSON itself, nested in the row
    if isinstance(f, DateTimeField):
        return value.isoformat()  # a time with its offset, which timestamptz reads as is
    prepared = f.get_prep_value(value)
    return prepared if isinstance(prepared, str | int | float | bool) else str(prepared)


def _pg_update(write: _Update, db: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    table = _table(write.model)
    sets, params = [], []
    for name, value in write.fields.items():
        prepared = _prepared(table, name, value, db)
        if isinstance(prepared, HeadValue):
            sets.append(f"{table.columns[name]} = h.{prepared.column} - %s")
            params.append(prepared.minus)
        else:
            # Typed: an untyped NULL would be text, which no JSON or time column takes.
            sets.append(f"{table.columns[name]} = CAST(%s AS {table.types[name]})")
            params.append(prepared)
    where, where_params = _where(table, write, db)
    sql = f"UPDATE {table.name} SET {', '.join(sets)} WHERE {where} AND EXISTS (SELECT 1 FROM h)"
    return sql, [*params, *where_params]


def _where(table: _Table, write: _Update, db: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    conditions, params = [f"{table.pk_column} = %s"], [write.pk]
    for name, value in write.where.items():
        if value is None:
            conditions.append(f"{table.columns[name]} IS NULL")
        else:
            conditions.append(f"{table.columns[name]} = %s")
            params.append(_prepared(table, name, value, db))
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


def _run_in_steps(chain: Chain, db: BaseDatabaseWrapper, now: datetime) -> ChainResult | None:
    with transaction.atomic(using=db.alias), db.cursor() as cursor:
        cursor.execute(chain.sql, chain.params)
        row = cursor.fetchone()
        if row is None:
            return None
        steps = _Steps(dict(zip(chain.columns, row, strict=False)))
        for write in chain.writes:
            if isinstance(write, _Insert):
                steps.inserted.append(_insert_step(cursor, write, steps, db, now))
                steps.inserts.append(write)
            else:
                _update_step(cursor, write, steps, db)
    return ChainResult(steps.head, steps.inserted)


def _insert_step(
    cursor: Any, write: _Insert, steps: _Steps, db: BaseDatabaseWrapper, now: datetime
) -> list[tuple[Any, ...]]:
    if not write.rows:
        return []
    table = _table(write.model)
    rows, params = [], []
    for values in write.rows:
        row = _row(table, values, now)
        rows.append(f"({', '.join(['%s'] * len(row))})")
        params += [steps.place(_prepared(table, name, value, db)) for name, value in row.items()]
    returning = f" RETURNING {', '.join(write.returning)}" if write.returning else ""
    columns = ", ".join(table.columns.values())
    cursor.execute(f"INSERT INTO {table.name} ({columns}) VALUES {', '.join(rows)}{returning}", params)
    return [tuple(row) for row in cursor.fetchall()] if write.returning else []


def _update_step(cursor: Any, write: _Update, steps: _Steps, db: BaseDatabaseWrapper) -> None:
    table = _table(write.model)
    sets = [f"{table.columns[name]} = %s" for name in write.fields]
    values = [steps.place(_prepared(table, name, value, db)) for name, value in write.fields.items()]
    where, where_params = _where(table, write, db)
    cursor.execute(f"UPDATE {table.name} SET {', '.join(sets)} WHERE {where}", [*values, *where_params])
