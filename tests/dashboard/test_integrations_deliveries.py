"""The deliveries page: admins see every notification and its attempts, and can redeliver (audited)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agents.models import AuditEntry
from agents.notify import dispatch
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from agents.services.notify import Target
from tests.support.flows import start

CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: webhook
    url: http://127.0.0.1:9/hook
    secret_env: NO_SUCH_SECRET_ENV
"""


@pytest.fixture
def failed_once(agent_config: Callable[[str], Path], django_capture_on_commit_callbacks) -> Delivery:
    agent_config(CONFIG)
    with django_capture_on_commit_callbacks(execute=True):
        start("Refund order A1001 for 25.00 USD")
    delivery = Delivery.objects.get()
    dispatch.send(delivery.pk)
    delivery.refresh_from_db()
    return delivery


def test_it_lists_deliveries_with_their_attempts_for_admins(client_for, carol, alice, failed_once):
    page = client_for(carol).get("/deliveries")
    assert page.status_code == 200
    assert b"approval.required" in page.content and b"NO_SUCH_SECRET_ENV is not set" in page.content
    assert client_for(alice).get("/deliveries").status_code == 403


def test_it_redelivers_on_an_admins_post_and_audits_it(client_for, carol, alice, failed_once):
    assert client_for(alice).post(f"/deliveries/{failed_once.pk}/redeliver").status_code == 403
    answer = client_for(carol).post(f"/deliveries/{failed_once.pk}/redeliver")
    assert answer.status_code == 302
    failed_once.refresh_from_db()
    assert (failed_once.status, failed_once.attempts) == ("pending", 0)
    assert failed_once.attempt_log.count() == 1  # the earlier attempt stays on record
    entry = AuditEntry.objects.get(action="redeliver")
    assert entry.actor == "carol" and entry.source == "web"
    assert client_for(carol).post("/deliveries/999999/redeliver").status_code == 404


def test_it_keeps_the_status_filter_on_the_next_page(client_for, carol):
    hook = Target(Delivery.Kind.WEBHOOK, "http://127.0.0.1:9/hook", {"n": 1})
    notify_services.deliveries_open(event_type="approval.required", approval_id="", targets=[hook] * 60)

    first = client_for(carol).get("/deliveries", {"status": "pending"})

    assert first.context["page"].has_next()
    assert 'href="?status=pending&amp;page=2"' in first.content.decode()
