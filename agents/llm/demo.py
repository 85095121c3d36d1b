"""The built-in demo model: deterministic, offline, and open about being a script.

It reads the conversation the way a tool-calling model would (the task, then the tool
results of its last turn, or a reviewer's feedback) and answers from a few rules, so that
every approval flow can be tried on a fresh machine without an API key.
"""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from agents.llm.base import AssistantTurn, DeltaSink, ProposedCall

_ORDER = r"[A-Za-z]\d{3,}"
_AMOUNT = r"\$?\s*((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d{1,2})?)"  # 5.00, 1500.00 or 1,500.00
_REFUND = re.compile(
    rf"\brefund\s+orders?\s+((?:{_ORDER})(?:\s*(?:,|and)\s*{_ORDER})*)\s+for\s+{_AMOUNT}", re.IGNORECASE
)
_EMAIL = re.compile(r"\bemail\s+([^\s@]+@[^\s@]+\.[^\s,]+)\s+that\s+(.+)", re.IGNORECASE | re.DOTALL)
_ASK = re.compile(r"\bask\s+(?:a\s+)?(?:human|person|someone)\s+(.+)", re.IGNORECASE | re.DOTALL)
_FEEDBACK_AMOUNT = re.compile(_AMOUNT)

CAPABILITIES = (
    "I am agentfast's built-in demo model: a short script, not a real language model, so I "
    "only understand a few requests. Try one of these:\n"
    "- Refund order A1001 for 25.00 USD\n"
    "- Refund orders A1001 and A1002 for 10.00 USD each\n"
    "- Email bob@example.com that his refund is on its way\n"
    "- Ask a human whether to expedite order A1003\n"
    "Configure an OpenAI-compatible model in agentfast.yaml for anything else."
)


class DemoModel:
    name = "demo"

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> AssistantTurn:
        turn = _respond(_Conversation(messages))
        if on_delta is not None and turn.content:
            pause = _token_pause()
            for word in re.findall(r"\S+\s*", turn.content):
                on_delta(word)
                if pause:
                    time.sleep(pause)  # a visible pace: a real model streams a few words at a time
        return turn


def _token_pause() -> float:
    """Return the seconds to wait after each streamed word (AGENTFAST_DEMO_DELAY_MS; 0 in tests and benches)."""
    return max(float(getattr(settings, "AGENTFAST_DEMO_DELAY_MS", 0) or 0), 0.0) / 1000


class _Conversation:
    """What the script needs to know of the message history."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = [m for m in messages if m["role"] != "system"]
        users = [m for m in self.messages if m["role"] == "user"]
        self.task = users[0]["content"] if users else ""
        self.step = sum(1 for m in self.messages if m["role"] == "assistant") + 1

    @property
    def last(self) -> dict[str, Any] | None:
        return self.messages[-1] if self.messages else None

    def last_results(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Return (call, output) pairs of the last assistant turn's tool calls."""
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message["role"] == "assistant" and message.get("tool_calls"):
                outputs = {
                    m["tool_call_id"]: _loads(m["content"]) for m in self.messages[index + 1 :] if m["role"] == "tool"
                }
                return [(call, outputs.get(call["id"], {})) for call in message["tool_calls"]]
        return []

    def call(self, index: int, name: str, arguments: dict[str, Any]) -> ProposedCall:
        return ProposedCall(id=f"call_{self.step}_{index}", name=name, arguments=json.dumps(arguments))


def _respond(convo: _Conversation) -> AssistantTurn:
    last = convo.last
    if last is None:
        return AssistantTurn(content=CAPABILITIES)
    if last["role"] == "user" and last["content"] != convo.task:
        return _after_feedback(convo, last["content"])
    if last["role"] == "user":
        return _start(convo)
    return _after_results(convo)


def _start(convo: _Conversation) -> AssistantTurn:
    if match := _REFUND.search(convo.task):
        orders = re.findall(_ORDER, match.group(1))
        cents = _cents(match.group(2))
        if len(orders) == 1:
            return AssistantTurn(
                content=f"Let me look up order {orders[0].upper()} first.",
                tool_calls=[convo.call(1, "lookup_order", {"order_id": orders[0].upper()})],
            )
        calls = [
            convo.call(i, "refund_request", {"order_id": order.upper(), "amount_cents": cents})
            for i, order in enumerate(orders, start=1)
        ]
        return AssistantTurn(tool_calls=calls)
    if match := _EMAIL.search(convo.task):
        to, body = match.group(1), match.group(2).strip()
        arguments = {"to": to, "subject": "A message from support", "body": body}
        return AssistantTurn(tool_calls=[convo.call(1, "send_email", arguments)])
    if match := _ASK.search(convo.task):
        question = match.group(1).strip().rstrip(".?")
        if question.lower().startswith("whether to "):
            question = "Should we " + question[len("whether to ") :]
        return AssistantTurn(tool_calls=[convo.call(1, "ask_human", {"question": question + "?"})])
    return AssistantTurn(content=CAPABILITIES)


