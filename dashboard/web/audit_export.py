"""The audit history as CSV: one row per decision attempt, oldest first, streamed a batch at a time.

Two writers of the same bytes. On PostgreSQL the database writes each batch's lines itself
(quoting, formula defusing and times in SQL, one text value per batch), so the web process
only passes text along; elsewhere (SQLite) Python's csv module writes them from plain rows.
`tests/dashboard/test_audit_export.py` holds the two to the same output.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import string
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import QuerySet

from agents import selectors, text
from agents.models import AuditEntry
from dashboard.live import hub

logger = logging.getLogger(__name__)

COLUMNS = ("created_at", *selectors.AUDIT_EXPORT_PLAIN, "note", "arguments_diff", "detail", "prev_hash", "hash")

# Rows per query and per chunk sent: big enough that per-query and per-send costs vanish, small
# enough that memory stays flat (a few MB) whatever the size of the history.
BATCH = 5000

# -- formulas (CSV injection) ---------------------------------------------------------------
# Notes and arguments are untrusted: a cell a spreadsheet would run as a formula gets a leading
# quote. Spreadsheets skip leading spaces and line breaks and read fullwidth ＝＋－＠ (and other
# compatibility forms) as = + - @, so the cell's first visible character is what counts.

# Every character whose NFKC form starts with = + - @; a test recomputes it from unicodedata.
FORMULA_CHARS = frozenset(
    "+-=@\u207a\u207c\u208a\u208c\u2a75\u2a76\ufb29\ufe62\ufe63\ufe66\ufe6b\uff0b\uff0d\uff1d\uff20"
)
# What str.lstrip() strips (str.isspace); a test recomputes it.
SPACE_CHARS = frozenset(
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_SAFE_FIRST = frozenset(string.ascii_letters + string.digits)  # most cells: nothing to look at


def spreadsheet_safe(value: str) -> str:
    """Return the cell with a leading quote if a spreadsheet would run it as a formula."""
    if not value or value[0] in _SAFE_FIRST:
        return value
    if value[0] in "\t\r\n" or value.lstrip()[:1] in FORMULA_CHARS:
        return "'" + value
    return value


# -- the stream -----------------------------------------------------------------------------


# The last line of an export an error stopped: the 200 and the rows before it are already sent.
INCOMPLETE = "export incomplete: an error stopped it after the row above; export again for the rest"


async def csv_lines(entries: QuerySet[AuditEntry]) -> AsyncIterator[str]:
    """Yield the header, then the lines a batch at a time, by id (keyset: each batch is one indexed query).

    An async iterator: under ASGI Django sends each batch as it is read (a sync one would be
    read whole into memory first). An error part-way ends the file with the INCOMPLETE line,
    so that a cut export never passes for the whole history.
    """
    yield csv_text([COLUMNS])
    try:
        async for lines in _postgres_lines(entries) if connection.vendor == "postgresql" else _python_lines(entries):
            yield lines
    except Exception:
        logger.exception("the audit export failed part-way")
        yield csv_text([[INCOMPLETE]])


async def _python_lines(entries: QuerySet[AuditEntry]) -> AsyncIterator[str]:
    after: int | None = 0
    while after is not None:
        after, lines = await sync_to_async(python_batch)(entries, after)
        if lines:
            yield lines


async def _postgres_lines(entries: QuerySet[AuditEntry]) -> AsyncIterator[str]:
    """Yield the batches' lines in order, the database writing the next batch while this one is sent.

    Each batch is the id range up to the BATCH-th id after the last one (a short index read), so
    the next can start before this one is written: two of them at most, on two connections.
    """
    ahead: asyncio.Future[str] | None = None
    try:
        after: int | None = 0
        while after is not None:
            until = await hub.read(selectors.audit_nth_id_after, entries, after, BATCH, spread=True)
            batch = asyncio.ensure_future(hub.read(postgres_batch, entries, after, until, spread=True))
            if ahead is not None and (lines := await ahead):
                yield lines
            ahead, after = batch, until
        if ahead is not None and (lines := await ahead):
            yield lines
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()  # the client went away: the batch's thread finishes on its own


def python_batch(entries: QuerySet[AuditEntry], after: int) -> tuple[int | None, str]:
    """Return the CSV lines of the next batch after id `after`, and its last id (None: the export is done)."""
    batch = selectors.audit_csv_rows_after(entries, pk=after, limit=BATCH)
    # PostgreSQL's UTF-8 text and jsonb hold neither NUL nor lone surrogates: only SQLite's rows need repair.
    lines = csv_text([_row(row) for row in batch], repair=connection.vendor != "postgresql")
    return (batch[-1][0] if len(batch) == BATCH else None), lines


def csv_text(rows: Iterable[Sequence[str]], *, repair: bool = True) -> str:
    """Return rows as CSV text, with NUL and lone surrogates repaired in one pass over the whole batch."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    # Only NUL and lone surrogates need repair, and the CSV writer adds neither: repairing the
    # batch's text once is the same as repairing each cell, at a fraction of the cost.
    return text.repair(buffer.getvalue()) if repair else buffer.getvalue()


