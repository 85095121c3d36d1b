"""People who decide (reviewers, admins) and external agents that ask, as Django users in groups of those names."""

from __future__ import annotations

import secrets
from typing import cast

from django.contrib.auth.models import Group, Permission, User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from agents import events, text
from agents.models import Approval, AuditEntry, Run, Vote
from agents.policy.config import AGENT_ROLE
from agents.services.audit import audit_append
from agents.services.errors import InvalidInput, unsafe_text_refused

ROLES = ("reviewer", "admin", AGENT_ROLE)
_REVIEWER_PERMISSIONS = ("view_approval", "decide_approval", "view_run")
# Admins are a role, not superusers: they read everything in the Django admin (which is
# read-only), the audit, and may relay a decision for another existing user.
_ADMIN_PERMISSIONS = (
    *_REVIEWER_PERMISSIONS,
    "decide_on_behalf",
    "view_auditentry",
    "view_message",
    "view_toolcall",
    "view_runevent",
    "view_sideeffect",
    "view_apitoken",
    "view_delivery",
)
# An external agent gates, waits on, claims and reports its own calls: it never decides, and
# without view_approval it reads no approval but those of its own gate requests.
_AGENT_PERMISSIONS = ("gate_external",)
_ROLE_PERMISSIONS = {"reviewer": _REVIEWER_PERMISSIONS, "admin": _ADMIN_PERMISSIONS, "agent": _AGENT_PERMISSIONS}
_USERNAME_CHARS = cast(int, User._meta.get_field("username").max_length)
_GROUP_CHARS = cast(int, Group._meta.get_field("name").max_length)
# Marks a deleted user's name on the runs they started. Django's username validator (the admin's
# forms, user_create) allows no blank, so no account can ever be given the name it makes.
_DEPARTED = " (deleted)"


class NotBlankPasswordValidator:
    """Refuse a password of whitespace alone: eight spaces pass Django's own validators, and guess easily.

    An AUTH_PASSWORD_VALIDATORS entry, so the CLI, the password change page and the admin refuse it alike.
    """

    def validate(self, password: str, user: User | None = None) -> None:
        if not password.strip():
            raise ValidationError("This password is only whitespace.", code="password_blank")

    def get_help_text(self) -> str:
        return "Your password can’t be only whitespace."


def role_groups_ensure() -> dict[str, Group]:
    """Create the reviewer, admin and agent groups with their permissions, if missing."""
    groups = {}
    for role, codenames in _ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(Permission.objects.filter(content_type__app_label="agents", codename__in=codenames))
        groups[role] = group
    return groups


