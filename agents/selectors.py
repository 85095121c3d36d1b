"""Reads: what the CLI, the API and the dashboard show."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, F, Q, QuerySet

from agents.models import ApiToken, Approval, AuditEntry, Message, Run, RunEvent, SideEffect
from agents.services.errors import NotFound

# The events the cross-run approval feed carries.
APPROVAL_EVENTS = (RunEvent.Type.APPROVAL_REQUIRED, RunEvent.Type.APPROVAL_DECIDED)


OLDEST, NEWEST = "oldest", "newest"


def approval_list(
    *,
    status: str | None = "pending",
    agent: str | None = None,
    tool: str | None = None,
    search: str = "",
    order: str = NEWEST,
) -> QuerySet[Approval]:
    """Return approvals, filtered; `oldest` puts the nearest deadline first, then the longest waiting."""
    approvals = Approval.objects.select_related("run", "tool_call")
    if order == OLDEST:
        approvals = approvals.order_by(F("expires_at").asc(nulls_last=True), "created_at", "id")
    else:
        approvals = approvals.order_by("-created_at", "-id")
    if status and status != "all":
        approvals = approvals.filter(status=status)
    if agent:
        approvals = approvals.filter(run__agent=agent)
    if tool:
        approvals = approvals.filter(tool=tool)
    if search:
        approvals = approvals.filter(_search(search))
    return approvals


def _search(words: str) -> Q:
    """Match every word in the tool, the arguments (proposed or edited), the run's input or the notes."""
    matches = Q()
    for word in words.split():
        matches &= (
            Q(tool__icontains=word)
            | Q(tool_call__arguments__icontains=word)
            | Q(arguments__icontains=word)
            | Q(run__input__icontains=word)
            | Q(note__icontains=word)
            | Q(feedback__icontains=word)
        )
    return matches


def approval_run_positions(approvals: Iterable[Approval]) -> dict[str, tuple[int, int]]:
    """Return, per approval id, its place among its run's pending approvals: (1, 2) is "1 of 2"."""
    run_ids = {approval.run_id for approval in approvals}
    rows = Approval.objects.filter(run_id__in=run_ids, status=Approval.Status.PENDING).order_by("created_at", "id")
    by_run: dict[str, list[str]] = {}
    for run_id, approval_id in rows.values_list("run_id", "id"):
        by_run.setdefault(run_id, []).append(approval_id)
    return {
        approval_id: (index + 1, len(ids)) for ids in by_run.values() for index, approval_id in enumerate(ids)
    }


def approval_next_pending(*, after: str, among: QuerySet[Approval] | None = None) -> Approval | None:
    """Return the pending approval a reviewer goes to next: the longest waiting other than `after`."""
    approvals = among if among is not None else approval_list(order=OLDEST)
    return approvals.filter(status=Approval.Status.PENDING).exclude(pk=after).first()


def approval_get(approval_id: str) -> Approval:
    try:
        return Approval.objects.select_related("run", "tool_call").get(pk=approval_id)
    except Approval.DoesNotExist:
        raise NotFound(f"no approval {approval_id}") from None


def approval_tools() -> QuerySet[Approval, str]:
    """Return the names of the tools any approval asked for, sorted, each once."""
    return Approval.objects.order_by("tool").values_list("tool", flat=True).distinct()


def approval_events_after(*, pk: int, limit: int) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    """Return up to `limit` approval events of every run after event `pk`: (pk, run_id, seq, type, data)."""
    rows = RunEvent.objects.filter(type__in=APPROVAL_EVENTS, pk__gt=pk).order_by("pk")
    return list(rows.values_list("pk", "run_id", "seq", "type", "data")[:limit])


def approval_event_latest() -> int:
    """Return the pk of the newest approval event (0: none yet)."""
    return RunEvent.objects.filter(type__in=APPROVAL_EVENTS).order_by("-pk").values_list("pk", flat=True).first() or 0


def run_list(*, status: str | None = None, agent: str | None = None, created_by: str | None = None) -> QuerySet[Run]:
    runs = Run.objects.order_by("-created_at")
    if status and status != "all":
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if created_by is not None:
        runs = runs.filter(created_by=created_by)
    return runs


