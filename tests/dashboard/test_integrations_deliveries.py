"""The deliveries page: admins see every notification and its attempts, and can redeliver (audited).

A person's message asking to decide a call that no longer waits cannot be redelivered: it would
only be superseded again. The page says so instead of offering the button; a request is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.core import mail
from django.http import HttpResponse

from agents import services
from agents.models import Approval, AuditEntry
from agents.notify import dispatch
from agents.notify.models import Delivery
from agents.services import Attempt
from agents.services import notify as notify_services
from agents.services.notify import Target
from tests.support.flows import decide, start

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


def test_admins_read_deliveries_in_the_django_admin_as_every_other_row(client_for, carol, alice, failed_once):
    listed = client_for(carol).get("/admin/agents/delivery/")
    assert listed.status_code == 200 and f"/admin/agents/delivery/{failed_once.pk}/change/" in listed.content.decode()
    assert (
        client_for(carol).post(f"/admin/agents/delivery/{failed_once.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert client_for(alice).get("/admin/agents/delivery/").status_code in (302, 403)  # a reviewer is no staff


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

    page = first.context["page"]
    assert page.has_next and len(page) == 50 and first.context["count"] == 60
    link = f'href="?status=pending&amp;page=2&amp;after={page.object_list[-1].pk}"'
    assert link in first.content.decode()
    second = client_for(carol).get("/deliveries", {"status": "pending", "page": 2, "after": page.object_list[-1].pk})
    shown = [d.pk for d in page.object_list] + [d.pk for d in second.context["page"].object_list]
    assert (
        sorted(shown, reverse=True)
        == shown
        == list(Delivery.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    )


def test_it_lists_deliveries_a_page_at_a_time_without_counting_them_all(client_for, carol, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.integrations import deliveries as pages

    monkeypatch.setattr(pages, "COUNT_CAP", 3)
    monkeypatch.setattr(pages, "PAGE_SIZE", 2)  # more than a page: counted (one page would be its own count)
    hook = Target(Delivery.Kind.WEBHOOK, "http://127.0.0.1:9/hook", {"n": 1})
    notify_services.deliveries_open(event_type="approval.required", approval_id="", targets=[hook] * 5)

    with CaptureQueriesContext(connection) as queries:
        page = client_for(carol).get("/deliveries")

    assert '<h1>Deliveries <span class="count">3+</span></h1>' in page.content.decode()
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"] and "agents_delivery" in q["sql"]]
    assert counts and all("LIMIT 4" in sql for sql in counts)  # a bounded read, not a COUNT(*) of every delivery


MAILED = """
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
"""


@pytest.fixture
def erin(db: None):
    return services.user_create(username="erin", role="reviewer", password="erin-password", email="erin@example.com")[0]


@pytest.fixture
def mailed(settings, erin, agent_config: Callable[[str], Path], django_capture_on_commit_callbacks) -> Delivery:
    """A mail asking erin to decide a call, stored but not sent (the mail server was down)."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    agent_config(MAILED)
    with django_capture_on_commit_callbacks(execute=True):
        start("Refund order A1001 for 25.00 USD")
    return Delivery.objects.get(kind="email")


def _row(page: HttpResponse, delivery: Delivery) -> str:
    content = page.content.decode()
    start_at = content.index(f'id="delivery-{delivery.pk}"')
    return content[start_at : content.index("</tr>", start_at)]


