"""Deadlines with a defined end, reminders, and scheduled calls (DESIGN.md "Time and reach").

A pending approval's deadline (`expires_at`) ends it the way its policy said (`on_timeout`):
reject (the model reads APPROVAL_EXPIRED), approve (the call runs, decided by "deadline"),
or escalate (the `escalate_to` approvers are added and told, and the deadline restarts
once, with the policy's timeout: an extension the first approvers got does not carry over;
the second expiry rejects). A scheduled call is a suspend approval whose deadline
runs it (`on_timeout` "run", decided by "schedule").

Each deadline fires from a Celery task scheduled with `eta` when it is set (on commit), so
it fires on time (a deadline further off than the broker holds a message travels in hops:
`queue.longest_eta_seconds`); the sweeper's pass over the database fires any whose message was lost
(every process restarted). Firing is a compare-and-set: the two never both act.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents import notify, queue
from agents.models import DEADLINE, RUN_NOW, SCHEDULE, Approval, AuditEntry
from agents.policy.config import MAX_TIMEOUT_SECONDS, ConfigError
from agents.policy.rules import Verdict
from agents.services.approvals import (
    Attempt,
    PolicyRefusal,
    _lock_run,
    approval_approve_as,
    approval_expire,
    overdue,
    verdict_now,
)
from agents.services.audit import audit_append
from agents.services.eligibility import refusal_for_name
from agents.services.errors import InvalidInput, NotFound, NotPermitted, WrongState
from agents.sql import SecondsApart

logger = logging.getLogger(__name__)


def deadline_schedule(*, approval_id: str, when: datetime) -> None:
    """Fire the approval's deadline at `when`, from a Celery task enqueued once the transaction commits."""
    transaction.on_commit(lambda: _enqueue(approval_id, when))


def _enqueue(approval_id: str, when: datetime) -> None:
    """Send the deadline's message for `when`, or for its next hop when `when` is too far off for the broker."""
    from agents.tasks import approval_deadline

    hop = timezone.now() + timedelta(seconds=queue.longest_eta_seconds())
    try:
        approval_deadline.apply_async(args=[approval_id], kwargs={"when": when.isoformat()}, eta=min(when, hop))
    except Exception as exc:  # noqa: BLE001 — a broker that is down: the sweeper fires it instead
        logger.warning("could not schedule the deadline of %s (the sweeper will fire it): %s", approval_id, exc)


def deadline_hop(*, approval_id: str, when: str) -> bool:
    """Send the next hop of a deadline's message that woke before `when`; return whether one was sent.

    Only while the approval still waits for that very deadline: an extension sent its own
    message, and a decision or an earlier firing needs none.
    """
    deadline = datetime.fromisoformat(when)
    pending = Approval.objects.filter(pk=approval_id, status=Approval.Status.PENDING, expires_at=deadline)
    if timezone.now() >= deadline or not pending.exists():
        return False
    _enqueue(approval_id, deadline)
    return True


EDITED_SHORT_OF_QUORUM = (
    "no quorum before the deadline for the edited arguments (on_timeout approve runs only the model's, unedited)"
)


