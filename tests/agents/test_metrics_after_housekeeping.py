"""Hunt (the record): housekeeping must not make a Prometheus counter go down."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.notify import tasks
from agents.notify.models import Delivery, DeliveryAttempt


def _failures_total(token: str) -> float:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name == "agentfast_notification_failures_total":
                return sample.value
    raise AssertionError("no agentfast_notification_failures_total")


def test_notification_failures_total_never_goes_down_when_housekeeping_prunes(db, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    settings.AGENTFAST_DELIVERY_RETENTION_DAYS = 90
    delivery = Delivery.objects.create(
        kind=Delivery.Kind.WEBHOOK,
        target="https://hooks.example.com/x",
        event_type="approval.required",
        approval_id="appr_run_x_call_1",
        status=Delivery.Status.FAILED,
    )
    for _ in range(3):
        DeliveryAttempt.objects.create(delivery=delivery, status_code=500, error="HTTP 500")
    then = timezone.now() - timedelta(days=200)
    Delivery.objects.filter(pk=delivery.pk).update(created_at=then)
    DeliveryAttempt.objects.filter(delivery=delivery).update(created_at=then)
    before = _failures_total("s3cret-scrape")
    assert before == 3

    assert tasks.housekeeping()["deliveries"] == 1

    # A counter that drops reads to Prometheus as a restart: rate()/increase() then count the
    # whole new value as fresh failures, and alerts on them fire for nothing.
    assert _failures_total("s3cret-scrape") >= before
