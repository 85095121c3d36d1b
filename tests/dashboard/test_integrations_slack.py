"""Slack's buttons: signed requests decide as the linked reviewer; replays, old and forged requests are refused."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.http import HttpResponse
from django.test import Client

from agents.models import Approval, AuditEntry
from agents.notify import dispatch
from agents.notify.channels import configuration_problems
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from tests.support.flows import decide, pending, start
from tests.support.reach import slack_signed
from tests.support.receiver import Receiver

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: slack
    webhook_url_env: TEST_SLACK_WEBHOOK
"""


@pytest.fixture
def slack(settings, chat: Receiver, agent_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> Receiver:
    settings.AGENTFAST_SLACK_SIGNING_SECRET = SIGNING_SECRET
    monkeypatch.setenv("TEST_SLACK_WEBHOOK", chat.url)
    agent_config(CONFIG)
    return chat


@pytest.fixture
def approval(slack: Receiver, alice, bob, django_capture_on_commit_callbacks) -> Approval:
    notify_services.slacklink_set(username="alice", slack_id="UALICE1")
    notify_services.slacklink_set(username="bob", slack_id="UBOB1")
    with django_capture_on_commit_callbacks(execute=True):
        run = start(REFUND)
    return pending(run)[0]


def _body(approval_id: str, decision: str, slack_id: str, response_url: str) -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": slack_id, "username": slack_id.lower()},
        "response_url": response_url,
        "actions": [{"action_id": decision, "value": approval_id, "type": "button"}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def _signed(body: bytes, *, at: int | None = None, secret: str = SIGNING_SECRET) -> dict[str, str]:
    return slack_signed(body, secret=secret, at=at)


def _post(body: bytes, headers: dict[str, str], capture: Callable[..., Any]) -> HttpResponse:
    with capture(execute=True):
        return Client(enforce_csrf_checks=True).post(
            "/integrations/slack/actions", body, content_type="application/x-www-form-urlencoded", **headers
        )


def _send_all(kind: str) -> None:
    for delivery in Delivery.objects.filter(kind=kind, status="pending"):
        assert dispatch.send(delivery.pk) == "delivered"


def test_it_posts_a_message_with_approve_and_reject_buttons(approval, slack):
    _send_all("slack")
    [message] = slack.received
    assert "refund_request needs a decision" in message.body["text"]
    actions = next(block for block in message.body["blocks"] if block["type"] == "actions")
    assert [(b["action_id"], b["value"]) for b in actions["elements"]] == [
        ("approved", approval.id),
        ("rejected", approval.id),
    ]


@pytest.mark.parametrize(
    ("answer", "status", "attempts"), [(404, "failed", 1), (410, "failed", 1), (503, "pending", 1)]
)
def test_it_gives_up_at_once_on_a_message_slack_refuses_for_good_and_retries_the_rest(
    approval, slack, answer, status, attempts
):
    slack.answer = answer  # 404 no_service: a webhook URL removed or mistyped; 410: an archived channel
    delivery = Delivery.objects.get(kind="slack")

    assert dispatch.send(delivery.pk) == status

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (status, attempts)
    if status == "failed":
        assert delivery.last_error.startswith(f"HTTP {answer} (Slack refuses this message for good: not tried again")
        assert delivery.next_attempt_at is None
    else:
        assert delivery.last_error == f"HTTP {answer}" and delivery.next_attempt_at is not None  # passing: retried


def test_it_decides_as_the_linked_reviewer_and_updates_the_message(approval, slack, django_capture_on_commit_callbacks):
    body = _body(approval.id, "approved", "UALICE1", slack.url)
    answer = _post(body, _signed(body), django_capture_on_commit_callbacks)
    assert answer.status_code == 200
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", "alice")
    entry = AuditEntry.objects.get(outcome="decided")
    assert (entry.source, entry.actor) == ("slack", "alice")

    _send_all("slack_response")
    [update] = [item.body for item in slack.received if item.body.get("replace_original")]
    assert update["text"] == "refund_request was approved by alice"

    # Bob presses Reject on the same message a moment later: the first decision stands, he reads it.
    late = _body(approval.id, "rejected", "UBOB1", slack.url)
    assert _post(late, _signed(late), django_capture_on_commit_callbacks).json()["text"] == (
        "refund_request was already approved by alice"
    )
    assert Approval.objects.get(pk=approval.pk).status == "approved"


def test_it_tells_the_channel_about_a_decision_made_elsewhere(approval, slack, django_capture_on_commit_callbacks):
    _send_all("slack")  # the message asking for a decision
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "rejected", by="bob", feedback="too much")
    _send_all("slack")
    texts = [item.body["text"] for item in slack.received]
    assert "refund_request was rejected by bob" in texts


def test_it_posts_no_buttons_for_a_call_decided_before_the_message_went_out(
    approval, slack, django_capture_on_commit_callbacks
):
    [asking] = Delivery.objects.filter(kind="slack")  # Slack was down when the call paused: not sent yet
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "rejected", by="bob", feedback="too much")

    assert dispatch.send(asking.pk) == "superseded"
    _send_all("slack")  # the decision itself is still told

    assert [item.body["text"] for item in slack.received] == ["refund_request was rejected by bob"]
    asking.refresh_from_db()
    assert (asking.attempts, asking.next_attempt_at) == (0, None)
    assert asking.last_error == "not sent: the call was rejected by bob before this message went out"
    assert notify_services.deliveries_resend_due() == []  # nor does the sweep send it later


