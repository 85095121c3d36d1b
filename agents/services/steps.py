"""Writes of the run's driver: a model turn, tool claims and results, reports.

Every write that appends to a run's conversation is fenced by the driver's lease
(services.runs.run_write, which also reserves the event seqs, in the same write), so a
driver that lost its run to the sweeper cannot append after the new one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import events, ids, notify, sql, text
from agents.models import Approval, AuditEntry, Message, Run, RunEvent, ToolCall, arguments_digest
from agents.policy.rules import Verdict
from agents.services import grants
from agents.services.audit import audit_append
from agents.services.deadlines import deadline_schedule
from agents.services.runs import run_write
from agents.sql.chain import Chain, InsertedValue, values_of


@dataclass
class PlannedCall:
    """One tool call of a model turn, classified before anything is written."""

    call_id: str
    name: str
    arguments: dict[str, Any] | None
    status: str  # ToolCall.Status
    hitl_mode: str = ""  # suspend or defer when a person must decide
    # Tool output told to the model at once: an argument error, or APPROVAL_PENDING for defer.
    output: dict[str, Any] | None = None
    request: dict[str, Any] | None = None  # what a tool asks a person, if it asks itself
    expires_at: datetime | None = None
    # What the policy said: recorded on the approval (asked: its rule, approvers, quorum, four
    # eyes, version), or as its decision (allowed or denied by a rule).
    verdict: Verdict | None = None


def step_open(
    *,
    run_id: str,
    owner: str,
    seq: int,
    content: str,
    tool_calls: list[dict[str, Any]],
    calls: list[PlannedCall],
    suspend: bool,
) -> int:
    """Record a model turn with tool calls, its approvals and immediate outputs, all or nothing.

    With `suspend` (nothing left to run now, a suspend approval pending) the run is
    suspended in the same write (invariant 4). A pause is announced by its
    approval_required events alone (no separate status event), which keeps a paused run at
    six rows. Return the next free message seq. What the model wrote is repaired first
    (agents.text): one bad character in its JSON must not make the run unreadable. One
    statement on PostgreSQL, unless a rule or grant decided a call (its audit entry joins
    the same transaction; a grant that lapsed since it matched raises GrantLapsed, and
    nothing is written).
    """
    content, tool_calls, calls = text.repair(content), text.repair(tool_calls), [_repaired(c) for c in calls]
    messages = [_message_values(run_id, seq, Message.Role.ASSISTANT, content, tool_calls=tool_calls)]
    rows = [
        ToolCall(
            run_id=run_id,
            call_id=c.call_id,
            step=seq,
            name=c.name,
            arguments=c.arguments,
            status=c.status,
            hitl_mode=c.hitl_mode,
            # A call refused before it ran keeps what the model was told; a deferred call's
            # result stays empty until it runs (the compare-and-set looks for that).
            result=c.output if c.status in (ToolCall.Status.FAILED, ToolCall.Status.REJECTED) else None,
        )
        for c in calls
    ]
    items: list[tuple[str, dict[str, Any]]] = []
    if content:
        items.append((RunEvent.Type.MESSAGE, {"seq": seq, "role": "assistant", "content": content}))
    for call, row in zip(calls, rows, strict=True):
        if call.hitl_mode:
            items.append(_approval_required(row, request=call.request, suspended=suspend, verdict=call.verdict))
        else:
            items.append((RunEvent.Type.TOOL_CALL, {**_call_data(row), **_policy_data(call.verdict)}))
    for call, row in zip(calls, rows, strict=True):
        if call.output is not None:
            messages.append(_message_values(run_id, seq + len(messages), Message.Role.TOOL, **_tool_output(call)))
            items.append(_result_event(row, call.output))
    asked = [
        _approval(row, mode=c.hitl_mode, request=c.request, expires_at=c.expires_at, verdict=c.verdict)
        for c, row in zip(calls, rows, strict=True)
        if c.hitl_mode
    ]
    decided = _automatic(rows, calls)

    def add_rows(chain: Chain) -> None:
        chain.insert(Message, messages)
        inserted = chain.insert(ToolCall, [values_of(row) for row in rows], returning=("id", "call_id"))
        chain.insert(Approval, [_approval_values(a, inserted) for a in [*asked, *(a for a, _ in decided)]])

    status = {"status": Run.Status.SUSPENDED} if suspend else {}
    with transaction.atomic() if decided else contextlib.nullcontext():
        run_write(run_id=run_id, owner=owner, items=items, rows=add_rows, release=suspend, add_steps=1, **status)
        _audit_automatic(decided)
    _schedule_deadlines(asked)
    notify.announce_all("approval.required", [approval.id for approval in asked])
    return seq + len(messages)


def _message_values(
    run_id: str, seq: int, role: str, content: str, *, tool_calls: Any = None, tool_call_id: str = ""
) -> dict[str, Any]:
    """Return a message row's values for a chain (agents.sql.chain)."""
    return {
        "run_id": run_id,
        "seq": seq,
        "role": role,
        "content": content,
        "tool_calls": tool_calls,
        "tool_call_id": tool_call_id,
    }