def approval_deadline_fire(*, approval_id: str) -> str:
    """Give a pending approval past its deadline its outcome; return it ("" when nothing was due).

    1. Under the run's row lock (the order decisions and cancels take), re-read the approval:
       a decision, an extension or an earlier firing since the task was scheduled wins.
    2. Escalate once (when asked and not done yet), approve, run (scheduled), or expire. An
       `approve` expires instead when a vote edited the arguments short of its quorum.
    3. The clock approves (or runs) only what the policy as it stands now lets through: a deny
       rule or a remembered rejection added since the call was asked expires it instead, as
       does an approve the policy no longer gives (its on_timeout now rejects or escalates),
       and while the policy file cannot be read nothing is approved (the sweeper tries again).
    """
    with transaction.atomic():
        run_id = Approval.objects.filter(pk=approval_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return ""
        _lock_run(run_id)
        approval = Approval.objects.select_for_update().get(pk=approval_id)
        if not overdue(approval):
            return ""
        now = timezone.now()
        outcome = approval.on_timeout
        if outcome == Approval.OnTimeout.ESCALATE and approval.escalated_at is None and approval.escalate_to:
            try:
                verdict = verdict_now(approval, approval.current_arguments or {})
            except ConfigError as exc:
                logger.warning("deadline of %s not applied: the policy cannot be read (%s)", approval_id, exc)
                return ""
            # Escalation hands the call to more people: only to those the policy as it stands still names.
            if (
                verdict.action == "ask"
                and verdict.on_timeout == Approval.OnTimeout.ESCALATE
                and set(approval.escalate_to) <= set(verdict.escalate_to)
            ):
                _escalate(approval, now)
                return "escalated"
            approval_expire(
                approval=approval,
                actor="system",
                reason="the policy no longer escalates it: no decision before the deadline",
            )
            return "expired"
        if outcome == Approval.OnTimeout.APPROVE and approval.arguments is not None:
            # A pending edit is a vote's that fell short of its quorum: only its voter approved those
            # arguments. Approving them would let one person's edit past the quorum, the model's would
            # overrule that person's change: neither runs.
            approval_expire(approval=approval, actor="system", reason=EDITED_SHORT_OF_QUORUM)
            return "expired"
        if outcome in (Approval.OnTimeout.APPROVE, Approval.OnTimeout.RUN):
            try:
                verdict = verdict_now(approval, approval.current_arguments or {})
            except ConfigError as exc:
                logger.warning("deadline of %s not applied: the policy cannot be read (%s)", approval_id, exc)
                return ""
            if verdict.action == "deny":
                approval_expire(
                    approval=approval, actor="system", reason=f"the policy now refuses it: {verdict.reason}"
                )
                return "expired"
            if not _clock_approves(outcome, verdict):
                approval_expire(approval=approval, actor="system", reason=_no_longer_approved(verdict))
                return "expired"
        if outcome == Approval.OnTimeout.APPROVE:
            approval_approve_as(approval=approval, actor=DEADLINE, note="approved by its deadline: nobody decided")
            return "approved"
        if outcome == Approval.OnTimeout.RUN:
            approval_approve_as(approval=approval, actor=SCHEDULE, note="its scheduled time came")
            return "run"
        reason = "no decision before the deadline" + (
            " (escalated, still no decision)" if approval.escalated_at else ""
        )
        approval_expire(approval=approval, actor="system", reason=reason)
        return "expired"


def _clock_approves(outcome: str, verdict: Verdict) -> bool:
    """Return whether the policy as it stands lets the clock approve: no person asked, or (at a deadline)
    on_timeout approve. A scheduled call's time is the policy's leave to run it unasked: a policy that
    now asks a person for it has taken that back.
    """
    return verdict.action != "ask" or (
        outcome == Approval.OnTimeout.APPROVE and verdict.on_timeout == Approval.OnTimeout.APPROVE
    )


def _no_longer_approved(verdict: Verdict) -> str:
    source = f"rule {verdict.rule!r}" if verdict.rule else "the tool's own settings"
    return f"the policy no longer approves it when nobody decides ({source}: on_timeout {verdict.on_timeout})"


def _escalate(approval: Approval, now: datetime) -> None:
    """Add the escalation's approvers, restart the deadline once, audit and notify."""
    # An approval open to any reviewer stays open: narrowing it to escalate_to would lock out the first approvers.
    approvers = approval.approvers + [name for name in approval.escalate_to if name not in approval.approvers]
    approvers = approvers if approval.approvers else []
    if approval.timeout_seconds:
        expires_at = now + timedelta(seconds=approval.timeout_seconds)
    else:  # asked before approvals kept their timeout: the time it was given, extensions included
        expires_at = now + ((approval.expires_at or now) - approval.created_at)
    Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
        approvers=approvers, escalated_at=now, expires_at=expires_at
    )
    audit_append(
        approval_id=approval.pk,
        run_id=approval.run_id,
        tool=approval.tool,
        action="escalated",
        actor="system",
        source=AuditEntry.Source.SYSTEM,
        outcome=AuditEntry.Outcome.DECIDED,
        detail={"escalate_to": approval.escalate_to, "approvers": approvers, "expires_at": expires_at.isoformat()},
    )
    notify.announce("approval.escalated", approval.pk)
    deadline_schedule(approval_id=approval.pk, when=expires_at)


def approval_deadlines_due() -> int:
    """Fire every deadline that has passed (the sweeper's fallback for lost eta tasks); return how many fired."""
    due = Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=timezone.now())
    return sum(bool(approval_deadline_fire(approval_id=pk)) for pk in due.values_list("pk", flat=True))


MIN_EXTEND_SECONDS = 1  # the API's ExtendIn.by_seconds floor


