"""An index of external agents' sessions, built CONCURRENTLY on PostgreSQL (issue 12).

The sweeper looks each tick for external calls claimed longer ago than their lease with no
result, joined to their run by `kind = 'external'`. With no index on `kind`, PostgreSQL read
every run for it: 24 of a tick's 33 ms at 200,000 runs (`bench.scale`), 0.1 ms with this one.
It is partial, so an internal run's writes never touch it.
"""

import importlib

from django.db import migrations, models

trigram = importlib.import_module(
    "agents.migrations.0030_search_trigram_indexes"
)  # its build() rebuilds an invalid one

NAME = "run_external"
DEFINITION = "agents_run (id) WHERE kind = 'external'"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        trigram.build(schema_editor, {NAME: DEFINITION})
    else:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON {DEFINITION}")


def drop_index(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("agents", "0032_run_search_leaves_out_driven_runs"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(fields=["id"], name=NAME, condition=models.Q(kind="external")),
                ),
            ],
            database_operations=[migrations.RunPython(create_index, drop_index, elidable=False)],
        ),
    ]
