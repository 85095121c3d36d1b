"""Running one claimed tool call; shared by the driver and deferred execution."""

from __future__ import annotations

import json
import logging
import reprlib
from typing import Any

from django.db import connection
from django.utils import timezone

from agents import queue, services
from agents.models import SCHEDULE, Approval, ToolCall
from agents.policy import ConfigError
from agents.runtime import outputs
from agents.tools import FeedbackRequired, InvalidArguments, RunLater, Tool, ToolContext, ToolError, registry

logger = logging.getLogger(__name__)


def arguments_to_run(tool: Tool, call: ToolCall, approval: Approval | None) -> dict[str, Any]:
    """Return what will run: the reviewer's edit if any, else the model's proposal, validated."""
    edited = approval is not None and approval.arguments is not None
    return tool.validate(approval.arguments if edited else call.arguments)  # type: ignore[union-attr]


def context(call: ToolCall, approval: Approval | None) -> ToolContext:
    """Return what the tool is told of its call: the decision it runs under, when someone was asked.

    A rule's, a grant's or a schedule's allowance asked nobody: the tool sees no approval, as an unlisted
    tool's call, so one that asks a person while it has none (ask_human) asks (the driver turns
    the allowance into the question). Its idempotency key is the approval's all the same.
    """
    decided = approval if approval is not None and not approval.decided_by_policy else None
    return ToolContext(
        run_id=call.run_id,
        tool_call_id=call.call_id,
        idempotency_key=approval.pk if approval else f"{call.run_id}:{call.call_id}",
        approval_id=decided.pk if decided else None,
        approval_payload=decided.payload if decided else None,
        approval_note=decided.note if decided else "",
        edited=approval is not None and approval.arguments is not None,
        # A scheduled call run now by a person, or a decided one its tool put off (held till not_before).
        # A schedule rule's time coming is no leave to skip the tool's own run_at: that holds the call.
        released=call.not_before is not None
        or (
            approval is not None
            and approval.on_timeout == Approval.OnTimeout.RUN
            and approval.status == Approval.Status.APPROVED
            and approval.decided_by != SCHEDULE
        ),
    )


