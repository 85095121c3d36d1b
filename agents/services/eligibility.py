"""Who may decide an approval: the one rule every entry point (web, API, CLI, inbox) asks.

A user may decide when they are an active reviewer or admin, AND the approval names no
approvers or they belong to one (a Django group, or `user:<their name>`), AND not (four
eyes and they started the run). Standing grants build on `refusal` too.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from agents.models import Approval

DECIDE = "agents.decide_approval"
USER_PREFIX = "user:"


def refusal(user: Any, approval: Approval) -> str | None:
    """Return why this user may not decide this approval, or None when they may."""
    if not (user.is_authenticated and user.is_active and user.has_perm(DECIDE)):
        return f"{user.get_username() or 'an anonymous user'} is not an active reviewer"
    return restriction(user, approval)


def may_decide(user: Any, approval: Approval) -> bool:
    return refusal(user, approval) is None


def restriction(user: Any, approval: Approval) -> str | None:
    """Return why the approval's own restrictions (approvers, four eyes) exclude this reviewer, or None."""
    username = user.get_username()
    if approval.approvers and not _is_approver(user, approval.approvers):
        return f"{username} is not among the approvers of this call ({waits_for(approval)})"
    if approval.four_eyes and username == approval.run.created_by:
        return f"{username} started this run, and four eyes are required: someone else must approve it"
    return None


def refusal_for_name(username: str, approval: Approval) -> str | None:
    """Return why the person named (the CLI's --by, a relayed decided_by) may not decide, or None.

    An approval that names neither approvers nor four eyes keeps the name as given (the
    entry point authenticated whoever records it); otherwise the name must be an active
    user that the rule above allows.
    """
    if not approval.approvers and not approval.four_eyes:
        return None
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        return f"{username!r} is no active user, and this call names who may decide it"
    return refusal(user, approval)


def _is_approver(user: Any, approvers: list[str]) -> bool:
    names = {entry.removeprefix(USER_PREFIX) for entry in approvers if entry.startswith(USER_PREFIX)}
    if user.get_username() in names:
        return True
    groups = [entry for entry in approvers if not entry.startswith(USER_PREFIX)]
    return bool(groups) and user.groups.filter(name__in=groups).exists()


def waits_for(approval: Approval) -> str:
    """Say whom an approval waits for: "finance, user:dan" or "any reviewer"."""
    return ", ".join(approval.approvers) if approval.approvers else "any reviewer"
