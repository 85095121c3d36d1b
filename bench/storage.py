"""Rows and bytes a run occupies, table by table, and storage growth incl. indexes.

Bytes of rows:
- PostgreSQL: sum(pg_column_size(t.*)) of the run's rows (the tuple as stored: header,
  null bitmap, values; TOAST-compressed values at their compressed size);
- SQLite: the exact size of each row's record (SQLite's file format: the header of serial
  types plus the encoded values; an INTEGER PRIMARY KEY is the rowid and stored as NULL),
  computed from typeof()/length() of every column. Excludes the cell's rowid and size
  varints, indexes and page overhead.

Growth (storage_totals before/after N runs, divided by N) includes the indexes:
- PostgreSQL: pg_total_relation_size of the agents_* tables (page granular, 8 KB);
- SQLite: the dbstat virtual table, bytes of cell payload of the agents_* tables and their
  indexes (byte granular) and bytes of pages in use (page granular, 4 KB).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from agents import ids


@dataclass(frozen=True)
class TableUsage:
    rows: int
    bytes: int


def agents_tables() -> list[str]:
    return sorted(t for t in connection.introspection.table_names() if t.startswith("agents_"))


def _columns(table: str) -> list[tuple[str, bool]]:
    """Return (column, is the rowid alias) of a table."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA table_info({connection.ops.quote_name(table)})")
            # cid, name, type, notnull, default, pk
            return [(row[1], row[5] == 1 and row[2].lower() == "integer") for row in cursor.fetchall()]
        description = connection.introspection.get_table_description(cursor, table)
        return [(col.name, False) for col in description]


def _where(table: str, columns: list[str], run_id: str) -> tuple[str, list[str]] | None:
    """Return the SQL condition picking the rows of one run in a table, if it has any."""
    if table == "agents_run":
        return "id = %s", [run_id]
    if "run_id" in columns:
        return "run_id = %s", [run_id]
    if table == "agents_sideeffect":
        # The demo tools' idempotency key: the approval id, or run_id:call_id without one.
        return "(idempotency_key LIKE %s OR idempotency_key LIKE %s)", [
            ids.approval_id(run_id, "") + "%",
            f"{run_id}:%",
        ]
    return None


def run_usage(run_id: str) -> tuple[dict[str, TableUsage], list[str]]:
    """Return {table: rows and bytes of this run}, and the agents_* tables not attributable."""
    usage: dict[str, TableUsage] = {}
    unattributed: list[str] = []
    for table in agents_tables():
        columns = _columns(table)
        where = _where(table, [c for c, _ in columns], run_id)
        if where is None:
            unattributed.append(table)
            continue
        condition, params = where
        quoted = connection.ops.quote_name(table)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM {quoted} t WHERE {condition}", params
                )
                rows, size = cursor.fetchone()
            else:
                rows, size = _sqlite_record_bytes(cursor, quoted, columns, condition, params)
        usage[table] = TableUsage(int(rows), int(size))
    return usage, unattributed


def _sqlite_record_bytes(
    cursor, quoted: str, columns: list[tuple[str, bool]], condition: str, params: list[str]
) -> tuple[int, int]:  # noqa: ANN001
    # Expressions have no declared type, so the sqlite3 module converts nothing: for an
    # integer the value (its size depends on it), else the length in bytes.
    select = []
    for name, _ in columns:
        col = connection.ops.quote_name(name)
        select.append(
            f"typeof({col}), CASE typeof({col}) WHEN 'integer' THEN {col} ELSE length(CAST({col} AS BLOB)) END"
        )
    cursor.execute(f"SELECT {', '.join(select)} FROM {quoted} WHERE {condition}", params)
    total = rows = 0
    for row in cursor.fetchall():
        rows += 1
        serial_types = []
        body = 0
        for (_name, is_rowid), kind, value in zip(columns, row[0::2], row[1::2], strict=True):
            if is_rowid or kind == "null":
                serial, size = 0, 0
            elif kind == "integer":
                serial, size = _int_serial(value)
            elif kind == "real":
                serial, size = 7, 8
            elif kind == "text":
                serial, size = 2 * value + 13, value
            else:  # blob
                serial, size = 2 * value + 12, value
            serial_types.append(serial)
            body += size
        header = sum(_varint_len(s) for s in serial_types)
        header += _varint_len(header + 1)  # the header size counts itself (always 1 byte here)
        total += header + body
    return rows, total


def _int_serial(value: int) -> tuple[int, int]:
    if value in (0, 1):
        return 8 + value, 0
    for serial, size in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 6)):
        if -(1 << (8 * size - 1)) <= value < (1 << (8 * size - 1)):
            return serial, size
    return 6, 8


def _varint_len(value: int) -> int:
    length = 1
    while value >= 0x80 and length < 9:
        value >>= 7
        length += 1
    return length


def storage_totals() -> dict[str, int]:
    """Return the space the agents_* tables and their indexes use now."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND c.relname LIKE %s AND n.nspname = current_schema()",
                ["agents\\_%"],
            )
            return {"total_relation_bytes": int(cursor.fetchone()[0])}
        try:
            cursor.execute(
                "SELECT coalesce(sum(d.payload), 0), coalesce(sum(d.pgsize), 0) FROM dbstat d "
                "JOIN sqlite_master m ON m.name = d.name WHERE m.tbl_name LIKE %s ESCAPE '\\'",
                ["agents\\_%"],
            )
        except Exception:  # noqa: BLE001 — an SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
            return {}
        payload, pages = cursor.fetchone()
        return {"payload_bytes": int(payload), "page_bytes": int(pages)}
