"""Pages of the reviewers' dashboard: inbox, approval, runs, audit.

Each view parses its input, calls a service or a selector, and renders. An htmx request
gets the partial that a full page includes, so every piece of markup has one template.
"""

from __future__ import annotations

import csv
import unicodedata
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from agents import selectors, services, text
from agents.models import Approval, AuditEntry, Run
from agents.services import eligibility
from agents.tools import registry
from dashboard import playground
from dashboard.auth import admin_required, attempt_from, is_reviewer, reviewer_required
from dashboard.forms import AuditFilter, DecisionForm, InboxFilter, RunFilter

INBOX_PAGE_SIZE = 20


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it: `request.htmx` tells an htmx request apart."""

    htmx: HtmxDetails


RUNS_PAGE_SIZE = 25
AUDIT_PAGE_SIZE = 50


def _page(items: QuerySet[Any], request: HttpRequest, size: int) -> Page:
    return Paginator(items, size).get_page(request.GET.get("page"))


def _live_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Mark a page whose live list re-fetches itself (htmx) from the page's own URL.

    The fragment and the page share a URL: without `Vary` the browser's cache may hand the
    fragment to Back, and without `no-store` either may be replayed from the cache.
    """
    return vary_on_headers("HX-Request")(cache_control(no_store=True)(view))


def _query_without_page(request: HttpRequest) -> str:
    """Return the current filters as a query string, for pagination links."""
    return urlencode([(key, value) for key, value in request.GET.items() if key != "page" and value])


# -- inbox -------------------------------------------------------------------------------


@require_GET
@reviewer_required
@_live_page
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    filters = InboxFilter(request.GET, user=request.user)
    page = _page(filters.pending_approvals(), request, INBOX_PAGE_SIZE)
    eligibility.mark(request.user, page.object_list)
    context = {
        "page": page,
        "count": page.paginator.count,
        "filters": filters,
        "filtered": any(filters.data.get(key) for key in ("agent", "tool")),
        "for_me": filters.for_me,
        "agents": selectors.run_agents(),
        "tools": selectors.approval_tools(),
        "query": _query_without_page(request),
        # The consumer filters live cards the same way, and inserts them on the first page only.
        "ws_url": "/ws/inbox/?" + urlencode({**request.GET.dict(), "page": page.number}),
    }
    template = "dashboard/_inbox_list.html" if request.htmx else "dashboard/inbox.html"
    return render(request, template, context)


# -- one approval ------------------------------------------------------------------------


def _approval_or_404(approval_id: str) -> Approval:
    if text.problem(approval_id) is not None:  # no approval has such an id (and PostgreSQL refuses NUL)
        raise Http404("No such approval.")
    try:
        return selectors.approval_get(approval_id)
    except services.NotFound:
        raise Http404("No such approval.") from None


def _approval_context(approval: Approval, form: DecisionForm, **extra: Any) -> dict[str, Any]:
    tool = registry.get(approval.tool)
    schema = tool.parameters_schema() if tool else None
    return {
        "approval": approval,
        "form": form,
        # Not the Tool itself: templates call callables, and a Tool is one.
        "tool_registered": tool is not None,
        "tool_description": tool.description if tool else "",
        "schema": schema,
        "arguments_table": _arguments_table(schema) if schema else [],
        "messages": selectors.message_list(run_id=approval.run_id),
        **extra,
    }


