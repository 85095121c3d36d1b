"""Reads: what the CLI, the API and the dashboard show."""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Count,
    ExpressionWrapper,
    F,
    Min,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Greatest, TruncDate
from django.utils import timezone

from agents import sql, text
from agents.models import (
    DEADLINE,
    SCHEDULE,
    ApiToken,
    Approval,
    AuditEntry,
    Delivery,
    DeliveryAttempt,
    Grant,
    Message,
    PrunedFailures,
    Run,
    RunEvent,
    SavedAgent,
    SideEffect,
    ToolCall,
)
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
        approvals = _narrowed(approvals.filter(_search(search)), search)
    return approvals


def approval_matches(approval_id: str, search: str) -> bool:
    """Return whether this approval holds every word of a search (a live card checked against a searched list)."""
    return Approval.objects.filter(pk=approval_id).filter(_search(search)).exists()


def newest_first_after(items: QuerySet[Any], *, created_at: datetime, pk: str) -> QuerySet[Any]:
    """Return the items after (created_at, pk) in newest-first order: a keyset, read off a created_at index.

    `created_at <= t` bounds the index range; the few rows of that same moment are told apart by id.
    """
    return items.filter(created_at__lte=created_at).exclude(created_at=created_at, pk__gte=pk)


def newest_first_after_row(items: QuerySet[Any], pk: str) -> QuerySet[Any] | None:
    """Return the items after the row with id `pk` in newest-first order; None when no row has that id.

    The row need not be among the items any more (an approval decided since it was shown):
    the list goes on from where it stood.
    """
    anchor = _row_position(items, pk, "pk", "created_at")
    return None if anchor is None else newest_first_after(items, created_at=anchor[1], pk=anchor[0])


def oldest_first_after_row(approvals: QuerySet[Approval], approval_id: str) -> QuerySet[Approval] | None:
    """Return the approvals after this one in the inbox's oldest order (nearest deadline, then longest waiting).

    None when there is no such approval. The order puts approvals with no deadline last, so
    after one with a deadline come the later deadlines, then every approval without one.
    """
    anchor = _row_position(approvals, approval_id, "pk", "expires_at", "created_at")
    if anchor is None:
        return None
    pk, expires_at, created_at = anchor
    later = Q(created_at__gt=created_at) | Q(created_at=created_at, pk__gt=pk)
    if expires_at is None:
        return approvals.filter(Q(expires_at__isnull=True) & later)
    same_deadline = Q(expires_at=expires_at) & later
    return approvals.filter(Q(expires_at__gt=expires_at) | same_deadline | Q(expires_at__isnull=True))


def _row_position(items: QuerySet[Any], pk: str, *fields: str) -> tuple[Any, ...] | None:
    """Return these fields of the row of `items`' model with this id, or None: no such row, or no id of the model."""
    if not pk or len(pk) > 200 or text.problem(pk) is not None:  # PostgreSQL refuses a NUL in a query
        return None
    try:
        position: tuple[Any, ...] | None = items.model.objects.filter(pk=pk).values_list(*fields).first()
    except (ValueError, ValidationError):  # not an id of this model at all (an audit entry's is a number)
        return None
    return position


def count_up_to(items: QuerySet[Any], limit: int) -> int:
    """Return how many items there are, counting no further than `limit` (a bounded read, not a COUNT(*) of all)."""
    return items.order_by().values("pk")[:limit].count()


def _search(words: str) -> Q:
    """Match every word in the tool, the arguments (proposed or edited), the run's input or the notes."""
    matches = Q()
    for word in words.split():
        in_arguments = Q()
        for spelling in _json_spellings(word):
            in_arguments |= Q(tool_call__arguments__icontains=spelling) | Q(arguments__icontains=spelling)
        matches &= (
            Q(tool__icontains=word)
            | in_arguments
            | Q(run__input__icontains=word)
            | Q(note__icontains=word)
            | Q(feedback__icontains=word)
        )
    return matches


# A word in at most this many approvals, calls or runs is looked up in their trigram indexes first.
FEW_HOLDERS = 500
LOOKED_UP = 3  # words of a search looked up at most
_TRIGRAM = re.compile(r"[^\W_]{3}")  # three of pg_trgm's word characters (letters and digits) in a row


