"""Standing grants: a reviewer's decision remembered for a while, deciding the calls it matches.

A grant never widens authority. It is created only where its creator could have decided
the call alone (an active reviewer among the call's approvers, not excluded by four eyes,
quorum 1 for an approval, the tool's `grants` not false), and the same is checked again
each time it would apply, against the policy as it is then; the transaction that records
a call it decided checks once more that it is live (grant_use). A deny rule always wins
(the policy evaluates deny rules first); a remembered rejection wins over a remembered approval.

A grant decides only the calls of the principal it was given for: an internal agent (named
by agentfast.yaml), or an external agent of one account (whose agent name is the caller's
own say, so another account naming the same agent is not covered).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from agents import sql, text
from agents.models import Approval, AuditEntry, Grant, Run, arguments_digest
from agents.policy import config
from agents.policy.config import AgentSpec, ConfigError, ToolPolicy, agent_for, get_policy
from agents.policy.rules import CallFacts, GrantLookup, GrantMatch, Verdict, asked
from agents.services import eligibility
from agents.services.audit import audit_append
from agents.services.errors import InvalidInput, NotFound, NotPermitted

MIN_SECONDS = 60
MAX_SECONDS = 7 * 24 * 3600  # a week: a standing decision is reviewed again at least that often


@dataclass(frozen=True)
class Remember:
    """What a decision asks to remember: for which calls, and for how long."""

    scope: str  # Grant.Scope
    seconds: int

    @classmethod
    def of(cls, scope: Any, for_seconds: Any) -> Remember:
        """Return a validated request to remember, or raise InvalidInput naming the field."""
        if scope not in Grant.Scope.values:
            raise InvalidInput("remember.scope must be 'exact' or 'tool'", field="remember.scope")
        if isinstance(for_seconds, bool) or not isinstance(for_seconds, int):
            raise InvalidInput("remember.for_seconds must be a whole number of seconds", field="remember.for_seconds")
        if not MIN_SECONDS <= for_seconds <= MAX_SECONDS:
            raise InvalidInput(
                f"remember.for_seconds must be from {MIN_SECONDS} to {MAX_SECONDS} (7 days)",
                field="remember.for_seconds",
            )
        return cls(scope=scope, seconds=for_seconds)


def parse_duration(value: str) -> int:
    """Return the seconds of a duration like 30m, 1h, 8h, 24h or 7d; raise InvalidInput otherwise."""
    try:
        return int(config.parse_duration(value))
    except (ValueError, TypeError):
        raise InvalidInput(f"{value!r} is not a duration: write 30m, 1h, 8h, 24h or 7d", field="remember") from None


# -- creating -----------------------------------------------------------------------------


def refusal(*, approval: Approval, decision: str, decider: str) -> str | None:
    """Return why this person may not remember this decision, or None when they could have decided alone."""
    user = User.objects.filter(username=decider, is_active=True).first()
    if user is None:
        return f"{decider!r} is no active user: only a reviewer's own decision can be remembered"
    reason = eligibility.refusal(user, approval)
    if reason is not None:
        return reason
    if approval.request is not None:
        return f"{approval.tool} asked a question: each answer is a person's, it cannot be remembered"
    tool = _tool_policy_of(approval)
    if tool is None or not tool.grants:
        return f"decisions on {approval.tool} cannot be remembered (grants: false)"
    if decision == Approval.Status.APPROVED and approval.quorum > 1:
        return f"{approval.tool} needs {approval.quorum} approvers here: one person's approval cannot be remembered"
    # A grant applies only where the policy itself asks its author (_still_authorized): someone who
    # decides this call through its escalation, or under approvers the file has narrowed since,
    # would make a grant that never decides anything, listed as if it did.
    facts, _ = call_of(approval, approval.current_arguments or {})
    approvers, _ = asked(facts, tool)
    if approvers and eligibility.restriction(user, Approval(approvers=list(approvers))) is not None:
        return f"the policy asks {', '.join(approvers)} for such calls, and a remembered decision is theirs alone"
    return None


def call_of(approval: Approval, arguments: dict[str, Any]) -> tuple[CallFacts, AgentSpec | None]:
    """Return the facts the policy judges the approval's call by, now, with these arguments, and its agent entry.

    The entry is None for an external run's call, and for an agent gone from the file: its
    floor, the file's own policy, still holds.
    """
    run = approval.run
    try:
        agent = agent_of(run)
    except ConfigError:
        agent = None
    facts = CallFacts(
        tool=approval.tool,
        args=arguments,
        agent=agent.name if agent is not None else run.agent,
        run={"id": run.id, "agent": run.agent, "created_by": run.created_by, "input": run.input},
        now=timezone.now(),
        account=run.account,
    )
    return facts, agent


def _tool_policy_of(approval: Approval) -> ToolPolicy | None:
    """Return the tool's policy for the approval's run as it is now (None when its agent is gone)."""
    try:
        agent = agent_of(approval.run)
    except ConfigError:
        return None
    return get_policy().tool_policy(approval.tool, agent=agent)


def agent_of(run: Run) -> AgentSpec | None:
    """Return the agent entry a run's calls are evaluated with; ConfigError when it is gone from the file.

    An external run's calls are evaluated without an agent entry, as the gate does.
    """
    return None if run.kind == Run.Kind.EXTERNAL else agent_for(run.agent, run.agent_config)


def grant_create(*, approval: Approval, decision: str, creator: str, remember: Remember, source: str) -> Grant:
    """Remember a decision just taken on this approval (inside the caller's transaction), audited."""
    now = timezone.now()
    run = approval.run
    grant = Grant.objects.create(
        id=f"g{secrets.token_hex(6)}",
        created_by=creator,
        decision=decision,
        scope=remember.scope,
        tool=approval.tool,
        agent=run.agent,
        kind=run.kind,
        account=run.account,
        arguments_digest=approval.digest if remember.scope == Grant.Scope.EXACT else "",
        approval_id=approval.pk,
        created_at=now,
        expires_at=now + timedelta(seconds=remember.seconds),
    )
    audit_append(
        approval_id=approval.pk,
        run_id=approval.run_id,
        tool=approval.tool,
        action="remembered",
        actor=creator,
        source=source,
        outcome=AuditEntry.Outcome.DECIDED,
        detail=_described(grant),
    )
    return grant


# -- revoking -----------------------------------------------------------------------------


def grant_revoke(*, grant_id: str, actor: str, source: str) -> Grant:
    """Revoke a grant (its creator, or an admin); revoking a revoked grant changes nothing."""
    grant = _find(grant_id)
    if grant is None:
        raise NotFound(f"no grant {text.repair(grant_id)[:20]}")
    if grant.created_by != actor and not _is_admin(actor):
        reason = f"{actor} may revoke only their own grants (this one is {grant.created_by}'s)"
        _audit_grant(grant, actor, source, "revoke", AuditEntry.Outcome.NOT_PERMITTED, {"error": reason})
        raise NotPermitted(reason)
    with transaction.atomic():
        won = Grant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor
        )
        outcome = AuditEntry.Outcome.DECIDED if won else AuditEntry.Outcome.IDEMPOTENT
        grant.refresh_from_db()
        _audit_grant(grant, actor, source, "revoked", outcome, _described(grant))
    return grant


