"""Run now and bulk decisions refused on the dashboard: audited once each (README: "every attempt is audited"), never a 500."""

from __future__ import annotations

from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry
from tests.support.flows import pending, start

SCHEDULED = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request:
    risk: high
    rules:
      - name: later
        action: schedule
        at: 'now + duration("1h")'
"""


def test_a_run_now_pressed_by_a_user_without_a_role_is_refused_and_audited(client_for, dave, agent_config):
    agent_config(SCHEDULED)
    [approval] = pending(start("Refund order A1001 for 25.00 USD"))
    assert approval.on_timeout == Approval.OnTimeout.RUN

    response = client_for(dave).post(f"/approvals/{approval.id}/run-now")

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    entries = list(AuditEntry.objects.filter(approval_id=approval.id).values_list("actor", "action", "outcome"))
    assert entries == [("dave", "approved", AuditEntry.Outcome.NOT_PERMITTED)]


def test_a_run_now_pressed_by_an_agent_account_signed_in_is_refused_and_audited(client_for, agent_config, db):
    agent_config(SCHEDULED)
    [approval] = pending(start("Refund order A1001 for 25.00 USD"))
    bot, _ = services.user_create(username="billing-bot", role="agent", password="a-long-bot-password")

    response = client_for(bot).post(f"/approvals/{approval.id}/run-now")

    assert response.status_code == 403
    entries = list(AuditEntry.objects.filter(approval_id=approval.id).values_list("actor", "outcome"))
    assert entries == [("billing-bot", AuditEntry.Outcome.NOT_PERMITTED)]


def test_a_bulk_decision_from_a_user_without_a_role_is_refused_and_audited_for_each_card(client_for, dave, approval):
    response = client_for(dave).post(
        "/approvals/bulk", {"decision": "approved", "cards": [f"{approval.id}:{approval.digest}"]}
    )

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    entries = list(AuditEntry.objects.filter(approval_id=approval.id).values_list("actor", "action", "outcome"))
    assert entries == [("dave", "approved", AuditEntry.Outcome.NOT_PERMITTED)]


def test_a_bulk_decision_on_an_unknown_approval_is_audited_once(client_for, alice, approval):
    response = client_for(alice).post(
        "/approvals/bulk", {"decision": "approved", "cards": ["appr_no_such_call:" + "a" * 12]}
    )

    assert response.status_code == 200 and b"no such approval" in response.content
    entries = list(AuditEntry.objects.filter(approval_id="appr_no_such_call").values_list("actor", "outcome"))
    assert entries == [("alice", AuditEntry.Outcome.NOT_FOUND)]


def test_run_now_on_a_call_that_is_not_scheduled_is_refused_not_a_server_error(alice, approval):
    assert approval.on_timeout != Approval.OnTimeout.RUN  # a plain pending call: nothing to run now
    client = Client(raise_request_exception=False)
    client.force_login(alice)

    plain = client.post(f"/approvals/{approval.id}/run-now")
    htmx = client.post(f"/approvals/{approval.id}/run-now", headers={"HX-Request": "true"})

    assert plain.status_code < 500 and htmx.status_code < 500, (plain.status_code, htmx.status_code)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
