"""The runs' trigram index leaves out internal runs queued or driven by a worker (PostgreSQL only).

Every write of a run's row that changes its status or `updated_at` (5 of the 6 of a round
trip) gives each of its indexes a new entry, and a trigram index's entry is every trigram of
the prompt, the id and the answer: with a 4,000-character prompt, a round trip wrote 91 KB of
WAL, 24 KB of it without the trigram indexes. An internal run that is queued or running is
written again and again, and there are few of them at a time (the workers' threads and their
backlog); so the index now holds a run only while it waits on a person, once it ended, or for
an external agent's session (running for as long as the session, and never driven here): two
entries a round trip instead of six, and 60 KB of WAL for that round trip. The searches look
the runs it leaves out up through `run_status_created` (agents.selectors.run_text_matches).
The new index is built CONCURRENTLY before the old one is dropped, so the runs page and the
inbox stay served throughout.

PostgreSQL estimates how many rows a condition on an expression matches from the statistics of
an index on that expression, but never a partial index's (they describe only its rows): without
them it took a word no run holds for one in 200 and walked the newest-first index through all
200,000 runs (283 ms). Statistics on the three expressions (PostgreSQL 14+, as Django 5.2
requires) give it back the estimate, and the page its indexes (0.4 ms).
"""

import importlib

from django.db import migrations

trigram = importlib.import_module("agents.migrations.0030_search_trigram_indexes")

# The predicate is selectors.RUN_TEXT_INDEXED's, as PostgreSQL normalizes both.
INDEX = {
    "run_text_trgm": (
        "agents_run USING gin (UPPER(input) gin_trgm_ops, UPPER(id) gin_trgm_ops, UPPER(output) gin_trgm_ops)"
        " WHERE (NOT (status IN ('queued', 'running')) OR kind = 'external')"
    )
}
FORMER = {"run_search_trgm": trigram.INDEXES["run_search_trgm"]}


def _replace(schema_editor, new: dict[str, str], old: dict[str, str]) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    trigram.build(schema_editor, new)
    for name in old:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


STATISTICS = "run_text_stats"


def leave_out_driven_runs(apps, schema_editor):
    _replace(schema_editor, INDEX, FORMER)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE STATISTICS IF NOT EXISTS {STATISTICS}"
            " ON (UPPER(input)), (UPPER(id)), (UPPER(output)) FROM agents_run"
        )
        schema_editor.execute("ANALYZE agents_run")  # now, not at autovacuum's next pass


def index_every_run(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    _replace(schema_editor, FORMER, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("agents", "0031_drop_redundant_indexes"),
    ]

    operations = [migrations.RunPython(leave_out_driven_runs, index_every_run, elidable=False)]
