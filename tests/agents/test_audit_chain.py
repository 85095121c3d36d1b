"""The audit log's hash chain: every entry links to the one before; `audit verify` names a break.

Tampering is done with raw SQL, as someone with access to the database would do it.
Runs on SQLite and (with DATABASE_URL) PostgreSQL.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from agents import services
from agents.models import AuditEntry
from agents.services.audit import GENESIS, canonical_json, entry_fields, entry_hash
from dashboard import cli
from tests.agents.test_races import N, in_processes, in_threads
from tests.dashboard.test_audit import csv_body
from tests.support.flows import EXPORT_READS_COMMITTED, decide, pending, start

REFUND = "Refund order A1001 for 25.00 USD"
TABLE = AuditEntry._meta.db_table


@pytest.fixture
def history(db: None) -> list[AuditEntry]:
    """Seven entries from every kind of writer: decisions, refusals, an edit, a cancel, odd detail."""
    [first] = pending(start(REFUND))
    decide(
        first,
        "approved",
        by="bob",
        arguments={"order_id": "A1001", "amount_cents": 1500},
        note="½ now",
        auto_resume=False,
    )
    with pytest.raises(services.AlreadyDecided):
        decide(first, "rejected", by="alice")
    with pytest.raises(services.NotFound):
        decide("appr_missing", "approved", by="dave")
    run = start(REFUND, auto_resume=False)
    [second] = pending(run)
    services.approval_refuse(
        approval_id=second.id, decision="approved", attempt=attempt("eve"), outcome="not_permitted", reason="no"
    )
    decide(second, "rejected", by="alice", note="no refunds today")
    services.audit_append(
        approval_id="",
        action="note",
        actor="system",
        source="system",
        outcome="decided",
        detail={"big": 1e16, "ratio": 1.5, "tiny": 1e-7, "nested": {"b": [1, 2.0, None], "a": "日本"}},
    )
    services.run_cancel(run_id=start(REFUND).id, attempt=attempt("carol"))
    return list(AuditEntry.objects.order_by("id"))


def attempt(actor: str) -> services.Attempt:
    return services.Attempt(actor=actor, source="api", origin="10.0.0.9")


def verify(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = cli.main(["audit", "verify", *flags])
    return code, capsys.readouterr().out


def raw(sql: str, params: list[Any]) -> None:
    """Change stored rows behind the application's back."""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=TABLE), params)


def test_it_links_every_entry_to_the_one_before(history):
    assert len(history) >= 7
    assert history[0].prev_hash == GENESIS
    for before, entry in itertools.pairwise(history):
        assert entry.prev_hash == before.hash
    assert len({entry.hash for entry in history}) == len(history)


def test_it_hashes_what_the_database_gives_back(history):
    """The hash taken before the insert matches the values as the database returns them."""
    for entry in AuditEntry.objects.order_by("id"):
        assert entry_hash(entry.prev_hash, entry_fields(entry)) == entry.hash


def test_it_hashes_odd_text_as_the_database_stores_it(history):
    odd = 'émoji 😀 e\u0301 "quoted" \\back\\ \t tab 日本 \u2028 line'
    entry = services.audit_append(
        approval_id=odd, action="noted", actor=odd, source="api", outcome="decided", origin=odd, detail={odd: [odd]}
    )

    stored = AuditEntry.objects.get(pk=entry.pk)
    assert (stored.actor, stored.detail, stored.prev_hash) == (odd, {odd: [odd]}, history[-1].hash)
    assert stored.hash == entry.hash == entry_hash(stored.prev_hash, entry_fields(stored))


def test_it_verifies_an_intact_chain(history, capsys):
    code, out = verify(capsys)

    assert code == 0
    assert out.strip() == f"ok: {len(history)} entries, head {history[-1].hash}"


def test_it_reports_an_intact_chain_as_json(history, capsys):
    code, out = verify(capsys, "--json")

    assert code == 0
    assert json.loads(out) == {"ok": True, "entries": len(history), "head": history[-1].hash}


def test_it_verifies_page_by_page_across_the_pages_edges(history):
    """Read by keyset pages (no cursor held open): every entry checked once, a break on a page's edge found."""
    assert services.audit_verify(chunk_size=2) == services.audit_verify()
    assert services.audit_verify(chunk_size=2).entries == len(history)
    raw("UPDATE {table} SET actor = %s WHERE id = %s", ["mallory", history[4].pk])  # the first of page 3

    report = services.audit_verify(chunk_size=2)

    assert (report.problem, report.entry_id, report.entries) == ("altered", history[4].pk, 4)


def test_it_verifies_an_empty_log(db, capsys):
    assert verify(capsys) == (0, f"ok: 0 entries, head {GENESIS}\n")


EDITS: dict[str, Callable[[AuditEntry], tuple[str, Any]]] = {
    "actor": lambda entry: ("actor", "mallory"),
    "detail": lambda entry: ("detail", '{"note": "all fine"}'),
    "created_at": lambda entry: ("created_at", entry.created_at + timedelta(microseconds=1)),
    "hash": lambda entry: ("hash", "f" * 64),
}


@pytest.mark.parametrize("edit", EDITS)
def test_it_names_an_edited_entry(history, capsys, edit):
    target = history[3]
    column, value = EDITS[edit](target)
    raw(f"UPDATE {{table}} SET {column} = %s WHERE id = %s", [value, target.pk])

    code, out = verify(capsys)

    assert code == 1
    assert out.strip() == (
        f"broken after 3 intact entries: entry #{target.pk} at "
        f"{AuditEntry.objects.get(pk=target.pk).created_at.isoformat()} altered: its content does not match its hash"
    )