def test_it_escapes_names_in_the_answer_only_the_presser_reads(
    slack, alice, agent_config, django_capture_on_commit_callbacks
):
    agent_config(CONFIG.replace("hitl_mode: suspend}", "hitl_mode: suspend, approvers: ['<!channel> & co']}"))
    notify_services.slacklink_set(username="alice", slack_id="UALICE1")
    with django_capture_on_commit_callbacks(execute=True):
        approval = pending(start(REFUND))[0]

    body = _body(approval.id, "approved", "UALICE1", slack.url)
    text = _post(body, _signed(body), django_capture_on_commit_callbacks).json()["text"]

    assert "not among the approvers" in text
    assert "&lt;!channel&gt; &amp; co" in text and "<!channel>" not in text


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ("replayed", "replayed request"),
        ("old", "older than 5 minutes"),
        ("forged", "bad signature"),
    ],
)
def test_it_refuses_and_audits_a_request_slack_did_not_just_sign(
    approval, slack, tamper, reason, django_capture_on_commit_callbacks
):
    body = _body(approval.id, "approved", "UALICE1", slack.url)
    if tamper == "replayed":
        headers = _signed(body)
        assert _post(body, headers, django_capture_on_commit_callbacks).status_code == 200
    elif tamper == "old":
        headers = _signed(body, at=int(time.time()) - 6 * 60)
    else:
        headers = _signed(body, secret="not the secret")
    answer = _post(body, headers, django_capture_on_commit_callbacks)
    assert answer.status_code == 403 and reason in answer.json()["error"]
    refused = AuditEntry.objects.get(outcome="not_permitted")
    assert refused.source == "slack" and reason in refused.detail["error"]
    if tamper != "replayed":
        assert Approval.objects.get(pk=approval.pk).status == "pending"


def _forged(approval: Approval, slack: Receiver, capture: Callable[..., Any], address: str = "127.0.0.1") -> int:
    """Post a press signed with the wrong secret from `address`; return the answer's status."""
    body = _body(approval.id, "approved", "UALICE1", slack.url)
    headers = {**_signed(body, secret="not the secret"), "REMOTE_ADDR": address}
    return _post(body, headers, capture).status_code


