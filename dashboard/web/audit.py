"""The audit history for admins: every decision attempt, filtered, a page at a time or as CSV."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents import selectors
from dashboard.auth import admin_required, bearer_accepted
from dashboard.web import audit_export, links
from dashboard.web.forms import AuditFilter
from dashboard.web.pages import errors_text, query_without_page, window

AUDIT_PAGE_SIZE = 50

AUDIT_DETAIL_SHOWN = ("note", "feedback", "arguments_diff", "error", "existing")


@require_GET
@admin_required
def audit(request: HttpRequest) -> HttpResponse:
    filters = AuditFilter(request.GET)
    page = window(filters.entries(), request, AUDIT_PAGE_SIZE, selectors.newest_first_after_row)
    run_url, approval_url = links.route("run"), links.route("approval")
    for entry in page:
        # Every key the row shows, present: a key missing from `detail` is looked up through three exceptions.
        detail = entry.detail if isinstance(entry.detail, dict) else {}
        entry.shown = {key: detail.get(key, "") for key in AUDIT_DETAIL_SHOWN}
        # The edit as (argument, [old, new]) pairs: a template reads `diff.items` as an argument
        # named "items" before the method, and tools may well have one.
        diff = entry.shown["arguments_diff"]
        entry.shown["arguments_diff"] = list(diff.items()) if isinstance(diff, dict) else []
        # What the row links to: its approval, else its run (an attempt on no known run links nowhere).
        if entry.run_id:
            entry.link = approval_url(entry.approval_id) if entry.approval_id else run_url(entry.run_id)
    context = {
        "page": page,
        "filters": filters,
        "people": selectors.audit_people(),
        "tools": selectors.audit_tools(),
        "query": query_without_page(request.GET),
    }
    return render(request, "dashboard/audit.html", context)


@require_GET
@bearer_accepted
@admin_required
def audit_csv(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Stream the filtered audit history as CSV, oldest first, one row per decision attempt.

    Filters that do not read (a date that is none) get a 400 saying why: an export with the
    header alone would read as "nothing happened" to whoever opens the file. A script may send
    an admin's API token instead of a session.
    """
    filters = AuditFilter(request.GET)
    if not filters.is_valid():
        message = f"Nothing exported: {errors_text(filters)}\n"
        return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
    entries = filters.entries()
    name = f"agentfast-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"
    response = StreamingHttpResponse(audit_export.csv_lines(entries), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