def _row(row: tuple[Any, ...]) -> list[str]:
    """Return one entry's cells: (id, created_at text, the plain columns…, note, detail JSON, prev_hash, hash)."""
    _, created_at, *columns, note, detail_text, prev_hash, hash_ = row
    detail_text = detail_text or "{}"
    # The stored JSON text is shown as it is, unless it has escapes to spell out (SQLite keeps
    # non-ASCII as \uXXXX) or an argument diff to pick out: most rows skip the JSON work.
    detail = json.loads(detail_text) if "\\" in detail_text or "arguments_diff" in detail_text else None
    diff = detail.get("arguments_diff", {}) if isinstance(detail, dict) else {}
    safe, ok = spreadsheet_safe, _SAFE_FIRST  # the first-character test inline: most cells skip the call
    return [
        _iso_time(created_at),
        *[value if not value or value[0] in ok else safe(value) for value in columns],
        "" if not note else note if note[0] in ok else safe(note),
        json.dumps(diff, ensure_ascii=False, default=str) if diff else "{}",
        detail_text if detail is None else json.dumps(detail, ensure_ascii=False, default=str),
        prev_hash,
        hash_,
    ]


def _iso_time(value: str) -> str:
    """Return a stored time (the database's text of it, UTC) as ISO 8601 with its offset, as datetime.isoformat does.

    Read as text and parsed here: the driver's datetime loader costs more than the rest of the row.
    """
    moment = datetime.fromisoformat(value)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


# -- PostgreSQL: the database writes the lines ----------------------------------------------


def _regex_class(chars: frozenset[str]) -> str:
    """Return a regular-expression bracket of these characters, each as an escape (nothing in it is special)."""
    return "[" + "".join(f"\\u{ord(c):04x}" for c in sorted(chars)) + "]"


# A cell to defuse: a tab or line break first, or a formula sign after the spaces lstrip() skips.
_FORMULA_RE = f"^([\\t\\r\\n]|{_regex_class(SPACE_CHARS)}*{_regex_class(FORMULA_CHARS)})"


def _defused(cell: str) -> str:
    return f"CASE WHEN {cell} ~ f.re THEN '''' || {cell} ELSE {cell} END"


def _quoted(cell: str) -> str:
    """A cell as csv.writer's QUOTE_MINIMAL writes it: quoted, quotes doubled, if it holds , " CR or LF."""
    return f"""CASE WHEN {cell} ~ '[",\\r\\n]' THEN '"' || replace({cell}, '"', '""') || '"' ELSE {cell} END"""


_ISO_TIME = (
    """to_char(b.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')"""
    " || CASE WHEN date_trunc('second', b.created_at) = b.created_at THEN ''"
    " ELSE to_char(b.created_at AT TIME ZONE 'UTC', '.US') END || '+00:00'"
)
_DEFUSED = (*selectors.AUDIT_EXPORT_PLAIN, "note")
# A falsy diff (what Python's `if diff` skips) is written as {}.
_DIFF = """CASE WHEN b.diff IS NULL OR b.diff IN ('[]', '""', 'false', 'null', '0') THEN '{}' ELSE b.diff END"""
# The names the batch's sub-select gives its columns (AUDIT_EXPORT_FIELDS, in order).
_RENAMED = {"note_text": "note", "diff_text": "diff", "detail_text": "detail"}
_BATCH_COLUMNS = ", ".join(_RENAMED.get(name, name) for name in selectors.AUDIT_EXPORT_FIELDS)
# Each row's cells, defused, then its line, quoted.
_CELLS = ", ".join(
    [
        "b.id",
        f"{_ISO_TIME} AS created_at",  # digits and signs only: never quoted
        *(f"{_defused(f'coalesce(b.{name}, {chr(39) * 2})')} AS {name}" for name in _DEFUSED),
        f"{_DIFF} AS diff",
        "coalesce(b.detail, '{}') AS detail",  # never NULL: concat_ws would drop the cell, not write it empty
        "b.prev_hash",
        "b.hash",
    ]
)
# concat_ws: one allocation a line (a chain of || copies the line once per cell).
_LINE = (
    "concat_ws(',', "
    + ", ".join(
        ["c.created_at", *(_quoted(f"c.{name}") for name in (*_DEFUSED, "diff", "detail")), "c.prev_hash", "c.hash"]
    )
    + ")"
)


def postgres_batch(entries: QuerySet[AuditEntry], after: int, until: int | None) -> str:
    """Return the CSV lines of the entries with ids in (after, until], as the database wrote them in one text value."""
    rows = selectors.audit_csv_rows_between(entries, after=after, until=until, fields=selectors.AUDIT_EXPORT_FIELDS)
    try:
        inner, params = rows.query.sql_with_params()
    except EmptyResultSet:  # the filters select nothing (invalid ones do that)
        return ""
    statement = (
        f"SELECT string_agg({_LINE}, E'\\r\\n' ORDER BY c.id) || E'\\r\\n'"
        f" FROM (SELECT {_CELLS} FROM ({inner}) AS b({_BATCH_COLUMNS}), (SELECT %s::text AS re) AS f) AS c"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, _FORMULA_RE])
        (lines,) = cursor.fetchone()
    return lines or ""
