"""People who decide: reviewers and admins, as Django users in groups of those names."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import Group, Permission, User
from django.db import transaction

from agents.services.errors import InvalidInput

ROLES = ("reviewer", "admin")
_REVIEWER_PERMISSIONS = ("view_approval", "decide_approval", "view_run")
_ADMIN_PERMISSIONS = (*_REVIEWER_PERMISSIONS, "view_auditentry")


def role_groups_ensure() -> dict[str, Group]:
    """Create the reviewer and admin groups with their permissions, if missing."""
    groups = {}
    for role, codenames in (("reviewer", _REVIEWER_PERMISSIONS), ("admin", _ADMIN_PERMISSIONS)):
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(Permission.objects.filter(content_type__app_label="agents", codename__in=codenames))
        groups[role] = group
    return groups


def user_create(*, username: str, role: str, password: str | None = None, email: str = "") -> tuple[User, str]:
    """Create a reviewer or an admin; return the user and the password (generated if not given)."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, not {role!r}", field="role")
    if not username.strip():
        raise InvalidInput("the user name is empty", field="username")
    if User.objects.filter(username=username).exists():
        raise InvalidInput(f"a user named {username!r} already exists", field="username")
    password = password or secrets.token_urlsafe(12)
    with transaction.atomic():
        groups = role_groups_ensure()
        user = User.objects.create_user(
            username=username, email=email, password=password, is_staff=role == "admin", is_superuser=role == "admin"
        )
        user.groups.add(groups[role])
    return user, password


def user_set_password(*, username: str, password: str) -> User:
    """Set an existing user's password after Django's password validators accept it."""
    from django.contrib.auth import password_validation
    from django.core.exceptions import ValidationError

    user = User.objects.filter(username=username).first()
    if user is None:
        raise InvalidInput(f"no user {username!r}", field="username")
    try:
        password_validation.validate_password(password, user)
    except ValidationError as exc:
        raise InvalidInput(" ".join(exc.messages), field="password") from None
    user.set_password(password)
    user.save(update_fields=["password"])
    return user