def user_create(
    *, username: str, role: str, password: str | None = None, email: str = "", groups: tuple[str, ...] = ()
) -> tuple[User, str]:
    """Create a reviewer, an admin or an agent (in approver groups); return it and its password."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, not {role!r}", field="role")
    names = _valid_groups(groups)
    username = _valid_username(username)
    if User.objects.filter(username__iexact=username).exists():
        raise InvalidInput(
            f"a user named {username!r} already exists (names are compared ignoring case)", field="username"
        )
    user = User(username=username, email=_valid_email(email), is_staff=role == "admin")
    if password is None:  # only when none was given: an empty one (an unset "$PW") is refused as too weak
        password = secrets.token_urlsafe(12)
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise InvalidInput("the password is too weak: " + " ".join(exc.messages), field="password") from None
    user.set_password(password)
    with transaction.atomic():
        roles = role_groups_ensure()
        user.save()
        user.groups.add(roles[role], *_approver_groups(names))
    return user, password


def _valid_email(email: str) -> str:
    """Return an address mail can go to ("" for none), or refuse it: it would fail each notification later, unseen."""
    email = email.strip()
    if not email:
        return ""
    max_chars = cast(int, User._meta.get_field("email").max_length)
    try:
        if len(email) > max_chars:
            raise ValidationError(f"longer than {max_chars} characters")
        EmailValidator()(email)  # one address: no line break, no list, no display name
    except ValidationError:
        raise InvalidInput(f"email: {text.repair(email)[:80]!r} is not an email address", field="email") from None
    return email


def user_set_groups(*, username: str, groups: tuple[str, ...]) -> User:
    """Set a user's approver groups (agentfast.yaml's `approvers`), keeping their role."""
    names = _valid_groups(groups)
    user = _user_named(username)
    with transaction.atomic():
        roles = list(user.groups.filter(name__in=ROLES))
        user.groups.set([*roles, *_approver_groups(names)])  # m2m_changed: open sockets re-check access
    return user


def _valid_groups(groups: tuple[str, ...]) -> list[str]:
    """Return the group names without blanks or repeats; a role is not an approver group."""
    names: list[str] = []
    for raw in groups:
        name = raw.strip()
        if not name or len(name) > _GROUP_CHARS or text.problem(name) is not None:
            raise InvalidInput(f"the group name {raw!r} is not valid (1 to {_GROUP_CHARS} characters)", field="group")
        # Shown in lists and matched against agentfast.yaml: no control or invisible character.
        with unsafe_text_refused():
            text.require_plain_name(name, field="group")
        if name in ROLES:
            raise InvalidInput(f"{name!r} is a role, not an approver group: use --role", field="group")
        if name.startswith("user:"):
            raise InvalidInput(f"{name!r} names a user: list users in agentfast.yaml as user:NAME", field="group")
        if name not in names:
            names.append(name)
    return names


def _approver_groups(names: list[str]) -> list[Group]:
    return [Group.objects.get_or_create(name=name)[0] for name in names]


def username_as_typed(username: str) -> str:
    """Return a user name as the sign-in form reads it (NFKC: "ａlice" is alice), without blanks around it."""
    return User.normalize_username(username).strip()


def _valid_username(username: str) -> str:
    """Return the name as the sign-in form reads it (NFKC, no surrounding blanks), or raise InvalidInput."""
    username = username_as_typed(username)
    if not username:
        raise InvalidInput("the user name is empty", field="username")
    if len(username) > _USERNAME_CHARS:
        raise InvalidInput(f"the user name is longer than {_USERNAME_CHARS} characters", field="username")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError as exc:
        raise InvalidInput(
            f"the user name {username!r} is not valid: " + " ".join(exc.messages), field="username"
        ) from None
    return username


def user_set_password(*, username: str, password: str) -> User:
    """Set an existing user's password after Django's password validators accept it; their sessions end."""
    user = _user_named(username)
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise InvalidInput("the password is too weak: " + " ".join(exc.messages), field="password") from None
    user.set_password(password)
    user.save(update_fields=["password"])
    # Their sessions no longer verify (Django's session hash): open sockets re-check and close.
    events.access_changed(group=events.user_group(user.pk))
    return user


def _user_named(username: str) -> User:
    """Return the user of exactly this name, else the one user it names ignoring case; or raise InvalidInput."""
    from agents import selectors  # selectors import the services package: at call time, not at import

    matches = selectors.users_named(username_as_typed(username))
    if not matches:
        raise InvalidInput(f"no user {username!r}", field="username")
    if len(matches) > 1:
        raise InvalidInput(
            f"several users are named {username!r} ignoring case: give the exact name of one", field="username"
        )
    return matches[0]


def _departed_name(username: str) -> str:
    """Return the starter a deleted user's runs name: theirs as people knew it, and no account's."""
    return username[: _USERNAME_CHARS - len(_DEPARTED)] + _DEPARTED


def user_records_rename(*, old: str, new: str) -> None:
    """Hand the runs a renamed user started, and their votes on pending approvals, to their new name; audit it.

    Runs and votes name people by user name: left under the old one, four eyes would no longer
    see them as their runs' starter, and whoever is given the name next would cancel those runs
    and vote with them. A decided approval keeps the names as they were, as its audit does.
    A vote the new name already cast the same way (a CLI `--by` name the person is now given)
    absorbs the old name's: one name counts once, and a second row would break the votes'
    uniqueness.
    """
    with transaction.atomic():
        runs = Run.objects.filter(created_by=old).update(created_by=new)
        already = Vote.objects.filter(
            voter=new,
            approval=OuterRef("approval"),
            arguments_digest=OuterRef("arguments_digest"),
            decision=OuterRef("decision"),
        )
        merged, _ = _pending_votes(old).filter(Exists(already)).delete()
        votes = _pending_votes(old).update(voter=new)
        _audit_records("renamed", f"{old} was renamed {new}", runs=runs, votes=votes, merged=merged)


def user_records_orphan(*, username: str) -> None:
    """Name a deleted user's runs as no account's, and withdraw their votes on pending approvals; audit it.

    A new account given the name must start with none of them. The votes are withdrawn, not
    renamed: an approval that names nobody counts any name's vote as given (the CLI's --by),
    and someone deleted has no say any more, as someone deactivated has none. The audit keeps
    every vote they cast.
    """
    with transaction.atomic():
        runs = Run.objects.filter(created_by=username).update(created_by=_departed_name(username))
        votes, _ = _pending_votes(username).delete()
        _audit_records("deleted", f"{username} was deleted", runs=runs, votes=votes)


def _pending_votes(voter: str) -> QuerySet[Vote]:
    return Vote.objects.filter(voter=voter, approval__status=Approval.Status.PENDING)


def _audit_records(action: str, reason: str, *, runs: int, votes: int, merged: int = 0) -> None:
    """Audit, by the system, what a user's rename or deletion did to the runs and votes naming them (if anything)."""
    if runs or votes or merged:
        detail: dict[str, object] = {"reason": reason, "runs": runs, "votes": votes}
        if merged:
            detail["merged"] = merged
        audit_append(
            approval_id="",
            action=action,
            actor="system",
            source=AuditEntry.Source.SYSTEM,
            outcome=AuditEntry.Outcome.DECIDED,
            detail=detail,
        )
