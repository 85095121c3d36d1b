"""Reads: what the CLI, the API and the dashboard show."""

from __future__ import annotations

from django.db.models import QuerySet

from agents.models import Approval, Run, SideEffect
from agents.services.errors import NotFound


def approval_list(
    *, status: str | None = "pending", agent: str | None = None, tool: str | None = None
) -> QuerySet[Approval]:
    approvals = Approval.objects.select_related("run", "tool_call").order_by("-created_at")
    if status and status != "all":
        approvals = approvals.filter(status=status)
    if agent:
        approvals = approvals.filter(run__agent=agent)
    if tool:
        approvals = approvals.filter(tool=tool)
    return approvals


def approval_get(approval_id: str) -> Approval:
    try:
        return Approval.objects.select_related("run", "tool_call").get(pk=approval_id)
    except Approval.DoesNotExist:
        raise NotFound(f"no approval {approval_id}") from None


def run_list(*, status: str | None = None, agent: str | None = None) -> QuerySet[Run]:
    runs = Run.objects.order_by("-created_at")
    if status and status != "all":
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    return runs


def run_get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None


def sideeffect_list() -> QuerySet[SideEffect]:
    return SideEffect.objects.order_by("created_at", "id")


def user_is_active(username: str) -> bool:
    """Return whether an active user has exactly this name (someone a decision may be recorded for)."""
    from django.contrib.auth.models import User

    return User.objects.filter(username=username, is_active=True).exists()
