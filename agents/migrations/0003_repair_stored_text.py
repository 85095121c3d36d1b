"""Repair text stored by older versions that a page cannot render (lone surrogates, NUL).

JSON columns could hold lone surrogates as `\\ud800` escapes, and text columns on SQLite
could hold NUL; every row that does is rewritten with agents.text.repair (U+FFFD), so no
page, CSV line or stream fails on what is stored. Rows without a problem are not touched.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from agents import text

FIELDS = {
    "Run": ("input", "output", "error", "agent_config"),
    "Message": ("content", "tool_calls"),
    "ToolCall": ("arguments", "executed_arguments", "result"),
    "Approval": ("request", "note", "feedback", "arguments", "payload"),
    "RunEvent": ("data",),
    "AuditEntry": ("detail",),
}


def repair_stored_text(apps: Any, schema_editor: Any) -> None:
    """Rewrite, row by row, the fields whose value agents.text finds a problem in."""
    for model_name, fields in FIELDS.items():
        model = apps.get_model("agents", model_name)
        for row in model.objects.only("pk", *fields).iterator(chunk_size=500):
            repaired = {
                field: text.repair(getattr(row, field), max_depth=text.MAX_STORED_DEPTH)
                for field in fields
                if text.problem(getattr(row, field), max_depth=text.MAX_STORED_DEPTH)
            }
            if repaired:
                model.objects.filter(pk=row.pk).update(**repaired)


class Migration(migrations.Migration):
    dependencies = [("agents", "0002_admin_role")]

    operations = [migrations.RunPython(repair_stored_text, migrations.RunPython.noop, elidable=True)]
