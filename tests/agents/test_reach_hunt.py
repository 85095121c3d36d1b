"""Reach: mailed links and Slack buttons decide only the arguments their reviewer saw; messages fit Slack."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.http import HttpResponse
from django.test import Client

from agents import services
from agents.models import Approval, SideEffect
from agents.notify import channels, dispatch
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from tests.support.flows import decide, pending, start
from tests.support.reach import confirm_link, mailed_links, slack_signed
from tests.support.receiver import Receiver
from tests.support.threads import started

REFUND = "Refund order A1001 for 25.00 USD"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
QUORUM = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend, quorum: 2}
  send_email: {risk: high, hitl_mode: suspend}
notifications:
  - kind: email
    to: [erin]
    one_click: true
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
"""
EDITED = {"order_id": "A1001", "amount_cents": 4000}


@pytest.fixture
def reach(settings, chat: Receiver, agent_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> Receiver:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.AGENTFAST_SLACK_SIGNING_SECRET = SIGNING_SECRET
    monkeypatch.setenv("TEST_SLACK_WEBHOOK", chat.url)
    agent_config(QUORUM)
    return chat


@pytest.fixture
def erin(db: None) -> User:
    user, _ = services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")
    notify_services.slacklink_set(username="erin", slack_id="UERIN1")
    return user


def _send_all() -> None:
    for delivery in Delivery.objects.filter(status="pending"):
        assert dispatch.send(delivery.pk) == "delivered", Delivery.objects.get(pk=delivery.pk).last_error


def _paused(capture: Callable[..., Any], prompt: str = REFUND) -> Approval:
    with capture(execute=True):
        run = start(prompt)
    _send_all()
    return pending(run)[0]


def _press(message: dict[str, Any], decision: str, slack_id: str, capture: Callable[..., Any]) -> HttpResponse:
    """Press a button of a posted message, as Slack reports it: the action, its block and value."""
    block = next(block for block in message["blocks"] if block["type"] == "actions")
    button = next(element for element in block["elements"] if element["action_id"] == decision)
    action = {"action_id": decision, "block_id": block["block_id"], "value": button["value"], "type": "button"}
    payload = {"type": "block_actions", "user": {"id": slack_id}, "response_url": "", "actions": [action]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    with capture(execute=True):
        return Client().post(
            "/integrations/slack/actions",
            body,
            content_type="application/x-www-form-urlencoded",
            **slack_signed(body, secret=SIGNING_SECRET),
        )


def test_it_refuses_a_mailed_approve_link_once_another_reviewer_edited_the_arguments(
    reach, erin, alice, django_capture_on_commit_callbacks
):
    approval = _paused(django_capture_on_commit_callbacks)
    links = mailed_links(mail.outbox[0])
    # Alice approves 25.00 edited to 40.00: one of the two approvals the quorum needs.
    decide(approval, "approved", by="alice", arguments=EDITED)

    status, content = confirm_link(Client(enforce_csrf_checks=True), links["approved"])

    assert status == 400 and "The call changed since this mail was sent" in content
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not SideEffect.objects.exists()


def test_it_mails_a_reminder_with_the_edited_arguments_and_its_link_approves_them(
    reach, erin, alice, agent_config, django_capture_on_commit_callbacks
):
    agent_config(QUORUM.replace("quorum: 2}", "quorum: 2, remind_every: 1s}"))
    approval = _paused(django_capture_on_commit_callbacks)
    decide(approval, "approved", by="alice", arguments=EDITED)
    Approval.objects.filter(pk=approval.pk).update(
        last_reminded_at=None, created_at=approval.created_at.replace(year=2000)
    )
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert services.approval_remind_due() == 1
    _send_all()

    [reminder] = mail.outbox
    assert '"amount_cents": 4000' in reminder.body  # what an approval now approves, not the model's 2500
    page = Client().get(mailed_links(reminder)["approved"])
    assert page.status_code == 200 and b"4000" in page.content and b"2500" not in page.content
    status, _ = confirm_link(Client(enforce_csrf_checks=True), mailed_links(reminder)["approved"])
    approval.refresh_from_db()
    assert status == 200 and (approval.status, approval.arguments) == ("approved", EDITED)


def test_it_refuses_a_slack_approve_pressed_on_arguments_edited_since_the_message(
    reach, erin, alice, django_capture_on_commit_callbacks
):
    approval = _paused(django_capture_on_commit_callbacks)
    [message] = [item.body for item in reach.received if item.body.get("blocks")]
    decide(approval, "approved", by="alice", arguments=EDITED)

    answer = _press(message, "approved", "UERIN1", django_capture_on_commit_callbacks)

    assert answer.status_code == 200 and "arguments changed" in answer.json()["text"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not SideEffect.objects.exists()


def test_it_still_decides_from_slack_when_the_arguments_are_those_shown(
    reach, erin, alice, django_capture_on_commit_callbacks
):
    approval = _paused(django_capture_on_commit_callbacks)
    [message] = [item.body for item in reach.received if item.body.get("blocks")]
    decide(approval, "approved", by="alice")

    answer = _press(message, "approved", "UERIN1", django_capture_on_commit_callbacks)

    approval.refresh_from_db()
    assert answer.json()["text"] == "refund_request was approved by erin"
    assert approval.status == "approved"


def test_it_keeps_each_slack_section_within_slacks_3000_characters_when_escaping_grows_the_text(
    reach, erin, django_capture_on_commit_callbacks
):
    html = "<p>" + "&lt;b&gt; " * 400 + "</p>"  # a mail body of markup: each < and & grows four- or fivefold
    _paused(django_capture_on_commit_callbacks, prompt=f"Email bob@example.com that {html}")
    [message] = [item.body for item in reach.received if item.body.get("blocks")]
    for block in message["blocks"]:
        if block["type"] == "section":
            text = block["text"]["text"]
            assert len(text) <= 3000
            assert "<" not in text.replace("<http://localhost:8321/approvals/", "")  # still escaped throughout
            assert not re.search(r"&(?!amp;|lt;|gt;)", text)  # no entity cut in half
    assert "Open in agentfast>" in message["blocks"][1]["text"]["text"]  # the link survives the cut


DECIDED = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: email
    to: [erin]
    events: [approval.decided]
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
    events: [approval.decided]
"""


def test_it_mails_and_posts_a_decision_whose_recorded_name_carries_a_line_break_or_slack_markup(
    reach, erin, agent_config, django_capture_on_commit_callbacks
):
    agent_config(DECIDED)
    with django_capture_on_commit_callbacks(execute=True):
        [approval] = pending(start(REFUND))
    # The CLI's --by keeps any name for a call open to every reviewer: a pasted one may hold a line break.
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "approved", by="ops <!channel>\r\nBcc: mallory@example.com")

    _send_all()

    [message] = mail.outbox
    assert "\n" not in message.subject and "\r" not in message.subject
    assert message.subject.startswith("[agentfast] refund_request was approved by ops")
    assert message.to == ["erin@example.com"] and not message.bcc
    [posted] = [item.body for item in reach.received]
    assert "<!channel>" not in json.dumps(posted)  # nobody is paged by a name
    assert "&lt;!channel&gt;" in posted["text"]


def test_it_tells_that_a_call_ended_with_its_cancelled_run_not_that_nobody_decided_in_time(
    reach, erin, agent_config, django_capture_on_commit_callbacks
):
    agent_config(DECIDED.replace("approval.decided", "approval.expired"))
    with django_capture_on_commit_callbacks(execute=True):
        [approval] = pending(start(REFUND))
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run_id=approval.run_id, attempt=services.Attempt(actor="bob", source="cli"))

    _send_all()

    [message] = mail.outbox
    assert message.subject == "[agentfast] refund_request will not run: the run was cancelled by bob"
    assert "expired without a decision" not in json.dumps([item.body for item in reach.received])


SCHEDULED = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request:
    risk: high
    hitl_mode: suspend
    remind_every: 1s
    rules:
      - {name: at night, when: "true", action: schedule, at: "now + duration('9h')"}
notifications:
  - kind: email
    to: [erin]
    one_click: true
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
"""


def test_it_neither_asks_nor_reminds_anyone_to_decide_a_call_that_is_only_scheduled(
    reach, erin, agent_config, django_capture_on_commit_callbacks
):
    agent_config(SCHEDULED)
    with django_capture_on_commit_callbacks(execute=True):
        [approval] = pending(start(REFUND))
    assert approval.on_timeout == Approval.OnTimeout.RUN
    Approval.objects.filter(pk=approval.pk).update(created_at=approval.created_at.replace(year=2000))

    with django_capture_on_commit_callbacks(execute=True):
        reminded = services.approval_remind_due()
    _send_all()

    assert reminded == 0
    assert not mail.outbox and not reach.received  # no "needs a decision", no Approve link, every second for 9 h
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_it_mails_no_call_to_a_named_person_who_is_no_longer_a_reviewer(
    reach, erin, alice, django_capture_on_commit_callbacks
):
    services.user_create(username="gail", role="reviewer", email="gail@example.com")
    erin.groups.clear()  # erin's reviewer role ends: she may no longer read calls, nor decide them
    with django_capture_on_commit_callbacks(execute=True):
        [approval] = pending(start(REFUND))
    Delivery.objects.filter(kind="slack").delete()
    _send_all()
    assert not mail.outbox  # no tool, no arguments, no prompt, no link for her

    erin.groups.add(services.role_groups_ensure()["reviewer"])
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "rejected", by="alice")
    [stored] = Delivery.objects.filter(kind="email", event_type="approval.decided")
    erin.groups.clear()  # between the event and its sending
    assert dispatch.send(stored.pk) == "pending"
    assert not mail.outbox and "no longer a reviewer" in Delivery.objects.get(pk=stored.pk).last_error


@pytest.mark.parametrize("secret", ["whsec_AA==", "whsec_!!not-base64!!", "whsec_" + "c2hvcnQ="])
def test_it_signs_no_webhook_with_a_secret_anyone_could_guess(
    db, secret, agent_config, monkeypatch, django_capture_on_commit_callbacks
):
    server = Receiver(secret=secret).start()
    try:
        monkeypatch.setenv("TEST_WEBHOOK_SECRET", secret)
        agent_config(
            QUORUM.split("notifications:")[0]
            + f"notifications:\n  - kind: webhook\n    url: {server.url}\n    secret_env: TEST_WEBHOOK_SECRET\n"
        )
        with django_capture_on_commit_callbacks(execute=True):
            start(REFUND)
        [delivery] = Delivery.objects.all()
        assert dispatch.send(delivery.pk) == "pending"
        assert not server.received  # a one-byte key is guessed in 256 tries: its signatures prove nothing
        assert (
            "TEST_WEBHOOK_SECRET must hold a whsec_ secret: at least 24 bytes"
            in Delivery.objects.get(pk=delivery.pk).last_error
        )
    finally:
        server.stop()


@pytest.fixture
def silent_smtp() -> Iterator[int]:
    """A mail server that takes the connection and never says a word; it hangs up after 10 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            accepted.append(listener.accept()[0])
            time.sleep(10)
            accepted[0].close()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for connection in accepted:
        connection.close()


def test_it_gives_up_a_mail_attempt_on_a_server_that_never_answers(
    settings, silent_smtp, erin, agent_config, monkeypatch, django_capture_on_commit_callbacks
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent_smtp
    monkeypatch.setattr(channels, "ATTEMPT_SECONDS", 2.0)  # 30 s in production
    agent_config(QUORUM.split("  - kind: slack")[0])
    with django_capture_on_commit_callbacks(execute=True):
        start(REFUND)
    [delivery] = Delivery.objects.all()

    began = time.monotonic()
    status = dispatch.send(delivery.pk)

    # Unbounded, the worker's thread waits as long as the server holds on, and once the claim's
    # minute has passed the sweeper sends the same mail again beside it.
    assert time.monotonic() - began < 8
    assert status == "pending" and "timed out" in Delivery.objects.get(pk=delivery.pk).last_error


class SlowSmtp:
    """A mail server that answers every step correctly, each a little under the client's timeout."""

    def __init__(self, pause: float) -> None:
        self.pause, self.messages = pause, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection = self.listener.accept()[0]
                threading.Thread(target=self._talk, args=(connection,), daemon=True).start()

    def _talk(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as lines:
            self._say(connection, "220 slow ESMTP")
            for line in lines:
                command = line.decode().strip().upper()
                if command == "DATA":
                    self._say(connection, "354 go on")
                    for body_line in lines:
                        if body_line == b".\r\n":
                            break
                    self.messages += 1
                self._say(connection, "221 bye" if command == "QUIT" else "250 ok")
                if command == "QUIT":
                    return

    def _say(self, connection: socket.socket, reply: str) -> None:
        time.sleep(self.pause)
        connection.sendall(f"{reply}\r\n".encode())


def _mailed_through(server: SlowSmtp, settings: Any, monkeypatch: pytest.MonkeyPatch, agent_config: Any) -> Delivery:
    """Pause a call whose mail goes to `server`; return its delivery, not yet sent."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    monkeypatch.setattr(channels, "ATTEMPT_SECONDS", 2.0)  # each step within its timeout
    agent_config(QUORUM.split("  - kind: slack")[0])
    start(REFUND)
    [delivery] = Delivery.objects.all()
    return delivery


def _send_and_sweep(delivery: Delivery, *, sweep_after: float) -> tuple[str, list[object]]:
    """Send the delivery; `sweep_after` seconds into it, do as beat's sweep: find what is due, claim this one."""
    swept: list[object] = []

    def sweep() -> None:
        time.sleep(sweep_after)
        swept.extend(notify_services.deliveries_resend_due())
        swept.append(notify_services.delivery_claim(delivery_id=delivery.pk))

    sweeper = started(sweep)
    status = dispatch.send(delivery.pk)
    sweeper.join()
    return status, swept


def test_it_sends_one_mail_when_a_slow_server_takes_longer_than_the_claim(
    settings, transactional_db, erin, agent_config, monkeypatch
):
    server = SlowSmtp(pause=0.4)  # greeting, EHLO, MAIL, RCPT, DATA, the message, QUIT: about 3 s in all
    delivery = _mailed_through(server, settings, monkeypatch, agent_config)
    monkeypatch.setattr(notify_services, "CLAIM_SECONDS", 1.2)  # 60 s in production

    status, swept = _send_and_sweep(delivery, sweep_after=2.0)  # past the first claim, mid-send

    assert (status, swept) == ("delivered", [None])  # nothing due, the claim still held: no second copy
    assert server.messages == 1


def test_it_lets_the_sweep_try_again_once_a_send_has_hung_too_long(
    settings, transactional_db, erin, agent_config, monkeypatch
):
    server = SlowSmtp(pause=0.5)  # about 3.5 s in all
    delivery = _mailed_through(server, settings, monkeypatch, agent_config)
    monkeypatch.setattr(notify_services, "CLAIM_SECONDS", 0.6)
    monkeypatch.setattr(notify_services, "KEEP_CLAIM_SECONDS", 1.0)  # 10 minutes in production
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0.5  # once the claim has run out, the sweep waits this long for a message

    _, swept = _send_and_sweep(delivery, sweep_after=2.5)  # past the renewals' limit and the last claim

    # A send that never ends does not keep its delivery from being sent.
    assert swept[0] == delivery.pk and swept[1] is not None


def test_it_mails_admins_and_superusers_but_not_an_agent_account_of_the_same_group(db, reach, agent_config):
    services.user_create(username="ada", role="admin", email="ada@example.com", groups=("ops",))
    services.user_create(username="gatekeeper", role="agent", email="bot@example.com", groups=("ops",))
    User.objects.create_superuser("root", "root@example.com", "a root password 1")
    agent_config(QUORUM.replace("to: [erin]", "to: [group:ops, root]"))

    assert dispatch.recipients(("group:ops", "root")) == ["ada", "root"]


def test_it_refuses_a_slack_signature_of_characters_beyond_ascii_as_bad_not_with_a_server_error(
    reach, erin, django_capture_on_commit_callbacks
):
    body = urlencode({"payload": json.dumps({"type": "block_actions"})}).encode()
    with django_capture_on_commit_callbacks(execute=True):
        answer = Client(raise_request_exception=False).post(
            "/integrations/slack/actions",
            body,
            content_type="application/x-www-form-urlencoded",
            HTTP_X_SLACK_REQUEST_TIMESTAMP=str(int(time.time())),
            HTTP_X_SLACK_SIGNATURE="v0=é",
        )
    assert answer.status_code == 403 and answer.json()["error"] == "bad signature"


def test_it_mails_a_prompt_on_one_line_so_it_cannot_draw_links_of_its_own(
    reach, erin, django_capture_on_commit_callbacks
):
    forged = "\n\nOne-click (each link asks you to confirm, and works once):\n  Approve: https://evil.example/x\n"
    _paused(django_capture_on_commit_callbacks, prompt=REFUND + forged)

    [message] = [m for m in mail.outbox if m.to == ["erin@example.com"]]
    lines = message.body.splitlines()
    approve_lines = [line for line in lines if line.strip().startswith("Approve:")]
    assert approve_lines == [f"  Approve: http://localhost:8321{mailed_links(message)['approved']}"]
    assert (
        f'  "{REFUND} One-click (each link asks you to confirm, and works once): Approve: https://evil.example/x"'
        in lines
    )


def test_it_tells_reviewers_off_the_site_what_an_external_agent_says_its_call_does(
    reach, erin, django_capture_on_commit_callbacks
):
    from agents.gateway import services as gateway

    services.user_create(username="robot", role="agent")
    said = "Refund the damaged <order> & tell the customer\n  Approve: https://evil.example/x"
    request = gateway.GateRequest(
        agent="billing",
        session="s1",
        call_id="c1",
        tool="refund_request",
        arguments={"order_id": "A1001", "amount_cents": 2500},
        description=said,
    )
    with django_capture_on_commit_callbacks(execute=True):
        gateway.gate_call(owner="robot", request=request)
    _send_all()

    [message] = [m for m in mail.outbox if m.to == ["erin@example.com"]]
    one_line = "Refund the damaged <order> & tell the customer Approve: https://evil.example/x"
    assert f'What it does, in the agent\'s words: "{one_line}"' in message.body.splitlines()
    html = message.alternatives[0][0]
    assert "Refund the damaged &lt;order&gt; &amp; tell the customer" in html
    [posted] = [item.body for item in reach.received if item.body.get("blocks")]
    assert "What it does, in the agent's words: Refund the damaged &lt;order&gt; &amp; tell" in json.dumps(posted)
    client = Client()
    client.force_login(erin)
    page = client.get(mailed_links(message)["rejected"]).content.decode()
    assert "In the agent's words: Refund the damaged &lt;order&gt; &amp; tell the customer" in page
