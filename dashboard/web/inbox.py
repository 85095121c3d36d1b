"""The inbox: the calls waiting for a decision, filtered, a page at a time, and the filters a reviewer saved.

Each view parses its input, calls a service or a selector, and renders. An htmx request
gets the partial that a full page includes, so every piece of markup has one template.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents import selectors
from agents.models import Approval
from agents.policy.config import ConfigError, get_policy
from agents.services import eligibility
from agents.tools import registry
from agents.tools.registry import summarize as registry_summarize
from dashboard.auth import reviewer_required
from dashboard.templatetags.agentfast import shown_text
from dashboard.web import links
from dashboard.web.forms import InboxFilter, SavedFilterForm
from dashboard.web.pages import (
    HtmxHttpRequest,
    count_context,
    count_pages,
    live_page,
    query_without_page,
    window,
)

INBOX_PAGE_SIZE = 20
# The inbox counts its pending approvals up to this many and says "500+" beyond: an exact
# COUNT(*) of 100,000 pending approvals (and their "For me" filter) costs more than the page.
INBOX_COUNT_CAP = 500


def prepare_cards(user: Any, approvals: Iterable[Approval], groups: set[str] | None = None) -> None:
    """Give each card what a reviewer triages by: may I decide, a summary, the risk, its place in its run."""
    approvals = list(approvals)
    eligibility.mark(user, approvals, groups)
    describe_cards(approvals)


def describe_cards(approvals: list[Approval]) -> None:
    """Give each card what is the same for every reviewer: a summary, the risk, its place in its run, its links."""
    positions = selectors.approval_run_positions(approvals)
    try:
        policy: Any = get_policy()
    except ConfigError:
        policy = None  # the page still lists the calls; the commands name the broken file
    approval_url, decide_url, run_url = links.route("approval"), links.route("approval-decide"), links.route("run")
    for approval in approvals:
        tool = registry.get(approval.tool)
        arguments = approval.current_arguments
        # Display-only attributes, like eligibility.mark's `decidable`.
        summary = tool.summarize(arguments) if tool else registry_summarize(arguments)
        approval.summary = shown_text(summary)  # type: ignore[attr-defined]
        approval.risk = policy.tool_policy(approval.tool).risk if policy is not None else ""  # type: ignore[attr-defined]
        approval.position, approval.siblings = positions.get(approval.id, (1, 1))  # type: ignore[attr-defined]
        approval.url, approval.decide_url = approval_url(approval.id), decide_url(approval.id)  # type: ignore[attr-defined]
        approval.run_url = run_url(approval.run_id)  # type: ignore[attr-defined]


# What a card shows only in a decision's answer or a push (_approval_card.html, _deadline.html).
CARD_DEFAULTS: dict[str, Any] = {
    "form": None,
    "refusal": "",
    "conflict": False,
    "next_pending": None,
    "oob": False,
    "said": "",
    "unrecorded": [],
}


def pending_count_context(count: int) -> dict[str, Any]:
    """What _pending_count.html shows of a count read up to INBOX_COUNT_CAP + 1: the number, or "500+"."""
    return count_context(count, INBOX_COUNT_CAP)


@require_GET
@reviewer_required
@live_page
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    return _inbox_page(request, request.GET)


def _inbox_page(
    request: HtmxHttpRequest, params: QueryDict, *, save_form: SavedFilterForm | None = None
) -> HttpResponse:
    """Render the inbox with these filters; `save_form`: a name to save them under that was refused, shown by its field.

    A filter that does not read is named above the list (400) and left out; the others apply.
    """
    groups = eligibility.group_names(request.user)  # read once, for the For me filter and the cards
    filters = InboxFilter(params, user=request.user)
    approvals = filters.pending_approvals(groups)
    oldest = filters.ordering == selectors.OLDEST
    after = selectors.oldest_first_after_row if oldest else selectors.newest_first_after_row
    page = window(approvals, request, INBOX_PAGE_SIZE, after)
    count = count_pages(page, approvals, size=INBOX_PAGE_SIZE, cap=INBOX_COUNT_CAP)
    prepare_cards(request.user, page.object_list, groups)
    agents, tools = selectors.approval_filter_choices()
    context = {
        "page": page,
        **pending_count_context(count),
        "filters": filters,
        "filtered": any(params.get(key) for key in ("agent", "tool", "q")),
        "for_me": filters.for_me,
        "order": filters.ordering,
        "search": filters.search,
        "agents": agents,
        "tools": tools,
        "saved_filters": _saved_filters(request),
        "save_form": save_form,
        "query": query_without_page(params),
        # Where the list is fetched again: this page, or (a refused save, answering a POST) the inbox it saves.
        "list_url": request.get_full_path() if save_form is None else f"/?{query_without_page(params)}",
        # Given as nothing: a name missing from the context is looked up through three exceptions, on every card.
        **CARD_DEFAULTS,
        # The consumer filters live cards the same way (the filters that read: the list leaves the
        # others out), and inserts them on the first page only.
        # `last`: with the oldest first, a new card belongs at the end of the last page.
        "ws_url": "/ws/inbox/?"
        + urlencode({**filters.applied(), "page": page.number, "last": "0" if page.has_next else "1"}),
    }
    if request.htmx:  # the list fetched again: the filters' errors are on the page already
        return render(request, "dashboard/_inbox_list.html", context)
    refused = bool(filters.errors) or save_form is not None
    return render(request, "dashboard/inbox.html", context, status=400 if refused else 200)


# -- saved filters (kept in the reviewer's session: a handful of links, nothing to migrate) --

SAVED_FILTERS_KEY = "inbox_saved_filters"
MAX_SAVED_FILTERS = 20


def _saved_filters(request: HttpRequest) -> list[dict[str, str]]:
    saved = request.session.get(SAVED_FILTERS_KEY, [])
    return saved if isinstance(saved, list) else []


@require_POST
@reviewer_required
def inbox_filter_save(request: HtmxHttpRequest) -> HttpResponse:
    """Remember the inbox's current filters under a name, or forget the name when `forget` is sent."""
    form = SavedFilterForm(request.POST)
    if not form.is_valid():  # the inbox these filters show, with the message by the name and the name as typed
        return _inbox_page(request, QueryDict(str(request.POST.get("query", ""))), save_form=form)
    name = form.cleaned_data["name"]
    # Only the filters' own keys are kept, so a saved link can never carry anything else.
    query = QueryDict(form.cleaned_data["query"])
    kept = urlencode([(key, query[key]) for key in InboxFilter.KEYS if query.get(key)])
    saved = [entry for entry in _saved_filters(request) if entry.get("name") != name]
    if not request.POST.get("forget"):
        saved = [*saved, {"name": name, "query": kept}][-MAX_SAVED_FILTERS:]
    request.session[SAVED_FILTERS_KEY] = saved
    return redirect(f"/?{kept}" if not request.POST.get("forget") else "/")
