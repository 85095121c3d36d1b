"""Deadlines at their edges: extensions past the last date a deadline can hold; whom an escalation reaches."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry
from agents.notify.models import Delivery
from agents.policy.config import MAX_TIMEOUT_SECONDS
from agents.services.deadlines import approval_deadline_fire, approval_extend
from tests.agents.test_deadlines import past_deadline
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {refund}
notifications:
  - kind: email
    to: [group:finance]
"""


@pytest.fixture
def refund_policy(agent_config: Callable[[str], Path], alice: User) -> Callable[..., Path]:
    """Configure refund_request with these keys; alice is in finance, its approvers."""
    services.user_set_groups(username="alice", groups=("finance",))

    def configure(**keys: Any) -> Path:
        return agent_config(CONFIG.format(refund=json.dumps({"risk": "high", "approvers": ["finance"], **keys})))

    return configure


def test_it_refuses_an_extension_past_the_longest_deadline_instead_of_failing(refund_policy, alice):
    refund_policy(rules=[{"name": "later", "action": "schedule", "at": 'timestamp("9999-12-31T23:59:59Z")'}])
    [approval] = pending(start(REFUND))
    client = Client()
    client.force_login(alice)

    response = client.post(
        f"/api/approvals/{approval.id}/extend", {"by_seconds": 3600}, content_type="application/json"
    )

    assert response.status_code == 400, response.content
    assert "by_seconds" in response.json()["message"]
    assert Approval.objects.get(pk=approval.id).expires_at == approval.expires_at
    assert not AuditEntry.objects.filter(action="extended", outcome="decided").exists()


def test_it_refuses_extensions_that_pile_a_deadline_up_past_the_longest_one(refund_policy):
    refund_policy(timeout="1h")
    [approval] = pending(start(REFUND))
    alice = services.Attempt(actor="alice", source="cli")

    approval_extend(approval_id=approval.id, by_seconds=MAX_TIMEOUT_SECONDS / 2, attempt=alice)
    with pytest.raises(services.InvalidInput, match="by_seconds"):
        approval_extend(approval_id=approval.id, by_seconds=MAX_TIMEOUT_SECONDS, attempt=alice)
    extended = Approval.objects.get(pk=approval.id)

    assert extended.expires_at is not None and extended.expires_at.year < 9999
    assert AuditEntry.objects.filter(action="extended", outcome="decided").count() == 1


def test_it_mails_the_people_a_call_escalates_to_though_the_mail_entry_names_only_the_first(
    refund_policy, carol, django_capture_on_commit_callbacks
):
    # DESIGN.md: at the deadline, escalate_to become approvers and "they are notified".
    services.user_create(username="fiona", role="reviewer", email="fiona@example.com", groups=("finance",))
    services.user_create(username="max", role="reviewer", email="max@example.com", groups=("managers",))
    services.user_create(username="dan", role="reviewer", email="dan@example.com")
    refund_policy(timeout="1h", on_timeout="escalate", escalate_to=["managers", "user:dan"])
    with django_capture_on_commit_callbacks(execute=True):
        [approval] = pending(start(REFUND))

    with django_capture_on_commit_callbacks(execute=True):
        assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "escalated"

    asked = Delivery.objects.filter(approval_id=approval.id, event_type="approval.required")
    escalated = Delivery.objects.filter(approval_id=approval.id, event_type="approval.escalated")
    assert {d.target for d in asked} == {"fiona"}
    assert {d.target for d in escalated} == {"fiona", "max", "dan"}