def _tool_output(call: PlannedCall) -> dict[str, Any]:
    return {"content": json.dumps(call.output), "tool_call_id": call.call_id}


def _approval_values(approval: Approval, inserted_calls: int) -> dict[str, Any]:
    """Return an approval's row for the chain, pointing at its call inserted in the same chain."""
    call = InsertedValue(inserted_calls, "call_id", approval.tool_call.call_id)
    return {**values_of(approval), "tool_call_id": call}


def _repaired(call: PlannedCall) -> PlannedCall:
    return replace(
        call,
        name=text.repair(call.name),
        arguments=text.repair(call.arguments),
        output=text.repair(call.output),
        request=text.repair(call.request),
    )


def _approval(
    call: ToolCall,
    *,
    mode: str,
    request: dict[str, Any] | None,
    expires_at: datetime | None,
    verdict: Verdict | None = None,
) -> Approval:
    approval = Approval(
        id=ids.approval_id(call.run_id, call.call_id),
        run_id=call.run_id,
        tool_call=call,
        tool=call.name,
        mode=mode,
        request=request,
        expires_at=expires_at,
        arguments_digest=arguments_digest(call.arguments),
    )
    if verdict is not None:
        approval.rule = verdict.rule
        approval.approvers = list(verdict.approvers)
        approval.quorum = verdict.quorum
        approval.four_eyes = verdict.four_eyes
        approval.policy_version = verdict.policy_version
        approval.on_timeout = Approval.OnTimeout.RUN if verdict.action == "schedule" else verdict.on_timeout
        approval.escalate_to = list(verdict.escalate_to)
        approval.timeout_seconds = verdict.timeout_seconds
        approval.remind_every_seconds = verdict.remind_every_seconds
    return approval


def _schedule_deadlines(approvals: list[Approval]) -> None:
    """Fire each pending approval's deadline on time (after commit): call it once the approvals are written."""
    for approval in approvals:
        if approval.expires_at is not None:
            deadline_schedule(approval_id=approval.id, when=approval.expires_at)


def _record_automatic(rows: list[ToolCall], calls: list[PlannedCall]) -> None:
    """Record each call a rule (or grant) allowed or denied as a decision: an approval row and an audit entry."""
    decided = _automatic(rows, calls)
    Approval.objects.bulk_create(approval for approval, _ in decided)
    _audit_automatic(decided)


def _automatic(rows: list[ToolCall], calls: list[PlannedCall]) -> list[tuple[Approval, Verdict]]:
    """Return the decided approval of each call a rule (or grant) allowed or denied, with its verdict."""
    now = timezone.now()
    decided = []
    for row, c in zip(rows, calls, strict=True):
        verdict = c.verdict
        if verdict is None or not verdict.automatic:
            continue
        approval = _approval(row, mode=verdict.mode, request=None, expires_at=None, verdict=verdict)
        approval.status = Approval.Status.APPROVED if verdict.action == "allow" else Approval.Status.REJECTED
        approval.decided_by = verdict.decided_by
        approval.decided_at = now
        approval.note = text.repair(verdict.reason)[:2000]
        decided.append((approval, verdict))
    return decided