def _arguments_table(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a tool's arguments as rows a reviewer reads: name, type, required, description."""
    required = set(schema.get("required", []))
    rows = []
    for name, spec in schema.get("properties", {}).items():
        types = [spec["type"]] if "type" in spec else [option.get("type", "any") for option in spec.get("anyOf", [])]
        rows.append(
            {
                "name": name,
                "type": " or ".join(types) or "any",
                "required": name in required,
                "description": spec.get("description", ""),
            }
        )
    return rows


@require_GET
@reviewer_required
def approval_detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _approval_or_404(approval_id)
    eligibility.mark(request.user, [approval])
    return render(request, "dashboard/approval.html", _approval_context(approval, DecisionForm(approval=approval)))


@require_POST
@login_required
def approval_decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Record a decision; a decision already taken is shown (409), never an error page.

    Every attempt is audited, refused ones too (not a reviewer, unreadable input). The
    response fits where the request came from: the inbox card it replaces, the decision
    panel of the approval page, or (without htmx) the page itself.
    """
    if not is_reviewer(request.user):
        _refuse(request, approval_id, AuditEntry.Outcome.NOT_PERMITTED, "not a reviewer")
        raise PermissionDenied("reviewers only")
    try:
        approval = _approval_or_404(approval_id)
    except Http404:
        _refuse(request, approval_id, AuditEntry.Outcome.NOT_FOUND, "no such approval")
        raise
    form = DecisionForm(request.POST, approval=approval)
    refusal = ""
    if form.is_valid():
        status, approval, refusal = _decide(request, form)
    else:
        _refuse(request, approval_id, AuditEntry.Outcome.INVALID_ARGUMENTS, _errors_text(form))
        status = 422
    eligibility.mark(request.user, [approval])
    if status != 422:
        form = DecisionForm(approval=approval)  # a fresh form: the current arguments and their digest
    context = {"approval": approval, "form": form, "conflict": status == 409 and not refusal, "refusal": refusal}
    if request.htmx and request.htmx.target == f"card-{approval.id}":
        return render(request, "dashboard/_approval_card.html", context, status=status)
    if request.htmx:
        return render(request, "dashboard/_decision.html", context, status=status)
    if status == 200:
        return redirect("approval", approval_id=approval.id)
    return render(
        request,
        "dashboard/approval.html",
        _approval_context(approval, form, conflict=context["conflict"], refusal=refusal),
        status=status,
    )


def _refuse(request: HttpRequest, approval_id: str, outcome: str, reason: str) -> None:
    decision = str(request.POST.get("decision", ""))
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    services.approval_refuse(
        approval_id=approval_id, decision=decision, attempt=attempt, outcome=outcome, reason=reason
    )


def _errors_text(form: DecisionForm) -> str:
    return "; ".join(f"{field}: {' '.join(str(e) for e in errors)}" for field, errors in form.errors.items())


def _decide(request: HttpRequest, form: DecisionForm) -> tuple[int, Approval, str]:
    """Call the service; return the HTTP status, the approval as it now stands, and why it was refused."""
    data = form.cleaned_data
    try:
        services.approval_decide(
            approval_id=form.approval.id,
            decision=data["decision"],
            attempt=attempt_from(request, source=AuditEntry.Source.WEB),
            note=data["note"],
            # Sent whatever the decision: the service refuses an approval with feedback, never drops it.
            feedback=data["feedback"],
            arguments=form.edited_arguments(),
            payload=form.payload(),
            expect_digest=data["expect_digest"],
        )
    except (services.AlreadyDecided, services.WrongState):
        return 409, selectors.approval_get(form.approval.id), ""
    except services.DigestMismatch as exc:
        return 409, selectors.approval_get(form.approval.id), exc.message
    except services.NotPermitted as exc:
        return 403, selectors.approval_get(form.approval.id), exc.message
    except services.InvalidInput as exc:
        form.add_service_error(exc.details.get("field", ""), exc.message)
        return 422, form.approval, ""
    return 200, selectors.approval_get(form.approval.id), ""


# -- deadlines and scheduled calls -------------------------------------------------------


@require_POST
@reviewer_required
def approval_extend(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Push a deadline later (by an hour unless by_seconds says otherwise); answer with the deadline's part."""
    approval = _approval_or_404(approval_id)
    try:
        seconds = float(request.POST.get("by_seconds", "3600"))
    except ValueError:
        seconds = -1.0  # the service refuses it with the message
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    return _deadline_answer(
        request,
        approval,
        lambda: services.approval_extend(approval_id=approval.id, by_seconds=seconds, attempt=attempt),
    )


@require_POST
@reviewer_required
def approval_run_now(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Run a scheduled call now; answer with the deadline's part."""
    approval = _approval_or_404(approval_id)
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    return _deadline_answer(
        request, approval, lambda: services.toolcall_run_now(approval_id=approval.id, attempt=attempt), "Runs now."
    )


@require_POST
@reviewer_required
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Cancel a run (a scheduled one, from its card or page); answer where the request came from."""
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    try:
        services.run_cancel(run_id=run_id, attempt=attempt)
        said, status = "The run was cancelled.", 200
    except services.NotFound:
        raise Http404("No such run.") from None
    except services.WrongState as exc:
        said, status = exc.message, 409
    approval = selectors.run_approvals(selectors.run_get(run_id)).filter(on_timeout=Approval.OnTimeout.RUN).first()
    if request.htmx and approval is not None:
        eligibility.mark(request.user, [approval])
        return render(request, "dashboard/_deadline.html", {"approval": approval, "said": said}, status=status)
    return redirect("run", run_id=run_id)


def _deadline_answer(
    request: HtmxHttpRequest, approval: Approval, act: Callable[[], object], done: str = ""
) -> HttpResponse:
    status, said = 200, done
    try:
        act()
    except services.NotPermitted as exc:
        status, said = 403, exc.message
    except services.InvalidInput as exc:
        status, said = 422, exc.message
    except services.WrongState as exc:
        status, said = 409, exc.message
    approval = selectors.approval_get(approval.id)
    eligibility.mark(request.user, [approval])
    if not request.htmx:
        return redirect("approval", approval_id=approval.id)
    return render(request, "dashboard/_deadline.html", {"approval": approval, "said": said}, status=status)


# -- runs --------------------------------------------------------------------------------


@require_GET
@reviewer_required
@_live_page
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    filters = RunFilter(request.GET)
    status = filters.cleaned_data["status"] if filters.is_valid() else ""
    runs = selectors.run_list_with_pending(status=status or None)
    context = {
        "page": _page(runs, request, RUNS_PAGE_SIZE),
        "status": status,
        "statuses": Run.Status.choices,
        "query": _query_without_page(request),
    }
    template = "dashboard/_runs_table.html" if request.htmx else "dashboard/runs.html"
    return render(request, template, context)


@require_GET
@reviewer_required
@_live_page
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    try:
        run = selectors.run_get(run_id)
    except services.NotFound:
        raise Http404("No such run.") from None
    approvals = selectors.run_approvals(run)
    eligibility.mark(request.user, approvals)  # a scheduled call's run now and cancel, for who may decide it
    context = {
        "run": run,
        "events": selectors.run_events(run),
        "approvals": approvals,
        "definition": playground.definition(run),  # a run that carries its own agent shows it
    }
    template = "dashboard/_timeline.html" if request.htmx else "dashboard/run.html"
    return render(request, template, context)


# -- audit -------------------------------------------------------------------------------

AUDIT_CSV_COLUMNS = (
    "created_at",
    "actor",
    "on_behalf_of",
    "action",
    "tool",
    "approval_id",
    "run_id",
    "source",
    "origin",
    "outcome",
    "note",
    "arguments_diff",
    "detail",
    "prev_hash",
    "hash",
)


@require_GET
@admin_required
def audit(request: HttpRequest) -> HttpResponse:
    filters = AuditFilter(request.GET)
    context = {
        "page": _page(filters.entries(), request, AUDIT_PAGE_SIZE),
        "filters": filters,
        "people": selectors.audit_people(),
        "tools": selectors.audit_tools(),
        "query": _query_without_page(request),
    }
    return render(request, "dashboard/audit.html", context)


@require_GET
@admin_required
def audit_csv(request: HttpRequest) -> StreamingHttpResponse:
    """Stream the filtered audit history as CSV, oldest first, one row per decision attempt.

    The rows come from an async iterator, a batch at a time: under ASGI Django sends each
    batch as it is read (a sync iterator would be read whole into memory first).
    """
    entries = AuditFilter(request.GET).entries()
    name = f"agentfast-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"
    response = StreamingHttpResponse(_csv_lines(entries), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


CSV_BATCH = 1000


class _Echo:
    def write(self, value: str) -> str:
        return value


async def _csv_lines(entries: QuerySet[AuditEntry]) -> AsyncIterator[str]:
    """Yield the header, then the rows a batch at a time, by id (keyset: each batch is one indexed query)."""
    writer = csv.writer(_Echo())
    yield writer.writerow(AUDIT_CSV_COLUMNS)
    after: int | None = 0
    while after is not None:
        after, lines = await sync_to_async(_csv_batch)(entries, after, writer)
        if lines:
            yield lines


def _csv_batch(entries: QuerySet[AuditEntry], after: int, writer: Any) -> tuple[int | None, str]:
    """Return the CSV lines of the next batch after id `after`, and its last id (None: the export is done)."""
    batch = selectors.audit_entries_after(entries, pk=after, limit=CSV_BATCH)
    lines = "".join(writer.writerow(_csv_row(entry)) for entry in batch)
    return (batch[-1].pk if len(batch) == CSV_BATCH else None), lines


def _csv_row(entry: AuditEntry) -> list[str]:
    detail = entry.detail or {}
    row = [
        entry.created_at.isoformat(),
        entry.actor,
        entry.on_behalf_of,
        entry.action,
        entry.tool,
        entry.approval_id,
        entry.run_id,
        entry.source,
        entry.origin,
        entry.outcome,
        detail.get("note", ""),
        text.dumps(detail.get("arguments_diff", {})),
        text.dumps(detail),
        entry.prev_hash,
        entry.hash,
    ]
    return [_spreadsheet_safe(text.repair(str(value))) for value in row]


_FORMULA_STARTS = frozenset("=+-@")


def _spreadsheet_safe(value: str) -> str:
    """Defuse a cell a spreadsheet would run as a formula (CSV injection): notes and arguments are untrusted.

    Spreadsheets skip leading spaces and line breaks and read fullwidth ＝＋－＠ as = + - @,
    so the first visible character is normalized (NFKC) before it is checked.
    """
    if value[:1] in ("\t", "\r", "\n"):
        return "'" + value
    first = value.lstrip()[:1]
    return "'" + value if first and unicodedata.normalize("NFKC", first)[:1] in _FORMULA_STARTS else value


# -- health ------------------------------------------------------------------------------


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
