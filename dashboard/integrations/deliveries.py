"""The deliveries log: every notification sent, each attempt, and a way to send one again."""

from __future__ import annotations

from urllib.parse import urlencode

from django.db.models import prefetch_related_objects
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents import selectors, services
from agents.models import AuditEntry
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from dashboard.auth import admin_required, attempt_from
from dashboard.web.pages import count_context, count_pages, window

PAGE_SIZE = 50
COUNT_CAP = 1000  # the heading counts this far ("1000+"), not every delivery ever sent


@require_GET
@admin_required
def delivery_list(request: HttpRequest) -> HttpResponse:
    """List deliveries, newest first, optionally of one status."""
    return _list_page(request)


def _list_page(request: HttpRequest, *, error: str = "", status_code: int = 200) -> HttpResponse:
    status = request.GET.get("status", "")
    deliveries = Delivery.objects.all()  # newest first, read off an index of (status,) created_at
    if status in Delivery.Status.values:
        deliveries = deliveries.filter(status=status)
    else:
        status = ""
    # A page at a time, neither counted nor skipped to: a site sends a few per decision, for ever.
    page = window(deliveries, request, PAGE_SIZE, selectors.newest_first_after_row)
    count = count_pages(page, deliveries, size=PAGE_SIZE, cap=COUNT_CAP)
    prefetch_related_objects(page.object_list, "attempt_log")
    # A person's message asking to decide a call that no longer waits has no Redeliver button: sent
    # again, it would only be superseded at once. The row says why instead.
    settled = notify_services.deliveries_settled(page.object_list)
    for delivery in page.object_list:
        delivery.settled = settled.get(delivery.pk, "")
    context = {
        "page": page,
        **count_context(count, COUNT_CAP),
        "status": status,
        "statuses": Delivery.Status.values,
        "query": urlencode({"status": status}) if status else "",  # the pager's links keep the filter
        "error": error,
    }
    return render(request, "dashboard/deliveries.html", context, status=status_code)


@require_POST
@admin_required
def delivery_redeliver(request: HttpRequest, delivery_id: int) -> HttpResponse:
    """Send a delivery again (same webhook-id); audited. One that could only be superseded again is refused (409)."""
    try:
        notify_services.delivery_redeliver(
            delivery_id=delivery_id, attempt=attempt_from(request, source=AuditEntry.Source.WEB)
        )
    except services.NotFound:
        return render(request, "404.html", status=404)
    except services.WrongState as exc:
        return _list_page(request, error=f"Delivery {delivery_id} not redelivered: {exc.message}", status_code=409)
    return redirect("deliveries")