def test_it_names_an_edited_entry_in_json(history, capsys):
    target = history[2]
    raw("UPDATE {table} SET outcome = %s WHERE id = %s", ["decided", target.pk])

    code, out = verify(capsys, "--json")

    report = json.loads(out)
    assert code == 1
    assert (report["ok"], report["problem"], report["entries"]) == (False, "altered", 2)
    assert report["entry"] == {"id": target.pk, "created_at": target.created_at.isoformat()}


def test_it_names_the_entry_after_a_deleted_one(history, capsys):
    raw("DELETE FROM {table} WHERE id = %s", [history[4].pk])

    code, out = verify(capsys)

    after = history[5]
    assert code == 1
    assert f"entry #{after.pk} at {after.created_at.isoformat()} removed" in out
    assert out.startswith("broken after 4 intact entries:")


def test_it_notices_that_the_first_entries_were_deleted(history, capsys):
    raw("DELETE FROM {table} WHERE id <= %s", [history[1].pk])

    code, out = verify(capsys)

    assert code == 1
    assert f"entry #{history[2].pk} at {history[2].created_at.isoformat()} removed" in out


def test_it_names_two_swapped_entries_as_reordered(history, capsys):
    first, second = history[2], history[3]
    swap(first.pk, second.pk)

    code, out = verify(capsys, "--json")

    report = json.loads(out)
    assert code == 1
    assert (report["problem"], report["entry"]["id"], report["entries"]) == ("reordered", first.pk, 2)
    assert f"it follows entry #{second.pk} in the chain" in report["message"]


def swap(first_id: int, second_id: int) -> None:
    """Exchange every column but the id of two rows (prev_hash is unique: park one value first)."""
    columns = [f.column for f in AuditEntry._meta.concrete_fields if f.column != "id"]
    listing = ", ".join(columns)
    with connection.cursor() as cursor:
        rows = {}
        for row_id in (first_id, second_id):
            cursor.execute(f"SELECT {listing} FROM {TABLE} WHERE id = %s", [row_id])
            rows[row_id] = cursor.fetchone()
        cursor.execute(f"UPDATE {TABLE} SET prev_hash = %s WHERE id = %s", ["parked", first_id])
        assignments = ", ".join(f"{column} = %s" for column in columns)
        for target, source in ((second_id, first_id), (first_id, second_id)):
            values = [_db_value(v) for v in rows[source]]
            cursor.execute(f"UPDATE {TABLE} SET {assignments} WHERE id = %s", [*values, target])


def _db_value(value: Any) -> Any:
    # PostgreSQL's driver hands jsonb back as Python objects; send it back as JSON text.
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def test_it_writes_the_canonical_form_independent_of_key_order_and_float_spelling():
    one = canonical_json({"detail": {"b": 1.0, "a": 1e16}, "actor": "ü"})
    other = canonical_json({"actor": "ü", "detail": {"a": 10_000_000_000_000_000, "b": 1}})

    assert one == other == '{"actor":"ü","detail":{"a":10000000000000000,"b":1}}'


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_it_keeps_one_chain_under_32_concurrent_writers(transactional_db, capsys, runner):
    """Decisions racing on one approval and refusals racing beside them: one unbroken chain."""
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)

    def write(i: int) -> str:
        if i % 2:
            services.approval_refuse(
                approval_id=approval.id,
                decision="approved",
                attempt=attempt(f"r{i}"),
                outcome="not_permitted",
                reason="",
            )
            return "refused"
        try:
            return decide(approval.id, "approved", by=f"reviewer{i}", auto_resume=False).outcome
        except services.AlreadyDecided:
            return "lost"

    results = {"threads": in_threads, "processes": in_processes}[runner](write)

    assert not [r for r in results if r not in {"refused", "decided", "idempotent", "lost"}], results
    entries = list(AuditEntry.objects.order_by("id"))
    assert len(entries) == N
    assert len({entry.prev_hash for entry in entries}) == N
    # Each writer takes its time under the chain's lock: none is dated before the entry it follows.
    assert all(a.created_at <= b.created_at for a, b in itertools.pairwise(entries))
    assert verify(capsys) == (0, f"ok: {N} entries, head {entries[-1].hash}\n")


@EXPORT_READS_COMMITTED
def test_it_exports_the_hashes_in_the_csv(history, carol):
    client = Client()
    client.force_login(carol)

    table = list(csv.DictReader(io.StringIO(csv_body(client.get("/audit.csv")))))

    assert [(row["prev_hash"], row["hash"]) for row in table] == [(e.prev_hash, e.hash) for e in history]


def test_it_shows_a_short_hash_on_the_audit_page(history, carol):
    client = Client()
    client.force_login(carol)

    html = client.get("/audit").content.decode()

    assert f'<code class="meta" title="{history[0].hash}">{history[0].hash[:12]}</code>' in html


def test_it_chains_the_entries_written_before_the_migration(transactional_db, capsys):
    """Entries from before the chain get the hashes new ones would have had, in id order."""
    from django.db.migrations.executor import MigrationExecutor

    [approval] = pending(start(REFUND, auto_resume=False))
    decide(approval, "approved", by="bob", note="ok")
    with pytest.raises(services.AlreadyDecided):
        decide(approval, "rejected", by="alice")
    services.approval_refuse(approval_id="appr_x", decision="approved", attempt=attempt("eve"), outcome="", reason="")
    live = list(AuditEntry.objects.order_by("id").values_list("id", "prev_hash", "hash"))

    executor = MigrationExecutor(connection)
    executor.migrate([("agents", "0005_votes")])  # before the chain existed
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # and forward again, to the latest

    assert list(AuditEntry.objects.order_by("id").values_list("id", "prev_hash", "hash")) == live
    assert verify(capsys) == (0, f"ok: 3 entries, head {live[-1][2]}\n")