def approval_extend(*, approval_id: str, by_seconds: float, attempt: Attempt) -> Approval:
    """Push a pending approval's deadline later by `by_seconds`; only someone who may decide it may, audited."""
    if (
        isinstance(by_seconds, bool)
        or not isinstance(by_seconds, (int, float))
        or not MIN_EXTEND_SECONDS <= by_seconds <= MAX_TIMEOUT_SECONDS
    ):
        # As the API's ExtendIn: less than a second moved nothing, yet was said and audited as an extension.
        raise InvalidInput(
            f"by_seconds must be a number of seconds from {MIN_EXTEND_SECONDS} to {MAX_TIMEOUT_SECONDS}",
            field="by_seconds",
        )
    approval = Approval.objects.select_related("run").filter(pk=approval_id).first()
    if approval is None:
        raise NotFound(f"no approval {approval_id[:200]}")
    reason = refusal_for_name(attempt.decider, approval)
    if reason is not None:
        detail = {"error": reason, "by_seconds": by_seconds}
        _audit_attempt(approval, attempt, "extended", AuditEntry.Outcome.NOT_PERMITTED, detail)
        raise NotPermitted(reason, field="by")
    if overdue(approval):
        # Past its deadline already (its task is late): the policy's outcome stands, not an extension.
        approval_deadline_fire(approval_id=approval_id)
    with transaction.atomic():
        _lock_run(approval.run_id)
        locked = Approval.objects.select_for_update().get(pk=approval_id)
        if overdue(locked):
            raise WrongState(f"approval {approval_id} passed its deadline at {locked.expires_at:%Y-%m-%d %H:%M:%S} UTC")
        if locked.status != Approval.Status.PENDING or locked.expires_at is None:
            state = "has no deadline" if locked.status == Approval.Status.PENDING else f"is {locked.status}"
            raise WrongState(f"approval {approval_id} {state}: there is no deadline to extend")
        before, now = locked.expires_at, timezone.now()
        if (max(before, now) - now).total_seconds() + by_seconds > MAX_TIMEOUT_SECONDS:
            # Piled-up extensions (or a scheduled call's far time) would pass the last date a deadline can hold.
            raise InvalidInput(
                f"by_seconds would put the deadline more than {MAX_TIMEOUT_SECONDS} seconds from now",
                field="by_seconds",
            )
        locked.expires_at = max(before, now) + timedelta(seconds=by_seconds)
        Approval.objects.filter(pk=approval_id).update(expires_at=locked.expires_at)
        detail = {"by_seconds": by_seconds, "from": before.isoformat(), "to": locked.expires_at.isoformat()}
        _audit_attempt(locked, attempt, "extended", AuditEntry.Outcome.DECIDED, detail)
        deadline_schedule(approval_id=approval_id, when=locked.expires_at)
    return locked


def _audit_attempt(
    approval: Approval, attempt: Attempt, action: str, outcome: str, detail: Mapping[str, object]
) -> None:
    audit_append(
        approval_id=approval.pk,
        run_id=approval.run_id,
        tool=approval.tool,
        action=action,
        actor=attempt.actor,
        on_behalf_of=attempt.on_behalf_of,
        source=attempt.source,
        origin=attempt.origin,
        outcome=outcome,
        detail=detail,
    )


def approval_remind_due() -> int:
    """Send `approval.reminder` for each pending approval whose reminder interval has passed; return how many."""
    now = timezone.now()
    sent = 0
    waiting = Approval.objects.filter(status=Approval.Status.PENDING, remind_every_seconds__isnull=False)
    # A scheduled call (the tool's remind_every came with its rule) waits for its time, not for anyone.
    waiting = waiting.exclude(on_timeout=Approval.OnTimeout.RUN)
    # Chosen by the database: a tool that reminds can have thousands of calls waiting, and each
    # sweep read them all to remind the few whose interval had passed.
    last = Coalesce("last_reminded_at", "created_at")
    due = waiting.filter(SecondsApart(last, Value(now, output_field=DateTimeField()), "remind_every_seconds"))
    for approval in due.only("pk", "last_reminded_at"):
        # A compare-and-set on the last reminder: two sweepers never remind twice for one interval.
        with transaction.atomic():
            claimed = Approval.objects.filter(
                pk=approval.pk, status=Approval.Status.PENDING, last_reminded_at=approval.last_reminded_at
            ).update(last_reminded_at=now)
            if claimed:
                notify.announce("approval.reminder", approval.pk)
                sent += 1
    return sent


def toolcall_run_now(*, approval_id: str, attempt: Attempt) -> Approval:
    """Run a scheduled call now instead of at its time: someone who may decide it says so, audited.

    It approves the call, so a refused attempt is audited as a refused decision is: not
    permitted (who asks, or a deny rule of the policy as it stands now that matches the call),
    or decided already (run, cancelled).
    """
    approval = Approval.objects.select_related("run").filter(pk=approval_id, on_timeout=Approval.OnTimeout.RUN).first()
    if approval is None:
        raise NotFound(f"no scheduled call {approval_id[:200]}")
    reason = refusal_for_name(attempt.decider, approval)
    if reason is not None:
        detail = {"error": reason, "note": RUN_NOW}
        _audit_attempt(approval, attempt, Approval.Status.APPROVED, AuditEntry.Outcome.NOT_PERMITTED, detail)
        raise NotPermitted(reason, field="by")
    try:
        with transaction.atomic():
            _lock_run(approval.run_id)
            ran = approval_approve_as(approval=approval, actor=attempt.decider, note=RUN_NOW, attempt=attempt)
    except PolicyRefusal as refused:
        # Audited once the transaction is rolled back, as approval_decide audits its refusals.
        detail = {**refused.detail, "note": RUN_NOW}
        _audit_attempt(approval, attempt, Approval.Status.APPROVED, AuditEntry.Outcome.NOT_PERMITTED, detail)
        raise refused.error from None
    if not ran:
        approval.refresh_from_db()
        expired = approval.status == Approval.Status.EXPIRED
        outcome = AuditEntry.Outcome.EXPIRED if expired else AuditEntry.Outcome.ALREADY_DECIDED
        detail = {"note": RUN_NOW, "existing": approval.status}
        _audit_attempt(approval, attempt, Approval.Status.APPROVED, outcome, detail)
        raise WrongState(f"{approval_id} is no longer scheduled")
    return Approval.objects.get(pk=approval_id)
