"""Prometheus `/metrics`: figures read from the database at scrape time, behind a bearer token.

Every figure is computed from rows when Prometheus scrapes, not counted in memory: web, API,
CLI and worker processes all decide and run, and the database is the one place that sees them
all (an in-process counter would see one process's share and reset at every restart).

Other modules add their figures with `register(name, collect)`; registering a name again
replaces it.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agents import selectors, services
from dashboard.auth import bearer_token, is_admin

Collect = Callable[[], Iterable[Metric]]

# Seconds from the question to its decision: a few seconds (a reviewer at the screen) to a day.
LATENCY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)

_collectors: dict[str, Collect] = {}


def register(name: str, collect: Collect) -> None:
    """Add (or replace) a named source of metrics, read at every scrape."""
    _collectors[name] = collect


def _pending_approvals() -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "agentfast_pending_approvals", "Approvals waiting for a decision.", value=selectors.pending_approval_count()
    )


def _runs_by_status() -> Iterator[Metric]:
    family = GaugeMetricFamily("agentfast_runs", "Runs by status.", labels=["status"])
    for status, count in selectors.run_counts_by_status().items():
        family.add_metric([status], count)
    yield family


def _decision_latency() -> Iterator[Metric]:
    """Yield the time-to-decision histogram of every approval a person decided, by tool, counted by the database."""
    family = HistogramMetricFamily(
        "agentfast_decision_latency_seconds",
        "Seconds from an approval's question to a person's decision (not a rule's, a grant's or a deadline's).",
        labels=["tool"],
    )
    for tool in selectors.decision_latency_histogram(LATENCY_BUCKETS):
        buckets = [(_bucket_name(bound), within) for bound, within in zip(LATENCY_BUCKETS, tool.within, strict=True)]
        buckets.append(("+Inf", tool.count))
        family.add_metric([tool.tool], buckets, sum_value=tool.seconds)
    yield family


def _bucket_name(bound: float) -> str:
    return str(bound)


def _notification_failures() -> Iterator[Metric]:
    """Yield how many notification delivery attempts failed: each retry that failed counts, a redelivery erases none."""
    yield CounterMetricFamily(
        "agentfast_notification_failures",
        "Notification delivery attempts that failed.",
        value=selectors.notification_failure_count(),
    )


def _deliveries_due() -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "agentfast_deliveries_due",
        "Notification deliveries whose time has come and that are not sent yet (a backlog when it stays up).",
        value=selectors.deliveries_due_count(),
    )


register("pending_approvals", _pending_approvals)
register("runs_by_status", _runs_by_status)
register("decision_latency", _decision_latency)
register("notification_failures", _notification_failures)
register("deliveries_due", _deliveries_due)


class _Registered:
    """A prometheus collector that reads every registered source at scrape time."""

    def collect(self) -> Iterator[Metric]:
        for collect in list(_collectors.values()):
            yield from collect()


def exposition() -> bytes:
    """Return the current metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Registered())
    return generate_latest(registry)


def _allowed(request: HttpRequest) -> tuple[bool, int]:
    """Return whether the bearer token admits the scraper, and the status to refuse with (401 or 403)."""
    token = bearer_token(request)
    if not token:
        return False, 401
    configured = getattr(settings, "AGENTFAST_METRICS_TOKEN", "")
    if configured and hmac.compare_digest(token.encode(), configured.encode()):
        return True, 200
    user = services.token_authenticate(token)
    if user is None:
        return False, 401
    return (True, 200) if is_admin(user) else (False, 403)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the metrics to a scraper holding an admin's API token or AGENTFAST_METRICS_TOKEN."""
    allowed, status = _allowed(request)
    if not allowed:
        response = HttpResponse(
            "metrics need an admin's API token or AGENTFAST_METRICS_TOKEN as a bearer token\n",
            status=status,
            content_type="text/plain; charset=utf-8",
        )
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="agentfast metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