def grants_revoke_of(*, username: str, reason: str) -> int:
    """Revoke the live grants a user name created, or that decide its calls, by the system, each audited; return how many.

    For a name that is no longer its person's (renamed, deleted): a grant is looked up by its
    creator's name, and an external agent's by its account's, each time it would apply, so the
    next holder of the name would inherit it.
    """
    named = Q(created_by=username) | Q(account=username)
    live = list(Grant.objects.filter(named, revoked_at__isnull=True))
    with transaction.atomic():
        for grant in live:
            if Grant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
                revoked_at=timezone.now(), revoked_by="system"
            ):
                grant.refresh_from_db()
                _audit_grant(
                    grant,
                    "system",
                    AuditEntry.Source.SYSTEM,
                    "revoked",
                    AuditEntry.Outcome.DECIDED,
                    {**_described(grant), "reason": reason},
                )
    return len(live)


def _is_admin(username: str) -> bool:
    user = User.objects.filter(username=username, is_active=True).first()
    return user is not None and user.has_perm(eligibility.ADMIN)


def _find(grant_id: str) -> Grant | None:
    if text.problem(grant_id) is not None or len(grant_id) > 20:
        return None
    return Grant.objects.filter(pk=grant_id).first()


def _audit_grant(grant: Grant, actor: str, source: str, action: str, outcome: str, detail: dict[str, Any]) -> None:
    audit_append(
        approval_id=grant.approval_id,
        tool=grant.tool,
        action=action,
        actor=actor,
        source=source,
        outcome=outcome,
        detail=detail,
    )


# -- applying -----------------------------------------------------------------------------


