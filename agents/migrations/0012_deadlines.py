"""Deadlines with a defined end: on_timeout, escalation and reminders on approvals."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    # 0009_grants lands in parallel; the merge re-points this at it.
    dependencies = [
        ("agents", "0011_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="escalate_to",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="approval",
            name="escalated_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approval",
            name="last_reminded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approval",
            name="on_timeout",
            field=models.CharField(
                choices=[("reject", "Reject"), ("approve", "Approve"), ("escalate", "Escalate"), ("run", "Run")],
                default="reject",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="approval",
            name="remind_every_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
