"""Notifications: signed webhooks, retries with backoff, redelivery, the config entries."""

from __future__ import annotations

import base64
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from agents import services
from agents.models import Approval, AuditEntry
from agents.notify import dispatch
from agents.notify.models import Delivery
from agents.policy.config import ConfigError, get_policy
from agents.services import notify as notify_services
from tests.conftest import wait_for
from tests.support.flows import decide, pending, start
from tests.support.receiver import Receiver

REFUND = "Refund order A1001 for 25.00 USD"
SECRET = "whsec_" + base64.b64encode(b"a test secret of thirty-two bytes").decode()
AGENT = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
  send_email: {risk: high, hitl_mode: defer}
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(secret=SECRET)
    yield server
    server.stop()


@pytest.fixture
def webhook_to(agent_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Configure one webhook entry pointing at a URL."""

    def configure(url: str, events: str = "") -> Path:
        monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
        extra = f"\n    events: [{events}]" if events else ""
        return agent_config(
            AGENT + f"notifications:\n  - kind: webhook\n    url: {url}\n    secret_env: TEST_WEBHOOK_SECRET{extra}\n"
        )

    return configure


def _paused(capture: Callable[..., Any]) -> Approval:
    """Pause a refund, running what its commit triggers (the announcement)."""
    with capture(execute=True):
        run = start(REFUND)
    assert run.status == "suspended"
    return pending(run)[0]


def test_it_signs_a_webhook_that_the_receiver_verifies(db, receiver, webhook_to, django_capture_on_commit_callbacks):
    webhook_to(receiver.start().url)
    approval = _paused(django_capture_on_commit_callbacks)

    delivery = Delivery.objects.get(approval_id=approval.id)
    assert (delivery.kind, delivery.event_type, delivery.status) == ("webhook", "approval.required", "pending")
    assert dispatch.send(delivery.pk) == "delivered"

    [got] = receiver.received
    assert got.verified
    assert got.headers["webhook-id"] == f"msg_{delivery.pk}"
    assert got.body["type"] == "approval.required"
    assert got.body["data"]["approval_id"] == approval.id
    assert got.body["data"]["arguments"] == {"order_id": "A1001", "amount_cents": 2500}
    assert got.body["data"]["url"].endswith(f"/approvals/{approval.id}")
    [attempt] = delivery.attempt_log.all()
    assert attempt.status_code == 204 and attempt.error == ""


def test_it_loses_nothing_while_the_receiver_is_down_and_sends_nothing_twice(
    db, receiver, webhook_to, django_capture_on_commit_callbacks
):
    webhook_to(receiver.url)  # not started: connections are refused
    approval = _paused(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "approved", by="alice")
    deliveries = list(Delivery.objects.filter(approval_id=approval.id).order_by("pk"))
    assert [d.event_type for d in deliveries] == ["approval.required", "approval.decided"]

    now = timezone.now()
    for _ in range(3):  # three attempts each, every one refused and stored
        for delivery in deliveries:
            assert dispatch.send(delivery.pk, now=now) == "pending"
            assert dispatch.send(delivery.pk, now=now) == "skipped"  # not due again yet
        now += timedelta(hours=1)
    for delivery in deliveries:
        delivery.refresh_from_db()
        assert delivery.attempts == 3 and delivery.next_attempt_at > now - timedelta(hours=1)
        assert "ConnectError" in delivery.last_error
        assert delivery.attempt_log.count() == 3

    receiver.start()
    assert [dispatch.send(d.pk, now=now) for d in deliveries] == ["delivered", "delivered"]
    later = now + timedelta(days=2)
    assert [dispatch.send(d.pk, now=later) for d in deliveries] == ["skipped", "skipped"]
    assert notify_services.deliveries_resend_due(now=later) == []
    assert sorted(receiver.ids()) == sorted(f"msg_{d.pk}" for d in deliveries)
    assert all(item.verified for item in receiver.received)
    assert [item.body["type"] for item in receiver.received] == ["approval.required", "approval.decided"]


def test_it_retries_for_about_a_day_then_gives_up(db, webhook_to, receiver, django_capture_on_commit_callbacks):
    assert timedelta(hours=20) < timedelta(seconds=sum(notify_services.BACKOFF)) < timedelta(hours=30)
    webhook_to(receiver.url)
    approval = _paused(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(approval_id=approval.id)
    now = timezone.now()
    outcomes = []
    for _ in range(notify_services.MAX_ATTEMPTS):
        outcomes.append(dispatch.send(delivery.pk, now=now))
        now += timedelta(hours=7)
    assert outcomes == ["pending"] * (notify_services.MAX_ATTEMPTS - 1) + ["failed"]
    assert notify_services.deliveries_resend_due(now=now + timedelta(days=5)) == []


def test_it_retries_a_webhook_whose_receiver_answers_404(db, webhook_to, receiver, django_capture_on_commit_callbacks):
    # Unlike Slack's, a receiver's 404 may pass (a deploy under way, a route not yet added): retried.
    receiver.answer = 404
    webhook_to(receiver.start().url)
    delivery = Delivery.objects.get(approval_id=_paused(django_capture_on_commit_callbacks).id)

    assert dispatch.send(delivery.pk) == "pending"

    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_error) == (1, "HTTP 404") and delivery.next_attempt_at is not None


def test_it_stores_a_missing_secret_as_a_failed_attempt_and_still_pauses(
    db, receiver, agent_config, django_capture_on_commit_callbacks
):
    agent_config(
        AGENT + f"notifications:\n  - kind: webhook\n    url: {receiver.start().url}\n    secret_env: UNSET_X\n"
    )
    approval = _paused(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(approval_id=approval.id)
    assert dispatch.send(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert "UNSET_X is not set" in delivery.last_error
    assert receiver.received == []


def test_it_notifies_only_the_events_an_entry_asks_for(db, receiver, webhook_to, django_capture_on_commit_callbacks):
    webhook_to(receiver.start().url, events="approval.decided")
    approval = _paused(django_capture_on_commit_callbacks)
    assert not Delivery.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "rejected", by="alice")
    assert list(Delivery.objects.values_list("event_type", flat=True)) == ["approval.decided"]


def test_it_announces_an_expiry(db, receiver, webhook_to, django_capture_on_commit_callbacks):
    webhook_to(receiver.start().url, events="approval.expired")
    approval = _paused(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.approval_expire(approval=approval, actor="system", reason="deadline")
    delivery = Delivery.objects.get()
    assert dispatch.send(delivery.pk) == "delivered"
    assert receiver.received[0].body["data"]["status"] == "expired"


def test_it_announces_an_external_agents_call_that_waits_for_a_person(
    db, receiver, webhook_to, django_capture_on_commit_callbacks
):
    from agents.gateway import services as gateway

    webhook_to(receiver.start().url, events="approval.required")
    services.user_create(username="robot", role="agent")
    arguments = {"order_id": "A1001", "amount_cents": 2500}
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="refund_request", arguments=arguments
    )
    with django_capture_on_commit_callbacks(execute=True):
        answer = gateway.gate_call(owner="robot", request=request)

    assert answer.decision == "pending"
    delivery = Delivery.objects.get(approval_id=answer.approval_id)
    assert delivery.event_type == "approval.required"
    assert dispatch.send(delivery.pk) == "delivered"
    [got] = receiver.received
    assert got.verified and got.body["type"] == "approval.required"
    assert (got.body["data"]["tool"], got.body["data"]["arguments"]) == ("refund_request", arguments)


def test_it_redelivers_with_the_same_id_and_audits_it(
    db, carol, receiver, webhook_to, django_capture_on_commit_callbacks
):
    webhook_to(receiver.start().url)
    _paused(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    dispatch.send(delivery.pk)
    attempt = services.Attempt(actor="carol", source=AuditEntry.Source.WEB, origin="127.0.0.1")
    with django_capture_on_commit_callbacks(execute=True):
        notify_services.delivery_redeliver(delivery_id=delivery.pk, attempt=attempt)
    assert dispatch.send(delivery.pk) == "delivered"
    assert receiver.ids() == [f"msg_{delivery.pk}"] * 2
    entry = AuditEntry.objects.get(action="redeliver")
    assert entry.actor == "carol" and entry.detail["delivery"] == delivery.pk


def test_it_refuses_to_redeliver_while_an_attempt_is_under_way_so_no_second_copy_goes_out(
    transactional_db, receiver, webhook_to, django_capture_on_commit_callbacks
):
    receiver.hold = threading.Event()  # the receiver takes its time: the attempt stays under way
    webhook_to(receiver.start().url)
    delivery = Delivery.objects.get(approval_id=_paused(django_capture_on_commit_callbacks).id)
    attempt = services.Attempt(actor="carol", source=AuditEntry.Source.WEB)
    with ThreadPoolExecutor(1) as worker:
        sending = worker.submit(dispatch.send, delivery.pk)
        wait_for(lambda: receiver.received, what="the attempt to reach the receiver")

        with pytest.raises(services.WrongState) as refused:
            notify_services.delivery_redeliver(delivery_id=delivery.pk, attempt=attempt)
        assert refused.value.message == notify_services.SENDING_REFUSAL
        assert dispatch.send(delivery.pk) == "skipped"  # what the enqueued redelivery would have met, claimed

        receiver.hold.set()
        assert sending.result(timeout=10) == "delivered"
    assert not Delivery.objects.get(pk=delivery.pk).sending
    assert not AuditEntry.objects.filter(action="redeliver").exists()

    # Once the attempt has ended, Redeliver sends it again.
    with django_capture_on_commit_callbacks(execute=True):
        notify_services.delivery_redeliver(delivery_id=delivery.pk, attempt=attempt)
    assert dispatch.send(delivery.pk) == "delivered"
    assert receiver.ids() == [f"msg_{delivery.pk}"] * 2


def test_it_redelivers_a_delivery_whose_attempt_died_with_its_worker(
    db, webhook_to, receiver, django_capture_on_commit_callbacks
):
    webhook_to(receiver.start().url)
    delivery = Delivery.objects.get(approval_id=_paused(django_capture_on_commit_callbacks).id)
    long_ago = timezone.now() - timedelta(seconds=notify_services.CLAIM_SECONDS + 1)
    assert notify_services.delivery_claim(delivery_id=delivery.pk, now=long_ago, force=True)  # never renewed since
    assert not Delivery.objects.get(pk=delivery.pk).sending

    notify_services.delivery_redeliver(
        delivery_id=delivery.pk, attempt=services.Attempt(actor="carol", source=AuditEntry.Source.CLI)
    )
    assert dispatch.send(delivery.pk) == "delivered"
    assert receiver.ids() == [f"msg_{delivery.pk}"]


def test_it_refuses_notification_entries_it_does_not_understand(agent_config):
    for entry, problem in [
        ("{kind: webhook, url: 'ftp://x', secret_env: S}", "must be an http(s) URL"),
        ("{kind: fax}", "does not match any of the expected tags"),
        ("{kind: email, to: [alice], bogus: 1}", "notifications[0].email.bogus"),
        ("{kind: slack, webhook_url_env: 'not a name'}", "must name an environment variable"),
        ("{kind: webhook, url: 'http://x', secret_env: S, events: [approval.maybe]}", "approval.maybe"),
        # a delivery keeps 500 characters of its URL: a longer one would never find its secret again
        (f"{{kind: webhook, url: 'https://x/{'q' * 500}', secret_env: S}}", "at most 500 characters"),
    ]:
        agent_config(AGENT + f"notifications:\n  - {entry}\n")
        with pytest.raises(ConfigError, match=r"notifications\[0\]") as raised:
            get_policy()
        assert problem in str(raised.value)
    assert Delivery._meta.get_field("target").max_length == 500


def test_it_says_at_start_what_will_make_deliveries_fail(agent_config, monkeypatch, settings, capsys):
    from dashboard.processes import _say_configuration_problems

    settings.AGENTFAST_SLACK_SIGNING_SECRET = ""
    settings.AGENTFAST_BASE_URL = "https://agentfast.example.com"
    monkeypatch.delenv("UNSET_SECRET", raising=False)
    monkeypatch.delenv("UNSET_SLACK_URL", raising=False)
    monkeypatch.setenv("WEAK_SECRET", "whsec_" + base64.b64encode(b"short").decode())
    monkeypatch.setenv("GOOD_SECRET", "whsec_" + base64.b64encode(bytes(32)).decode())
    agent_config(
        AGENT
        + "notifications:\n"
        + "  - {kind: webhook, url: 'https://a.example.com/', secret_env: UNSET_SECRET}\n"
        + "  - {kind: webhook, url: 'https://b.example.com/', secret_env: WEAK_SECRET}\n"
        + "  - {kind: webhook, url: 'https://c.example.com/', secret_env: GOOD_SECRET}\n"
        + "  - {kind: slack, webhook_url_env: UNSET_SLACK_URL}\n"
    )

    _say_configuration_problems()

    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        (
            "agentfast: warning: notifications[0] (webhook): the environment variable UNSET_SECRET is not set; "
            "its deliveries fail until it is"
        ),
        (
            "agentfast: warning: notifications[1] (webhook): WEAK_SECRET must hold a whsec_ secret: at least 24 bytes "
            "in base64 (a shorter key is guessed, and its signatures prove nothing); its deliveries fail until it is"
        ),
        (
            "agentfast: warning: notifications[3] (slack): the environment variable UNSET_SLACK_URL is not set; "
            "its deliveries fail until it is"
        ),
        (
            "agentfast: warning: notifications[3] (slack): SLACK_SIGNING_SECRET is not set; presses of its buttons "
            "are refused"
        ),
    ]


SMTP = "django.core.mail.backends.smtp.EmailBackend"
FILES = "django.core.mail.backends.filebased.EmailBackend"


@pytest.mark.parametrize(
    ("base_url", "channel", "backend", "warned"),
    [
        ("http://localhost:8321", "{kind: slack, webhook_url_env: SLACK_URL}", FILES, True),
        ("http://127.0.0.1:8321", "{kind: webhook, url: 'https://a.example.com/', secret_env: S}", FILES, True),
        ("http://[::1]:8321", "{kind: email, to: [ops@example.com]}", SMTP, True),
        ("http://0.0.0.0:8321", "{kind: email, to: [ops@example.com]}", SMTP, True),
        ("http://review.localhost:8321", "{kind: email, to: [ops@example.com]}", SMTP, True),
        # `make run`: mail is written to files here, where localhost is where the reader is
        ("http://localhost:8321", "{kind: email, to: [ops@example.com]}", FILES, False),
        ("https://agentfast.example.com", "{kind: slack, webhook_url_env: SLACK_URL}", SMTP, False),
        ("http://10.0.0.5:8321", "{kind: email, to: [ops@example.com]}", SMTP, False),
    ],
)
def test_it_says_at_start_a_base_url_that_sends_readers_of_its_links_to_their_own_machine(
    agent_config, settings, capsys, base_url, channel, backend, warned
):
    from dashboard.processes import _say_configuration_problems

    settings.AGENTFAST_BASE_URL, settings.EMAIL_BACKEND = base_url, backend
    agent_config(AGENT + f"notifications:\n  - {channel}\n")

    _say_configuration_problems()

    said = [line for line in capsys.readouterr().err.splitlines() if "AGENTFAST_BASE_URL" in line]
    expected = (
        f"agentfast: warning: AGENTFAST_BASE_URL is {base_url}: the links in mail, Slack messages and webhook "
        "events lead each reader to their own machine; set it to the address reviewers open"
    )
    assert said == ([expected] if warned else [])


def test_it_refuses_two_webhook_entries_for_one_url(agent_config):
    # A delivery finds its secret by its URL: the second entry's events would be signed with the first's secret.
    hook = "{kind: webhook, url: 'https://hooks.example.com/a', secret_env: %s, events: [%s]}"
    entries = [hook % ("FIRST_SECRET", "approval.required"), hook % ("SECOND_SECRET", "approval.decided")]
    agent_config(AGENT + "notifications:\n" + "".join(f"  - {entry}\n" for entry in entries))

    with pytest.raises(ConfigError, match=r"notifications\[1\] repeats the url of notifications\[0\]"):
        get_policy()


@pytest.fixture
def silent_mail_server() -> Iterator[int]:
    """A local TCP server standing for a mail server that takes connections and never says a word."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def _send_within(delivery_pk: int, *, seconds: int) -> str:
    """Send a delivery once, failing the test if the attempt is still going after `seconds`."""

    def still_going(*_: object) -> None:
        raise AssertionError(f"the attempt is still going after {seconds} s")

    previous = signal.signal(signal.SIGALRM, still_going)
    signal.alarm(seconds)
    try:
        return dispatch.send(delivery_pk)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_it_gives_up_an_attempt_on_a_mail_server_that_never_answers(
    db, agent_config, settings, silent_mail_server, django_capture_on_commit_callbacks
):

    # A worker runs deliveries on threads, where Celery's time limits do not apply: an attempt
    # that never ends keeps its thread, and the sweeper hands the delivery to another each minute.
    assert settings.EMAIL_TIMEOUT == 10  # the default, unless EMAIL_TIMEOUT says otherwise
    settings.EMAIL_TIMEOUT = 1  # the same path, sooner
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent_mail_server
    services.user_create(username="erin", role="reviewer", email="erin@example.com")
    agent_config(AGENT + "notifications:\n  - kind: email\n    to: [erin]\n")
    approval = _paused(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(approval_id=approval.id, kind="email")

    assert _send_within(delivery.pk, seconds=40) == "pending"
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "timed out" in delivery.last_error


@pytest.fixture
def dripping_receiver() -> Iterator[str]:
    """A local HTTP server standing for a receiver that answers one byte of its headers a second, for ever."""
    import socket
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def drip() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.is_set():
                connection.sendall(b"X")  # within every read timeout, and never done
                time.sleep(1)

    threading.Thread(target=drip, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    stop.set()
    listener.close()


def test_it_ends_an_attempt_on_a_receiver_that_never_finishes_its_answer(
    db, webhook_to, dripping_receiver, monkeypatch, django_capture_on_commit_callbacks
):

    from agents.notify import channels

    monkeypatch.setattr(channels, "ATTEMPT_SECONDS", 3.0)  # 30 s in production
    webhook_to(dripping_receiver)
    approval = _paused(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(approval_id=approval.id)

    assert _send_within(delivery.pk, seconds=40) == "pending"
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "took longer than 3 s" in delivery.last_error
