"""Decisions on approvals; the same function serves the web, the API and the CLI."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Exists, Field, Model
from django.utils import timezone

from agents import events, notify, queue, sql, text
from agents.models import Approval, AuditEntry, Grant, Run, RunEvent, ToolCall, Vote, arguments_digest
from agents.services import eligibility, grants
from agents.services.audit import audit_append
from agents.services.errors import AlreadyDecided, DigestMismatch, InvalidInput, NotFound, NotPermitted, WrongState
from agents.tools import InvalidArguments, ToolError, registry

DECISIONS = (Approval.Status.APPROVED, Approval.Status.REJECTED)
MAX_TEXT_CHARS = 10_000
APPROVAL_ID_CHARS = cast(int, Approval._meta.get_field("id").max_length)
SHORT_DIGEST_CHARS = 12  # what pages and `approvals show` print of a digest


@dataclass(frozen=True)
class Decision:
    approval: Approval
    outcome: str  # AuditEntry.Outcome: decided, voted (the quorum is not reached yet) or idempotent
    resume_enqueued: bool = False
    grant: Grant | None = None  # the standing grant this decision created (`remember`)
    votes: list[Vote] | None = None  # the approval's votes when known without a read (None: read them)


@dataclass(frozen=True)
class Attempt:
    """Who asks for a decision, and from where; identity comes from authentication."""

    actor: str
    source: str  # AuditEntry.Source
    origin: str = ""
    on_behalf_of: str = ""

    @property
    def decider(self) -> str:
        return self.on_behalf_of or self.actor


@dataclass(frozen=True)
class _Ask:
    """What one decision request carries, once validated."""

    decision: str
    attempt: Attempt
    note: str
    feedback: str
    arguments: dict[str, Any] | None
    payload: dict[str, Any] | None
    auto_resume: bool | None


def approval_decide(
    *,
    approval_id: str,
    decision: str,
    attempt: Attempt,
    note: str = "",
    feedback: str = "",
    arguments: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    auto_resume: bool | None = None,
    expect_digest: str = "",
    remember: grants.Remember | None = None,
) -> Decision:
    """Vote on a pending approval; a rejection, or the quorum's last approval, decides it (invariant 3).

    1. Validate the request and who asks (refusals are audited and change nothing else).
    2. Under the run's and the approval's row locks: refuse if the arguments are no longer
       those the reviewer saw (`expect_digest`); record the vote, bound to the digest of
       the arguments it approves (an edit makes them the current ones); a rejection, or
       `quorum` distinct approvals of the current digest, compare-and-sets pending →
       decision with the tool call, audit row and event, in one transaction.
    3. On commit, enqueue the resume (the step's last suspend approval, auto_resume on) or
       the execution of a deferred call.
    Repeating the same vote is idempotent; a different decision after the end raises AlreadyDecided.
    With `remember`, the decision also becomes a standing grant, in the same transaction; it
    is refused up front (NotPermitted, audited) unless the reviewer could have decided alone.
    """
    approval = _get_or_audit(approval_id, decision, attempt)
    arguments = _validated_or_audit(approval, decision, attempt, note, feedback, arguments, payload)
    _permitted_or_audit(approval, decision, attempt)
    if remember is not None:
        _may_remember_or_audit(approval, decision, attempt, remember)
    ask = _Ask(decision, attempt, note, feedback, arguments, payload, auto_resume)
    result, mismatch = None, ""
    with _one_writer(), transaction.atomic():
        locked = _lock_for_decision(approval)
        if locked.status == Approval.Status.PENDING:
            if expect_digest and not _same_digest(expect_digest, locked.digest):
                mismatch = locked.digest
            else:
                result = _vote(locked, ask)
                if remember is not None and result.outcome == AuditEntry.Outcome.DECIDED:
                    grant = grants.grant_create(
                        approval=result.approval,
                        decision=decision,
                        creator=attempt.decider,
                        remember=remember,
                        source=attempt.source,
                    )
                    result = replace(result, grant=grant)
    if mismatch:
        _refuse_mismatch(approval, ask, expect_digest, mismatch)
    if result is not None:
        return result
    return _refuse_or_repeat(approval.pk, decision, attempt, note, arguments)


def _lock_for_decision(approval: Approval) -> Approval:
    """Lock the run's row, then the approval's (with its call and run), in one statement; return it as locked.

    The run's row first, as run_cancel does, so a decision and a cancel never interleave: a
    cancel that came first has expired this approval, and the compare-and-set fails. Then
    the approval's: concurrent votes count one at a time, so one of them decides. On
    PostgreSQL the run's lock is the sub-select's, a one-time filter evaluated before the
    approval is read; the rows are then locked as their latest committed versions.
    """
    rows = Approval.objects.select_for_update().select_related("tool_call", "run").filter(pk=approval.pk)
    if connection.features.has_select_for_update:  # SQLite: BEGIN IMMEDIATE holds the one write lock
        rows = rows.filter(Exists(Run.objects.select_for_update().filter(pk=approval.run_id)))
    return rows.get()


def _same_digest(expected: str, current: str) -> bool:
    """Accept the whole digest or the short one pages print (12 hex digits or more)."""
    expected = expected.strip().lower()
    return len(expected) >= SHORT_DIGEST_CHARS and current.startswith(expected)


def _permitted_or_audit(approval: Approval, decision: str, attempt: Attempt) -> None:
    reason = eligibility.refusal_for_name(attempt.decider, approval)
    if reason is not None:
        _audit_refusal(approval.pk, attempt, decision, AuditEntry.Outcome.NOT_PERMITTED, {"error": reason}, approval)
        raise NotPermitted(reason, field="decided_by")


def _may_remember_or_audit(approval: Approval, decision: str, attempt: Attempt, remember: grants.Remember) -> None:
    """Refuse the whole decision when it cannot be remembered: nobody may believe a grant exists that does not."""
    reason = grants.refusal(approval=approval, decision=decision, decider=attempt.decider)
    if reason is not None:
        message = f"this decision cannot be remembered: {reason}"
        detail = {"error": message, "remember": {"scope": remember.scope, "for_seconds": remember.seconds}}
        _audit_refusal(approval.pk, attempt, decision, AuditEntry.Outcome.NOT_PERMITTED, detail, approval)
        raise NotPermitted(message, field="remember")


def _refuse_mismatch(approval: Approval, ask: _Ask, expected: str, current: str) -> None:
    message = f"the arguments changed since you saw them (you saw {expected[:12]}, they are now {current[:12]})"
    detail = {"error": message, "expect_digest": expected, "arguments_digest": current}
    _audit_refusal(approval.pk, ask.attempt, ask.decision, AuditEntry.Outcome.DIGEST_MISMATCH, detail, approval)
    raise DigestMismatch(message, arguments_digest=current, approval=Approval.objects.get(pk=approval.pk))


def _vote(approval: Approval, ask: _Ask) -> Decision:
    """Record one vote on the locked, pending approval; decide it when the vote is decisive."""
    edited = ask.arguments is not None and arguments_digest(ask.arguments) != approval.digest
    if edited:
        # An edit is its author's approval of new arguments: approvals of the old ones stop counting.
        approval.arguments, approval.arguments_digest = ask.arguments, arguments_digest(ask.arguments)
        Approval.objects.filter(pk=approval.pk).update(
            arguments=approval.arguments, arguments_digest=approval.arguments_digest
        )
    key = {"voter": _fit(ask.attempt.decider, Vote, "voter"), "arguments_digest": approval.digest}
    # The approval's row lock serializes its votes: a plain check then insert cannot race here
    # (the unique constraint would still refuse a double). With a quorum of 1 (fixed when the
    # approval opened) any earlier vote decided it, so a pending one has none to repeat.
    repeated = (
        approval.quorum > 1 and Vote.objects.filter(approval=approval, decision=ask.decision, **key).exists()
    )
    vote = None
    if not repeated:
        vote = Vote.objects.create(
            approval=approval,
            decision=ask.decision,
            arguments=ask.arguments if edited else None,
            note=ask.note,
            source=_fit(ask.attempt.source, Vote, "source"),
            origin=_fit(ask.attempt.origin, Vote, "origin"),
            policy_version=approval.policy_version,
            **key,
        )
    if repeated:
        detail = {"note": ask.note, "arguments_digest": approval.digest, "tally": approval.tally}
        _audit(approval, ask.attempt, action=ask.decision, outcome=AuditEntry.Outcome.IDEMPOTENT, detail=detail)
        return Decision(approval=approval, outcome=AuditEntry.Outcome.IDEMPOTENT)
    # A quorum of 1 is met by this very vote: no need to count.
    if (
        ask.decision == Approval.Status.APPROVED
        and approval.quorum > 1
        and len(approval.counted_voters) < approval.quorum
    ):
        _announce_vote(approval, ask, edited)
        return Decision(approval=approval, outcome=AuditEntry.Outcome.VOTED)
    # A quorum of 1 had no earlier vote (it would have decided): this one is all there is.
    return _conclude(approval, ask, votes=[vote] if vote is not None and approval.quorum == 1 else None)


def _conclude(approval: Approval, ask: _Ask, *, votes: list[Vote] | None = None) -> Decision:
    fields = {
        "status": ask.decision,
        "decided_by": _fit(ask.attempt.decider, Approval, "decided_by"),
        "decided_at": timezone.now(),
        "note": ask.note,
        "feedback": ask.feedback if ask.decision == Approval.Status.REJECTED else "",  # blank otherwise: refused
        "arguments": approval.arguments,
        "payload": ask.payload,
    }
    Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(**fields)
    for name, value in fields.items():
        setattr(approval, name, value)
    resume = _after_decision(approval, ask.attempt, ask.auto_resume)
    notify.announce("approval.decided", approval.id)
    return Decision(approval=approval, outcome=AuditEntry.Outcome.DECIDED, resume_enqueued=resume, votes=votes)


def _announce_vote(approval: Approval, ask: _Ask, edited: bool) -> None:
    """Audit a vote that leaves the quorum unreached, and tell viewers (cards show the tally)."""
    detail = {**_detail(approval), "note": ask.note, "tally": approval.tally}
    if not edited:
        detail.pop("arguments_diff", None)  # an earlier voter's edit, already audited with their vote
    _audit(approval, ask.attempt, action=ask.decision, outcome=AuditEntry.Outcome.VOTED, detail=detail)
    data = {
        "approval_id": approval.id,
        "tool": approval.tool,
        "voter": ask.attempt.decider,
        "tally": approval.tally,
        "arguments_digest": approval.digest,
        "edited": edited,
    }
    events.publish(run_id=approval.run_id, type=RunEvent.Type.APPROVAL_VOTED, data=data)


def _after_decision(approval: Approval, attempt: Attempt, auto_resume: bool | None) -> bool:
    ToolCall.objects.filter(pk=approval.tool_call_id, status=ToolCall.Status.AWAITING_APPROVAL).update(
        status=approval.status
    )
    resume = _announce_and_unblock(approval, auto_resume)
    # Last: the audit chain's lock is one for the whole database, held until the commit.
    _audit(approval, attempt, action=approval.status, outcome=AuditEntry.Outcome.DECIDED, detail=_detail(approval))
    return resume


def _announce_and_unblock(approval: Approval, auto_resume: bool | None) -> bool:
    """Publish the decision and enqueue what it makes possible; return whether a resume was enqueued.

    The event's seq is reserved with the run's status read under the run's row lock, so a
    driver suspending the run at this moment is seen either before or after, never half.
    """
    seq, run_status, run_auto_resume, others_pending = sql.run_reserve_events(
        run_id=approval.run_id, count=1, columns=("status", "auto_resume"), pending_suspend=True
    )
    data = {
        "approval_id": approval.id,
        "tool": approval.tool,
        "decision": approval.status,
        "decided_by": approval.decided_by,
        "note": approval.note,
        "edited": approval.arguments is not None,
    }
    if approval.arguments is not None:
        data["arguments"] = approval.arguments  # what runs, shown wherever the decision is
    events.record(run_id=approval.run_id, last_seq=seq, items=[(RunEvent.Type.APPROVAL_DECIDED, data)])
    if approval.mode == Approval.Mode.DEFER:
        queue.deferred_on_commit(approval.tool_call_id)
        return False
    wanted = bool(run_auto_resume) if auto_resume is None else auto_resume
    if not wanted or run_status != Run.Status.SUSPENDED:
        return False
    if others_pending:
        return False  # the step's other approvals still wait (this one is decided already)
    queue.drive_on_commit(approval.run_id)
    return True


def _get_or_audit(approval_id: str, decision: str, attempt: Attempt) -> Approval:
    approval = _find(approval_id)
    if approval is None:
        _audit_refusal(approval_id, attempt, decision, AuditEntry.Outcome.NOT_FOUND, {})
        raise NotFound(f"no approval {text.repair(approval_id)[:APPROVAL_ID_CHARS]}")
    refusal = None
    if decision not in DECISIONS:
        refusal = InvalidInput(f"decision must be 'approved' or 'rejected', not {decision!r}", field="decision")
    elif not attempt.actor.strip():
        refusal = InvalidInput("who decides is required", field="decided_by")
    if refusal is not None:
        _audit_refusal(
            approval_id, attempt, decision, AuditEntry.Outcome.INVALID_ARGUMENTS, {"error": refusal.message}, approval
        )
        raise refusal
    return approval


def _find(approval_id: str) -> Approval | None:
    """Return the approval, or None; an id no approval can have (NUL, too long) is not even looked up."""
    if text.problem(approval_id) is not None or len(approval_id) > APPROVAL_ID_CHARS:
        return None
    # No joins: the decision reads the row again, with its run and call, under the lock; this
    # copy only validates the request (a rule that needs the run, four eyes, loads it).
    return Approval.objects.filter(pk=approval_id).first()


def _validated_or_audit(
    approval: Approval,
    decision: str,
    attempt: Attempt,
    note: str,
    feedback: str,
    arguments: dict[str, Any] | None,
    payload: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Return the edited arguments, strictly validated against the tool's schema, or raise InvalidInput."""
    try:
        _check_texts(decision, note=note, feedback=feedback, arguments=arguments, payload=payload)
        if decision == Approval.Status.APPROVED:
            _check_answer(approval, payload)
        if arguments is None:
            return None
        if decision != Approval.Status.APPROVED:
            raise InvalidInput("edited arguments only go with an approval", field="arguments")
        return _validated_edit(approval.tool, arguments)
    except InvalidInput as exc:
        _audit_refusal(
            approval.pk,
            attempt,
            decision,
            AuditEntry.Outcome.INVALID_ARGUMENTS,
            {"error": exc.message, "arguments": arguments},
            approval=approval,
        )
        raise


def _check_texts(decision: str, **values: Any) -> None:
    """Refuse a reviewer's text that cannot be stored, and feedback that would be dropped."""
    for field, value in values.items():
        try:
            text.require_clean(value, field=field)
        except text.UnsafeText as exc:
            raise InvalidInput(exc.message, field=field) from None
    if len(values["note"]) > MAX_TEXT_CHARS or len(values["feedback"]) > MAX_TEXT_CHARS:
        raise InvalidInput(f"note and feedback are limited to {MAX_TEXT_CHARS} characters", field="note")
    if values["payload"] is not None and not isinstance(values["payload"], dict):
        raise InvalidInput("payload must be a JSON object", field="payload")
    if decision == Approval.Status.APPROVED and values["feedback"].strip():
        # Feedback is a message for the model to revise with: it only exists with a rejection.
        raise InvalidInput(
            "feedback goes with a rejection (the model revises with it); to approve, move it to the note",
            field="feedback",
        )


def _check_answer(approval: Approval, payload: dict[str, Any] | None) -> None:
    """Refuse to approve a question a tool asked without the reviewer's answer: never invent one."""
    if approval.request is None:
        return
    if not payload:
        raise InvalidInput(f"{approval.tool} asked a question: approve it with an answer", field="payload")
    if "answer" in approval.request and not str(payload.get("answer") or "").strip():
        raise InvalidInput(f"{approval.tool} asked a question: the answer is empty", field="payload.answer")


def _validated_edit(tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Validate a reviewer's edit strictly: no coercion (true is not 1, "1500" is not 1500)."""
    tool = registry.get(tool_name)
    if tool is None:
        raise InvalidInput(f"tool {tool_name!r} is no longer registered", field="arguments")
    try:
        validated = tool.validate(arguments, strict=True)
        tool.check_arguments(validated)
    except InvalidArguments as exc:
        raise InvalidInput(
            f"arguments: {exc.message}", field=f"arguments.{exc.field}" if exc.field else "arguments"
        ) from None
    except ToolError as exc:
        raise InvalidInput(f"arguments: {exc.message}", field="arguments") from None
    return validated


def _refuse_or_repeat(
    approval_id: str, decision: str, attempt: Attempt, note: str, arguments: dict[str, Any] | None
) -> Decision:
    approval = Approval.objects.get(pk=approval_id)
    if approval.status == decision and (arguments is None or arguments == approval.arguments):
        _audit(approval, attempt, action=decision, outcome=AuditEntry.Outcome.IDEMPOTENT, detail={"note": note})
        return Decision(approval=approval, outcome=AuditEntry.Outcome.IDEMPOTENT)
    outcome = (
        AuditEntry.Outcome.EXPIRED if approval.status == Approval.Status.EXPIRED else AuditEntry.Outcome.ALREADY_DECIDED
    )
    _audit(approval, attempt, action=decision, outcome=outcome, detail={"note": note, "existing": approval.status})
    when = f" at {approval.decided_at:%Y-%m-%d %H:%M:%S} UTC" if approval.decided_at else ""
    message = f"approval {approval.id} was already {approval.status} by {approval.decided_by or 'the system'}{when}"
    error = WrongState if outcome == AuditEntry.Outcome.EXPIRED else AlreadyDecided
    raise error(message, approval=approval)


def approval_refuse(*, approval_id: str, decision: str, attempt: Attempt, outcome: str, reason: str) -> None:
    """Audit a decision attempt that its caller refused before deciding (not permitted, unreadable)."""
    approval = _find(approval_id)
    _audit_refusal(approval_id, attempt, decision, outcome, {"error": reason}, approval=approval)


def approval_expire(*, approval: Approval, actor: str, reason: str, resume: bool = True) -> bool:
    """Expire a pending approval (timeout, cancelled run); the model reads it as a rejection."""
    with transaction.atomic():
        _lock_run(approval.run_id)  # the order approval_decide and run_cancel take locks in: no deadlock
        won = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
            status=Approval.Status.EXPIRED, decided_by=actor, decided_at=timezone.now(), note=reason
        )
        if not won:
            return False
        approval.refresh_from_db()
        ToolCall.objects.filter(pk=approval.tool_call_id, status=ToolCall.Status.AWAITING_APPROVAL).update(
            status=ToolCall.Status.REJECTED
        )
        attempt = Attempt(actor=actor, source=AuditEntry.Source.SYSTEM)
        _audit(approval, attempt, action="expired", outcome=AuditEntry.Outcome.DECIDED, detail={"note": reason})
        _announce_and_unblock(approval, None if resume else False)
        notify.announce("approval.expired", approval.id)
    return True


def approval_expire_due() -> int:
    """Give every pending approval past its deadline its outcome (agents.services.deadlines); return how many."""
    from agents.services.deadlines import approval_deadlines_due

    return approval_deadlines_due()


def approval_approve_as(*, approval: Approval, actor: str, note: str, attempt: Attempt | None = None) -> bool:
    """Approve a pending approval without votes: its deadline (or a schedule) says so, or a reviewer runs it now.

    The caller holds the run's row lock; the compare-and-set in _conclude makes a second call a no-op.
    """
    locked = Approval.objects.select_for_update().select_related("tool_call", "run").get(pk=approval.pk)
    if locked.status != Approval.Status.PENDING:
        return False
    attempt = attempt or Attempt(actor=actor, source=AuditEntry.Source.SYSTEM)
    _conclude(locked, _Ask(Approval.Status.APPROVED, attempt, note, "", None, locked.payload, None))
    return True


def _detail(approval: Approval) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "note": approval.note,
        "arguments_digest": approval.digest,
        "policy_version": approval.policy_version,
    }
    if approval.quorum > 1:
        detail["votes"] = approval.counted_voters
    if approval.feedback:
        detail["feedback"] = approval.feedback
    if approval.payload is not None:
        detail["payload"] = approval.payload
    if approval.arguments is not None:
        before = approval.tool_call.arguments or {}
        detail["arguments_diff"] = {
            key: [before.get(key), approval.arguments.get(key)]
            for key in sorted(set(before) | set(approval.arguments))
            if before.get(key) != approval.arguments.get(key)
        }
    return detail