def _narrowed(approvals: QuerySet[Approval], words: str) -> QuerySet[Approval]:
    """Narrow a searched list to the approvals holding its first word that few rows hold (PostgreSQL).

    `_search` ORs conditions over three tables, which no index serves: a word no call holds
    made the inbox read each of 100,000 pending approvals (565 ms). Looked up alone, each
    table's condition is served by its trigram index (migration 0030), so a word held by few
    rows gives the approvals that can match at all in a few milliseconds; a common word gives
    no narrowing, and the list walks its newest-first index, filling its page at once. Only
    words with three letters or digits in a row are looked up (the index holds no shorter part
    of a word, and would be read whole), and no more than LOOKED_UP of them, so a search of
    forty common words costs no more than one of three. SQLite has no such index: there each
    lookup would read whole tables, so the list is left as it is.
    """
    if connection.vendor != "postgresql":
        return approvals
    indexed: dict[str, str] = {}  # each word once, whatever its case (the lookups ignore it)
    for word in words.split():
        if _TRIGRAM.search(word):
            indexed.setdefault(word.upper(), word)
    for word in list(indexed.values())[:LOOKED_UP]:
        holders = _few_holders(word)
        if holders is not None:
            return approvals.filter(holders)
    return approvals


def _few_holders(word: str) -> Q | None:
    """Return a condition on the approvals that can hold this word, or None if more than FEW_HOLDERS rows hold it."""
    in_arguments = Q()  # an approval's edited arguments, or a call's proposed ones
    for spelling in _json_spellings(word):
        in_arguments |= Q(arguments__icontains=spelling)
    in_own = in_arguments | Q(tool__icontains=word) | Q(note__icontains=word) | Q(feedback__icontains=word)
    lookups = (
        ("pk__in", Approval.objects.filter(in_own).values_list("pk", flat=True)),
        ("tool_call_id__in", ToolCall.objects.filter(in_arguments).values_list("pk", flat=True)),
        ("run_id__in", Run.objects.filter(run_text_matches(word, ("input",))).values_list("pk", flat=True)),
    )
    holders = Q()
    for lookup, rows in lookups:
        found = list(rows.order_by()[: FEW_HOLDERS + 1])
        if len(found) > FEW_HOLDERS:
            return None
        holders |= Q(**{lookup: found})
    return holders


def _json_spellings(word: str) -> list[str]:
    """Return the ways a word is written inside a JSON column's text, the word itself first.

    The arguments are searched as JSON text: SQLite's keeps every non-ASCII character as
    a \\uXXXX escape (PostgreSQL's as itself), and both escape quotes and backslashes, so
    "Müller" or C:\\tmp written as typed would never match the arguments that hold them.
    """
    spellings = [word, json.dumps(word)[1:-1], json.dumps(word, ensure_ascii=False)[1:-1]]
    return list(dict.fromkeys(spellings))


def approval_run_positions(approvals: Iterable[Approval]) -> dict[str, tuple[int, int]]:
    """Return, per approval id, its place among its run's pending approvals: (1, 2) is "1 of 2"."""
    run_ids = {approval.run_id for approval in approvals}
    rows = Approval.objects.filter(run_id__in=run_ids, status=Approval.Status.PENDING).order_by("created_at", "id")
    by_run: dict[str, list[str]] = {}
    for run_id, approval_id in rows.values_list("run_id", "id"):
        by_run.setdefault(run_id, []).append(approval_id)
    return {approval_id: (index + 1, len(ids)) for ids in by_run.values() for index, approval_id in enumerate(ids)}


def approval_next_pending(*, after: str, among: QuerySet[Approval] | None = None) -> Approval | None:
    """Return the pending approval a reviewer goes to next: the longest waiting other than `after`."""
    approvals = among if among is not None else approval_list(order=OLDEST)
    return approvals.filter(status=Approval.Status.PENDING).exclude(pk=after).first()


def approval_get(approval_id: str) -> Approval:
    try:
        return Approval.objects.select_related("run", "tool_call").get(pk=approval_id)
    except Approval.DoesNotExist:
        raise NotFound(f"no approval {approval_id}") from None


def approvals_in(approval_ids: Iterable[str]) -> dict[str, Approval]:
    """Return the approvals of these ids that exist, by id, with their run and call."""
    rows = Approval.objects.select_related("run", "tool_call").filter(pk__in=list(approval_ids))
    return {approval.id: approval for approval in rows}


def approval_filter_choices() -> tuple[list[str], list[str]]:
    """Return the agents any run ran and the tools any approval asked for, sorted (a probe of an index per name)."""
    agents, tools = sql.distinct_values((Run._meta.db_table, "agent"), (Approval._meta.db_table, "tool"))
    return agents, tools