def _audit_automatic(decided: list[tuple[Approval, Verdict]]) -> None:
    """Audit each automatic decision (a grant's also counts its use), in the caller's transaction."""
    for approval, verdict in decided:
        if verdict.grant_id:
            grants.grant_use(approval=approval, verdict=verdict)  # counts the use, and audits it
            continue
        audit_append(
            approval_id=approval.pk,
            run_id=approval.run_id,
            tool=approval.tool,
            action=approval.status,
            actor=approval.decided_by,
            source=AuditEntry.Source.SYSTEM,
            outcome=AuditEntry.Outcome.DECIDED,
            detail=_policy_data(verdict)["policy"],
        )


def _policy_data(verdict: Verdict | None) -> dict[str, Any]:
    """Return what the timeline shows of the policy's part in a call ({} when it had none)."""
    if verdict is None or not (verdict.rule or verdict.grant_id):
        return {}
    policy = {
        "action": verdict.action,
        "rule": verdict.rule,
        "decided_by": verdict.decided_by,
        "reason": verdict.reason,
        "policy_version": verdict.policy_version,
    }
    if verdict.grant_id:
        policy["grant"] = verdict.grant_id
    return {"policy": policy}


def _call_data(call: ToolCall) -> dict[str, Any]:
    return {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments}


def _approval_required(
    call: ToolCall, *, request: dict[str, Any] | None, suspended: bool, verdict: Verdict | None = None
) -> tuple[str, dict[str, Any]]:
    data = {
        **_call_data(call),
        "approval_id": ids.approval_id(call.run_id, call.call_id),
        "mode": call.hitl_mode,
        "request": request,
        "arguments_digest": arguments_digest(call.arguments),  # what a decision from this event is bound to
        **_policy_data(verdict),
    }
    if suspended:
        data["run_status"] = Run.Status.SUSPENDED
    return RunEvent.Type.APPROVAL_REQUIRED, data


def _result_event(call: ToolCall, output: dict[str, Any], **extra: Any) -> tuple[str, dict[str, Any]]:
    return RunEvent.Type.TOOL_RESULT, {"call_id": call.call_id, "tool": call.name, "output": output, **extra}


def toolcall_claim(*, tool_call: ToolCall) -> datetime | None:
    """Claim the execution of a call; return the claim time, or None if another caller has it.

    The compare-and-set on executed_at is what makes a call run exactly once (invariant 2).
    It reads the run's state under the run's row lock, in the same statement (agents.sql):
    a cancel that comes first stops the claim, and one that comes second sees the claim
    and waits for its result. It commits on its own, before the effect runs.
    """
    now = timezone.now()
    return now if sql.toolcall_claim(tool_call_pk=tool_call.pk, now=now) else None


def toolcall_finish(
    *,
    owner: str,
    tool_call: ToolCall,
    seq: int,
    status: str,
    output: dict[str, Any],
    executed_arguments: dict[str, Any] | None = None,
) -> None:
    """Memoize a call's output and tell the model, fenced by the lease (one statement on PostgreSQL)."""
    output, executed_arguments = text.repair(output), text.repair(executed_arguments)
    memo = {"status": status, "result": output, "executed_arguments": executed_arguments}
    told = _message_values(tool_call.run_id, seq, Message.Role.TOOL, json.dumps(output), tool_call_id=tool_call.call_id)

    def add_rows(chain: Chain) -> None:
        chain.update(ToolCall, tool_call.pk, memo)
        chain.insert(Message, [told])

    run_write(run_id=tool_call.run_id, owner=owner, items=[_result_event(tool_call, output)], rows=add_rows)


def toolcall_record_result(
    *,
    tool_call: ToolCall,
    status: str,
    output: dict[str, Any],
    executed_arguments: dict[str, Any] | None = None,
    unclaimed: bool = False,
) -> bool:
    """Memoize the output of a deferred call; the run's driver tells the model later.

    `unclaimed`: an outcome decided without running the tool (a refusal), stored only while no
    worker holds the call's claim: one that does is running the tool, and its result is the call's.
    """
    output, executed_arguments = text.repair(output), text.repair(executed_arguments)
    rows = ToolCall.objects.filter(pk=tool_call.pk, result__isnull=True)
    if unclaimed:
        rows = rows.filter(executed_at__isnull=True)
    with transaction.atomic():
        stored = rows.update(status=status, result=output, executed_arguments=executed_arguments)
        if stored:
            type, data = _result_event(tool_call, output, deferred=True)
            events.publish(run_id=tool_call.run_id, type=type, data=data)
    return bool(stored)


