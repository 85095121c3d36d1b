"""Who may decide an approval: the one rule every entry point (web, API, CLI, inbox) asks.

A user may decide when they are an active reviewer or admin, AND the approval names no
approvers or they belong to one (a Django group, or `user:<their name>`), AND not (four
eyes and they started the run). Standing grants build on `refusal` too, and so does the
quorum: a vote counts only while its voter may decide (`counted_voters`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group, User
from django.db.models import Q, QuerySet

from agents.models import Approval, AuditEntry, Run, Vote
from agents.policy.config import USER_PREFIX, Policy, Rule, ToolPolicy
from agents.sql import JsonArrayHasAny

DECIDE = "agents.decide_approval"
ADMIN = "agents.view_auditentry"  # the admin role's permission: admins may revoke anyone's grant, resume anyone's run
# Approvals any active reviewer may decide: no approvers named, no four eyes.
OPEN_TO_ALL = Q(approvers=[], four_eyes=False)


def refusal(user: Any, approval: Approval, groups: set[str] | None = None) -> str | None:
    """Return why this user may not decide this approval, or None when they may."""
    return refusal_of_role(user) or restriction(user, approval, groups)


def may_decide(user: Any, approval: Approval) -> bool:
    return refusal(user, approval) is None


def restriction(user: Any, approval: Approval, groups: set[str] | None = None) -> str | None:
    """Return why the approval's own restrictions (approvers, four eyes) exclude this reviewer, or None.

    `groups` are the user's group names when the caller read them already (a page of cards).
    """
    username = user.get_username()
    if approval.approvers and not _is_approver(user, approval.approvers, groups):
        return f"{username} is not among the approvers of this call ({waits_for(approval)})"
    if approval.four_eyes and username == approval.run.created_by:
        return f"{username} started this run, and four eyes are required: someone else must approve it"
    return None


def refusal_for_name(username: str, approval: Approval, *, user: Any = None) -> str | None:
    """Return why the person named (the CLI's --by, a relayed decided_by) may not decide, or None.

    A name that is a user's is that user, as they are now: a deactivated account, or one
    without the reviewer role (an agent's), may not decide however the name arrives. An
    approval that names neither approvers nor four eyes keeps any other name as given (the
    entry point authenticated whoever records it); otherwise the name must be an active
    user that the rule above allows. `user` is the one the entry point authenticated under
    that name, if any: judged as it was loaded for this request, not read again.
    """
    if user is None or user.get_username() != username:
        user = User.objects.filter(username=username).first()
    return _refusal_of_named(username, user, approval)


def _refusal_of_named(
    username: str, user: User | None, approval: Approval, groups: set[str] | None = None, *, signed_in: bool = False
) -> str | None:
    """Return why the person named, found as `user` (None: no user has the name), may not decide, or None.

    `signed_in`: the name is that of an account that signed in to act (a vote cast other than
    through the CLI's --by), so an account deleted since has no say, as a deactivated one has none.
    """
    if user is not None:
        return refusal(user, approval, groups)
    if signed_in:
        return f"{username!r} is no user any more"
    if not approval.approvers and not approval.four_eyes:
        return None
    return f"{username!r} is no active user, and this call names who may decide it"


def counted_voters(
    approval: Approval,
    votes: Iterable[Vote],
    voters: _Voters | None = None,
    decided: dict[str, list[str]] | None = None,
) -> list[str]:
    """Return whose approvals of the current arguments count towards the quorum, in order (`votes` oldest first).

    A vote counts only while its voter may decide: someone deactivated or deleted, or taken out
    of the approvers' group, since they voted no longer has a say. A quorum of one is decided by its
    first vote, which counts as cast. Once decided, the approvals that counted then are the
    ones shown (`decided_voters`): someone who has left since still approved it.
    `voters`, `decided`: what a page of cards read for all of them at once.
    """
    votes = list(votes)
    counted = approval.voters_counted(votes)
    if approval.quorum == 1:
        return counted
    if approval.status != Approval.Status.PENDING:
        recorded = (decided_voters([approval]) if decided is None else decided).get(approval.pk)
        if recorded is not None:
            return recorded
    # Each counted voter's last vote approves the current arguments: where it came from says who cast it.
    signed_in = {vote.voter: vote.source != AuditEntry.Source.CLI for vote in votes}
    voters = voters or _Voters.read(set(counted))
    return [name for name in counted if voters.refusal(name, approval, signed_in=signed_in[name]) is None]


def decided_voters(approvals: Iterable[Approval]) -> dict[str, list[str]]:
    """Return, by approval id, whose approvals counted when each decided quorum was decided, as its audit entry says.

    One read for all of them; an approval still pending, of a quorum of one, or decided
    without a vote counted (expired) is not in it.
    """
    ids = [a.pk for a in approvals if a.quorum > 1 and a.status != Approval.Status.PENDING]
    if not ids:
        return {}
    entries = AuditEntry.objects.filter(approval_id__in=ids, outcome=AuditEntry.Outcome.DECIDED)
    return {
        approval_id: detail["votes"]
        for approval_id, detail in entries.values_list("approval_id", "detail")
        if isinstance(detail, dict) and isinstance(detail.get("votes"), list)
    }


def refusal_of_relayer(relayer: str, username: str, approval: Approval) -> str | None:
    """Return why a relayer (with the permission to decide in others' names) may not relay for this person, or None.

    Four eyes keep whoever started the run from getting its calls decided, for or against:
    naming someone else as the decider does not change who gets the decision recorded.
    """
    if approval.four_eyes and relayer == approval.run.created_by:
        return (
            f"{relayer} started this run, and four eyes are required: they may not relay a decision on it, "
            f"even in {username}'s name"
        )
    return None


def decidable(user: Any, approvals: QuerySet[Approval], groups: set[str] | None = None) -> QuerySet[Approval]:
    """Narrow approvals to those this user may decide (the inbox's "For me"), in SQL.

    The same rule as `restriction`, as a filter the database applies: a page of 100,000
    restricted approvals costs one indexed query, not a read of each one in Python.
    `groups` are the user's group names when the caller read them already.
    """
    if refusal_of_role(user) is not None:
        return approvals.none()
    username = user.get_username()
    # Group names that look like `user:<name>` would read as a person in `_is_approver`: never as a group.
    groups = group_names(user) if groups is None else groups
    names = [USER_PREFIX + username, *sorted(g for g in groups if not g.startswith(USER_PREFIX))]
    approver = Q(approvers=[]) | Q(approvers__isnull=True) | Q(JsonArrayHasAny("approvers", names))
    # A sub-select, not a join: the page's rows need no join to their runs just to be filtered.
    own_run = Q(four_eyes=True, run_id__in=Run.objects.filter(created_by=username).values("id"))
    return approvals.filter(approver & ~own_run)


def mark(user: Any, approvals: Iterable[Approval], groups: set[str] | None = None) -> None:
    """Note on each approval whether this user may decide it (`decidable`), and whose approvals count, for the cards."""
    approvals = list(approvals)
    if groups is None:
        groups = group_names(user) if user.is_authenticated else set()
    for approval in approvals:
        approval.decidable = refusal(user, approval, groups) is None  # type: ignore[attr-defined]
    read_votes(approvals)


def read_votes(approvals: list[Approval]) -> None:
    """Give each card its votes and whose approvals count (its tally), reading those of all of them at once.

    The same for every reviewer: a card pushed to many is read once for all of them.
    """
    votes: dict[str, list[Vote]] = {approval.pk: [] for approval in approvals}
    for vote in Vote.objects.filter(approval_id__in=list(votes)).order_by("created_at", "id"):
        votes[vote.approval_id].append(vote)
    voters = _Voters.read({vote.voter for approval in approvals if approval.quorum > 1 for vote in votes[approval.pk]})
    decided = decided_voters(approvals)
    for approval in approvals:
        approval.page_votes = votes[approval.pk]
        approval.page_counted_voters = counted_voters(approval, votes[approval.pk], voters, decided)


@dataclass(frozen=True)
class _Voters:
    """Users read by name with their group names and permissions, to judge as `refusal_for_name` does, from memory."""

    users: dict[str, User]
    groups: dict[str, set[str]]

    def refusal(self, username: str, approval: Approval, *, signed_in: bool = False) -> str | None:
        """Return why the person named may not decide the approval, or None (`refusal_for_name`, from memory)."""
        user, groups = self.users.get(username), self.groups.get(username, set())
        return _refusal_of_named(username, user, approval, groups, signed_in=signed_in)

    @classmethod
    def read(cls, names: set[str]) -> _Voters:
        """Read these users in three queries, however many there are (none for no names: an empty IN is not sent)."""
        users = {user.pk: user for user in User.objects.filter(username__in=names)}
        groups: dict[int, set[str]] = {pk: set() for pk in users}
        permissions: dict[int, set[str]] = {pk: set() for pk in users}
        memberships = User.groups.through.objects.filter(user_id__in=users).values_list(
            "user_id", "group__name", "group__permissions__content_type__app_label", "group__permissions__codename"
        )
        own = User.user_permissions.through.objects.filter(user_id__in=users).values_list(
            "user_id", "permission__content_type__app_label", "permission__codename"
        )
        for user_id, group, app_label, codename in memberships:
            groups[user_id].add(group)
            if codename is not None:  # a group without permissions
                permissions[user_id].add(f"{app_label}.{codename}")
        for user_id, app_label, codename in own:
            permissions[user_id].add(f"{app_label}.{codename}")
        for pk, user in users.items():
            if user.is_active and not user.is_superuser:
                # Where ModelBackend keeps them (as agents.sql.token_user does): has_perm answers from memory.
                user._perm_cache = permissions[pk]  # type: ignore[attr-defined]
        return cls(
            users={user.username: user for user in users.values()},
            groups={users[pk].username: member_of for pk, member_of in groups.items()},
        )


def refusal_of_role(user: Any) -> str | None:
    if not (user.is_authenticated and user.is_active and user.has_perm(DECIDE)):
        return f"{user.get_username() or 'an anonymous user'} is not an active reviewer"
    return None


def _is_approver(user: Any, approvers: list[str], groups: set[str] | None) -> bool:
    names = {entry.removeprefix(USER_PREFIX) for entry in approvers if entry.startswith(USER_PREFIX)}
    if user.get_username() in names:
        return True
    wanted = {entry for entry in approvers if not entry.startswith(USER_PREFIX)}
    return bool(wanted & (group_names(user) if groups is None else groups))


def group_names(user: Any) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


def waits_for(approval: Approval) -> str:
    return approval.waits_for


def unknown_approvers(policy: Policy) -> Iterator[str]:
    """Say each approvers or escalate_to entry of the file naming no group, or no active user, in the database.

    Nobody it names can decide: a call only they may approve waits for ever, or runs at its
    deadline under on_timeout: approve. Said when a process starts; a group made later is not seen.
    """
    named = list(_approver_entries(policy))
    people = {name.removeprefix(USER_PREFIX) for _, name in named if name.startswith(USER_PREFIX)}
    users = set(User.objects.filter(username__in=people, is_active=True).values_list("username", flat=True))
    groups = set(Group.objects.filter(name__in=[name for _, name in named]).values_list("name", flat=True))
    for where, name in named:
        person = name.removeprefix(USER_PREFIX) if name.startswith(USER_PREFIX) else None
        if person is None and name not in groups:
            yield f"{policy.path}: {where}: no group is named {name!r}, so nobody it names can decide"
        elif person is not None and person not in users:
            yield f"{policy.path}: {where}: {person!r} is no active user, so {name!r} names nobody who can decide"


def _approver_entries(policy: Policy) -> Iterator[tuple[str, str]]:
    """Yield (where in the file, name) for every approvers and escalate_to entry, of tools and their rules."""
    scopes: list[tuple[str, dict[str, ToolPolicy]]] = [("tool_overrides", policy.tool_overrides)]
    scopes += [(f"agents.{name}.tool_overrides", agent.tool_overrides) for name, agent in policy.agents.items()]
    for scope, tools in scopes:
        for tool_name, tool in tools.items():
            keyed: list[tuple[str, ToolPolicy | Rule]] = [(f"{scope}.{tool_name}", tool)]
            keyed += [(f"{scope}.{tool_name}.rules.{rule.name}", rule) for rule in tool.rules]
            for where, entry in keyed:
                for key in ("approvers", "escalate_to"):
                    for name in getattr(entry, key, None) or ():
                        yield f"{where}.{key}", name