def approval_events_after(*, pk: int, limit: int) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    """Return up to `limit` approval events of every run after event `pk`: (pk, run_id, seq, type, data)."""
    rows = RunEvent.objects.filter(type__in=APPROVAL_EVENTS, pk__gt=pk).order_by("pk")
    return list(rows.values_list("pk", "run_id", "seq", "type", "data")[:limit])


def approval_event_pks_between(*, after: int, upto: int) -> list[int]:
    """Return the pks of the approval events of every run with pks in (after, upto], ascending."""
    rows = RunEvent.objects.filter(type__in=APPROVAL_EVENTS, pk__gt=after, pk__lte=upto).order_by("pk")
    return list(rows.values_list("pk", flat=True))


def approval_events_in(pks: Sequence[int]) -> list[tuple[int, str, int, str, dict[str, Any]]]:
    """Return the approval events with these pks that exist, by pk: (pk, run_id, seq, type, data)."""
    rows = RunEvent.objects.filter(type__in=APPROVAL_EVENTS, pk__in=list(pks)).order_by("pk")
    return list(rows.values_list("pk", "run_id", "seq", "type", "data"))


def run_event_horizon() -> tuple[int, frozenset[str]]:
    """Return the newest committed RunEvent id and the transactions that may still commit ids below it (sql)."""
    return sql.run_event_horizon()


def approval_event_latest() -> int:
    """Return the pk of the newest approval event (0: none yet)."""
    return RunEvent.objects.filter(type__in=APPROVAL_EVENTS).order_by("-pk").values_list("pk", flat=True).first() or 0


def run_list(*, status: str | None = None, agent: str | None = None, created_by: str | None = None) -> QuerySet[Run]:
    runs = Run.objects.order_by("-created_at", "-id")  # the id tells runs of the same moment apart (the API's keyset)
    if status and status != "all":
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if created_by is not None:
        runs = runs.filter(created_by=created_by)
    return runs


def run_exists(run_id: str) -> bool:
    return Run.objects.filter(pk=run_id).exists()


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


def run_events_latest(run: Run, limit: int) -> tuple[list[RunEvent], bool]:
    """Return a run's latest `limit` stored events in order, and whether earlier ones exist (limit + 1 rows read)."""
    rows = list(RunEvent.objects.filter(run=run).order_by("-seq")[: limit + 1])
    return rows[:limit][::-1], len(rows) > limit


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


# The export's text columns that are the entry's own, as they are stored.
AUDIT_EXPORT_PLAIN = ("actor", "on_behalf_of", "action", "tool", "approval_id", "run_id", "source", "origin", "outcome")
# The columns of an audit export row as Python writes it: the id (the keyset), then the export's
# columns with the note, `created_at` as the database's text of it (UTC; the driver's datetime
# loader is the slowest part of a row) and `detail` as its JSON text (arguments_diff is read from it).
AUDIT_CSV_FIELDS = ("id", "created_text", *AUDIT_EXPORT_PLAIN, "note_text", "detail_text", "prev_hash", "hash")
# As PostgreSQL writes it (the query is its batch's sub-select): the time itself, and the diff apart.
AUDIT_EXPORT_FIELDS = (
    "id",
    "created_at",
    *AUDIT_EXPORT_PLAIN,
    "note_text",
    "diff_text",
    "detail_text",
    "prev_hash",
    "hash",
)


def audit_csv_rows_after(entries: QuerySet[AuditEntry], *, pk: int, limit: int) -> list[tuple[Any, ...]]:
    """Return up to `limit` of these entries after id `pk` as export rows (tuples of AUDIT_CSV_FIELDS), by id."""
    return list(_export_rows(entries.filter(pk__gt=pk), AUDIT_CSV_FIELDS)[:limit])


def audit_csv_rows_between(
    entries: QuerySet[AuditEntry], *, after: int, until: int | None, fields: tuple[str, ...]
) -> QuerySet[AuditEntry, tuple[Any, ...]]:
    """Return these entries with ids in (after, until] (no upper bound: None) as export rows of `fields`, by id."""
    entries = entries.filter(pk__gt=after)
    return _export_rows(entries if until is None else entries.filter(pk__lte=until), fields)


def audit_nth_id_after(entries: QuerySet[AuditEntry], pk: int, n: int) -> int | None:
    """Return the id of the n-th of these entries after id `pk` (None: there are fewer), read from the index."""
    return next(iter(entries.filter(pk__gt=pk).order_by("pk").values_list("pk", flat=True)[n - 1 : n]), None)