def _after_feedback(convo: _Conversation, feedback: str) -> AssistantTurn:
    refund = _REFUND.search(convo.task)
    amount = _FEEDBACK_AMOUNT.search(feedback)
    if refund and amount:
        order = re.findall(_ORDER, refund.group(1))[0].upper()
        arguments = {"order_id": order, "amount_cents": _cents(amount.group(1))}
        return AssistantTurn(
            content=f"Understood. I will ask again with {_money(arguments['amount_cents'])}.",
            tool_calls=[convo.call(1, "refund_request", arguments)],
        )
    return AssistantTurn(content=f"Understood: “{feedback.strip()}”. I have made no change.")


def _after_results(convo: _Conversation) -> AssistantTurn:
    results = convo.last_results()
    if len(results) == 1 and results[0][0]["function"]["name"] == "lookup_order":
        return _after_lookup(convo, results[0][1])
    return AssistantTurn(content=" ".join(_describe(call, output) for call, output in results) or CAPABILITIES)


def _after_lookup(convo: _Conversation, output: dict[str, Any]) -> AssistantTurn:
    refund = _REFUND.search(convo.task)
    if not output.get("ok"):
        return AssistantTurn(content=f"I could not look up the order: {output.get('message', 'unknown error')}")
    if refund is None:
        return AssistantTurn(content=f"Order {output['result']['order_id']}: {json.dumps(output['result'])}")
    order = output["result"]["order_id"]
    arguments = {"order_id": order, "amount_cents": _cents(refund.group(2))}
    return AssistantTurn(tool_calls=[convo.call(1, "refund_request", arguments)])


def _describe(call: dict[str, Any], output: dict[str, Any]) -> str:
    name = call["function"]["name"]
    arguments = _loads(call["function"].get("arguments") or "{}")
    code = output.get("error_code")
    if output.get("status") == "APPROVAL_PENDING":
        target = f" to {arguments['to']}" if name == "send_email" and "to" in arguments else ""
        return f"The {name.replace('_', ' ')}{target} is queued for approval; it will run once a reviewer approves it."
    if code == "APPROVAL_REJECTED":
        return f"I'm sorry, I could not complete {_what(name, arguments)}: {output.get('message', '')}"
    if code == "POLICY_DENIED":
        return f"I may not make {_what(name, arguments)}: {output.get('message', '')}"
    if code == "IN_DOUBT":
        return f"I cannot tell whether {_what(name, arguments)} went through; a person should check before retrying."
    if not output.get("ok"):
        return f"{_what(name, arguments).capitalize()} failed: {output.get('message', 'unknown error')}"
    result = output.get("result") or {}
    edited = " (a reviewer edited the request before it ran)" if output.get("edited_by_human") else ""
    if name == "refund_request":
        amount, order, refund = _money(result.get("amount_cents", 0)), result.get("order_id"), result.get("refund_id")
        return f"Refunded {amount} for order {order} (refund {refund}){edited}."
    if name == "send_email":
        return f"Sent the email to {result.get('to')}{edited}."
    if name == "ask_human":
        return f"A person answered: {result.get('answer')}"
    return f"{name} returned {json.dumps(result)}{edited}."


def _what(name: str, arguments: dict[str, Any]) -> str:
    if name == "refund_request":
        return f"the refund of {_money(arguments.get('amount_cents', 0))} for order {arguments.get('order_id')}"
    if name == "send_email":
        return f"the email to {arguments.get('to')}"
    return f"the call to {name}"


def _cents(amount: str) -> int:
    try:
        return int((Decimal(amount.replace(",", "")) * 100).to_integral_value())
    except InvalidOperation:
        return 0


def _money(cents: Any) -> str:
    try:
        return f"{Decimal(int(cents)) / 100:.2f} USD"
    except (TypeError, ValueError):
        return f"{cents} cents"


def _loads(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