@pytest.mark.parametrize("redis_state", ["up", "away"])
def test_it_audits_a_stream_of_forged_requests_once_a_minute_and_refuses_them_all(
    approval, slack, django_capture_on_commit_callbacks, _redis, redis_state
):
    # Anyone may POST here: each refusal audited would fill the audit and hold its chain's lock.
    # With Redis away, the process counts in its own memory: still refused, still audited once.
    if redis_state == "away":
        _redis.stop()
    statuses = [_forged(approval, slack, django_capture_on_commit_callbacks) for _ in range(5)]

    assert statuses == [403] * 5
    assert AuditEntry.objects.filter(outcome="not_permitted", source="slack").count() == 1
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_it_keeps_the_once_a_minute_count_in_redis_for_every_web_process(
    approval, slack, django_capture_on_commit_callbacks
):
    # Counted in one process's memory, each web process would audit its own refusal a minute.
    assert _forged(approval, slack, django_capture_on_commit_callbacks) == 403

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        [key] = client.keys("*slack-refused:127.0.0.1")
        assert 0 < client.ttl(key) <= 60
    finally:
        client.close()
    caches["local"].clear()  # another process: its memory knows nothing of the refusal
    assert _forged(approval, slack, django_capture_on_commit_callbacks) == 403
    assert AuditEntry.objects.filter(outcome="not_permitted", source="slack").count() == 1


def test_it_counts_the_addresses_of_one_ipv6_network_as_one_sender(approval, slack, django_capture_on_commit_callbacks):
    # A host given a /64 could otherwise have a refusal audited every minute from each address in it.
    addresses = ("2001:db8:0:1::1", "2001:db8:0:1::ffff:2", "2001:db8:0:2::1")
    statuses = [_forged(approval, slack, django_capture_on_commit_callbacks, address) for address in addresses]

    assert statuses == [403] * 3
    refused = AuditEntry.objects.filter(outcome="not_permitted", source="slack").order_by("id")
    assert [entry.origin for entry in refused] == ["slack 2001:db8:0:1::1", "slack 2001:db8:0:2::1"]