def _export_rows(entries: QuerySet[AuditEntry], fields: tuple[str, ...]) -> QuerySet[AuditEntry, tuple[Any, ...]]:
    """Keyset order, plain tuples and `detail` as text: no model objects and no JSON decoded by the ORM."""
    rows = entries.order_by("pk").annotate(
        created_text=Cast("created_at", TextField()),
        note_text=KeyTextTransform("note", "detail"),
        diff_text=Cast(KeyTransform("arguments_diff", "detail"), TextField()),
        detail_text=Cast("detail", TextField()),
    )
    return rows.values_list(*fields)


def audit_people() -> list[str]:
    """Return the names a person filter of the audit may name: every user, sorted.

    Read from the users, not by a DISTINCT over a million audit entries; the filter is free text, so
    an actor who is no longer a user can still be typed.
    """
    return list(User.objects.order_by("username").values_list("username", flat=True))


def audit_tools() -> list[str]:
    """Return the tools a decision may be about: those registered and those the policy lists, sorted."""
    from agents.policy.config import ConfigError, get_policy
    from agents.tools.registry import registry

    try:
        policy = get_policy()
    except ConfigError:  # a half-saved file: the registered tools still filter (any name does, by URL)
        return sorted(registry.names())
    listed = set(policy.tool_overrides)
    for agent in policy.agents.values():
        listed |= set(agent.tool_overrides)
    return sorted(listed | set(registry.names()))


def run_pending_and_scheduled(run_ids: list[str]) -> dict[str, tuple[int, datetime | None]]:
    """Return, per run, how many pending approvals it has and when its scheduled call runs (None: none scheduled).

    Runs with no pending approval are left out. One grouped read for both (the runs page's two badges).
    """
    scheduled = Q(on_timeout=Approval.OnTimeout.RUN)
    rows = (
        Approval.objects.filter(run_id__in=run_ids, status=Approval.Status.PENDING)
        .values("run_id")
        .annotate(pending=Count("pk"), at=Min("expires_at", filter=scheduled))
        .values_list("run_id", "pending", "at")
    )
    return {run_id: (pending, at) for run_id, pending, at in rows}


def run_held_until(run_ids: list[str], now: datetime) -> dict[str, datetime]:
    """Return, per run, when its decided call that a tool put off runs; runs with none are left out."""
    rows = (
        ToolCall.objects.filter(run_id__in=run_ids, not_before__gt=now, result__isnull=True)
        .values("run_id")
        .annotate(at=Min("not_before"))
        .values_list("run_id", "at")
    )
    return dict(rows)


def run_get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None


def sideeffect_list() -> QuerySet[SideEffect]:
    return SideEffect.objects.order_by("created_at", "id")


def users_named(name: str) -> list[User]:
    """Return the user of exactly this name; else the users it names ignoring case, two at most.

    Two names may differ in case only where the Django admin or createsuperuser made them.
    """
    exact = User.objects.filter(username=name).first()
    if exact is not None:
        return [exact]
    return list(User.objects.filter(username__iexact=name)[:2])


def username_as_spelled(name: str) -> str:
    """Return the one user's own spelling of a name typed in another case ("Alice" for alice), else the name.

    Names are unique ignoring case, and four eyes compares a run's starter with a decider exactly:
    a run recorded as started by "Alice" would let alice decide it.
    """
    matches = users_named(name)
    return matches[0].username if len(matches) == 1 else name


def user_get_active_by_name(username: str) -> User | None:
    """Return the active user with exactly this name (someone a decision may be recorded for), or None."""
    return User.objects.filter(username=username, is_active=True).first()


def user_get_active(user_id: int) -> User | None:
    return User.objects.filter(pk=user_id, is_active=True).first()


def token_is_live(token_id: int) -> bool:
    """Return whether an API token exists and is not revoked."""
    return ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).exists()


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
    """Return runs newest first, filtered by a search text, status, agent, creator and dates."""
    runs = run_list(status=status, agent=agent)
    if query:
        runs = runs.filter(run_text_matches(query, ("input", "id", "output")))
    if created_by:
        runs = runs.filter(created_by=created_by)
    if since:
        runs = runs.filter(created_at__gte=since)
    if until:
        runs = runs.filter(created_at__lt=until)
    return runs  # the view counts the pending approvals of the visible page only (run_pending_and_scheduled)


