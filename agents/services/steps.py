"""Writes of the run's driver: a model turn, tool claims and results, reports.

Every write that appends to a run's conversation is fenced by the driver's lease
(run_renew_lease in the same transaction), so a driver that lost its run to the sweeper
cannot append after the new one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents import events, ids
from agents.models import Approval, Message, Run, RunEvent, ToolCall
from agents.services.errors import LeaseLost
from agents.services.runs import lease_expiry


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
    """Record a model turn with tool calls, its approvals and immediate outputs, in one transaction.

    With `suspend` (nothing left to run now, a suspend approval pending) the run is
    suspended in the same transaction (invariant 4). Return the next free message seq.
    """
    now = timezone.now()
    with transaction.atomic():
        fence = {"steps": F("steps") + 1, "lease_expires_at": lease_expiry(), "updated_at": now}
        if suspend:
            fence.update(status=Run.Status.SUSPENDED, lease_owner="", lease_expires_at=None)
        if not Run.objects.filter(pk=run_id, lease_owner=owner).update(**fence):
            raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")
        Message.objects.create(run_id=run_id, seq=seq, role=Message.Role.ASSISTANT, content=content, tool_calls=tool_calls)
        if content:
            events.publish(run_id=run_id, type=RunEvent.Type.MESSAGE, data={"seq": seq, "role": "assistant", "content": content})
        rows = ToolCall.objects.bulk_create(
            ToolCall(run_id=run_id, call_id=c.call_id, step=seq, name=c.name, arguments=c.arguments, status=c.status, hitl_mode=c.hitl_mode)
            for c in calls
        )
        next_seq = seq + 1
        for call, row in zip(calls, rows, strict=True):
            if call.hitl_mode:
                _open_approval(row, mode=call.hitl_mode, request=call.request, expires_at=call.expires_at, suspended=suspend)
            else:
                events.publish(run_id=run_id, type=RunEvent.Type.TOOL_CALL, data=_call_data(row))
            if call.output is not None:
                _tool_message(row, seq=next_seq, output=call.output)
                next_seq += 1
    return next_seq


def _open_approval(
    call: ToolCall, *, mode: str, request: dict[str, Any] | None, expires_at: datetime | None, suspended: bool
) -> Approval:
    approval = Approval.objects.create(
        id=ids.approval_id(call.run_id, call.call_id),
        run_id=call.run_id,
        tool_call=call,
        tool=call.name,
        mode=mode,
        request=request,
        expires_at=expires_at,
    )
    # A pause is announced by its approval_required events alone (no separate status
    # event), which keeps a paused run at six rows.
    data = {**_call_data(call), "approval_id": approval.id, "mode": mode, "request": request}
    if suspended:
        data["run_status"] = Run.Status.SUSPENDED
    events.publish(run_id=call.run_id, type=RunEvent.Type.APPROVAL_REQUIRED, data=data)
    return approval


def _call_data(call: ToolCall) -> dict[str, Any]:
    return {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments}


def _tool_message(call: ToolCall, *, seq: int, output: dict[str, Any]) -> None:
    Message.objects.create(
        run_id=call.run_id, seq=seq, role=Message.Role.TOOL, content=json.dumps(output), tool_call_id=call.call_id
    )
    events.publish(
        run_id=call.run_id,
        type=RunEvent.Type.TOOL_RESULT,
        data={"call_id": call.call_id, "tool": call.name, "output": output},
    )


def toolcall_claim(*, tool_call: ToolCall) -> datetime | None:
    """Claim the execution of a call; return the claim time, or None if another caller has it.

    The compare-and-set on executed_at is what makes a call run exactly once (invariant 2).
    """
    now = timezone.now()
    won = ToolCall.objects.filter(pk=tool_call.pk, executed_at__isnull=True, result__isnull=True).update(
        executed_at=now, status=ToolCall.Status.RUNNING
    )
    return now if won else None


def toolcall_finish(
    *,
    owner: str,
    tool_call: ToolCall,
    seq: int,
    status: str,
    output: dict[str, Any],
    executed_arguments: dict[str, Any] | None = None,
) -> None:
    """Memoize a call's output and tell the model, fenced by the lease."""
    with transaction.atomic():
        _fence(tool_call.run_id, owner)
        ToolCall.objects.filter(pk=tool_call.pk).update(status=status, result=output, executed_arguments=executed_arguments)
        _tool_message(tool_call, seq=seq, output=output)


def toolcall_record_result(
    *, tool_call: ToolCall, status: str, output: dict[str, Any], executed_arguments: dict[str, Any] | None = None
) -> bool:
    """Memoize the output of a deferred call; the run's driver tells the model later."""
    with transaction.atomic():
        stored = ToolCall.objects.filter(pk=tool_call.pk, result__isnull=True).update(
            status=status, result=output, executed_arguments=executed_arguments
        )
        if stored:
            events.publish(
                run_id=tool_call.run_id,
                type=RunEvent.Type.TOOL_RESULT,
                data={"call_id": tool_call.call_id, "tool": tool_call.name, "output": output, "deferred": True},
            )
    return bool(stored)


def toolcall_ask(
    *, owner: str, tool_call: ToolCall, claimed_at: datetime, request: dict[str, Any], expires_at: datetime | None
) -> Approval:
    """Turn a claimed call whose tool asked a person itself into a pending suspend approval.

    The tool asked before doing anything, so its claim is handed back: it runs once, later,
    with the reviewer's answer.
    """
    with transaction.atomic():
        _fence(tool_call.run_id, owner)
        ToolCall.objects.filter(pk=tool_call.pk, executed_at=claimed_at).update(
            executed_at=None, status=ToolCall.Status.AWAITING_APPROVAL, hitl_mode=Approval.Mode.SUSPEND
        )
        return _open_approval(tool_call, mode=Approval.Mode.SUSPEND, request=request, expires_at=expires_at, suspended=False)


def toolcall_mark_in_doubt(*, tool_call: ToolCall) -> bool:
    """Mark a claim with no result whose worker died: it is never re-run, a person must check."""
    return bool(
        ToolCall.objects.filter(pk=tool_call.pk, executed_at__isnull=False, result__isnull=True)
        .exclude(status=ToolCall.Status.IN_DOUBT)
        .update(status=ToolCall.Status.IN_DOUBT)
    )


def message_append(
    *,
    owner: str,
    run_id: str,
    seq: int,
    role: str,
    content: str,
    tool_call_id: str = "",
    reports: list[ToolCall] | None = None,
) -> None:
    """Append a feedback or report message, fenced by the lease.

    `reports` are the deferred calls whose outcome this message tells the model; they are
    marked reported in the same transaction, so the model is told once.
    """
    with transaction.atomic():
        _fence(run_id, owner)
        Message.objects.create(run_id=run_id, seq=seq, role=role, content=content, tool_call_id=tool_call_id)
        if reports:
            ToolCall.objects.filter(pk__in=[c.pk for c in reports]).update(reported_at=timezone.now())
        events.publish(run_id=run_id, type=RunEvent.Type.MESSAGE, data={"seq": seq, "role": role, "content": content})


def _fence(run_id: str, owner: str) -> None:
    if not Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=lease_expiry()):
        raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")
