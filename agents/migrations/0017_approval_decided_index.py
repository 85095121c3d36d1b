"""Insights reads the decisions of the last 7, 30 or 90 days by decided_at, not every decision ever made."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0016_grant_principal"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="approval",
            index=models.Index(fields=["decided_at"], name="approval_decided"),
        ),
    ]
