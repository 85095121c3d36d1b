from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agents", "0007_notifications")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="kind",
            field=models.CharField(
                choices=[("internal", "Internal"), ("external", "External")], default="internal", max_length=10
            ),
        ),
        migrations.AlterModelOptions(
            name="run",
            options={
                "ordering": ["-created_at"],
                "permissions": [("gate_external", "Can gate, claim and report its own external tool calls")],
            },
        ),
    ]
