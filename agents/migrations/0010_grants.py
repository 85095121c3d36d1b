from __future__ import annotations

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0009_saved_agents"),
    ]

    operations = [
        migrations.CreateModel(
            name="Grant",
            fields=[
                ("id", models.CharField(editable=False, max_length=20, primary_key=True, serialize=False)),
                ("created_by", models.CharField(max_length=150)),
                ("decision", models.CharField(max_length=10)),
                ("scope", models.CharField(choices=[("exact", "Exact"), ("tool", "Tool")], max_length=10)),
                ("tool", models.CharField(max_length=100)),
                ("agent", models.CharField(max_length=100)),
                ("arguments_digest", models.CharField(blank=True, max_length=64)),
                ("approval_id", models.CharField(blank=True, max_length=200)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ("expires_at", models.DateTimeField()),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_by", models.CharField(blank=True, max_length=150)),
                ("uses", models.PositiveIntegerField(default=0)),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-created_at", "id"],
                "indexes": [models.Index(fields=["tool", "agent", "expires_at"], name="grant_lookup")],
            },
        ),
    ]