def run_list_with_pending(*, status: str | None = None) -> QuerySet[Run]:
    """Return runs like run_list, each annotated with `pending`, its count of pending approvals."""
    return run_list(status=status).annotate(
        pending=Count("approvals", filter=Q(approvals__status=Approval.Status.PENDING))
    )


def run_exists(run_id: str) -> bool:
    return Run.objects.filter(pk=run_id).exists()


def run_agents() -> QuerySet[Run, str]:
    """Return the names of the agents any run ran, sorted, each once."""
    return Run.objects.order_by("agent").values_list("agent", flat=True).distinct()


def run_approvals(run: Run) -> QuerySet[Approval]:
    """Return a run's approvals, oldest first."""
    return run.approvals.order_by("created_at")


def run_approvals_waiting(run: Run) -> QuerySet[Approval]:
    """Return the pending approvals a suspended run waits on."""
    return run.approvals.filter(status=Approval.Status.PENDING, mode=Approval.Mode.SUSPEND)


def run_state(run_id: str) -> tuple[str, int] | None:
    """Return a run's (status, last_event_seq), or None when there is no such run."""
    return Run.objects.filter(pk=run_id).values_list("status", "last_event_seq").first()


def run_lease(run_id: str) -> dict[str, Any]:
    """Return a run's lease_owner and lease_expires_at ({} when there is no such run)."""
    lease = Run.objects.filter(pk=run_id).values("lease_owner", "lease_expires_at").first()
    return dict(lease) if lease else {}


def run_events(run: Run) -> QuerySet[RunEvent]:
    """Return a run's stored events, in order."""
    return RunEvent.objects.filter(run=run).order_by("seq")


def run_events_after(*, run_id: str, seq: int, limit: int) -> list[tuple[int, str, dict[str, Any]]]:
    """Return up to `limit` stored events of a run after `seq`: (seq, type, data)."""
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")
    return list(rows.values_list("seq", "type", "data")[:limit])


def run_event_get(*, run_id: str, seq: int) -> RunEvent | None:
    return RunEvent.objects.filter(run_id=run_id, seq=seq).first()


def run_event_pk(*, run_id: str, seq: int) -> int | None:
    return RunEvent.objects.filter(run_id=run_id, seq=seq).values_list("pk", flat=True).first()


def message_list(*, run_id: str) -> QuerySet[Message]:
    """Return a run's conversation, in order."""
    return Message.objects.filter(run_id=run_id).order_by("seq")


def audit_entries(
    *,
    person: str = "",
    tool: str = "",
    outcome: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEntry]:
    """Return the audit entries matching every filter given: by or on behalf of `person`, in [since, until)."""
    entries = AuditEntry.objects.all()
    if person:
        entries = entries.filter(Q(actor=person) | Q(on_behalf_of=person))
    if tool:
        entries = entries.filter(tool=tool)
    if outcome:
        entries = entries.filter(outcome=outcome)
    if since is not None:
        entries = entries.filter(created_at__gte=since)
    if until is not None:
        entries = entries.filter(created_at__lt=until)
    return entries


def audit_entries_after(entries: QuerySet[AuditEntry], *, pk: int, limit: int) -> list[AuditEntry]:
    """Return up to `limit` of these entries after id `pk`, by id (keyset: one indexed query each)."""
    return list(entries.filter(pk__gt=pk).order_by("pk")[:limit])


def audit_people() -> QuerySet[AuditEntry, str]:
    """Return everyone who attempted a decision, sorted, each once."""
    return AuditEntry.objects.order_by("actor").values_list("actor", flat=True).distinct()


def audit_tools() -> QuerySet[AuditEntry, str]:
    """Return the tools named in the audit history, sorted, each once."""
    return AuditEntry.objects.exclude(tool="").order_by("tool").values_list("tool", flat=True).distinct()


def run_get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None


def sideeffect_list() -> QuerySet[SideEffect]:
    return SideEffect.objects.order_by("created_at", "id")


def user_is_active(username: str) -> bool:
    """Return whether an active user has exactly this name (someone a decision may be recorded for)."""
    return User.objects.filter(username=username, is_active=True).exists()


def user_get_active(user_id: int) -> User | None:
    return User.objects.filter(pk=user_id, is_active=True).first()


def token_is_live(token_id: int) -> bool:
    """Return whether an API token exists and is not revoked."""
    return ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).exists()
