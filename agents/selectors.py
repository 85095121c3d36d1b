"""Reads: what the CLI, the API and the dashboard show."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q, QuerySet

from agents.models import Approval, Run, SavedAgent, SideEffect
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


# -- runs list, insights and metrics (issue 11) -------------------------------------------


def run_search(
    *,
    query: str = "",
    status: str | None = None,
    agent: str | None = None,
    created_by: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Run]:
    """Return runs newest first, filtered, each with its count of pending approvals (`pending`)."""
    runs = run_list(status=status, agent=agent)
    if query:
        runs = runs.filter(Q(input__icontains=query) | Q(id__icontains=query) | Q(output__icontains=query))
    if created_by:
        runs = runs.filter(created_by=created_by)
    if since:
        runs = runs.filter(created_at__gte=since)
    if until:
        runs = runs.filter(created_at__lt=until)
    return runs.annotate(pending=Count("approvals", filter=Q(approvals__status=Approval.Status.PENDING)))


def run_agents() -> list[str]:
    return list(Run.objects.order_by("agent").values_list("agent", flat=True).distinct())


def run_creators() -> list[str]:
    return list(
        Run.objects.exclude(created_by="").order_by("created_by").values_list("created_by", flat=True).distinct()
    )


def decided_approvals(*, since: datetime | None = None) -> QuerySet[Approval]:
    """Return approvals decided by a person or the system (not expired), oldest decision first."""
    decided = Approval.objects.filter(
        status__in=(Approval.Status.APPROVED, Approval.Status.REJECTED), decided_at__isnull=False
    ).select_related("run")
    if since:
        decided = decided.filter(decided_at__gte=since)
    return decided.order_by("decided_at", "id")


def approvals_opened_and_closed(*, since: datetime) -> QuerySet[Approval]:
    """Return approvals that were open at some moment since `since` (for queue depth over time)."""
    return Approval.objects.filter(Q(decided_at__isnull=True) | Q(decided_at__gte=since)).only(
        "id", "created_at", "decided_at", "status"
    )


def pending_approval_count() -> int:
    return Approval.objects.filter(status=Approval.Status.PENDING).count()


def run_counts_by_status() -> dict[str, int]:
    counts = dict(Run.objects.order_by().values_list("status").annotate(n=Count("id")))
    return {status: counts.get(status, 0) for status in Run.Status.values}


@dataclass(frozen=True)
class DecisionLatency:
    tool: str
    seconds: float


def decision_latencies() -> Iterator[DecisionLatency]:
    """Yield the tool and seconds-to-decision of every decided approval, a batch of rows at a time."""
    rows = decided_approvals().values_list("tool", "created_at", "decided_at")
    for tool, created_at, decided_at in rows.iterator(chunk_size=2000):
        yield DecisionLatency(tool=tool, seconds=max((decided_at - created_at).total_seconds(), 0.0))


def saved_agents(*, owner_id: int) -> QuerySet[SavedAgent]:
    return SavedAgent.objects.filter(owner_id=owner_id).order_by("name", "id")


def saved_agent_get(*, owner_id: int, saved_id: int) -> SavedAgent:
    """Return one of the owner's saved agents; another person's is not found."""
    try:
        return SavedAgent.objects.get(owner_id=owner_id, pk=saved_id)
    except SavedAgent.DoesNotExist:
        raise NotFound(f"no saved agent {saved_id}") from None
