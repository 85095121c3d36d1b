"""Trigram indexes for the searches of the runs page and the inbox, on PostgreSQL only.

A search matches a word anywhere inside the text (`icontains`: `UPPER(col) LIKE UPPER('%word%')`),
which no B-tree serves: at 100,000 runs the runs page read every row for a word no run holds
(190 ms), and the inbox each of 100,000 pending approvals (565 ms). pg_trgm's GIN operator class
serves `LIKE '%…%'`, and the planner still walks the newest-first index instead when a word is
so common that the first page fills at once.

The indexes are not in the models' state: SQLite has neither GIN nor pg_trgm, and Django
rebuilds a SQLite table with every index its state names. They are built CONCURRENTLY, so a
running deployment keeps writing while they build (10 s for the three at 200,000 runs, calls
and approvals here).
"""

from django.db import migrations

# The expressions are those Django's `icontains` writes, so that the planner matches them.
INDEXES = {
    "run_search_trgm": (
        "agents_run USING gin (UPPER(input) gin_trgm_ops, UPPER(id) gin_trgm_ops, UPPER(output) gin_trgm_ops)"
    ),
    # The inbox's search looks a word up in each table alone (selectors._narrowed).
    "toolcall_arguments_trgm": "agents_toolcall USING gin (UPPER(arguments::text) gin_trgm_ops)",
    "approval_search_trgm": (
        "agents_approval USING gin (UPPER(tool) gin_trgm_ops, UPPER(arguments::text) gin_trgm_ops,"
        " UPPER(note) gin_trgm_ops, UPPER(feedback) gin_trgm_ops)"
    ),
}

INVALID = """
    SELECT 1 FROM pg_index JOIN pg_class ON pg_class.oid = pg_index.indexrelid
    WHERE pg_class.relname = %s AND pg_class.relnamespace = current_schema()::regnamespace
      AND NOT pg_index.indisvalid
"""


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # pg_trgm is a trusted extension (PostgreSQL 13+): the database's owner may create it; a
    # role that may not needs it created once by a superuser, after which this is a no-op.
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    build(schema_editor, INDEXES)


def build(schema_editor, indexes: dict[str, str]) -> None:
    """Build each index CONCURRENTLY unless it is there and valid (later migrations build theirs with it)."""
    for name, definition in indexes.items():
        # A concurrent build that failed (a deploy killed mid-way) leaves an invalid index, which
        # IF NOT EXISTS would keep for ever: drop it and build it again.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(INVALID, [name])
            if cursor.fetchone() is not None:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("agents", "0029_vote_payload"),
    ]

    # Going back keeps pg_trgm: something else may use it, and it costs nothing unused.
    # (Django's TrigramExtension is not used: going back, it queries pg_extension on SQLite too.)
    operations = [migrations.RunPython(create_indexes, drop_indexes, elidable=False)]
