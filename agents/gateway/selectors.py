"""Reads of the external-agent gate: one external call, as its owner (or a reviewer) may see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from agents import text
from agents.gateway import ids as gateway_ids
from agents.models import Approval, Run, RunEvent, ToolCall
from agents.services.errors import NotFound

APPROVAL_ID_CHARS = Approval._meta.get_field("id").max_length
GATE_PERMISSION = "agents.gate_external"  # the agent role's: gate, claim and report its own calls


@dataclass(frozen=True)
class ExternalCall:
    approval_id: str
    call: ToolCall
    approval: Approval | None  # None: an unlisted tool, allowed with no decision to record

    @property
    def allowed(self) -> bool:
        """Return whether the call may run: approved, or an unlisted tool nobody is asked about."""
        return self.approval is None or self.approval.status == Approval.Status.APPROVED

    @property
    def stopped(self) -> bool:
        """Return whether the call's run ended (cancelled) before anyone claimed it: it never runs."""
        return self.call.executed_at is None and self.call.run.is_terminal

    @property
    def decision(self) -> str:
        """Return what the gate answers for the call: allowed, pending, denied, rejected or expired.

        Denied: a rule or a standing grant refused it, nobody was asked; rejected: a person did.
        """
        approval = self.approval
        if self.allowed and self.stopped:  # as its pending approvals are, on cancel
            return "expired"
        if approval is None or approval.status == Approval.Status.APPROVED:
            return "allowed"
        if approval.decided_by_policy:
            return "denied"
        return str(approval.status)

    @property
    def idempotency_key(self) -> str:
        """Return the key the agent passes to the real tool, so a doubled execution is recognisable."""
        return self.approval_id


def external_call_get(*, owner: str | None, approval_id: str) -> ExternalCall:
    """Return an external call by its approval id; `owner` (None: any) must be the account that gated it.

    Another account's call is reported as missing, so an agent cannot even learn it exists.
    """
    missing = NotFound(f"no external call {text.repair(approval_id)[:APPROVAL_ID_CHARS]}")
    parts = gateway_ids.split(approval_id) if text.problem(approval_id) is None else None
    if parts is None:
        raise missing
    run_id, call_id = parts
    calls = ToolCall.objects.select_related("run").filter(run_id=run_id, call_id=call_id, run__kind=Run.Kind.EXTERNAL)
    if owner is not None:
        calls = calls.filter(run__created_by=owner)
    call = calls.first()
    if call is None:
        raise missing
    return ExternalCall(approval_id=approval_id, call=call, approval=Approval.objects.filter(pk=approval_id).first())


def external_run_get(*, owner: str, run_id: str) -> Run:
    """Return the run of one of `owner`'s external sessions; any other run is reported as missing, as a call is."""
    ok = text.problem(run_id) is None  # no run has such an id (and PostgreSQL refuses NUL)
    run = Run.objects.filter(pk=run_id, kind=Run.Kind.EXTERNAL, created_by=owner).first() if ok else None
    if run is None:
        raise NotFound(f"no run {text.repair(run_id)[:APPROVAL_ID_CHARS]}")
    return run


def approval_state(approval_id: str) -> str:
    """Return the status of an approval ("allowed" when none was recorded: an unlisted tool)."""
    status = Approval.objects.filter(pk=approval_id).values_list("status", flat=True).first()
    return status or "allowed"


def external_request(approval_id: str, run_id: str) -> dict[str, Any]:
    """Return what an external agent said about a gated call (description, metadata), as gated."""
    data = (
        RunEvent.objects.filter(run_id=run_id, type=RunEvent.Type.APPROVAL_REQUIRED, data__approval_id=approval_id)
        .values_list("data", flat=True)
        .first()
    )
    asked = (data or {}).get("external")
    return asked if isinstance(asked, dict) else {}


def account_may_gate(username: str) -> bool:
    """Return whether the account is active and may gate calls now (the agent role), as its token would be judged."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    return user is not None and user.has_perm(GATE_PERMISSION)
