"""State changes of the external-agent gate: gate a call, claim its execution once, store its result.

An external session is a run of kind "external" (its id derived from the account, the agent
and the session); each gated call is a ToolCall of it with its approval, recorded by the same
helpers as the calls of agents agentfast runs, so the inbox, timeline and audit show them alike.
Such a run is never driven by a worker: it stays "running" with no lease, and its approvals are
always suspend approvals, so a decision enqueues nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agents import events, notify, text
from agents.gateway import ids as gateway_ids
from agents.gateway.selectors import ExternalCall, external_call_get
from agents.models import Approval, Run, RunEvent, ToolCall
from agents.policy import get_policy
from agents.policy.config import Policy, ToolPolicy
from agents.policy.rules import CallFacts, Verdict, evaluate
from agents.services.errors import InvalidInput, ServiceError, unsafe_text_refused
from agents.services.grants import GrantLapsed, grant_match_except
from agents.services.steps import (
    PlannedCall,
    _approval,
    _approval_required,
    _call_data,
    _policy_data,
    _record_automatic,
    _result_event,
    _schedule_deadlines,
    toolcall_claim,
    toolcall_mark_in_doubt,
)

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,100}")  # whole names only: fullmatch (a `$` lets "x\n" through)
TOOL_NAME_RULE = "tool must be 1 to 100 letters, digits or _ . : / -"
MAX_NAME_CHARS = 100
MAX_SESSION_CHARS = 200
MAX_DESCRIPTION_CHARS = 10_000
MAX_ERROR_CHARS = 10_000  # a reported error longer than this is cut, never refused: the call ran
_EXECUTABLE = (Approval.Status.APPROVED,)


class GateConflict(ServiceError):
    """A 409 with a code of its own: the request contradicts what is stored, or the call may not run."""

    def __init__(self, message: str, *, code: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code


class Conflict(GateConflict):
    """Other arguments for a call id already gated, or another result for a call already reported."""


class NotClaimable(GateConflict):
    """The call may not run (pending, rejected, expired, denied) or was never claimed."""


@dataclass(frozen=True)
class GateRequest:
    """What an external agent asks about one call it is about to make."""

    agent: str
    session: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    description: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GateAnswer:
    decision: str  # allowed, denied or pending (or, on a retry, rejected/expired once a person decided)
    approval_id: str
    reason: str
    rule: str
    idempotency_key: str
    run_id: str  # the session's run: its events stream at /api/runs/{run_id}/events
    repeated: bool = False


@dataclass(frozen=True)
class Claim:
    claimed: bool
    state: str
    arguments: dict[str, Any] | None = None
    idempotency_key: str = ""
    result: dict[str, Any] | None = None


def gate_call(*, owner: str, request: GateRequest, unlisted: ToolPolicy | None = None) -> GateAnswer:
    """Let the policy decide an external call and record it; a retried request finds the same approval.

    1. Refuse input that cannot be stored (InvalidInput names the field).
    2. Find or create the session's run; a call id seen before is answered from what is
       stored, or refused (Conflict) when its tool or arguments changed.
    3. Evaluate the policy and record the call, its approval and events in one transaction;
       evaluate again when a grant that matched lapsed before that transaction (GrantLapsed).

    `unlisted` is what the tool needs when agentfast.yaml does not list it (default: it runs).
    """
    _validate(request)
    run = _session_run(owner, request)
    call_id = gateway_ids.call_id(request.call_id)
    existing = ToolCall.objects.filter(run=run, call_id=call_id).first()
    if existing is not None:
        return _repeat(owner, existing, request)
    facts = CallFacts(
        tool=request.tool,
        args=request.arguments,
        agent=request.agent,
        run={"id": run.id, "agent": run.agent, "created_by": owner, "input": run.input},
        now=timezone.now(),
        account=owner,
    )
    lapsed: set[str] = set()
    while True:
        verdict = evaluate(policy_for(request.tool, unlisted), facts, grant_lookup=grant_match_except(lapsed))
        try:
            with transaction.atomic():
                _record(run, call_id, request, verdict)
        except IntegrityError:  # the same call gated concurrently: the other request recorded it
            return _repeat(owner, ToolCall.objects.get(run=run, call_id=call_id), request)
        except GrantLapsed as exc:  # revoked or expired since it matched, nothing written: decide without it
            lapsed.add(exc.grant_id)
            facts = replace(facts, now=timezone.now())
            continue
        return _answer(owner, ToolCall.objects.select_related("run").get(run=run, call_id=call_id))


def policy_for(tool: str, unlisted: ToolPolicy | None) -> Policy:
    """Return the policy, with `unlisted` as the tool's entry when the file does not list it."""
    policy = get_policy()
    if unlisted is None or tool in policy.tool_overrides:
        return policy
    return replace(policy, tool_overrides={**policy.tool_overrides, tool: unlisted})


