"""Prometheus /metrics: who may scrape it, and the figures it reads from the database."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from agents import services
from agents.models import Approval
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from agents.services.notify import Target
from dashboard import metrics
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start


def scrape(token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def decided_after(seconds: float, decision: str) -> None:
    """Decide a new refund as alice, made to have waited `seconds` (negative: decided "before" it was asked)."""
    approval = pending(start(REFUND))[0]
    decide(approval, decision, by="alice")
    decided_at = Approval.objects.get(pk=approval.pk).decided_at
    Approval.objects.filter(pk=approval.pk).update(created_at=decided_at - timedelta(seconds=seconds))


def buckets(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], *bounds: str) -> list[float]:
    """Return the refund_request latency histogram's cumulative counts at these bounds."""
    name = "agentfast_decision_latency_seconds_bucket"
    return [samples[(name, (("le", le), ("tool", "refund_request")))] for le in bounds]


def test_it_refuses_a_scrape_without_an_admins_token_or_the_metrics_token(alice, carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    _, reviewer_token = services.token_create(username="alice")

    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert Client().get("/metrics", headers={"Authorization": f"Bearer {reviewer_token}"}).status_code == 403
    signed_in = Client()
    signed_in.force_login(carol)
    assert signed_in.get("/metrics").status_code == 401  # a scraper has no session: tokens only


def test_it_serves_pending_runs_and_decision_latency_from_the_rows(carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    first, second = start(REFUND), start(REFUND)
    decide(pending(first)[0], "approved", by="alice")
    start("hello")
    _, admin_token = services.token_create(username="carol")

    for token in ("s3cret-scrape", admin_token):
        samples = scrape(token)
        assert samples[("agentfast_pending_approvals", ())] == 1
        assert samples[("agentfast_runs", (("status", "suspended"),))] == 2
        assert samples[("agentfast_runs", (("status", "completed"),))] == 1
        assert samples[("agentfast_runs", (("status", "failed"),))] == 0
        assert samples[("agentfast_decision_latency_seconds_count", (("tool", "refund_request"),))] == 1
        assert samples[("agentfast_decision_latency_seconds_bucket", (("le", "+Inf"), ("tool", "refund_request")))] == 1
        assert samples[("agentfast_notification_failures_total", ())] == 0
        assert samples[("agentfast_deliveries_due", ())] == 0
    assert second.status == "suspended"


def test_the_latency_histogram_counts_each_bucket_and_sums_the_seconds(carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    waits = [0.5, 4.0, 7200.0, -3.0]  # the last decided "before" it was asked: clocks apart, counted as 0
    for index, wait in enumerate(waits):
        decided_after(wait, "approved" if index % 2 == 0 else "rejected")
    pending(start(REFUND))  # still waiting: not in the histogram

    samples = scrape("s3cret-scrape")

    assert buckets(samples, "1.0", "2.0", "5.0", "3600.0", "14400.0", "+Inf") == [2, 2, 3, 3, 4, 4]
    assert samples[("agentfast_decision_latency_seconds_count", (("tool", "refund_request"),))] == 4
    assert samples[("agentfast_decision_latency_seconds_sum", (("tool", "refund_request"),))] == 7204.5


def test_the_latency_histogram_counts_a_wait_at_a_bound_within_it(carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    for wait in (1.0, 3600.0):
        decided_after(wait, "approved")

    samples = scrape("s3cret-scrape")

    assert buckets(samples, "1.0", "2.0", "900.0", "3600.0") == [1, 1, 1, 2]
    assert samples[("agentfast_decision_latency_seconds_sum", (("tool", "refund_request"),))] == 3601.0


def test_the_latency_histogram_counts_only_what_people_took_not_rules_or_grants(alice, carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    asked = pending(start(REFUND))[0]
    decide(asked, "approved", by="alice", remember=services.Remember(scope="exact", seconds=3600))
    decided_at = Approval.objects.get(pk=asked.pk).decided_at
    Approval.objects.filter(pk=asked.pk).update(created_at=decided_at - timedelta(seconds=90))
    for prompt in (REFUND, REFUND, "Refund order A1001 for 5.00 USD", "Refund order A1010 for 1,500.00 USD"):
        start(prompt)  # alice's grant twice, then the demo's allow and deny rules: each at once
    automatic = Approval.objects.exclude(pk=asked.pk).values_list("decided_by", flat=True)
    assert sorted(by.split(":")[0] for by in automatic) == ["grant", "grant", "policy", "policy"]

    samples = scrape("s3cret-scrape")

    assert samples[("agentfast_decision_latency_seconds_count", (("tool", "refund_request"),))] == 1
    assert samples[("agentfast_decision_latency_seconds_sum", (("tool", "refund_request"),))] == 90.0
    assert buckets(samples, "60.0", "+Inf") == [0, 1]


def test_it_lets_another_module_add_or_replace_a_figure(carol, settings, monkeypatch):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    monkeypatch.setattr(metrics, "_collectors", dict(metrics._collectors))

    metrics.register("widgets", lambda: [GaugeMetricFamily("agentfast_widgets", "Widgets.", value=7)])

    assert scrape("s3cret-scrape")[("agentfast_widgets", ())] == 7


def test_it_counts_the_deliveries_whose_time_has_come_and_that_are_not_sent(carol, settings):
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    hook = Target(Delivery.Kind.WEBHOOK, "http://127.0.0.1:9/hook", {"n": 1})
    ids = notify_services.deliveries_open(event_type="approval.required", approval_id="", targets=[hook] * 4)
    later = timezone.now() + timedelta(minutes=5)
    Delivery.objects.filter(pk=ids[0]).update(next_attempt_at=later)  # waiting out its backoff: not due
    Delivery.objects.filter(pk=ids[1]).update(status=Delivery.Status.DELIVERED, next_attempt_at=None)

    assert scrape("s3cret-scrape")[("agentfast_deliveries_due", ())] == 2
