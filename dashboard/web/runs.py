"""Runs: the list, one run's timeline, and cancelling a run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from agents import selectors, services, text
from agents.models import Approval, AuditEntry, Run
from agents.services import eligibility
from dashboard.auth import attempt_from, reviewer_required
from dashboard.web import links, playground
from dashboard.web.forms import RunFilter
from dashboard.web.pages import HtmxHttpRequest, live_page, query_without_page, refusal_shown, window

RUNS_PAGE_SIZE = 25
TIMELINE_EVENTS = 200


@require_GET
@reviewer_required
@live_page
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    filters = RunFilter(request.GET)
    page = window(filters.runs(), request, RUNS_PAGE_SIZE, selectors.newest_first_after_row)
    data = getattr(filters, "cleaned_data", {})  # after runs(), which validates the filters
    # The pending counts of the visible runs only: one small query, not a join over every run.
    visible = [run.id for run in page]
    waiting = selectors.run_pending_and_scheduled(visible)
    held = selectors.run_held_until([run.id for run in page if run.status == Run.Status.SUSPENDED], timezone.now())
    run_url = links.route("run")
    for run in page:
        run.pending, run.scheduled_for = waiting.get(run.id, (0, None))
        run.held_until = held.get(run.id)
        run.url = run_url(run.id)
    agents, creators = selectors.run_filter_choices()
    context = {
        "page": page,
        "filters": filters,
        "status": data.get("status", ""),
        "filtered": any(data.get(key) for key in ("q", "status", "agent", "creator", "since", "until")),
        "statuses": Run.Status.choices,
        "agents": agents,
        "creators": creators,
        "query": query_without_page(request.GET),
    }
    template = "dashboard/_runs_table.html" if request.htmx else "dashboard/runs.html"
    # Unreadable search text is refused, clearly, rather than searched for.
    return render(request, template, context, status=400 if "q" in filters.errors else 200)


def _run_or_404(run_id: str) -> Run:
    if text.problem(run_id) is not None:
        raise Http404("No such run.")
    try:
        return selectors.run_get(run_id)
    except services.NotFound:
        raise Http404("No such run.") from None


@require_GET
@reviewer_required
@live_page
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    return _run_page(request, _run_or_404(run_id))


def _run_page(request: HtmxHttpRequest, run: Run, *, cancel_error: str = "", status: int = 200) -> HttpResponse:
    approvals = list(selectors.run_approvals(run))
    eligibility.mark(request.user, approvals)  # a scheduled call's run now and cancel, for who may decide it
    # A long run shows its latest events (as fast at 10,000 events as at 10); `all=1` shows every one.
    events: Iterable[Any]
    if request.GET.get("all") == "1":
        events, earlier = selectors.run_events(run), False
    else:
        events, earlier = selectors.run_events_latest(run, TIMELINE_EVENTS)
    context = {
        "run": run,
        "events": events,
        "earlier": earlier,
        "timeline_limit": TIMELINE_EVENTS,
        "approvals": approvals,
        "waiting": [approval for approval in approvals if approval.status == Approval.Status.PENDING],
        "cancel_error": cancel_error,
        "definition": playground.definition(run),  # a run that carries its own agent shows it
    }
    template = "dashboard/_timeline.html" if request.htmx else "dashboard/run.html"
    return render(request, template, context, status=status)


@require_POST
@reviewer_required
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Cancel a run that has not ended; one that has ended, is running a call (409), or that holds a call
    this reviewer may not decide (403), says why."""
    run = _run_or_404(run_id)
    said, status = "The run was cancelled.", 200
    try:
        services.run_cancel(run_id=run.id, attempt=attempt_from(request, source=AuditEntry.Source.WEB))
    except services.WrongState as exc:
        said, status = exc.message, 409
    except services.NotPermitted as exc:
        said, status = exc.message, 403
    scheduled = selectors.run_approvals(run).filter(on_timeout=Approval.OnTimeout.RUN).first()
    if request.htmx and scheduled is not None:  # from a scheduled call's card: answer with its part
        eligibility.mark(request.user, [scheduled])
        return refusal_shown(
            render(request, "dashboard/_deadline.html", {"approval": scheduled, "said": said}, status=status)
        )
    if status != 200:
        return _run_page(request, selectors.run_get(run.id), cancel_error=said, status=status)
    return redirect("run", run_id=run.id)
