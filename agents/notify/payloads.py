"""What an event says about an approval, in plain words and as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from agents.gateway.selectors import external_request
from agents.models import Approval, Run

# The events about a call that still waits for a person: their messages offer a decision.
WAITING = ("approval.required", "approval.reminder", "approval.escalated")


def base_url() -> str:
    return settings.AGENTFAST_BASE_URL.rstrip("/")


def approval_url(approval_id: str) -> str:
    return f"{base_url()}/approvals/{approval_id}"


def event(event_type: str, approval: Approval) -> dict[str, Any]:
    """Return the JSON body of an event: its type, when, and the approval as it stands."""
    run = approval.run
    return {
        "type": event_type,
        "timestamp": timezone.now().isoformat(),
        "data": {
            "approval_id": approval.id,
            "run_id": run.id,
            "agent": run.agent,
            "tool": approval.tool,
            # What a decision now approves (a quorum vote's edit, else the model's), and its digest:
            # a link or button must never approve arguments other than those its message showed.
            "arguments": approval.current_arguments,
            "arguments_digest": approval.digest,
            "prompt": run.input[:2000],
            # An external agent's words for what the call does (its gate request's description), or "".
            "description": _description(approval, run),
            "requested_by": run.created_by,
            "status": approval.status,
            "decided_by": approval.decided_by,
            "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
            "note": approval.note,
            "request": approval.request,  # what the tool asked itself (feedback_required), or None
            "url": approval_url(approval.id),
        },
    }


def _description(approval: Approval, run: Run) -> str:
    if run.kind != Run.Kind.EXTERNAL:
        return ""
    return str(external_request(approval.id, run.id).get("description") or "")[:2000]


def one_line(text: str, *, limit: int = 0) -> str:
    """Return the text on one line (every run of whitespace one space), cut to `limit` characters with "…".

    Python's whitespace includes the separators some mail readers and Slack break lines at
    (U+0085, U+2028, U+2029), which a JSON string keeps as they are.
    """
    line = " ".join(text.split())
    return line[: limit - 1] + "…" if limit and len(line) > limit else line


# JSON leaves these unescaped (they are not control characters), yet a mail reader or Slack may
# start a line at each: arguments could lay out an "Approve: <link>" line of their own.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def arguments_json(arguments: Any, *, indent: int | None = None) -> str:
    """Return arguments as JSON for people to read: the same values, every line break written as an escape."""
    return json.dumps(arguments, indent=indent, ensure_ascii=False).translate(_LINE_BREAKS)


def headline(payload: dict[str, Any]) -> str:
    """Return one line saying what happened (a recorded name or note may hold line breaks: they become spaces)."""
    data, kind = payload["data"], payload["type"]
    names = {key: one_line(str(data.get(key) or "")) for key in ("decided_by", "note")}
    data = {**data, **names}
    if kind == "approval.decided":
        return f"{data['tool']} was {data['status']} by {data['decided_by'] or 'the system'}"
    if kind == "approval.expired" and data.get("decided_by") not in (None, "", "system"):
        # Ended by a person (a cancelled run, agents.services.runs.run_cancel), not by its deadline.
        return f"{data['tool']} will not run: {data['note'] or 'it was withdrawn'} by {data['decided_by']}"
    if kind == "approval.expired":
        return f"{data['tool']} expired without a decision"
    if kind == "approval.reminder":
        return f"Reminder: {data['tool']} still waits for a decision"
    if kind == "approval.escalated":
        return f"Escalated: {data['tool']} needs your decision"
    return f"{data['tool']} needs a decision"


def asks_answer(payload: dict[str, Any]) -> bool:
    """Return whether the event asks a person to answer a tool's question, which only its page can take."""
    # .get: a delivery stored before payloads carried the request is retried as it was stored.
    return payload["type"] in WAITING and payload["data"].get("request") is not None


def click_decisions(payload: dict[str, Any]) -> tuple[str, ...]:
    """Return the decisions one click may make: none once decided, only a rejection of a question."""
    if payload["type"] not in WAITING:
        return ()
    # Approving a question needs the reviewer's answer: a button or link could only be refused.
    return ("rejected",) if asks_answer(payload) else ("approved", "rejected")
