"""The audit export's two writers (PostgreSQL's SQL, Python's csv module) and its batches."""

from __future__ import annotations

import csv
import io
import sys
import unicodedata
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, connection

from agents import selectors, services
from agents.models import AuditEntry
from dashboard.web import audit_export
from tests.support.flows import EXPORT_READS_COMMITTED

ODD_TEXTS = [
    "plain",
    'say "hi", then leave',
    "two\nlines",
    "carriage\rreturn",
    "and\r\nboth",
    "=1+1",
    "  -2+3",
    "\t=1",
    "\u3000＝1",  # an ideographic space, then a fullwidth equals sign
    "\u2a75 double equals",
    "'already quoted",
    "émoji 🧾 and ünïcode",
    "",
    ",",
    '"',
]


def _everything() -> str:
    return async_to_sync(_read)()


async def _read() -> str:
    return "".join([part async for part in audit_export.csv_lines(AuditEntry.objects.all())])


def _append(n: int, text: str) -> None:
    services.audit_append(
        approval_id=f"appr_{n}{text}"[:40],
        run_id=f"run_{n}",
        tool=text or "tool",
        action="approved" if n % 2 else text,
        actor=text or "bob",
        on_behalf_of=text,
        source="web",
        origin=text,
        outcome="decided",
        detail={"note": text, "nested": {"text": text, "list": [1, 2.5, None, True]}}
        | ({"arguments_diff": {"amount_cents": [2500, n]}} if n % 3 == 0 else {}),
    )


def test_it_knows_every_character_a_spreadsheet_reads_as_a_formula_sign():
    everything = map(chr, range(sys.maxunicode + 1))
    signs = {c for c in everything if unicodedata.normalize("NFKC", c)[:1] in "=+-@"}

    assert audit_export.FORMULA_CHARS == signs


def test_it_knows_every_space_a_formula_may_hide_behind():
    assert audit_export.SPACE_CHARS == {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}


@pytest.mark.parametrize("cell", ODD_TEXTS)
def test_it_defuses_exactly_the_cells_that_start_a_formula(cell):
    first = cell.lstrip()[:1]
    formula = cell[:1] in ("\t", "\r", "\n") or (first and unicodedata.normalize("NFKC", first)[0] in "=+-@")

    assert audit_export.spreadsheet_safe(cell) == ("'" + cell if formula else cell)


@EXPORT_READS_COMMITTED
def test_postgres_writes_the_same_bytes_as_the_csv_module():
    if connection.vendor != "postgresql":
        pytest.skip("the database writes the lines on PostgreSQL only")
    for n, text in enumerate(ODD_TEXTS):
        _append(n, text)
    # A time on the second exactly: isoformat leaves out the microseconds.
    AuditEntry.objects.filter(pk=AuditEntry.objects.order_by("pk").values("pk")[:1]).update(
        created_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    )

    _, by_python = audit_export.python_batch(AuditEntry.objects.all(), 0)
    by_postgres = audit_export.postgres_batch(AuditEntry.objects.all(), 0, None)

    assert by_postgres == by_python
    rows = list(csv.DictReader(io.StringIO(csv_header() + by_postgres)))
    assert [row["note"] for row in rows] == [audit_export.spreadsheet_safe(text) for text in ODD_TEXTS]
    assert rows[0]["created_at"] == "2026-12-01T09:30:00+00:00"
    assert rows[3]["arguments_diff"] == '{"amount_cents": [2500, 3]}' and rows[1]["arguments_diff"] == "{}"


@EXPORT_READS_COMMITTED
def test_it_exports_every_entry_once_in_order_across_batches(monkeypatch):
    monkeypatch.setattr(audit_export, "BATCH", 3)
    for n in range(10):
        _append(n, f"entry {n}")
    hashes = list(AuditEntry.objects.order_by("pk").values_list("hash", flat=True))

    rows = list(csv.DictReader(io.StringIO(_everything())))

    assert [row["hash"] for row in rows] == hashes
    assert [row["actor"] for row in rows] == [f"entry {n}" for n in range(10)]


@EXPORT_READS_COMMITTED
@pytest.mark.parametrize("entries", [0, 3, 6])
def test_it_ends_cleanly_on_an_empty_or_exactly_full_last_batch(monkeypatch, entries):
    monkeypatch.setattr(audit_export, "BATCH", 3)
    for n in range(entries):
        _append(n, f"entry {n}")

    lines = _everything().split("\r\n")

    assert lines[0] == ",".join(audit_export.COLUMNS) and lines[-1] == ""
    assert len(lines) == entries + 2


@EXPORT_READS_COMMITTED
def test_an_export_an_error_stops_ends_with_a_line_saying_so(monkeypatch, caplog):
    monkeypatch.setattr(audit_export, "BATCH", 3)
    for n in range(7):
        _append(n, f"entry {n}")
    # The second batch's read fails, as it does when the database goes away mid-export.
    name = "audit_csv_rows_between" if connection.vendor == "postgresql" else "audit_csv_rows_after"
    read, calls = getattr(selectors, name), []

    def failing_second(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("server closed the connection unexpectedly")
        return read(*args, **kwargs)

    monkeypatch.setattr(selectors, name, failing_second)

    lines = _everything().split("\r\n")

    assert lines[0] == ",".join(audit_export.COLUMNS)
    sent = list(csv.DictReader(io.StringIO("\r\n".join(lines[:4]))))
    assert [row["actor"] for row in sent] == ["entry 0", "entry 1", "entry 2"]
    assert lines[4:] == [audit_export.INCOMPLETE, ""]
    assert "the audit export failed part-way" in caplog.text


@EXPORT_READS_COMMITTED
def test_it_exports_the_header_alone_for_filters_that_select_nothing(client_for, carol):
    _append(1, "bob")

    response = client_for(carol).get("/audit.csv?person=nobody-at-all")
    body = async_to_sync(_join)(response)

    assert body == csv_header()


def test_it_refuses_filters_that_do_not_read_saying_why(client_for, carol):
    _append(1, "bob")

    response = client_for(carol).get("/audit.csv?since=notadate&person=%00")

    assert response.status_code == 400 and response["Content-Type"].startswith("text/plain")
    assert "Content-Disposition" not in response  # no file that reads as an empty history
    said = response.content.decode()
    assert said.startswith("Nothing exported: ") and "since: Enter a valid date." in said
    assert "person: Null characters are not allowed." in said


async def _join(response) -> str:  # noqa: ANN001
    return b"".join([part async for part in response.streaming_content]).decode()


def csv_header() -> str:
    return ",".join(audit_export.COLUMNS) + "\r\n"