def test_it_offers_no_redeliver_of_a_mail_superseded_by_its_calls_decision_and_says_why(
    client_for, carol, mailed, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        decide(Approval.objects.get(), "approved", by="bob")
    assert dispatch.send(mailed.pk) == "superseded"

    row = _row(client_for(carol).get("/deliveries"), mailed)

    assert "Redeliver</button>" not in row
    assert "No redeliver: it asks for a decision, and the call was approved by bob." in row


def test_it_refuses_to_redeliver_a_superseded_mail_with_the_reason_and_leaves_it_as_it_was(
    client_for, carol, mailed, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        decide(Approval.objects.get(), "rejected", by="bob", feedback="no")
    dispatch.send(mailed.pk)
    before = Delivery.objects.get(pk=mailed.pk)

    answer = client_for(carol).post(f"/deliveries/{mailed.pk}/redeliver")

    # Queued again, it was superseded again at once: the button did nothing, and said nothing.
    assert answer.status_code == 409
    assert (
        f"Delivery {mailed.pk} not redelivered: this mail asks for a decision, and the call was rejected by bob: "
        "sent again, it would only be superseded at once"
    ) in answer.content.decode()
    after = Delivery.objects.get(pk=mailed.pk)
    assert (after.status, after.attempts, after.next_attempt_at, after.last_error) == (
        "superseded",
        before.attempts,
        None,
        before.last_error,
    )
    assert not AuditEntry.objects.filter(action="redeliver").exists()
    assert mail.outbox == []


def test_it_refuses_in_the_service_too_so_every_caller_gets_the_reason(mailed, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        services.run_cancel(run_id=Approval.objects.get().run_id, attempt=Attempt(actor="bob", source="cli"))
    dispatch.send(mailed.pk)

    with pytest.raises(services.WrongState) as refused:
        notify_services.delivery_redeliver(delivery_id=mailed.pk, attempt=Attempt(actor="carol", source="cli"))

    assert refused.value.code == "wrong_state"
    assert "this mail asks for a decision, and the call expired" in refused.value.message


def test_it_keeps_a_delivered_question_delivered_rather_than_letting_a_redeliver_supersede_it(
    client_for, carol, mailed, django_capture_on_commit_callbacks
):
    assert dispatch.send(mailed.pk) == "delivered"
    with django_capture_on_commit_callbacks(execute=True):
        decide(Approval.objects.get(), "approved", by="bob")

    assert client_for(carol).post(f"/deliveries/{mailed.pk}/redeliver").status_code == 409
    assert Delivery.objects.get(pk=mailed.pk).status == "delivered"


def test_it_still_redelivers_a_failed_mail_while_its_call_waits_and_the_decisions_own_mail(
    client_for, carol, mailed, settings, django_capture_on_commit_callbacks
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 9  # nothing listens: the attempt fails
    statuses = [dispatch.send(mailed.pk, force=True) for _ in range(notify_services.MAX_ATTEMPTS)]
    assert statuses[-1] == "failed"
    assert "Redeliver</button>" in _row(client_for(carol).get("/deliveries"), mailed)

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert client_for(carol).post(f"/deliveries/{mailed.pk}/redeliver").status_code == 302
    assert dispatch.send(mailed.pk) == "delivered"  # as the worker the redeliver enqueued for
    assert [message.to for message in mail.outbox] == [["erin@example.com"]]

    with django_capture_on_commit_callbacks(execute=True):
        decide(Approval.objects.get(), "approved", by="bob")
    told = Delivery.objects.get(kind="email", event_type="approval.decided")
    assert dispatch.send(told.pk) == "delivered"
    assert "Redeliver</button>" in _row(client_for(carol).get("/deliveries"), told)  # a record, not a question
    assert client_for(carol).post(f"/deliveries/{told.pk}/redeliver").status_code == 302
    assert dispatch.send(told.pk) == "delivered"
    assert len(mail.outbox) == 3


def test_it_offers_no_redeliver_while_a_worker_is_sending_it_and_refuses_one(client_for, carol, failed_once):
    claimed = notify_services.delivery_claim(delivery_id=failed_once.pk, force=True)  # a worker's attempt, under way
    assert claimed is not None

    row = _row(client_for(carol).get("/deliveries"), failed_once)
    assert "sending now" in row and "No redeliver while it is being sent." in row
    assert "Redeliver</button>" not in row

    answer = client_for(carol).post(f"/deliveries/{failed_once.pk}/redeliver")
    assert answer.status_code == 409
    assert f"Delivery {failed_once.pk} not redelivered: {notify_services.SENDING_REFUSAL}" in answer.content.decode()
    after = Delivery.objects.get(pk=failed_once.pk)
    assert (after.next_attempt_at, after.attempts) == (claimed.next_attempt_at, claimed.attempts)  # left to the worker
    assert not AuditEntry.objects.filter(action="redeliver").exists()

    notify_services.delivery_record(delivery=claimed, ok=False, status_code=503, error="HTTP 503", duration_ms=3)
    assert "Redeliver</button>" in _row(client_for(carol).get("/deliveries"), failed_once)