def _audit(approval: Approval, attempt: Attempt, *, action: str, outcome: str, detail: dict[str, Any]) -> None:
    _audit_refusal(approval.pk, attempt, action, outcome, detail, approval=approval)


def _audit_refusal(
    approval_id: str,
    attempt: Attempt,
    decision: str,
    outcome: str,
    detail: dict[str, Any],
    approval: Approval | None = None,
) -> None:
    """Append an audit row; the approval may be unknown (a refused attempt on a bad id).

    Whatever a refused request carried is repaired and cut to its column, so refusing it
    can never fail: an attempt is audited however malformed it was.
    """
    audit_append(
        approval_id=approval_id,
        run_id=approval.run_id if approval else "",
        tool=approval.tool if approval else "",
        action=decision,
        actor=attempt.actor,
        on_behalf_of=attempt.on_behalf_of,
        source=attempt.source,
        origin=attempt.origin,
        outcome=outcome,
        detail=detail,
    )


def audit_run(*, run_id: str, attempt: Attempt, action: str, detail: dict[str, Any]) -> None:
    """Audit a change of a whole run (a cancel): who, from where, what."""
    audit_append(
        approval_id="",
        run_id=run_id,
        action=action,
        actor=attempt.actor,
        on_behalf_of=attempt.on_behalf_of,
        source=attempt.source,
        origin=attempt.origin,
        outcome=AuditEntry.Outcome.DECIDED,
        detail=detail,
    )


def _fit(value: str, model: type[Model], field: str) -> str:
    """Return text repaired and cut to the column's length."""
    column = cast("Field[Any, Any]", model._meta.get_field(field))  # a text column, not a relation
    return text.repair(value)[: column.max_length]


def _lock_run(run_id: str) -> None:
    """Lock the run's row until the transaction ends (SQLite serializes writing transactions anyway)."""
    if not connection.features.has_select_for_update:
        return  # SQLite: BEGIN IMMEDIATE already holds the database's one write lock
    list(Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True))


_sqlite_writer = threading.Lock()


def _one_writer() -> AbstractContextManager[object]:
    """On SQLite, let this process's threads take the write lock one after the other.

    SQLite admits one writing transaction; a thread that finds it taken polls with growing
    sleeps (up to 100 ms each), so decisions served side by side would wait far longer than
    the transaction ahead of them lasts. A lock of the process queues them instead (other
    processes still meet SQLite's own). PostgreSQL's row locks need no help. Inside a
    caller's transaction the write lock is already held: waiting here could only deadlock.
    """
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return nullcontext()
    return _sqlite_writer
