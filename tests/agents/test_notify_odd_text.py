"""Notifications of calls whose words nobody here wrote: deep arguments, line separators, names with line breaks.

Every channel is real but Slack's and the webhook receiver's side: a local HTTP server each.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from agents import services
from agents.gateway import services as gateway
from agents.models import Approval
from agents.notify import dispatch
from agents.notify.models import Delivery
from tests.support.flows import decide
from tests.support.reach import mailed_links
from tests.support.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"a test secret of thirty-two bytes").decode()
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: email
    to: [erin]
    one_click: true
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
  - kind: webhook
    url: HOOK_URL
    secret_env: TEST_HOOK_SECRET
"""
FORGED = "\n\nOne-click (each link asks you to confirm, and works once):\n  Approve: https://evil.example/x\n"


@pytest.fixture
def hook() -> Iterator[Receiver]:
    """A receiver of the signed webhook: it checks each request's Standard Webhooks signature."""
    server = Receiver(secret=SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def everywhere(
    settings, chat: Receiver, hook: Receiver, agent_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Receiver:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    monkeypatch.setenv("TEST_SLACK_WEBHOOK", chat.url)
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    agent_config(CONFIG.replace("HOOK_URL", hook.url))
    return chat


@pytest.fixture
def erin(db: None) -> User:
    user, _ = services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")
    services.user_create(username="robot", role="agent")
    return user


def _gated(capture: Callable[..., Any], arguments: dict[str, Any], **fields: str) -> Approval:
    """Gate an external agent's call (it may send any JSON object it likes) and send every notification."""
    request = gateway.GateRequest(
        **{"agent": "billing", "session": "s1", "call_id": "c1", **fields},
        tool="refund_request",
        arguments=arguments,
    )
    with capture(execute=True):
        answer = gateway.gate_call(owner="robot", request=request)
    _send_all()
    return Approval.objects.get(pk=answer.approval_id)


def _send_all() -> None:
    for delivery in Delivery.objects.filter(status="pending"):
        assert dispatch.send(delivery.pk) == "delivered", Delivery.objects.get(pk=delivery.pk).last_error


def _nested(levels: int) -> Any:
    value: Any = "the innermost value"
    for _ in range(levels):
        value = {"k": value}
    return value


def _posted(chat: Receiver) -> dict[str, Any]:
    [message] = [item.body for item in chat.received if item.body.get("blocks")]
    return message


def test_it_sends_arguments_nested_as_deep_as_the_gate_takes_whole_and_their_mailed_link_works(
    everywhere, hook, erin, django_capture_on_commit_callbacks
):
    arguments = {"order_id": "A1001", "deep": _nested(30)}  # 31 levels: the gate takes up to 32
    approval = _gated(django_capture_on_commit_callbacks, arguments)

    # Cut to "(nested too deep)" in the stored payload, the mail's link carried the digest of the
    # cut arguments, and its page said at once that the call had changed since the mail was sent.
    [message] = mail.outbox
    page = Client().get(mailed_links(message)["approved"])
    assert page.status_code == 200 and b"The call changed" not in page.content
    assert "(nested too deep)" not in message.body and "the innermost value" in message.body
    [event] = hook.received
    assert event.verified and event.body["data"]["arguments"] == approval.current_arguments
    assert event.body["data"]["arguments_digest"] == approval.digest
    assert "(nested too deep)" not in json.dumps(_posted(everywhere))


def test_it_keeps_line_separators_in_arguments_from_laying_out_lines_of_their_own(
    everywhere, erin, django_capture_on_commit_callbacks
):
    # JSON escapes \n but not U+2028, U+2029 or U+0085, at which mail readers and Slack may break a line.
    forged = {"note": "ok\u2028\u2028One-click:\u2029  Approve: https://evil.example/x\x85", "amount_cents": 2500}
    _gated(django_capture_on_commit_callbacks, forged)

    [message] = mail.outbox
    approve_lines = [line for line in message.body.splitlines() if line.strip().startswith("Approve:")]
    assert approve_lines == [f"  Approve: http://localhost:8321{mailed_links(message)['approved']}"]
    shown = message.body.split("Arguments:\n", 1)[1].split("\n\n", 1)[0]
    assert json.loads(shown) == forged  # the same values, the separators written as escapes
    html = message.alternatives[0][0]
    assert "\u2028" not in html and "\\u2028" in html
    section = _posted(everywhere)["blocks"][1]["text"]["text"]
    assert not {"\u2028", "\u2029", "\x85"} & set(section) and "\\u2028" in section


def test_it_puts_what_an_agent_wrote_on_one_line_in_slack_and_lets_slack_add_no_links_or_mentions(
    everywhere, erin, django_capture_on_commit_callbacks
):
    said = "Refund it\n\n*refund_request was approved by alice*\nsee https://evil.example/x @here #general"
    _gated(django_capture_on_commit_callbacks, {"order_id": "A1001"}, description=said, agent="bil\u2028ling")

    message = _posted(everywhere)
    call = message["blocks"][1]["text"]["text"]
    # One line: the agent's words cannot pass for the message's own line saying who approved.
    assert (
        "What it does, in the agent's words: Refund it *refund_request was approved by alice* "
        "see https://evil.example/x @here #general\n"
    ) in call
    sections = [block["text"] for block in message["blocks"] if block["type"] == "section"]
    assert sections and all(text["verbatim"] is True for text in sections)  # no link, channel or mention added
    [mailed] = mail.outbox  # an agent's name may hold U+2028 (a separator, not a control character)
    [run_line] = [line for line in mailed.body.splitlines() if line.startswith("Run ")]
    assert run_line.endswith("(agent bil ling), asked by robot:")


def test_it_mails_and_posts_a_name_with_line_breaks_on_one_line_everywhere_it_shows(
    everywhere, erin, django_capture_on_commit_callbacks
):
    approval = _gated(django_capture_on_commit_callbacks, {"order_id": "A1001"})
    mail.outbox.clear()
    everywhere.received.clear()
    # The CLI's --by keeps any name for a call open to every reviewer: a pasted one may hold line breaks.
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "approved", by="ops" + FORGED)
    _send_all()

    [message] = mail.outbox
    lines = message.body.splitlines()
    assert not [line for line in lines if line.strip().startswith(("Approve:", "One-click"))]
    one_line = "ops One-click (each link asks you to confirm, and works once): Approve: https://evil.example/x"
    assert lines[0] == f"refund_request was approved by {one_line}"
    assert f"Status: approved by {one_line}" in lines
    assert message.subject == f"[agentfast] refund_request was approved by {one_line}"
    [posted] = [item.body for item in everywhere.received]
    assert "\n" not in posted["text"] and "\n" not in posted["blocks"][0]["text"]["text"]


def test_it_says_on_one_line_which_decision_superseded_a_message(everywhere, erin, django_capture_on_commit_callbacks):
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="refund_request", arguments={"order_id": "A1001"}
    )
    with django_capture_on_commit_callbacks(execute=True):
        answer = gateway.gate_call(owner="robot", request=request)
    with django_capture_on_commit_callbacks(execute=True):
        decide(answer.approval_id, "approved", by="ops\r\nand more")
    asking = Delivery.objects.get(kind="email", event_type="approval.required")

    assert dispatch.send(asking.pk) == "superseded"
    assert Delivery.objects.get(pk=asking.pk).last_error == (
        "not sent: the call was approved by ops and more before this message went out"
    )
