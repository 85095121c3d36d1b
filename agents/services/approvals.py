"""Decisions on approvals; the same function serves the web, the API and the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from agents import events, notify, queue, text
from agents.models import Approval, AuditEntry, Run, RunEvent, ToolCall
from agents.services.errors import AlreadyDecided, InvalidInput, NotFound, WrongState
from agents.tools import InvalidArguments, ToolError, registry

DECISIONS = (Approval.Status.APPROVED, Approval.Status.REJECTED)
MAX_TEXT_CHARS = 10_000
APPROVAL_ID_CHARS = Approval._meta.get_field("id").max_length


@dataclass(frozen=True)
class Decision:
    approval: Approval
    outcome: str  # AuditEntry.Outcome: decided or idempotent
    resume_enqueued: bool = False


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
) -> Decision:
    """Approve or reject a pending approval; the first decision wins (invariant 3).

    1. Validate the request (refusals are audited and change nothing else).
    2. Compare-and-set pending → decision, with the tool call, audit row and event, in one
       transaction.
    3. On commit, enqueue the resume (the step's last suspend approval, auto_resume on) or
       the execution of a deferred call.
    Repeating the same decision is idempotent; a different one raises AlreadyDecided.
    """
    approval = _get_or_audit(approval_id, decision, attempt)
    arguments = _validated_or_audit(approval, decision, attempt, note, feedback, arguments, payload)
    fields = {
        "status": decision,
        "decided_by": attempt.decider,
        "decided_at": timezone.now(),
        "note": note,
        "feedback": feedback if decision == Approval.Status.REJECTED else "",  # blank otherwise: refused above
        "arguments": arguments,
        "payload": payload,
    }
    with transaction.atomic():
        # The run's row first, as run_cancel does, so a decision and a cancel never interleave:
        # a cancel that came first has expired this approval, and the compare-and-set fails.
        _lock_run(approval.run_id)
        won = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(**fields)
        if won:
            for name, value in fields.items():
                setattr(approval, name, value)
            resume = _after_decision(approval, attempt, auto_resume)
            notify.announce("approval.decided", approval.id)
    if won:
        return Decision(approval=approval, outcome=AuditEntry.Outcome.DECIDED, resume_enqueued=resume)
    return _refuse_or_repeat(approval.pk, decision, attempt, note, arguments)


def _after_decision(approval: Approval, attempt: Attempt, auto_resume: bool | None) -> bool:
    ToolCall.objects.filter(pk=approval.tool_call_id, status=ToolCall.Status.AWAITING_APPROVAL).update(
        status=approval.status
    )
    _audit(approval, attempt, action=approval.status, outcome=AuditEntry.Outcome.DECIDED, detail=_detail(approval))
    return _announce_and_unblock(approval, auto_resume)


def _announce_and_unblock(approval: Approval, auto_resume: bool | None) -> bool:
    """Publish the decision and enqueue what it makes possible; return whether a resume was enqueued.

    The event's seq is reserved with the run's status read under the run's row lock, so a
    driver suspending the run at this moment is seen either before or after, never half.
    """
    seq, run_status, run_auto_resume = events.reserve_returning(
        run_id=approval.run_id, count=1, columns=("status", "auto_resume")
    )
    data = {
        "approval_id": approval.id,
        "tool": approval.tool,
        "decision": approval.status,
        "decided_by": approval.decided_by,
        "note": approval.note,
        "edited": approval.arguments is not None,
    }
    events.record(run_id=approval.run_id, last_seq=seq, items=[(RunEvent.Type.APPROVAL_DECIDED, data)])
    if approval.mode == Approval.Mode.DEFER:
        queue.deferred_on_commit(approval.tool_call_id)
        return False
    wanted = bool(run_auto_resume) if auto_resume is None else auto_resume
    if not wanted or run_status != Run.Status.SUSPENDED:
        return False
    if Approval.objects.filter(
        run_id=approval.run_id, mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING
    ).exists():
        return False  # the step's other approvals still wait
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
    return Approval.objects.select_related("tool_call", "run").filter(pk=approval_id).first()


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
    """Expire every pending approval whose deadline has passed; return how many."""
    due = Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lt=timezone.now())
    return sum(approval_expire(approval=a, actor="system", reason="no decision before the deadline") for a in due)


def _detail(approval: Approval) -> dict[str, Any]:
    detail: dict[str, Any] = {"note": approval.note}
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
    AuditEntry.objects.create(
        approval_id=_fit(approval_id, AuditEntry, "approval_id"),
        run_id=approval.run_id if approval else "",
        tool=approval.tool if approval else "",
        action=_fit(str(decision), AuditEntry, "action"),
        actor=_fit(attempt.actor.strip() or "(anonymous)", AuditEntry, "actor"),
        on_behalf_of=_fit(attempt.on_behalf_of, AuditEntry, "on_behalf_of"),
        source=_fit(attempt.source, AuditEntry, "source"),
        origin=_fit(attempt.origin, AuditEntry, "origin"),
        outcome=outcome,
        detail=text.repair(detail),
    )


def audit_run(*, run_id: str, attempt: Attempt, action: str, detail: dict[str, Any]) -> None:
    """Audit a change of a whole run (a cancel): who, from where, what."""
    AuditEntry.objects.create(
        approval_id="",
        run_id=run_id,
        action=_fit(action, AuditEntry, "action"),
        actor=_fit(attempt.actor.strip() or "(anonymous)", AuditEntry, "actor"),
        on_behalf_of=_fit(attempt.on_behalf_of, AuditEntry, "on_behalf_of"),
        source=_fit(attempt.source, AuditEntry, "source"),
        origin=_fit(attempt.origin, AuditEntry, "origin"),
        outcome=AuditEntry.Outcome.DECIDED,
        detail=text.repair(detail),
    )


def _fit(value: str, model: type[Model], field: str) -> str:
    """Return text repaired and cut to the column's length."""
    return text.repair(value)[: model._meta.get_field(field).max_length]


def _lock_run(run_id: str) -> None:
    """Lock the run's row until the transaction ends (SQLite serializes writing transactions anyway)."""
    list(Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True))
