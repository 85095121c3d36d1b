"""Mailed one-click links: a refused press must not spend the mail's other link."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from agents import services
from agents.models import Approval
from agents.notify import dispatch
from agents.notify.models import Delivery
from tests.support.flows import pending, start
from tests.support.reach import confirm_link, mailed_links

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend%s}
notifications:
  - kind: email
    to: [group:reviewer]
    events: [approval.required]
    one_click: true
"""
FROZEN = ', rules: [{name: frozen, when: "args.amount_cents > 2000", action: deny, reason: refunds are frozen}]'


@pytest.fixture
def erin(db: None) -> User:
    user, _ = services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")
    return user


def test_a_refused_approve_leaves_the_mails_reject_link_usable(
    settings, agent_config: Callable[[str], Path], erin, django_capture_on_commit_callbacks
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    agent_config(CONFIG % "")
    with django_capture_on_commit_callbacks(execute=True):
        approval = pending(start(REFUND))[0]
    [delivery] = Delivery.objects.filter(kind="email")
    assert dispatch.send(delivery.pk) == "delivered"
    links = mailed_links(mail.outbox[0])
    agent_config(CONFIG % FROZEN)  # the operator freezes refunds while the call waits

    status, content = confirm_link(Client(enforce_csrf_checks=True), links["approved"])
    assert status == 403 and "the policy now denies this call" in content  # refused: nothing was decided
    assert Approval.objects.get(pk=approval.pk).status == "pending"

    # A rejection is always taken (README); the same mail's Reject link should still do it.
    status, content = confirm_link(Client(enforce_csrf_checks=True), links["rejected"])
    assert "already used" not in content, content[:300]
    assert status == 200 and Approval.objects.get(pk=approval.pk).status == "rejected"
