"""Notification mails: the call in plain words, and one-click links that confirm, decide once, and expire."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry
from agents.notify import dispatch
from agents.notify.models import Delivery
from tests.support.flows import decide, pending, start
from tests.support.reach import confirm_link, mailed_links

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: email
    to: [group:reviewer]
    events: [approval.required]
    one_click: true
"""


@pytest.fixture
def mailed(settings, agent_config: Callable[[str], Path]) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    agent_config(CONFIG)


@pytest.fixture
def erin(db: None) -> User:
    """A reviewer with an email address."""
    user, _ = services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")
    return user


def _paused_and_mailed(capture: Callable[..., object]) -> Approval:
    with capture(execute=True):
        run = start(REFUND)
    for delivery in Delivery.objects.filter(kind="email"):
        assert dispatch.send(delivery.pk) == "delivered"
    return pending(run)[0]


def test_it_mails_the_call_in_plain_words_with_a_link_to_the_approval(mailed, erin, django_capture_on_commit_callbacks):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    [message] = mail.outbox  # only erin: the other reviewers have no address
    assert message.to == ["erin@example.com"]
    assert "refund_request needs a decision" in message.subject
    assert '"amount_cents": 2500' in message.body and "A1001" in message.body
    assert REFUND in message.body and "asked by bob" in message.body
    assert f"http://localhost:8321/approvals/{approval.id}" in message.body
    assert message.alternatives[0][1] == "text/html"


def test_it_decides_on_the_confirming_post_and_refuses_a_second_use(mailed, erin, django_capture_on_commit_callbacks):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    links = mailed_links(mail.outbox[0])
    client = Client(enforce_csrf_checks=True)

    page = client.get(links["approved"])
    assert page.status_code == 200 and b"Approve as erin" in page.content
    approval.refresh_from_db()
    assert approval.status == "pending"  # a GET never decides

    assert client.post(links["approved"]).status_code == 403  # no CSRF token: refused
    status, _ = confirm_link(client, links["approved"])
    approval.refresh_from_db()
    assert status == 200 and (approval.status, approval.decided_by) == ("approved", "erin")
    assert AuditEntry.objects.get(outcome="decided").source == "email"

    for path in links.values():  # the same link again, or its twin: both spent
        again = client.get(path)
        assert again.status_code == 400 and b"already used" in again.content
    assert Approval.objects.get(pk=approval.pk).status == "approved"


def test_it_shows_who_decided_first_elsewhere(mailed, erin, bob, django_capture_on_commit_callbacks):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    decide(approval, "rejected", by="bob", feedback="no")
    page = Client().get(mailed_links(mail.outbox[0])["approved"])
    assert page.status_code == 409
    assert b"refund_request was already rejected by bob" in page.content


def test_it_mails_no_links_for_a_call_decided_before_the_mail_went_out(
    mailed, erin, bob, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        approval = pending(start(REFUND))[0]
    [asking] = Delivery.objects.filter(kind="email")  # the mail server was down when the call paused
    with django_capture_on_commit_callbacks(execute=True):
        decide(approval, "approved", by="bob")

    assert dispatch.send(asking.pk) == "superseded"
    assert mail.outbox == []
    asking.refresh_from_db()
    assert (asking.status, asking.last_error) == (
        "superseded",
        "not sent: the call was approved by bob before this message went out",
    )


def test_it_refuses_a_forged_or_altered_link(mailed, erin, django_capture_on_commit_callbacks):
    _paused_and_mailed(django_capture_on_commit_callbacks)
    path = mailed_links(mail.outbox[0])["approved"]
    for bad in (path[:-3] + "xyz", "/integrations/email/not-a-token"):
        page = Client().get(bad)
        assert page.status_code == 400 and b"not valid" in page.content


def test_it_refuses_a_link_of_someone_who_is_no_longer_a_reviewer(mailed, erin, django_capture_on_commit_callbacks):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    path = mailed_links(mail.outbox[0])["approved"]
    client = Client(enforce_csrf_checks=True)
    page = client.get(path)  # opened while erin was still a reviewer: the form's token stays valid
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    erin.groups.clear()

    again = client.get(path)  # the mail outlives the role: the page shows nothing of the call any more
    assert again.status_code == 403 and b"may not decide" in again.content
    assert b"amount_cents" not in again.content and REFUND.encode() not in again.content
    answer = client.post(path, {"csrfmiddlewaretoken": token})
    assert answer.status_code == 403 and b"may not decide" in answer.content
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert AuditEntry.objects.get().outcome == "not_permitted"


def test_it_refuses_a_link_of_a_reviewer_outside_the_calls_approvers(
    mailed, erin, agent_config, django_capture_on_commit_callbacks
):
    agent_config(CONFIG.replace("hitl_mode: suspend}", "hitl_mode: suspend, approvers: [finance]}"))
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    status, content = confirm_link(Client(enforce_csrf_checks=True), mailed_links(mail.outbox[0])["approved"])
    assert status == 403 and "not among the approvers" in content
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert AuditEntry.objects.get().outcome == "not_permitted"


def test_it_says_a_vote_short_of_the_quorum_is_counted_and_the_call_still_waits(
    mailed, erin, agent_config, django_capture_on_commit_callbacks
):
    agent_config(CONFIG.replace("hitl_mode: suspend}", "hitl_mode: suspend, quorum: 2}"))
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)

    status, content = confirm_link(Client(enforce_csrf_checks=True), mailed_links(mail.outbox[0])["approved"])

    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert status == 200 and "was pending" not in content
    assert (
        "refund_request still waits: erin&#x27;s approval is counted (1 of 2 approvals: erin); it runs at 2" in content
    )


def test_a_press_after_someone_else_decided_is_audited(mailed, erin, alice, django_capture_on_commit_callbacks):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    links = mailed_links(mail.outbox[0])

    status, content = confirm_link(
        Client(enforce_csrf_checks=True), links["rejected"], between=lambda: decide(approval, "approved", by="alice")
    )

    assert status == 409 and "already approved by alice" in content
    entries = AuditEntry.objects.filter(approval_id=approval.id, actor="erin")
    assert list(entries.values_list("source", "action", "outcome")) == [
        (AuditEntry.Source.EMAIL, "rejected", AuditEntry.Outcome.ALREADY_DECIDED)
    ]


def test_a_press_by_someone_whose_role_ended_shows_nothing_of_a_decided_call_and_is_audited(
    mailed, erin, alice, django_capture_on_commit_callbacks
):
    approval = _paused_and_mailed(django_capture_on_commit_callbacks)
    links = mailed_links(mail.outbox[0])

    def decided_and_erin_left() -> None:
        decide(approval, "approved", by="alice")
        erin.is_active = False
        erin.save()

    status, content = confirm_link(Client(enforce_csrf_checks=True), links["rejected"], between=decided_and_erin_left)

    assert status == 403
    assert "refund_request" not in content and approval.id not in content and "alice" not in content
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.APPROVED
    entries = AuditEntry.objects.filter(approval_id=approval.id, actor="erin")
    assert list(entries.values_list("outcome", flat=True)) == [AuditEntry.Outcome.NOT_PERMITTED]
