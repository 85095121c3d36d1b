"""Admins made before admin became a role were superusers: make them the admin role only."""

from __future__ import annotations

from django.db import migrations

# The admin role's permissions as agents.services.users grants them (a migration keeps its own copy).
_ADMIN_PERMISSIONS = (
    "view_approval",
    "decide_approval",
    "view_run",
    "decide_on_behalf",
    "view_auditentry",
    "view_message",
    "view_toolcall",
    "view_runevent",
    "view_sideeffect",
    "view_apitoken",
)


def demote_admins(apps, schema_editor) -> None:
    """Give the admin group its permissions and take superuser status from its members."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    User = apps.get_model("auth", "User")
    group = Group.objects.filter(name="admin").first()
    if group is None:
        return  # a fresh database: `users create` makes the group with its permissions
    permissions = Permission.objects.filter(content_type__app_label="agents", codename__in=_ADMIN_PERMISSIONS)
    group.permissions.add(*permissions)
    User.objects.filter(groups=group, is_superuser=True).update(is_superuser=False, is_staff=True)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(demote_admins, migrations.RunPython.noop)]
