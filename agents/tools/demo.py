"""Demo tools of the `support` agent; the ones with effects write the SideEffect journal."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from pydantic import Field

from agents import services
from agents.tools.registry import ToolContext, ToolError, feedback_required, tool

# Demo orders A1001–A1010; every total is at least 50.00 USD, and A1010 is a large order
# (2,500.00) so that the policy tour can try a refund above 1,000.00.
ORDERS: dict[str, dict[str, Any]] = {
    f"A{1000 + n}": {
        "order_id": f"A{1000 + n}",
        "customer": f"customer{n}@example.com",
        "total_cents": 250_000 if n == 10 else 5000 + 1250 * (n - 1),
        "currency": "USD",
        "status": "delivered",
    }
    for n in range(1, 11)
}


def _reference(prefix: str, idempotency_key: str) -> str:
    # Derived from the key so a retried call would name the same refund or email.
    return f"{prefix}_{hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]}"


@tool(summary="Look up order {order_id}")
def lookup_order(
    ctx: ToolContext, order_id: Annotated[str, Field(description="Order id, e.g. A1001")]
) -> dict[str, Any]:
    """Look up an order: its customer, total and status."""
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        raise ToolError(f"No order {order_id!r}; demo orders are A1001 to A1010.", code="NOT_FOUND")
    return dict(order)


def _refund_is_possible(order_id: str, amount_cents: int) -> None:
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        raise ToolError(f"No order {order_id!r}; demo orders are A1001 to A1010.", code="NOT_FOUND")
    if not 0 < amount_cents <= order["total_cents"]:
        raise ToolError(
            f"amount_cents must be above 0 and at most the order total {order['total_cents']}, not {amount_cents}.",
            code="CHECK_FAILED",
        )


@tool(check=_refund_is_possible, summary="Refund {amount_cents|money} on {order_id}")
def refund_request(
    ctx: ToolContext,
    order_id: Annotated[str, Field(description="Order id, e.g. A1001")],
    amount_cents: Annotated[int, Field(description="Amount to refund, in cents")],
) -> dict[str, Any]:
    """Refund part or all of an order to the customer's card."""
    order_id = order_id.strip().upper()
    services.sideeffect_record(
        tool="refund_request",
        idempotency_key=ctx.idempotency_key,
        arguments={"order_id": order_id, "amount_cents": amount_cents},
    )
    return {
        "refund_id": _reference("rf", ctx.idempotency_key),
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "USD",
    }


@tool(summary="Email {to}: {subject}")
def send_email(
    ctx: ToolContext,
    to: Annotated[str, Field(description="Recipient address")],
    subject: Annotated[str, Field(description="Subject line")],
    body: Annotated[str, Field(description="Plain-text body")],
) -> dict[str, Any]:
    """Send an email to a customer."""
    if "@" not in to:
        raise ToolError(f"{to!r} is not an email address.", code="INVALID_ADDRESS")
    services.sideeffect_record(
        tool="send_email",
        idempotency_key=ctx.idempotency_key,
        arguments={"to": to, "subject": subject, "body": body},
    )
    return {"message_id": _reference("msg", ctx.idempotency_key), "to": to, "status": "sent"}


@tool(summary="Ask: {question}")
def ask_human(
    ctx: ToolContext, question: Annotated[str, Field(description="The question for a person")]
) -> dict[str, Any]:
    """Ask a person a question and wait for their answer."""
    if ctx.approval_id is None:
        feedback_required({"question": question, "answer": "text"})
    # Only a person's own words are an answer: approving without one is refused upstream,
    # and a decision that carries none (a deadline's) is told as such, never as "yes".
    answer = str((ctx.approval_payload or {}).get("answer") or "").strip()
    if not answer:
        raise ToolError("Nobody answered the question.", code="NO_ANSWER")
    return {"question": question, "answer": answer}
