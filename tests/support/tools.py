"""Tools only the tests use: they let a test stop a worker at an exact point."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agents import services
from agents.tools import ToolContext, feedback_required, run_at, tool


@tool
def charge_card(ctx: ToolContext, customer: str, amount_cents: int) -> dict[str, Any]:
    """Charge a customer's card; with MARKER_DIR set, pause after the effect (crash tests)."""
    services.sideeffect_record(
        tool="charge_card",
        idempotency_key=ctx.idempotency_key,
        arguments={"customer": customer, "amount_cents": amount_cents},
    )
    marker_dir = os.environ.get("AGENTFAST_TEST_MARKER_DIR")
    if marker_dir:
        # The effect is committed but its result is not: a kill now leaves the claim in doubt.
        Path(marker_dir, f"{ctx.tool_call_id}.effect").touch()
        time.sleep(float(os.environ.get("AGENTFAST_TEST_TOOL_SLEEP", "0")))
    return {"charged": amount_cents, "customer": customer}


@tool
def explode(ctx: ToolContext, reason: str) -> dict[str, Any]:
    """Raise an unexpected exception (a buggy tool)."""
    raise RuntimeError(reason)


@tool
def charge_after_hours(ctx: ToolContext, customer: str, not_before: str) -> dict[str, Any]:
    """Charge a customer's card, but not before a time (ISO 8601): the run waits until then."""
    run_at(datetime.fromisoformat(not_before))
    services.sideeffect_record(
        tool="charge_after_hours", idempotency_key=ctx.idempotency_key, arguments={"c": customer}
    )
    return {"charged": customer}


@tool
def ship_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Ship an order on the day a person names: ask while no approval came with the call, as ask_human does."""
    if ctx.approval_id is None:
        feedback_required({"question": f"On which day should {order_id} ship?", "answer": "text"})
    answer = str((ctx.approval_payload or {}).get("answer") or "")
    services.sideeffect_record(
        tool="ship_order", idempotency_key=ctx.idempotency_key, arguments={"order_id": order_id, "answer": answer}
    )
    return {"order_id": order_id, "answer": answer}


@tool
def pack_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Pack an order in the box a person names: ask until an answer comes with the call."""
    if not ctx.approval_payload:
        feedback_required({"question": f"Which box for {order_id}?", "answer": "text"})
    answer = str(ctx.approval_payload.get("answer") or "")
    services.sideeffect_record(
        tool="pack_order", idempotency_key=ctx.idempotency_key, arguments={"order_id": order_id, "answer": answer}
    )
    return {"order_id": order_id, "answer": answer}


@tool
def keep_asking(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Ask about an order whatever the answer was (a tool that never settles)."""
    feedback_required({"question": f"Anything else about {order_id}?", "answer": "text"})