def toolcall_ask(
    *,
    owner: str,
    tool_call: ToolCall,
    claimed_at: datetime,
    request: dict[str, Any],
    expires_at: datetime | None,
    allowance: Approval | None = None,
) -> Approval:
    """Turn a claimed call whose tool asked a person itself into a pending suspend approval.

    The tool asked before doing anything, so its claim is handed back: it runs once, later,
    with the reviewer's answer. A call a rule, a standing grant, a schedule's time or a reviewer's
    Run now let through has its one approval already (`allowance`, Approval.decided_by_policy:
    nobody asked): that approval becomes the question, for those the policy names for the call
    (approvers, quorum, four eyes), in the same write; the audit keeps the allowance and says
    that the tool asked.
    """
    request = text.repair(request)
    tool_call.hitl_mode = Approval.Mode.SUSPEND
    approval = _approval(tool_call, mode=tool_call.hitl_mode, request=request, expires_at=expires_at)
    event = _approval_required(tool_call, request=request, suspended=False)
    if allowance is None:
        _hand_back_claim(owner, tool_call, claimed_at, approval, event)
    else:
        with transaction.atomic():
            _reopen_as_question(owner, tool_call, claimed_at, approval, allowance, event)
    notify.announce("approval.required", approval.id)
    return approval


def _reopen_as_question(
    owner: str,
    tool_call: ToolCall,
    claimed_at: datetime,
    approval: Approval,
    allowance: Approval,
    event: tuple[str, dict[str, Any]],
) -> None:
    """Hand back the claim of a call nobody was asked for, its approval now the pending question, and audit it."""
    approval.approvers, approval.quorum = allowance.approvers, allowance.quorum
    approval.four_eyes, approval.policy_version = allowance.four_eyes, allowance.policy_version
    approval.created_at = timezone.now()  # the question waits from now, as a new one does
    kept = ("id", "run_id", "tool_call_id")
    question = {name: value for name, value in values_of(approval).items() if name not in kept}
    # Only the policy's decision is turned back: a person's answer, once given, is the call's for good.
    allowed = {"status": Approval.Status.APPROVED, "decided_by": allowance.decided_by}
    _hand_back_claim(
        owner,
        tool_call,
        claimed_at,
        approval,
        event,
        write=lambda chain: chain.update(Approval, approval.pk, question, where=allowed),
    )
    audit_append(
        approval_id=approval.pk,
        run_id=approval.run_id,
        tool=approval.tool,
        action="asked",
        actor="system",
        source=AuditEntry.Source.SYSTEM,
        outcome=AuditEntry.Outcome.DECIDED,
        detail={
            "allowed_by": allowance.decided_by,
            "reason": allowance.note,
            "request": approval.request,
            "note": "the call was let run without a question to anyone; its tool asked one, which a person answers",
        },
    )


def toolcall_schedule(*, owner: str, tool_call: ToolCall, claimed_at: datetime, run_at: datetime) -> Approval:
    """Turn a claimed call whose tool asked to run later (run_at) into a scheduled suspend approval.

    The tool stopped before doing anything, so its claim is handed back: it runs once, at
    `run_at` (the approval's deadline runs it) or when a reviewer says "run now".
    """
    tool_call.hitl_mode = Approval.Mode.SUSPEND
    verdict = Verdict(action="schedule", run_at=run_at)
    approval = _approval(tool_call, mode=tool_call.hitl_mode, request=None, expires_at=run_at, verdict=verdict)
    data = {**_approval_required(tool_call, request=None, suspended=False)[1], "run_at": run_at.isoformat()}
    _hand_back_claim(owner, tool_call, claimed_at, approval, (RunEvent.Type.APPROVAL_REQUIRED, data))
    return approval