# The runs the trigram index holds (migration 0032): all but the internal ones queued or driven
# by a worker, whose row is written again and again while there are few of them. Spelled as the
# index's predicate, which PostgreSQL must find in a query to use it; _DRIVEN is its complement.
_DRIVEN_STATUSES = (Run.Status.QUEUED, Run.Status.RUNNING)
RUN_TEXT_INDEXED = ~Q(status__in=_DRIVEN_STATUSES) | Q(kind=Run.Kind.EXTERNAL)
_DRIVEN = Q(status__in=_DRIVEN_STATUSES, kind=Run.Kind.INTERNAL)


def run_text_matches(text: str, fields: Sequence[str]) -> Q:
    """Return a condition on runs: one of these text fields holds `text`, whatever its case.

    Spelled so PostgreSQL serves it with indexes: each field's match among the runs the
    trigram index holds is an arm of its own (an arm must name the index's predicate to use
    it), and the queued and running internal runs, which it leaves out, are read by status
    and matched. On SQLite it comes to the plain OR of the fields' matches.
    """
    matches = [Q(**{f"{field}__icontains": text}) for field in fields]
    condition = _DRIVEN & functools.reduce(operator.or_, matches)
    for match in matches:
        condition |= RUN_TEXT_INDEXED & match
    return condition


def run_filter_choices() -> tuple[list[str], list[str]]:
    """Return the agents any run ran and who started runs, sorted (a probe of an index per name)."""
    agents, creators = sql.distinct_values((Run._meta.db_table, "agent"), (Run._meta.db_table, "created_by"))
    return agents, creators


# (tool, agent, person, status, edited, how many, how many of them quick)
DecisionTally = tuple[str, str, str, str, bool, int, int]


def _decided() -> QuerySet[Approval]:
    """Approvals decided by a person or the system (not expired nor cancelled), in no order."""
    return Approval.objects.filter(
        status__in=(Approval.Status.APPROVED, Approval.Status.REJECTED), decided_at__isnull=False
    ).order_by()


# Decided by a person: a rule, a grant ("policy:…", "grant:…") or the clock (a deadline, a schedule) is nobody.
CLOCK_DECIDERS = (DEADLINE, SCHEDULE)
_BY_PERSON = ~Q(decided_by="") & ~Q(decided_by__contains=":") & ~Q(decided_by__in=CLOCK_DECIDERS)
_PERSON = Case(When(_BY_PERSON, then=F("decided_by")), default=Value(""))


def decision_tallies(*, since: datetime, quick_seconds: float) -> list[DecisionTally]:
    """Count the decisions since then by tool, agent, person ("" for no one), status and whether edited.

    Each tally also counts its decisions made within `quick_seconds` of the call being asked.
    The database groups them: a busy team's window holds 100,000 decisions, whose rows the
    page read one by one before (seconds, most of it parsing their times).
    """
    edited = ExpressionWrapper(Q(arguments__isnull=False), output_field=BooleanField())
    quick = Count("id", filter=Q(waited__lt=quick_seconds))
    tallies = (
        _decided()
        .filter(decided_at__gte=since)
        .annotate(person=_PERSON, edited=edited, waited=sql.SecondsBetween("created_at", "decided_at"))
        .values_list("tool", "run__agent", "person", "status", "edited")
        .annotate(count=Count("id"), quick=quick)
    )
    return list(tallies)


# (tool, day decided in the current time zone or None for the whole window, p50 seconds, p95 seconds)
WaitPercentiles = tuple[str, date | None, float, float]


def decision_wait_percentiles(*, since: datetime) -> list[WaitPercentiles]:
    """Return how long people took to decide since then: p50 and p95 by tool, and by tool and day.

    Nearest-rank percentiles (`percentile`) of the seconds from asking to deciding, a clock
    set back between the two counting as no wait. PostgreSQL computes them (a row per tool
    and day instead of one per decision: 100,000 in a busy team's window); SQLite has no
    percentile function, so its waits are read and sorted here.
    """
    waits = (
        _decided()
        .filter(_BY_PERSON, decided_at__gte=since)
        .annotate(day=TruncDate("decided_at"), waited=Greatest(sql.SecondsBetween("created_at", "decided_at"), 0.0))
        .values_list("tool", "day", "waited")
    )
    if connection.vendor == "postgresql":
        return sql.nearest_rank_percentiles(waits, (0.5, 0.95))
    groups: dict[tuple[str, date | None], list[float]] = defaultdict(list)
    for tool, day, waited in waits.iterator(chunk_size=5000):
        groups[tool, None].append(waited)
        groups[tool, day].append(waited)
    return [(tool, day, percentile(values, 0.5), percentile(values, 0.95)) for (tool, day), values in groups.items()]


