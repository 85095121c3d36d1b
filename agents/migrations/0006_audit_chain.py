"""Chain the audit log: each entry carries the previous entry's hash and its own.

Existing entries are hashed in id order, the first one after 64 zeros, with the same
function new entries use, so `agentfast audit verify` checks the old entries too.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.utils import timezone

from agents.services.audit import GENESIS, entry_fields, entry_hash


def chain_existing(apps: Any, schema_editor: Any) -> None:
    """Write prev_hash and hash of every existing entry, oldest id first."""
    entry_model = apps.get_model("agents", "AuditEntry")
    previous = GENESIS
    for entry in entry_model.objects.order_by("id").iterator(chunk_size=1000):
        digest = entry_hash(previous, entry_fields(entry))
        entry_model.objects.filter(pk=entry.pk).update(prev_hash=previous, hash=digest)
        previous = digest


class Migration(migrations.Migration):
    dependencies = [("agents", "0005_votes")]

    operations = [
        migrations.AlterField(
            model_name="auditentry",
            name="created_at",
            field=models.DateTimeField(db_index=True, default=timezone.now, editable=False),
        ),
        migrations.AddField(
            model_name="auditentry",
            name="prev_hash",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditentry",
            name="hash",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(chain_existing, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="auditentry",
            name="prev_hash",
            field=models.CharField(editable=False, max_length=64, unique=True),
        ),
    ]
