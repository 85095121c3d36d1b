"""Housekeeping: settled deliveries past their retention, spent link nonces and expired sessions go; nothing else."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone

from agents import services
from agents.models import AuditEntry
from agents.notify import dispatch, tasks
from agents.notify.channels import ONE_CLICK_MAX_AGE
from agents.notify.models import Delivery, DeliveryAttempt, OneClickLink
from agents.services import notify as notify_services
from dashboard.celery import app

Status = Delivery.Status


def _delivery(status: str, *, days_old: float, attempts: int = 1) -> Delivery:
    delivery = Delivery.objects.create(
        kind=Delivery.Kind.WEBHOOK,
        target="https://hooks.example.com/x",
        event_type="approval.required",
        approval_id="appr_run_x_call_1",
        status=status,
    )
    for _ in range(attempts):
        DeliveryAttempt.objects.create(delivery=delivery, status_code=200)
    then = timezone.now() - timedelta(days=days_old)
    Delivery.objects.filter(pk=delivery.pk).update(created_at=then)
    DeliveryAttempt.objects.filter(delivery=delivery).update(created_at=then)
    return delivery


@pytest.fixture
def deliveries(db):  # noqa: ANN001, ANN201
    return {
        "old delivered": _delivery(Status.DELIVERED, days_old=91),
        "old failed": _delivery(Status.FAILED, days_old=200),
        "old superseded": _delivery(Status.SUPERSEDED, days_old=91, attempts=0),
        "old pending": _delivery(Status.PENDING, days_old=400),  # still owed to someone: never pruned
        "recent delivered": _delivery(Status.DELIVERED, days_old=89),
    }


def _left() -> set[int]:
    return set(Delivery.objects.values_list("pk", flat=True))


def test_it_deletes_settled_deliveries_past_the_retention_with_their_attempts(deliveries, settings):
    settings.AGENTFAST_DELIVERY_RETENTION_DAYS = 90

    report = tasks.housekeeping()

    assert report["deliveries"] == 3
    assert _left() == {deliveries["old pending"].pk, deliveries["recent delivered"].pk}
    assert set(DeliveryAttempt.objects.values_list("delivery_id", flat=True)) == _left()


def test_a_retention_of_zero_keeps_every_delivery(deliveries, settings):
    settings.AGENTFAST_DELIVERY_RETENTION_DAYS = 0

    assert tasks.housekeeping()["deliveries"] == 0
    assert len(_left()) == 5


def test_it_deletes_in_bounded_batches_and_the_next_call_goes_on(db):
    for _ in range(5):
        _delivery(Status.DELIVERED, days_old=100)
    before = timezone.now() - timedelta(days=90)

    first = notify_services.notifications_prune(deliveries_before=before, links_before=before, batch=2, batches=2)
    second = notify_services.notifications_prune(deliveries_before=before, links_before=before, batch=2, batches=2)

    assert (first.deliveries, second.deliveries, len(_left())) == (4, 1, 0)


def test_it_deletes_link_nonces_only_once_their_links_no_longer_open(db):
    old = notify_services.oneclick_issue(approval_id="appr_a", username="alice")
    fresh = notify_services.oneclick_issue(approval_id="appr_b", username="alice")
    expired_at = timezone.now() - timedelta(seconds=ONE_CLICK_MAX_AGE + tasks.LINK_CLOCK_MARGIN_SECONDS + 60)
    OneClickLink.objects.filter(nonce=old).update(created_at=expired_at)
    OneClickLink.objects.filter(nonce=fresh).update(created_at=timezone.now() - timedelta(seconds=ONE_CLICK_MAX_AGE))

    assert tasks.housekeeping()["links"] == 1
    assert list(OneClickLink.objects.values_list("nonce", flat=True)) == [fresh]
    assert notify_services.oneclick_use(nonce=fresh, approval_id="appr_b", username="alice")


def test_it_clears_expired_sessions_and_keeps_live_ones(db):
    live, gone = SessionStore(), SessionStore()
    live["x"], gone["x"] = 1, 1
    live.create()
    gone.create()
    Session.objects.filter(session_key=gone.session_key).update(expire_date=timezone.now() - timedelta(seconds=1))

    tasks.housekeeping()

    assert list(Session.objects.values_list("session_key", flat=True)) == [live.session_key]


def test_beat_runs_it():
    entry = settings.CELERY_BEAT_SCHEDULE["agentfast-housekeeping"]

    assert entry["task"] == tasks.housekeeping.name and entry["task"] in app.tasks  # a name the worker knows


def _old_failed_webhook() -> Delivery:
    delivery = _delivery(Status.FAILED, days_old=120)
    Delivery.objects.filter(pk=delivery.pk).update(attempts=16)
    DeliveryAttempt.objects.filter(delivery=delivery).update(created_at=timezone.now() - timedelta(days=119))
    return delivery


@pytest.mark.django_db(transaction=True)
def test_a_delivery_redelivered_while_the_prune_runs_is_not_deleted(carol):
    from tests.support.threads import started

    delivery = _old_failed_webhook()
    admin = services.Attempt(actor="carol", source=AuditEntry.Source.WEB)
    outcome: list[str] = []

    def press() -> None:  # the admin's Redeliver, from a web process: its own connection
        try:
            notify_services.delivery_redeliver(delivery_id=delivery.pk, attempt=admin)
            outcome.append("redelivered")
        except services.NotFound:
            outcome.append("not found")

    def redeliver_right_after_the_prune_read_its_ids(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        result = execute(sql, params, many, context)
        if not outcome and sql.lstrip().upper().startswith("SELECT") and '"agents_delivery"' in sql:
            started(press).join(timeout=3)  # lands between the prune's read and its delete (or waits for its lock)
            outcome.append("pressed")
        return result

    with connection.execute_wrapper(redeliver_right_after_the_prune_read_its_ids):
        notify_services.notifications_prune(
            deliveries_before=timezone.now() - timedelta(days=90), links_before=timezone.now() - timedelta(days=2)
        )
    for _ in range(100):
        if len(outcome) == 2:
            break
        time.sleep(0.1)

    if "redelivered" in outcome:  # the admin was told it is sent again, and it is audited so...
        assert AuditEntry.objects.filter(action="redeliver").count() == 1
        # ...so it must still be there, pending, for the worker the redeliver enqueued.
        assert Delivery.objects.get(pk=delivery.pk).status == Status.PENDING
        assert dispatch.send(delivery.pk) != "skipped"
    else:
        assert outcome == ["pressed", "not found"]


def test_an_old_delivery_redelivered_today_is_kept_as_long_from_its_last_attempt(
    carol, settings, django_capture_on_commit_callbacks
):
    settings.AGENTFAST_DELIVERY_RETENTION_DAYS = 90
    delivery = _old_failed_webhook()  # created 120 days ago; its receiver has since been mended
    with django_capture_on_commit_callbacks(execute=False):
        notify_services.delivery_redeliver(
            delivery_id=delivery.pk, attempt=services.Attempt(actor="carol", source=AuditEntry.Source.WEB)
        )
    claimed = notify_services.delivery_claim(delivery_id=delivery.pk)
    assert claimed is not None
    notify_services.delivery_record(
        delivery=claimed, ok=False, status_code=500, error="HTTP 500", duration_ms=3, final=True
    )
    assert Delivery.objects.get(pk=delivery.pk).status == Status.FAILED  # it failed again, today

    tasks.housekeeping()  # beat's next run, minutes later

    assert Delivery.objects.filter(pk=delivery.pk).exists()  # its attempt today is what the page shows of it