def toolcall_hold(*, owner: str | None, tool_call: ToolCall, claimed_at: datetime, run_at: datetime) -> None:
    """Hand back the claim of a decided call whose tool asked to run later: it runs at `run_at`.

    The tool stopped before doing anything. The call keeps its one approval (a person's, or
    the one a rule or grant wrote): the decision stands, only its time moves, and then the
    tool runs released (its run_at returns). A suspend call's run waits for that time
    (agents.sql.run_suspend), and the write is fenced by the driver's lease; a deferred
    call's run goes on, and may have ended.
    """
    deferred = tool_call.hitl_mode == Approval.Mode.DEFER
    # A rule's or grant's allowance waits as a suspend call does, so the sweeper finds its run once the time comes.
    mode = Approval.Mode.DEFER if deferred else Approval.Mode.SUSPEND
    held: dict[str, Any] = {
        "executed_at": None,
        "status": ToolCall.Status.APPROVED,
        "hitl_mode": mode,
        "not_before": run_at,
    }
    type, data = RunEvent.Type.TOOL_CALL, {**_call_data(tool_call), "waits_until": run_at.isoformat()}
    if deferred:
        with transaction.atomic():
            if ToolCall.objects.filter(pk=tool_call.pk, executed_at=claimed_at).update(**held):
                events.publish(run_id=tool_call.run_id, type=type, data=data)
    else:
        run_write(
            run_id=tool_call.run_id,
            owner=owner,
            items=[(type, data)],
            rows=lambda chain: chain.update(ToolCall, tool_call.pk, held, where={"executed_at": claimed_at}),
        )
    for name, value in held.items():
        setattr(tool_call, name, value)


def _hand_back_claim(
    owner: str,
    tool_call: ToolCall,
    claimed_at: datetime,
    approval: Approval,
    event: tuple[str, dict[str, Any]],
    *,
    write: Callable[[Chain], None] | None = None,
) -> None:
    """Release a call's claim and open its suspend approval (inserted, or by `write`), fenced by the lease."""
    released = {"executed_at": None, "status": ToolCall.Status.AWAITING_APPROVAL, "hitl_mode": tool_call.hitl_mode}

    def add_rows(chain: Chain) -> None:
        chain.update(ToolCall, tool_call.pk, released, where={"executed_at": claimed_at})
        if write is None:
            chain.insert(Approval, [values_of(approval)])
        else:
            write(chain)

    run_write(run_id=tool_call.run_id, owner=owner, items=[event], rows=add_rows)
    _schedule_deadlines([approval])


def toolcall_mark_in_doubt(*, tool_call: ToolCall) -> bool:
    """Mark a claim with no result whose worker died: it is never re-run, a person must check.

    Its run's viewers are told in the same transaction, as when a driver finds such a claim:
    a deferred call's timeline otherwise stayed at its approval, and the playground waited on.
    The result stays empty, so one its worker stores late still lands, as its own event.
    """
    from agents.runtime import outputs  # the runtime imports the services

    with transaction.atomic():
        marked = (
            ToolCall.objects.filter(pk=tool_call.pk, executed_at__isnull=False, result__isnull=True)
            .exclude(status=ToolCall.Status.IN_DOUBT)
            .update(status=ToolCall.Status.IN_DOUBT)
        )
        if marked:
            deferred = {"deferred": True} if tool_call.hitl_mode == Approval.Mode.DEFER else {}
            type, data = _result_event(tool_call, outputs.in_doubt(tool_call.name), in_doubt=True, **deferred)
            events.publish(run_id=tool_call.run_id, type=type, data=data)
    return bool(marked)


def message_append(
    *,
    owner: str,
    run_id: str,
    seq: int,
    role: str,
    content: str,
    tool_call_id: str = "",
    reports: list[ToolCall] | None = None,
    feedback: list[tuple[str, str]] | None = None,
) -> None:
    """Append a feedback or report message, fenced by the lease.

    `reports` are the deferred calls whose outcome this message tells the model; they are
    marked reported in the same write, so the model is told once. `feedback` (call id,
    reviewer's words) follows it as user messages in the same write: a rejection reported
    without its feedback would never get it.
    """
    told = [_message_values(run_id, seq, role, text.repair(content), tool_call_id=tool_call_id)]
    for offset, (call_id, words) in enumerate(feedback or [], start=1):
        told.append(_message_values(run_id, seq + offset, Message.Role.USER, text.repair(words), tool_call_id=call_id))
    now = timezone.now()

    def add_rows(chain: Chain) -> None:
        chain.insert(Message, told)
        for call in reports or []:
            chain.update(ToolCall, call.pk, {"reported_at": now})

    items = [(RunEvent.Type.MESSAGE, {"seq": m["seq"], "role": m["role"], "content": m["content"]}) for m in told]
    run_write(run_id=run_id, owner=owner, items=items, rows=add_rows)
