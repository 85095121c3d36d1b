"""Drop indexes no query reads, which every write of a run kept up to date (issue 12).

- A foreign key's own index where a constraint or index leading with the same column serves
  every lookup by it (Django's deletes, PostgreSQL's foreign-key checks, the engine's reads):
  messages and events (`…_run_seq`), tool calls (`toolcall_run_call`), approvals
  (`approval_run_status`), votes (`vote_once_per_digest`) and saved agents
  (`savedagent_owner_name`).
- On PostgreSQL, the `…_like` twin Django adds to every indexed text column and text primary
  key (`varchar_pattern_ops`): it serves only `LIKE 'prefix%'`, which the project writes
  nowhere but in a one-time data migration (0016, on a small table). Searches are `icontains`
  (`UPPER(…) LIKE '%…%'`, served by migration 0030's trigram indexes); every other lookup is
  by equality, which the plain index or the key serves.

A run's round trip (start, pause, approve, the call runs, done) inserts 14 rows and updates
its run's row 6 times, 5 of them changing an indexed column (no HOT update), so every index of
these tables took an entry at nearly every write: dropping these 27 took the round trip's WAL
from 216 records (35 KB) to 164 (31 KB) on PostgreSQL. The `…_like` twins are not in the
models' state (Django never records them), so they are dropped here by name: Django derives
the names from the table and column, the same on every database. Dropped CONCURRENTLY, so a
running deployment keeps writing; going back builds them again.
"""

from django.conf import settings
from django.db import migrations, models
from django.db.models.deletion import CASCADE

# index name → (table, column): a foreign key's index, on SQLite and PostgreSQL alike.
FOREIGN_KEYS = {
    "agents_message_run_id_f5579201": ("agents_message", "run_id"),
    "agents_runevent_run_id_babe6692": ("agents_runevent", "run_id"),
    "agents_toolcall_run_id_1a8efdb2": ("agents_toolcall", "run_id"),
    "agents_approval_run_id_d613c96b": ("agents_approval", "run_id"),
    "agents_vote_approval_id_98ce0aa7": ("agents_vote", "approval_id"),
    "agents_savedagent_owner_id_b920b586": ("agents_savedagent", "owner_id"),
}

# index name → (table, column): PostgreSQL's pattern twins of text columns (the keys above but
# the integer owner_id, and the rest).
PATTERN_TWINS = {
    "agents_message_run_id_f5579201_like": ("agents_message", "run_id"),
    "agents_runevent_run_id_babe6692_like": ("agents_runevent", "run_id"),
    "agents_toolcall_run_id_1a8efdb2_like": ("agents_toolcall", "run_id"),
    "agents_approval_run_id_d613c96b_like": ("agents_approval", "run_id"),
    "agents_vote_approval_id_98ce0aa7_like": ("agents_vote", "approval_id"),
    "agents_apitoken_prefix_f4bae1f8_like": ("agents_apitoken", "prefix"),
    "agents_apitoken_token_hash_49f88db0_like": ("agents_apitoken", "token_hash"),
    "agents_approval_id_d1087f2c_like": ("agents_approval", "id"),
    "agents_approval_tool_38cd18e5_like": ("agents_approval", "tool"),
    "agents_auditentry_approval_id_06ca1776_like": ("agents_auditentry", "approval_id"),
    "agents_auditentry_prev_hash_7d02ae10_like": ("agents_auditentry", "prev_hash"),
    "agents_auditentry_run_id_b090f5a5_like": ("agents_auditentry", "run_id"),
    "agents_delivery_approval_id_e448dc85_like": ("agents_delivery", "approval_id"),
    "agents_grant_id_a304e4c0_like": ("agents_grant", "id"),
    "agents_oneclicklink_approval_id_e25e6d99_like": ("agents_oneclicklink", "approval_id"),
    "agents_oneclicklink_nonce_8a453a4e_like": ("agents_oneclicklink", "nonce"),
    "agents_run_agent_4455de83_like": ("agents_run", "agent"),
    "agents_run_id_96886bc4_like": ("agents_run", "id"),
    "agents_sideeffect_idempotency_key_263c13e7_like": ("agents_sideeffect", "idempotency_key"),
    "agents_slacklink_slack_id_b061d79a_like": ("agents_slacklink", "slack_id"),
    "agents_slackrequest_signature_230553e3_like": ("agents_slackrequest", "signature"),
}


def _postgresql(schema_editor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def drop_indexes(apps, schema_editor):
    postgresql = _postgresql(schema_editor)
    concurrently = "CONCURRENTLY " if postgresql else ""
    names = [*FOREIGN_KEYS, *(PATTERN_TWINS if postgresql else ())]
    for name in names:
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


def create_indexes(apps, schema_editor):
    postgresql = _postgresql(schema_editor)
    concurrently = "CONCURRENTLY " if postgresql else ""
    for name, (table, column) in FOREIGN_KEYS.items():
        schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS {name} ON {table} ({column})")
    if postgresql:
        for name, (table, column) in PATTERN_TWINS.items():
            schema_editor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({column} varchar_pattern_ops)"
            )


def _unindexed(model_name: str, name: str, to: str, related_name: str) -> migrations.AlterField:
    field = models.ForeignKey(db_index=False, on_delete=CASCADE, related_name=related_name, to=to)
    return migrations.AlterField(model_name=model_name, name=name, field=field)


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("agents", "0030_search_trigram_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The database's side by name: Django's own AlterField would rebuild each SQLite table.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                _unindexed("approval", "run", "agents.run", "approvals"),
                _unindexed("message", "run", "agents.run", "messages"),
                _unindexed("runevent", "run", "agents.run", "events"),
                _unindexed("toolcall", "run", "agents.run", "tool_calls"),
                _unindexed("vote", "approval", "agents.approval", "votes"),
                _unindexed("savedagent", "owner", settings.AUTH_USER_MODEL, "saved_agents"),
            ],
            database_operations=[migrations.RunPython(drop_indexes, create_indexes, elidable=False)],
        ),
    ]