def test_it_refuses_a_slack_user_linked_to_nobody(approval, slack, django_capture_on_commit_callbacks):
    body = _body(approval.id, "approved", "USTRANGER", slack.url)
    answer = _post(body, _signed(body), django_capture_on_commit_callbacks)
    assert "link-slack NAME USTRANGER" in answer.json()["text"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert AuditEntry.objects.get().outcome == "not_permitted"


def test_it_links_a_slack_user_from_the_command_line(alice, capsys):
    from agents import cli

    assert cli.main(["users", "link-slack", "alice", "U012AB3CD"]) == 0
    assert "Slack user U012AB3CD is now alice" in capsys.readouterr().out
    assert alice.slack_link.slack_id == "U012AB3CD"
    assert cli.main(["users", "link-slack", "alice", "not an id"]) == 1
    assert "not a Slack user id" in capsys.readouterr().err
    assert cli.main(["users", "link-slack", "nobody", "U1"]) == 1


def test_it_tells_a_linked_reviewer_who_may_not_decide_this_call_why_and_keeps_the_buttons(
    slack, alice, bob, agent_config, django_capture_on_commit_callbacks
):
    agent_config(CONFIG.replace("hitl_mode: suspend}", "hitl_mode: suspend, four_eyes: true}"))
    notify_services.slacklink_set(username="bob", slack_id="UBOB1")
    with django_capture_on_commit_callbacks(execute=True):
        approval = pending(start(REFUND))[0]  # started by bob: four eyes keep him from approving it

    body = _body(approval.id, "approved", "UBOB1", slack.url)
    answer = _post(body, _signed(body), django_capture_on_commit_callbacks)

    assert answer.status_code == 200 and "bob" in answer.json()["text"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert AuditEntry.objects.get(outcome="not_permitted").actor == "bob"
    # Only bob reads the refusal: the message keeps its buttons for those who may decide.
    assert not Delivery.objects.filter(kind="slack_response").exists()


def test_it_keeps_the_buttons_when_a_slack_user_linked_to_nobody_presses_one(
    approval, slack, django_capture_on_commit_callbacks
):
    body = _body(approval.id, "approved", "USTRANGER", slack.url)
    answer = _post(body, _signed(body), django_capture_on_commit_callbacks)
    assert answer.status_code == 200 and "USTRANGER" in answer.json()["text"]
    assert not Delivery.objects.filter(kind="slack_response").exists()


@pytest.mark.parametrize("stamp", ["²", "١٧٠٠٠٠٠٠٠٠", "9" * 5000], ids=["superscript", "arabic-indic", "huge"])
def test_it_refuses_a_timestamp_only_python_calls_a_number(approval, slack, stamp, django_capture_on_commit_callbacks):
    body = _body(approval.id, "approved", "UALICE1", slack.url)
    headers = {**_signed(body), "HTTP_X_SLACK_REQUEST_TIMESTAMP": stamp}
    answer = _post(body, headers, django_capture_on_commit_callbacks)
    assert answer.status_code == 403 and "older than 5 minutes" in answer.json()["error"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.parametrize("secret", ["changeme", "slack", "0123456789abcdef0123456789abcde"])  # the last: 31 of 32
def test_it_decides_nothing_signed_with_a_signing_secret_anyone_could_guess(
    approval, slack, settings, secret, django_capture_on_commit_callbacks
):
    settings.AGENTFAST_SLACK_SIGNING_SECRET = secret
    body = _body(approval.id, "approved", "UALICE1", slack.url)

    answer = _post(body, _signed(body, secret=secret), django_capture_on_commit_callbacks)

    assert answer.status_code == 403
    assert "SLACK_SIGNING_SECRET" in answer.json()["error"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert AuditEntry.objects.filter(action="slack_action", outcome="not_permitted").exists()


def test_it_says_at_start_that_the_signing_secret_is_too_short(slack, settings):
    settings.AGENTFAST_SLACK_SIGNING_SECRET = "changeme"

    [problem] = configuration_problems()

    assert problem.startswith("notifications[0] (slack): SLACK_SIGNING_SECRET is shorter than")
    assert problem.endswith("presses of its buttons are refused")


def test_it_keeps_the_buttons_after_an_approval_that_leaves_the_quorum_short(
    slack, alice, bob, carol, agent_config, django_capture_on_commit_callbacks
):
    agent_config(CONFIG.replace("hitl_mode: suspend}", "hitl_mode: suspend, quorum: 2}"))
    notify_services.slacklink_set(username="alice", slack_id="UALICE1")
    notify_services.slacklink_set(username="carol", slack_id="UCAROL1")
    with django_capture_on_commit_callbacks(execute=True):
        approval = pending(start(REFUND))[0]

    first = _body(approval.id, "approved", "UALICE1", slack.url)
    headers = _signed(first)
    answer = _post(first, headers, django_capture_on_commit_callbacks)

    # Alice's approval counts, the call still waits for a second one: she reads the tally, and
    # the channel's message keeps its buttons for the next approver.
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert answer.json()["text"] == (
        "refund_request still waits: alice's approval is counted (1 of 2 approvals: alice); it runs at 2"
    )
    # Pressed again, as the message still shows the buttons: the same vote, counted once. (Another
    # press is signed at another second than the first: the same signature is refused as a replay.)
    pressed_at = int(headers["HTTP_X_SLACK_REQUEST_TIMESTAMP"])
    again = _post(first, _signed(first, at=pressed_at - 1), django_capture_on_commit_callbacks)
    assert "alice's approval is counted (1 of 2 approvals: alice)" in again.json()["text"]
    assert not Delivery.objects.filter(kind="slack_response").exists()

    second = _body(approval.id, "approved", "UCAROL1", slack.url)
    assert _post(second, _signed(second), django_capture_on_commit_callbacks).json()["text"] == (
        "refund_request was approved by carol"
    )
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    assert Delivery.objects.filter(kind="slack_response").count() == 1
