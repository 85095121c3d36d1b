"""Each index of the engine's tables serves a lookup no other serves: every write pays an entry in each (migration 0031)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.gateway.services import external_claims_mark_in_doubt
from agents.models import Run, ToolCall

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's pattern indexes")


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str | None, ...]  # None: an expression
    partial: bool
    unique: bool
    definition: str


def _indexes(table: str) -> list[Index]:
    """Return the table's indexes as the database has them (keys and unique constraints included)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                """
                SELECT c.relname,
                       ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
                             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                             ORDER BY k.n),
                       i.indpred IS NOT NULL, i.indisunique, pg_get_indexdef(i.indexrelid)
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                WHERE i.indrelid = %s::regclass""",
                [table],
            )
            return [Index(name, tuple(columns), partial, unique, sql) for name, columns, partial, unique, sql in cursor]
        indexes = []
        for _, name, unique, _, partial in cursor.execute(f"PRAGMA index_list({table})").fetchall():
            columns = tuple(row[2] for row in cursor.execute(f"PRAGMA index_info({name})").fetchall())
            indexes.append(Index(name, columns, bool(partial), bool(unique), ""))
        return indexes


def _tables() -> list[str]:
    return [model._meta.db_table for model in apps.get_app_config("agents").get_models()]


def test_every_foreign_key_leads_an_index_that_serves_each_of_its_lookups(db):
    """Deletes, the database's key checks and the engine's reads by run find their rows through an index."""
    unserved = []
    for model in apps.get_app_config("agents").get_models():
        table = model._meta.db_table
        leading = {index.columns[0] for index in _indexes(table) if not index.partial}
        keys = (field.column for field in model._meta.concrete_fields if field.is_relation)
        unserved += [f"{table}.{column}" for column in keys if column not in leading]
    assert unserved == []


def test_no_index_repeats_the_first_columns_of_another(db):
    """A plain index on columns another index starts with serves nothing the other does not."""
    repeated = []
    for table in _tables():
        indexes = [i for i in _indexes(table) if not i.partial and None not in i.columns]
        for plain in (i for i in indexes if not i.unique):
            covering = [
                other.name
                for other in indexes
                if other.name != plain.name and other.columns[: len(plain.columns)] == plain.columns
            ]
            if covering:
                repeated.append(f"{plain.name} {plain.columns} (served by {', '.join(covering)})")
    assert repeated == []


@postgres_only
def test_no_text_column_keeps_a_pattern_index_no_query_reads(db):
    """Django adds a `varchar_pattern_ops` twin to every indexed text column; it serves only LIKE 'prefix%'."""
    twins = [i.name for table in _tables() for i in _indexes(table) if "pattern_ops" in i.definition]
    assert twins == []


@postgres_only
def test_the_sweepers_look_for_stale_external_claims_reads_the_external_sessions_index(db):
    """Joined to its run by `kind = 'external'`, which no other index serves: at 200,000 runs it read them all (24 ms).

    The planner's choice depends on the tables' statistics, so the test gives it a thousand
    runs and calls and analyzes them itself (another test's ANALYZE of near-empty tables made
    a full read of an index look as cheap as any other plan).
    """
    runs = Run.objects.bulk_create(Run(id=f"run_many_{n}", agent="support", input="x") for n in range(1000))
    ToolCall.objects.bulk_create(ToolCall(run=run, call_id="call_1", step=1, name="refund_request") for run in runs)
    with CaptureQueriesContext(connection) as queries:
        external_claims_mark_in_doubt()
    [look] = [query["sql"] for query in queries.captured_queries if "'external'" in query["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_run")
        cursor.execute("ANALYZE agents_toolcall")
        cursor.execute(f"EXPLAIN {look}")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "run_external" in plan, plan
