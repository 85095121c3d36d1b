"""Grants name whose calls they decide: an internal agent, or an external agent of one account.

Existing grants given on an internal run stay internal and keep working. One given on an
external run (its approval id is `appr_ext_…`) becomes external and matches only the
account that owned that run, read from the run; where the run is gone the account stays
empty, which no call has, so that grant applies to nothing and only shows in the list.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

EXTERNAL_APPROVAL_PREFIX = "appr_ext_"  # agents.gateway.ids.APPROVAL_PREFIX when this was written


def _principals(apps: Any, schema_editor: Any) -> None:
    grant_model = apps.get_model("agents", "Grant")
    approval_model = apps.get_model("agents", "Approval")
    external = grant_model.objects.filter(approval_id__startswith=EXTERNAL_APPROVAL_PREFIX)
    for grant in external.only("id", "approval_id"):
        owner = (
            approval_model.objects.filter(pk=grant.approval_id, run__kind="external")
            .values_list("run__created_by", flat=True)
            .first()
        )
        grant_model.objects.filter(pk=grant.pk).update(kind="external", account=owner or "")


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0015_approval_created_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="grant",
            name="kind",
            field=models.CharField(
                choices=[("internal", "Internal"), ("external", "External")], default="internal", max_length=10
            ),
        ),
        migrations.AddField(
            model_name="grant",
            name="account",
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.RunPython(_principals, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="grant", name="grant_lookup"),
        migrations.AddIndex(
            model_name="grant",
            index=models.Index(fields=["tool", "agent", "kind", "account", "expires_at"], name="grant_lookup"),
        ),
    ]
