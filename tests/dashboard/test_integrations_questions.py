"""A tool's question in mail and Slack: no one-click Approve (it needs an answer), a link to answer it instead."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core import mail, signing
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry, arguments_digest
from agents.notify import channels, dispatch
from agents.notify.models import Delivery, OneClickLink
from agents.services import notify as notify_services
from tests.dashboard.test_integrations_slack import SIGNING_SECRET, _body, _post, _signed
from tests.support.flows import pending, start
from tests.support.receiver import Receiver

QUESTION = "Ask a human whether to expedite order A1003"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, ask_human]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: email
    to: [erin]
    events: [approval.required]
    one_click: true
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
    events: [approval.required]
"""


@pytest.fixture
def chat(settings, agent_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> Callable[[], Receiver]:
    """Mail to erin and a local server standing for Slack; return a way to start it."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.AGENTFAST_SLACK_SIGNING_SECRET = SIGNING_SECRET
    agent_config(CONFIG)
    servers: list[Receiver] = []

    def started() -> Receiver:
        server = Receiver().start()
        servers.append(server)
        monkeypatch.setenv("TEST_SLACK_WEBHOOK", server.url)
        return server

    yield started
    for server in servers:
        server.stop()


@pytest.fixture
def erin(db: None) -> User:
    """A reviewer with an email address and a Slack account."""
    user, _ = services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")
    notify_services.slacklink_set(username="erin", slack_id="UERIN1")
    return user


def _asked(capture: Callable[..., object]) -> Approval:
    """Pause on ask_human and send its mail and Slack message."""
    with capture(execute=True):
        [question] = pending(start(QUESTION))
    assert question.request is not None
    for delivery in Delivery.objects.filter(status="pending"):
        assert dispatch.send(delivery.pk) == "delivered", delivery.last_error
    return question


def _old_approve_link(approval: Approval, username: str) -> str:
    """Return an Approve link as mails carried them for questions before they stopped offering one."""
    nonce = notify_services.oneclick_issue(approval_id=approval.id, username=username)
    claims = {
        "a": approval.id,
        "u": username,
        "d": arguments_digest(approval.tool_call.arguments),
        "n": nonce,
        "k": "approved",
    }
    return "/integrations/email/" + signing.dumps(claims, salt=channels.ONE_CLICK_SALT)


def test_it_mails_a_question_with_a_link_to_answer_it_and_no_approve_link(
    chat, erin, django_capture_on_commit_callbacks
):
    chat()
    question = _asked(django_capture_on_commit_callbacks)
    [message] = mail.outbox
    page = f"http://localhost:8321/approvals/{question.id}"

    assert "Should we expedite order A1003?" in message.body
    assert f"Answer it in agentfast: {page}" in message.body
    assert "Approve:" not in message.body
    html = message.alternatives[0][0]
    assert f'<a href="{page}">Answer it in agentfast</a>' in html and ">Approve</a>" not in html

    # Declining to answer still takes one click (and its confirmation).
    [reject] = re.findall(r"Reject: +http://localhost:8321(/integrations/email/\S+)", message.body)
    client = Client(enforce_csrf_checks=True)
    confirm = client.get(reject)
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content).group(1).decode()
    assert client.post(reject, {"csrfmiddlewaretoken": token}).status_code == 200
    question.refresh_from_db()
    assert (question.status, question.decided_by) == ("rejected", "erin")


def test_it_answers_an_old_approve_link_of_a_question_with_a_page_that_says_where_to_answer(
    chat, erin, django_capture_on_commit_callbacks
):
    chat()
    question = _asked(django_capture_on_commit_callbacks)
    path = _old_approve_link(question, "erin")
    client = Client()

    for response in (client.get(path), client.post(path)):
        content = response.content.decode()
        assert response.status_code == 400, content
        assert "ask_human asked a question" in content and "<form" not in content
        assert f'href="/approvals/{question.id}"' in content

    question.refresh_from_db()
    assert question.status == "pending"
    assert not OneClickLink.objects.filter(used_at__isnull=False).exists()  # nothing spent
    assert not AuditEntry.objects.filter(outcome="decided").exists()


def test_it_posts_a_question_to_slack_with_reject_and_a_link_to_answer_it(
    chat, erin, django_capture_on_commit_callbacks
):
    slack = chat()
    question = _asked(django_capture_on_commit_callbacks)
    [message] = slack.received

    actions = next(block for block in message.body["blocks"] if block["type"] == "actions")
    assert [(b["action_id"], b["value"]) for b in actions["elements"]] == [("rejected", question.id)]
    text = "\n".join(block["text"]["text"] for block in message.body["blocks"] if "text" in block)
    assert f"<http://localhost:8321/approvals/{question.id}|Answer it in agentfast>" in text
    assert "Should we expedite order A1003?" in text

    # A press of Approve on a message posted before (it had the button) is told why, and decides nothing.
    body = _body(question.id, "approved", "UERIN1", slack.url)
    answer = _post(body, _signed(body), django_capture_on_commit_callbacks)
    assert answer.status_code == 200 and "asked a question" in answer.json()["text"]
    assert Approval.objects.get(pk=question.pk).status == "pending"
    assert not Delivery.objects.filter(kind="slack_response").exists()
