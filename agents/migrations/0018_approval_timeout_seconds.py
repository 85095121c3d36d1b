"""Approvals keep the policy's timeout, which an escalation restarts (existing ones keep their old restart)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0017_approval_decided_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="timeout_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