def grant_match(facts: CallFacts, tool: ToolPolicy) -> GrantMatch | None:
    """Return the live grant that decides this call, rejections first, or None (the policy's grant lookup)."""
    now = facts.now or timezone.now()
    # Only the principal the grant was given for: an external agent's name is its caller's say.
    kind = Run.Kind.EXTERNAL if facts.account else Run.Kind.INTERNAL
    # "rejected" sorts after "approved": a remembered rejection is looked at first.
    candidates = sql.grants_for(
        tool=facts.tool,
        agent=facts.agent,
        kind=kind,
        account=facts.account,
        digest=arguments_digest(facts.args),
        now=now,
    )
    for grant in candidates:
        if _still_authorized(grant, facts, tool):
            approved = grant.decision == Approval.Status.APPROVED
            return GrantMatch(id=grant.id, action="allow" if approved else "deny", reason=_reason(grant))
    return None


def live(now: datetime | None = None) -> QuerySet[Grant]:
    """Return the grants neither expired nor revoked."""
    return Grant.objects.filter(expires_at__gt=now or timezone.now(), revoked_at__isnull=True)


def _reason(grant: Grant) -> str:
    of = grant.principal
    what = "these exact arguments" if grant.scope == Grant.Scope.EXACT else f"any {grant.tool} call of {of}"
    if grant.decision == Approval.Status.REJECTED:
        return f"a remembered rejection by {grant.created_by} (grant {grant.id}, {what})"
    return f"a remembered approval by {grant.created_by} (grant {grant.id}, {what})"


def _still_authorized(grant: Grant, facts: CallFacts, tool: ToolPolicy) -> bool:
    """Check, against the policy as it is now, that the creator could still decide this call alone."""
    user = _active_reviewer(grant.created_by)
    if user is None:
        return False
    approvers, quorum = asked(facts, tool)
    if grant.decision == Approval.Status.APPROVED and quorum > 1:
        return False
    probe = Approval(approvers=list(approvers), four_eyes=False)  # four eyes is checked below, without a run row
    if approvers and eligibility.restriction(user, probe) is not None:
        return False
    return not (tool.four_eyes and facts.variables()["run"]["created_by"] == grant.created_by)


def _active_reviewer(username: str) -> User | None:
    """Return the active user of this name while they hold the reviewer role, else None."""
    user = User.objects.filter(username=username, is_active=True).first()
    return user if user is not None and eligibility.refusal_of_role(user) is None else None


class GrantLapsed(Exception):
    """The grant that matched a call was revoked or expired, or its creator lost their say, before it was recorded."""

    def __init__(self, grant_id: str) -> None:
        super().__init__(grant_id)
        self.grant_id = grant_id


def grant_match_except(lapsed: Collection[str]) -> GrantLookup:
    """Return grant_match, blind to the grants that lapsed at a write of this caller's.

    A caller plans a call again after GrantLapsed. A grant that matches and then lapses every
    time (its match and its use judging it differently) would make that a loop for ever: once
    lapsed, it is not tried again, and the plan ends, at worst with a person asked.
    """

    def lookup(facts: CallFacts, tool: ToolPolicy) -> GrantMatch | None:
        match = grant_match(facts, tool)
        return None if match is not None and match.id in lapsed else match

    return lookup


def grant_use(*, approval: Approval, verdict: Verdict) -> None:
    """Count one use of a grant still live and audit the call it decided (inside the caller's transaction).

    The grant was matched before the caller's transaction began: a revoke, an expiry, or its
    creator no longer able to decide the call alone (deactivated, out of its approvers) in
    between raises GrantLapsed, which rolls that transaction back, and the caller plans the
    call again (grant_match no longer finds this grant).
    """
    now = timezone.now()
    creator = sql.grant_use(grant_id=verdict.grant_id, now=now)
    if creator is None or eligibility.refusal_for_name(creator, approval) is not None:
        raise GrantLapsed(verdict.grant_id)
    audit_append(
        approval_id=approval.pk,
        run_id=approval.run_id,
        tool=approval.tool,
        action=approval.status,
        actor=verdict.decided_by,
        source=AuditEntry.Source.SYSTEM,
        outcome=AuditEntry.Outcome.DECIDED,
        detail={"grant": verdict.grant_id, "reason": verdict.reason, "policy_version": verdict.policy_version},
    )


def _described(grant: Grant) -> dict[str, Any]:
    return {
        "grant": grant.id,
        "decision": grant.decision,
        "scope": grant.scope,
        "tool": grant.tool,
        "agent": grant.agent,
        "kind": grant.kind,
        "account": grant.account,
        "arguments_digest": grant.arguments_digest,
        "expires_at": grant.expires_at.isoformat(),
        "revoked_by": grant.revoked_by,
    }
