"""The stable JSON shapes of runs and approvals, shared by the CLI's --json and the API."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from agents import text
from agents.models import Approval, Run, SideEffect, ToolCall


def _shown(build: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Repair what a shape carries: rows written by older versions may hold text no client can decode."""

    @functools.wraps(build)
    def shaped(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return text.repair(build(*args, **kwargs), max_depth=text.MAX_STORED_DEPTH)

    return shaped


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@_shown
def approval_summary(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.id,
        "run_id": approval.run_id,
        "tool": approval.tool,
        "arguments": approval.tool_call.arguments,
        "mode": approval.mode,
        "status": approval.status,
        "created_at": _time(approval.created_at),
    }


@_shown
def approval_detail(approval: Approval) -> dict[str, Any]:
    return {
        **approval_summary(approval),
        "agent": approval.run.agent,
        "request": approval.request,
        "decided_by": approval.decided_by or None,
        "decided_at": _time(approval.decided_at),
        "note": approval.note,
        "feedback": approval.feedback,
        "edited_arguments": approval.arguments,
        "payload": approval.payload,
        "expires_at": _time(approval.expires_at),
    }


@_shown
def tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": call.status,
        "executed_at": _time(call.executed_at),
        "executed_arguments": call.executed_arguments,
        "result": call.result,
        "in_doubt": call.in_doubt,
    }


@_shown
def run_detail(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "input": run.input,
        "auto_resume": run.auto_resume,
        "created_by": run.created_by,
        "created_at": _time(run.created_at),
        "updated_at": _time(run.updated_at),
        "lease_owner": run.lease_owner or None,
        "lease_expires_at": _time(run.lease_expires_at),
        "output": run.output,
        "error": run.error,
        "messages": [
            {
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "tool_calls": m.tool_calls,
                "tool_call_id": m.tool_call_id or None,
            }
            for m in run.messages.order_by("seq")
        ],
        "tool_calls": [tool_call(c) for c in run.tool_calls.order_by("step", "id")],
        "approvals": [
            {
                "id": a.id,
                "tool": a.tool,
                "mode": a.mode,
                "status": a.status,
                "decided_by": a.decided_by or None,
                "note": a.note,
            }
            for a in run.approvals.order_by("created_at")
        ],
    }


@_shown
def run_summary(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "input": run.input,
        "created_at": _time(run.created_at),
    }


@_shown
def side_effect(effect: SideEffect) -> dict[str, Any]:
    return {
        "tool": effect.tool,
        "idempotency_key": effect.idempotency_key,
        "arguments": effect.arguments,
        "created_at": _time(effect.created_at),
    }
