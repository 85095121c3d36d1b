"""Searches find a word in any text they cover; on PostgreSQL trigram indexes serve them, not a read of every row."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext

from agents import selectors
from agents.models import Approval, Run, ToolCall
from tests.support.flows import decide, pending, start

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="trigram indexes are PostgreSQL's")

latest = importlib.import_module("agents.migrations.0032_run_search_leaves_out_driven_runs")


def _plan_without_full_reads(queryset: QuerySet) -> str:
    """Return the plan of the query's first page when reading a whole table or index is made as dear as can be.

    The tests' tables are tiny, so the planner would read them whole anyway; costing those
    reads out leaves only an index whose expressions match what the query asks.
    """
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
    return queryset[:26].explain()


def _asked(prompt: str) -> Approval:
    [approval] = pending(start(prompt))
    return approval


def _found(search: str, status: str = "pending") -> set[str]:
    return set(selectors.approval_list(status=status, search=search).values_list("pk", flat=True))


# With 1, a word two rows hold narrows nothing: both ways of searching are taken (on PostgreSQL).
@pytest.mark.parametrize("few_holders", [1, selectors.FEW_HOLDERS])
def test_the_inbox_search_finds_a_word_in_the_prompt_the_call_the_tool_or_the_note(db, monkeypatch, few_holders):
    monkeypatch.setattr(selectors, "FEW_HOLDERS", few_holders)
    refund, other_refund = _asked("Refund order A1001 for 25.00 USD"), _asked("Refund order A1002 for 30.00 USD")
    mail = _asked("Email carol@example.com that it shipped")
    ToolCall.objects.filter(pk=mail.tool_call_id).update(arguments={"to": "carol@example.com", "memo": 'Zürich \\ "x"'})
    noted = _asked("Refund order A1003 for 40.00 USD")
    decide(noted, "rejected", note="Looks fraudulent", auto_resume=False)

    assert _found("a1001") == {refund.pk}
    assert _found("A100") == {refund.pk, other_refund.pk}
    assert _found("REFUND_request a1002") == {other_refund.pk}
    assert _found("zürich") == _found('\\ "x"') == {mail.pk}  # only in what the model proposed
    assert _found("25.00 usd") == {refund.pk}  # only in the prompt (the call asks for 2500 cents)
    assert _found("fraudulent") == set()
    assert _found("fraudulent", status="all") == {noted.pk}
    assert _found("a1 01") == {refund.pk}  # words too short for a trigram narrow nothing
    assert _found("a1001 carol") == _found("nowhere") == set()


# The runs' trigram index leaves out running internal runs (migration 0032): the searches find them another way.
@pytest.mark.parametrize("few_holders", [1, selectors.FEW_HOLDERS])
def test_the_searches_find_a_run_a_worker_drives_an_external_session_and_a_waiting_run(db, monkeypatch, few_holders):
    monkeypatch.setattr(selectors, "FEW_HOLDERS", few_holders)
    driven = start("Refund order A1007 for 25.00 USD to Quixote")
    [asked] = pending(driven)
    # As while a worker drives it: a deferred call's approval waits on a running run.
    Run.objects.filter(pk=driven.pk).update(status=Run.Status.RUNNING)
    session = Run.objects.create(
        id="run_session_1", kind=Run.Kind.EXTERNAL, agent="support", status=Run.Status.RUNNING, input="A1008 nightly"
    )
    waiting = start("Refund order A1009 for 30.00 USD to Sancho")
    [waits] = pending(waiting)

    assert set(selectors.run_search(query="a100").values_list("pk", flat=True)) == {driven.pk, session.pk, waiting.pk}
    assert list(selectors.run_search(query="QUIXOTE").values_list("pk", flat=True)) == [driven.pk]
    assert list(selectors.run_search(query="nightly").values_list("pk", flat=True)) == [session.pk]
    assert _found("quixote") == {asked.pk}  # only in the prompt of the run being driven
    assert _found("sancho") == {waits.pk}


@postgres_only
def test_the_inbox_search_for_a_word_few_rows_hold_reads_indexes_only(db):
    _asked("Refund order A1001 for 25.00 USD")

    with CaptureQueriesContext(connection) as lookups:
        approvals = selectors.approval_list(search="A1001")
    plans = [_plan_without_full_reads_of(query["sql"]) for query in lookups.captured_queries]

    assert [
        name
        for name in ("approval_search_trgm", "toolcall_arguments_trgm", "run_text_trgm")
        if any(name in plan for plan in plans)
    ] == [
        "approval_search_trgm",
        "toolcall_arguments_trgm",
        "run_text_trgm",
    ], plans
    page = _plan_without_full_reads(approvals)
    assert "Seq Scan" not in page and all("Seq Scan" not in plan for plan in plans), [page, *plans]


@postgres_only
def test_the_inbox_search_looks_up_three_words_at_most_and_only_those_an_index_holds(db, monkeypatch):
    _asked("Refund order A1001 for 25.00 USD")
    monkeypatch.setattr(selectors, "FEW_HOLDERS", 0)  # any word a row holds is common: none narrows
    looked_up: list[str] = []
    few_holders = selectors._few_holders
    monkeypatch.setattr(selectors, "_few_holders", lambda word: looked_up.append(word) or few_holders(word))

    found = selectors.approval_list(search="a1 25.00 _ Refund refund REFUND order for usd")

    assert looked_up == ["Refund", "order", "for"]  # "a1", "25.00" and "_" hold no trigram
    assert found.count() == 1  # every word is still searched for


def _plan_without_full_reads_of(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


@postgres_only
def test_the_runs_page_search_reads_its_trigram_index(db):
    plan = _plan_without_full_reads(selectors.run_search(query="A1001"))

    assert "run_text_trgm" in plan, plan
    assert "run_status_created" in plan, plan  # the running internal runs, which it leaves out
    assert "Seq Scan" not in plan, plan


def _valid(name: str) -> bool | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_index.indisvalid FROM pg_index JOIN pg_class ON pg_class.oid = pg_index.indexrelid"
            " WHERE pg_class.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


@postgres_only
def test_the_migration_builds_again_an_index_a_killed_build_left_invalid(transactional_db):
    # What CREATE INDEX CONCURRENTLY leaves when the process building it dies mid-way.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false"
            " WHERE indexrelid = (SELECT oid FROM pg_class WHERE relname = 'run_text_trgm')"
        )
    assert _valid("run_text_trgm") is False

    with connection.schema_editor(atomic=False) as editor:
        latest.leave_out_driven_runs(None, editor)

    assert _valid("run_text_trgm") is True
    assert _valid("run_search_trgm") is None  # the index it replaced is gone


@postgres_only
def test_the_planner_has_statistics_on_the_runs_searched_texts(db):
    """It never reads a partial index's: without its own, a word no run holds read every run (283 ms at 200,000)."""
    start("Refund order A1001 for 25.00 USD")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_run")
        cursor.execute("SELECT expr FROM pg_stats_ext_exprs WHERE tablename = 'agents_run' ORDER BY expr")
        expressions = [row[0] for row in cursor.fetchall()]

    assert expressions == ["upper((id)::text)", "upper(input)", "upper(output)"]