def is_tool_name(name: str) -> bool:
    """Return whether a call may name this tool (TOOL_NAME_RULE)."""
    return _TOOL_NAME.fullmatch(name) is not None


def require_name(value: object, name: str, limit: int) -> None:
    """Refuse a name a gated call is filed under (agent, session, call id): missing, too long, or
    holding what would hide in the inbox and the run lists (InvalidInput naming it)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} is required", field=name)
    if len(value) > limit:
        raise InvalidInput(f"{name} is longer than {limit} characters", field=name)
    with unsafe_text_refused():
        text.require_plain_name(value, field=name)


def _validate(request: GateRequest) -> None:
    for name, limit in (("agent", MAX_NAME_CHARS), ("session", MAX_SESSION_CHARS), ("call_id", MAX_SESSION_CHARS)):
        require_name(getattr(request, name), name, limit)
    if not is_tool_name(request.tool or ""):
        raise InvalidInput(TOOL_NAME_RULE, field="tool")
    if not isinstance(request.arguments, dict):
        raise InvalidInput("arguments must be a JSON object", field="arguments")
    if not isinstance(request.metadata, dict):
        raise InvalidInput("metadata must be a JSON object", field="metadata")
    if len(request.description) > MAX_DESCRIPTION_CHARS:
        raise InvalidInput(f"description is longer than {MAX_DESCRIPTION_CHARS} characters", field="description")
    with unsafe_text_refused():
        for name in ("arguments", "description", "metadata"):
            text.require_clean(getattr(request, name), field=name)


def _session_run(owner: str, request: GateRequest) -> Run:
    run_id = gateway_ids.run_id(owner=owner, agent=request.agent, session=request.session)
    run, _ = Run.objects.get_or_create(
        id=run_id,
        defaults={
            "kind": Run.Kind.EXTERNAL,
            "agent": request.agent,
            "input": request.session,
            "created_by": owner,
            # Never driven by a worker: running without a lease is what the sweeper leaves alone.
            "status": Run.Status.RUNNING,
            "auto_resume": False,
        },
    )
    if run.created_by != owner:  # the id derives from the name: an account that had it before, since renamed or deleted
        raise Conflict(
            f"session {request.session!r} of {request.agent!r} was begun by an account that had this name before: "
            "a new session needs a new session id",
            code="session_of_another_account",
            field="session",
        )
    return run


def _planned(call_id: str, request: GateRequest, verdict: Verdict) -> PlannedCall:
    """Classify the call as the runtime's planner does; a person's decision is always a suspend approval."""
    if verdict.action == "deny":
        output = {"ok": False, "error": verdict.reason or "denied by the policy", "code": "POLICY_DENIED"}
        status = ToolCall.Status.REJECTED
        return PlannedCall(call_id, request.tool, request.arguments, status, output=output, verdict=verdict)
    if verdict.action == "allow":
        automatic = verdict if verdict.automatic else None
        return PlannedCall(call_id, request.tool, request.arguments, ToolCall.Status.PROPOSED, verdict=automatic)
    if verdict.action == "schedule":  # as the driver plans it: its time (the deadline) runs it; a time past, now
        expires_at = verdict.held_until(timezone.now())
        if expires_at is None:
            return PlannedCall(call_id, request.tool, request.arguments, ToolCall.Status.PROPOSED)
    else:
        expires_at = timezone.now() + timedelta(seconds=verdict.timeout_seconds) if verdict.timeout_seconds else None
    return PlannedCall(
        call_id,
        request.tool,
        request.arguments,
        ToolCall.Status.AWAITING_APPROVAL,
        hitl_mode=Approval.Mode.SUSPEND,  # a deferred approval would have a worker run the call
        expires_at=expires_at,
        verdict=verdict,
    )


def _record(run: Run, call_id: str, request: GateRequest, verdict: Verdict) -> None:
    """Write the call, its approval (asked, or decided by a rule) and its events; refuse one for an ended run."""
    call = _planned(call_id, request, verdict)
    # A compare-and-set under the run's row lock, which run_cancel takes too: a cancel that
    # commits first is seen here, and one that comes second sees (and stops) this call.
    if not Run.objects.filter(pk=run.pk).exclude(status__in=Run.TERMINAL).update(steps=F("steps") + 1):
        status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
        raise NotClaimable(
            f"session {request.session!r} was {status}: it takes no new calls (use another session)",
            code=f"run_{status}",
            state=status,
        )
    step = Run.objects.values_list("steps", flat=True).get(pk=run.pk)
    row = ToolCall(
        run_id=run.pk,
        call_id=call_id,
        step=step,
        name=call.name,
        arguments=call.arguments,
        status=call.status,
        hitl_mode=call.hitl_mode,
        result=call.output,
    )
    row.save(force_insert=True)
    asked = {"description": request.description, "metadata": request.metadata, "external_call_id": request.call_id}
    if call.hitl_mode:
        approval = _approval(row, mode=call.hitl_mode, request=None, expires_at=call.expires_at, verdict=verdict)
        approval.save(force_insert=True)
        _schedule_deadlines([approval])
        notify.announce("approval.required", approval.pk)  # on commit, as a pause of a run agentfast drives
        type, data = _approval_required(row, request=None, suspended=False, verdict=verdict)
        items = [(type, {**data, "external": asked})]
    else:
        items = [(RunEvent.Type.TOOL_CALL, {**_call_data(row), **_policy_data(call.verdict), "external": asked})]
    _record_automatic([row], [call])
    if call.output is not None:
        items.append(_result_event(row, call.output))
    events.record(run_id=run.pk, last_seq=events.reserve(run_id=run.pk, count=len(items)), items=items)


def _repeat(owner: str, existing: ToolCall, request: GateRequest) -> GateAnswer:
    if existing.name != request.tool or not _same_json(existing.arguments, request.arguments):
        raise Conflict(
            f"call {request.call_id!r} of session {request.session!r} was gated with other "
            "arguments: a new call needs a new call_id",
            code="arguments_changed",
            field="arguments",
        )
    answer = _answer(owner, ToolCall.objects.select_related("run").get(pk=existing.pk))
    return GateAnswer(**{**answer.__dict__, "repeated": True})


def _same_json(stored: Any, given: Any) -> bool:
    """Return whether a stored JSON value is the one given, as JSON means it.

    PostgreSQL's jsonb keeps 1e+23 as the integer 100000000000000000000000, which Python's
    == finds unequal to the float; and == finds true equal to 1, which JSON does not.
    """
    if isinstance(stored, bool) or isinstance(given, bool):
        return type(stored) is type(given) and stored == given
    if isinstance(stored, int | float) and isinstance(given, int | float):
        try:
            return (
                float(stored) == float(given)
                if isinstance(stored, float) or isinstance(given, float)
                else stored == given
            )
        except OverflowError:  # an integer beyond any float cannot be the float given
            return False
    if isinstance(stored, dict) and isinstance(given, dict):
        return stored.keys() == given.keys() and all(_same_json(stored[key], given[key]) for key in stored)
    if isinstance(stored, list) and isinstance(given, list):
        return len(stored) == len(given) and all(map(_same_json, stored, given))
    return type(stored) is type(given) and stored == given


def _answer(owner: str, call: ToolCall) -> GateAnswer:
    found = external_call_get(owner=owner, approval_id=_approval_id_of(call))
    approval, decision = found.approval, found.decision
    rule = approval.rule if approval is not None else ""
    if decision == "expired" and found.stopped:
        reason = f"the run was {found.call.run.status}"
    else:
        reason = approval.note if approval is not None and decision != "pending" else ""
    return GateAnswer(decision, found.approval_id, reason, rule, found.idempotency_key, found.call.run_id)


def _approval_id_of(call: ToolCall) -> str:
    from agents import ids

    return ids.approval_id(call.run_id, call.call_id)


def external_call_claim(*, owner: str, approval_id: str) -> Claim:
    """Hand the execution of an allowed or approved call to exactly one caller (ToolCall.executed_at's compare-and-set).

    Every other caller is told the call's state and, once reported, its result. A call
    nobody may run (pending, rejected, expired, denied) raises NotClaimable with its state.
    """
    found = external_call_get(owner=owner, approval_id=approval_id)
    approval = found.approval
    if approval is not None and approval.status not in _EXECUTABLE:
        state = found.decision
        raise NotClaimable(f"approval {approval_id} is {state}: it may not run", code=f"approval_{state}", state=state)
    if found.stopped:  # answered "expired" when gated again
        status = found.call.run.status
        raise NotClaimable(
            f"the run of approval {approval_id} was {status}: it may not run", code=f"run_{status}", state="expired"
        )
    if toolcall_claim(tool_call=found.call):
        arguments = approval.arguments if approval is not None and approval.arguments is not None else None
        to_run = arguments if arguments is not None else found.call.arguments
        return Claim(
            claimed=True, state=ToolCall.Status.RUNNING, arguments=to_run, idempotency_key=found.idempotency_key
        )
    call = ToolCall.objects.get(pk=found.call.pk)
    return Claim(claimed=False, state=call.status, idempotency_key=found.idempotency_key, result=call.result)


def external_call_report(
    *, owner: str, approval_id: str, ok: bool, result: Any = None, error: str = ""
) -> tuple[dict[str, Any], bool]:
    """Store the outcome of a claimed call once; return it and whether this request stored it.

    The same outcome again is answered as stored; a different one raises Conflict. A result
    for a call marked in doubt is still taken: whoever ran it knows best what happened.
    What cannot be stored (NUL, a lone surrogate, NaN, nesting too deep) is repaired as a
    built-in tool's result is, never refused: the call ran, and refusing would lose its result.
    """
    result, error = text.repair(result), text.repair(error)[:MAX_ERROR_CHARS]
    found = external_call_get(owner=owner, approval_id=approval_id)
    output = {"ok": True, "result": result} if ok else {"ok": False, "error": error, "result": result}
    if ok and error:  # a success that says something went wrong (a warning, a partial result): kept as said
        output["error"] = error
    status = ToolCall.Status.SUCCEEDED if ok else ToolCall.Status.FAILED
    with transaction.atomic():
        stored = ToolCall.objects.filter(pk=found.call.pk, executed_at__isnull=False, result__isnull=True).update(
            status=status, result=output, executed_arguments=_executed_arguments(found)
        )
        if stored:
            type, data = _result_event(found.call, output)
            events.publish(run_id=found.call.run_id, type=type, data=data)
            return output, True
    call = ToolCall.objects.get(pk=found.call.pk)
    if call.executed_at is None:
        raise NotClaimable(f"approval {approval_id} was never claimed: claim it before running it", code="not_claimed")
    if not _same_json(call.result, output):
        raise Conflict(f"approval {approval_id} already has another result", code="result_conflict", stored=call.result)
    return output, False


def _executed_arguments(found: ExternalCall) -> dict[str, Any] | None:
    edited = found.approval.arguments if found.approval is not None else None
    return edited if edited is not None else found.call.arguments


def external_claims_mark_in_doubt() -> list[int]:
    """Mark external calls claimed longer ago than the lease with no result: in doubt, never handed out again."""
    lease = timedelta(seconds=settings.AGENTFAST_EXTERNAL_CLAIM_SECONDS)
    stale = ToolCall.objects.filter(
        run__kind=Run.Kind.EXTERNAL, result__isnull=True, executed_at__lt=timezone.now() - lease
    ).exclude(status=ToolCall.Status.IN_DOUBT)
    return [call.pk for call in stale if toolcall_mark_in_doubt(tool_call=call)]
