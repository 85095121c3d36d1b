"""The admin role reads deliveries in the Django admin too, as it reads every other row there."""

from __future__ import annotations

from django.db import migrations


def grant(apps, schema_editor) -> None:
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name="admin").first()
    permission = Permission.objects.filter(content_type__app_label="agents", codename="view_delivery").first()
    if group is None or permission is None:
        return  # a fresh database: `users create` makes the group with its permissions
    group.permissions.add(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0023_delivery_newest_indexes"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