def held_refusal(call: ToolCall, approval: Approval | None, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """Return the POLICY_DENIED output of a held call whose time came, when the policy now refuses it; else None.

    The call was decided before its tool put it off (not_before): like a scheduled call's time,
    that time runs only what the policy as it stands lets through (a deny rule or a remembered
    rejection added meanwhile stops it). Raises ConfigError while the policy cannot be read.
    """
    if call.not_before is None or approval is None:
        return None
    from agents.services.approvals import verdict_now  # the services import the runtime's outputs

    verdict = verdict_now(approval, arguments)
    if verdict.action != "deny":
        return None
    return outputs.error("POLICY_DENIED", f"the policy now refuses it: {verdict.reason}")


def release_connection() -> None:
    """Hand this thread's database connection back to the pool while the model thinks or a tool runs.

    A worker drives dozens of runs on threads, and a model turn or a tool's call to another
    service takes seconds: holding a connection through them would need a pool, and a
    server max_connections, as large as the threads, and a thread finding the pool empty
    fails after its timeout, possibly between a tool's effect and its recorded result.
    Nothing is open at those points (every write is its own transaction), so the next query
    simply takes a connection again. Without a pool (SQLite, AGENTFAST_DB_POOL=0) the
    connection is kept: closing it would only mean opening a new one.
    """
    if connection.connection is not None and not connection.in_atomic_block and getattr(connection, "pool", None):
        connection.close()


def invoke(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Call the tool; return (ToolCall status, output for the model). FeedbackRequired propagates."""
    release_connection()  # the claim is committed: the tool may take seconds, and needs no connection held
    try:
        result = tool(ctx, arguments)
    except (FeedbackRequired, RunLater):
        raise
    except ToolError as exc:
        return ToolCall.Status.FAILED, outputs.error(exc.code, exc.message)
    except InvalidArguments as exc:
        return ToolCall.Status.FAILED, outputs.error("INVALID_ARGUMENTS", exc.message)
    except Exception as exc:
        logger.exception("tool %s failed in %s", tool.name, ctx.run_id)
        return ToolCall.Status.FAILED, outputs.error("TOOL_FAILED", f"{type(exc).__name__}: {exc}")
    return ToolCall.Status.SUCCEEDED, outputs.ok(jsonable(result), edited_arguments=arguments if ctx.edited else None)


def jsonable(result: Any) -> Any:
    """Return what a tool handed back as JSON data; what JSON cannot hold (a date, bytes, a set) as its text.

    A result comes after the effect, a question before it: one that could not be stored
    would fail the run and leave its claimed call in doubt, though it ran (or never started).
    """
    try:
        return json.loads(json.dumps(result, default=str))
    except (TypeError, ValueError, RecursionError):
        # Circular, keyed by tuples, or nested past the recursion limit: a bounded text of it.
        return reprlib.repr(result)


def execute_deferred(tool_call_pk: int) -> str:
    """Run a decided deferred call once and memoize its result; return what happened.

    The run may have finished long ago: the result is recorded either way, and its driver
    tells the model at its next step if it is still going.
    """
    call = ToolCall.objects.select_related("approval").get(pk=tool_call_pk)
    approval = call.approval
    if call.result is not None:
        return "already recorded"
    if approval.status == Approval.Status.PENDING:
        return "still pending"
    if approval.status in (Approval.Status.REJECTED, Approval.Status.EXPIRED):
        output = outputs.declined(call.name, approval.status, approval.note)
        services.toolcall_record_result(tool_call=call, status=ToolCall.Status.REJECTED, output=output)
        return approval.status
    tool = registry.get(call.name)
    if tool is None:
        output = outputs.error("UNKNOWN_TOOL", f"tool {call.name!r} is not registered in this worker")
        services.toolcall_record_result(tool_call=call, status=ToolCall.Status.FAILED, output=output)
        return "unknown tool"
    try:
        arguments = arguments_to_run(tool, call, approval)
    except InvalidArguments as exc:  # the tool's schema changed since the call was proposed: it never runs
        output = outputs.error("INVALID_ARGUMENTS", exc.message)
        services.toolcall_record_result(tool_call=call, status=ToolCall.Status.FAILED, output=output)
        return "invalid arguments"
    if (until := call.held_until(timezone.now())) is not None:  # its tool's time has not come
        queue.deferred_at_on_commit(call.pk, until)
        return "held"
    try:
        refused = held_refusal(call, approval, arguments)
    except ConfigError:  # the policy cannot be read: the sweeper sends the call again
        return "policy unreadable"
    if refused is not None:
        if not services.toolcall_record_result(
            tool_call=call, status=ToolCall.Status.REJECTED, output=refused, unclaimed=True
        ):
            return "claimed elsewhere"
        return "denied"
    claimed_at = services.toolcall_claim(tool_call=call)
    if claimed_at is None:
        return "claimed elsewhere"
    ctx = context(call, approval)
    try:
        status, output = _invoke_deferred(tool, ctx, arguments)
    except RunLater as exc:  # decided before its tool put it off: the decision waits for the tool's time
        services.toolcall_hold(owner=None, tool_call=call, claimed_at=claimed_at, run_at=exc.when)
        queue.deferred_at_on_commit(call.pk, exc.when)
        return "held"
    services.toolcall_record_result(tool_call=call, status=status, output=output, executed_arguments=arguments)
    return status


def _invoke_deferred(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Invoke a decided deferred call; RunLater propagates unless the call was released (its time came)."""
    try:
        return invoke(tool, ctx, arguments)
    except RunLater:
        if not ctx.released:
            raise
        return ToolCall.Status.FAILED, outputs.error(
            "TOOL_ERROR", f"{tool.name} asked to run later after its time came"
        )
    except FeedbackRequired:  # asked after a person's (or a deadline's) decision: it was the answer
        # A rule's, a grant's or a schedule's allowance never gets here: its call runs in the driver, which asks.
        return ToolCall.Status.FAILED, outputs.error(
            "TOOL_ERROR", f"{tool.name} asked for a decision again after one was given"
        )