def percentile(values: Sequence[float], share: float) -> float:
    """Return the nearest-rank percentile: the smallest value with at least `share` of the values at or below it.

    PostgreSQL's percentile_disc, to the same floating-point product of `share` and the count.
    """
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def approvals_open_by_period(*, start: datetime, seconds: float) -> dict[int, tuple[int, int]]:
    """Return {period: (most open at once, net change)} for periods of `seconds` from `start` (-1: up to it)."""
    return sql.approvals_open_by_period(start=start, seconds=seconds)


def pending_approval_count() -> int:
    return Approval.objects.filter(status=Approval.Status.PENDING).count()


def notification_failure_count() -> int:
    """Return how many notification delivery attempts failed, ever: those kept, and those housekeeping deleted."""
    pruned = PrunedFailures.objects.filter(pk=1).values_list("count", flat=True).first() or 0
    return DeliveryAttempt.objects.exclude(error="").count() + pruned  # a failed attempt always says why


def deliveries_due_count() -> int:
    """Return how many pending deliveries' time has come and are not sent yet (a backlog, if it stays up)."""
    return Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=timezone.now()).count()


def run_counts_by_status() -> dict[str, int]:
    counts = dict(Run.objects.order_by().values_list("status").annotate(n=Count("id")))
    return {status: counts.get(status, 0) for status in Run.Status.values}


@dataclass(frozen=True)
class DecisionLatencies:
    """One tool's decided approvals: how many took at most each bound, how many in all, their seconds summed."""

    tool: str
    within: tuple[int, ...]
    count: int
    seconds: float


def decision_latency_histogram(bounds: Sequence[float]) -> list[DecisionLatencies]:
    """Return each tool's seconds-to-decision histogram over every approval a person decided, by tool name.

    A rule, a grant or the clock decides in no time a person took (or in the deadline's), so
    they are left out as on Insights. The database counts the buckets in one grouped scan and
    sends a row per tool, so a scrape's time and memory do not grow with the history a Python
    loop would read row by row. A decision stamped before its question (clocks apart) counts as 0 seconds.
    """
    return [
        DecisionLatencies(tool=tool, within=within, count=count, seconds=seconds)
        for tool, count, seconds, within in sql.seconds_histogram(_decided().filter(_BY_PERSON), bounds)
    ]


def saved_agents(*, owner_id: int) -> QuerySet[SavedAgent]:
    return SavedAgent.objects.filter(owner_id=owner_id).order_by("name", "id")


def saved_agent_get(*, owner_id: int, saved_id: int) -> SavedAgent:
    """Return one of the owner's saved agents; another person's is not found."""
    try:
        return SavedAgent.objects.get(owner_id=owner_id, pk=saved_id)
    except SavedAgent.DoesNotExist:
        raise NotFound(f"no saved agent {saved_id}") from None


def grant_list(*, include_ended: bool = False) -> QuerySet[Grant]:
    """Return standing grants, newest first; live ones only unless asked for every one."""
    grants = Grant.objects.order_by("-created_at", "id")
    if include_ended:
        return grants
    return grants.filter(expires_at__gt=timezone.now(), revoked_at__isnull=True)


def grant_state(grant: Grant) -> str:
    """Return live, expired or revoked."""
    if grant.revoked_at is not None:
        return "revoked"
    return "live" if grant.expires_at > timezone.now() else "expired"


def grant_as_json(grant: Grant) -> dict[str, Any]:
    """Return what `grants list --json` prints of a grant."""
    when = {name: getattr(grant, name) for name in ("created_at", "expires_at", "revoked_at", "last_used_at")}
    return {
        "id": grant.id,
        "decision": grant.decision,
        "scope": grant.scope,
        "tool": grant.tool,
        "agent": grant.agent,
        "kind": grant.kind,
        "account": grant.account or None,  # the external agent's account whose calls it decides
        "arguments_digest": grant.arguments_digest or None,
        "created_by": grant.created_by,
        "approval_id": grant.approval_id,
        **{name: value.isoformat() if value else None for name, value in when.items()},
        "revoked_by": grant.revoked_by or None,
        "uses": grant.uses,
        "state": grant_state(grant),
    }
