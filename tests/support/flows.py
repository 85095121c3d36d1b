"""Helpers that build state through the project's own services, as users would."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from agents import runtime, services
from agents.models import Approval, Message, Run
from tests.support.fake_openai import Reply, tool_messages

# On PostgreSQL the audit export reads its batches on two connections of their own, which see
# only committed rows: a test of what it contains commits its data (a transactional test).
EXPORT_READS_COMMITTED = pytest.mark.django_db(transaction=True)


def start(prompt: str, *, agent: str = "support", auto_resume: bool = True) -> Run:
    """Create a run and drive it in this process until it pauses or finishes."""
    run = services.run_create(agent=agent, input=prompt, created_by="bob", auto_resume=auto_resume, enqueue=False)
    runtime.drive(run.id, stream=False)
    run.refresh_from_db()
    return run


def resume(run: Run) -> Run:
    runtime.drive(run.id, stream=False)
    run.refresh_from_db()
    return run


def decide(approval: Approval | str, decision: str, *, by: str = "alice", **fields: Any) -> services.Decision:
    approval_id = approval if isinstance(approval, str) else approval.id
    attempt = services.Attempt(actor=by, source="cli", origin="tests")
    return services.approval_decide(approval_id=approval_id, decision=decision, attempt=attempt, **fields)


def pending(run: Run) -> list[Approval]:
    return list(Approval.objects.filter(run=run, status=Approval.Status.PENDING).order_by("created_at", "id"))


def tool_outputs(run: Run) -> list[dict[str, Any]]:
    """Return the tool outputs the model read, in order."""
    return [json.loads(m.content) for m in Message.objects.filter(run=run, role=Message.Role.TOOL).order_by("seq")]


def roles(run: Run) -> list[str]:
    return list(Message.objects.filter(run=run).order_by("seq").values_list("role", flat=True))


def charge_later(not_before: datetime) -> Callable[[dict[str, Any]], Reply]:
    """Return a model script: charge c1 with charge_after_hours (a test tool) not before that time, then say done."""

    def respond(body: dict[str, Any]) -> Reply:
        if not tool_messages(body):
            arguments = {"customer": "c1", "not_before": not_before.isoformat()}
            return Reply(tool_calls=[("call_later", "charge_after_hours", json.dumps(arguments))])
        return Reply(content="done")

    return respond
