"""Pages of the reviewers' dashboard: inbox, approval, runs, audit.

Each view parses its input, calls a service or a selector, and renders. An htmx request
gets the partial that a full page includes, so every piece of markup has one template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from agents import selectors, services, text
from agents.models import Approval, AuditEntry, Run
from agents.policy.config import ConfigError, get_policy
from agents.services import eligibility
from agents.tools import registry
from agents.tools.registry import summarize as registry_summarize
from dashboard import audit_export, links, playground
from dashboard.auth import (
    admin_required,
    attempt_from,
    bearer_accepted,
    is_reviewer,
    reviewer_required,
    signin_required,
)
from dashboard.forms import AuditFilter, BulkDecisionForm, DecisionForm, InboxFilter, RunFilter, SavedFilterForm
from dashboard.templatetags.agentfast import shown_json, shown_text

INBOX_PAGE_SIZE = 20
# The inbox counts its pending approvals up to this many and says "500+" beyond: an exact
# COUNT(*) of 100,000 pending approvals (and their "For me" filter) costs more than the page.
INBOX_COUNT_CAP = 500


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it: `request.htmx` tells an htmx request apart."""

    htmx: HtmxDetails


RUNS_PAGE_SIZE = 25
TIMELINE_EVENTS = 200
AUDIT_PAGE_SIZE = 50
# Deeper pages would make the database skip that many rows: the filters narrow a search instead.
MAX_PAGE = 2000


@dataclass
class _Window:
    """One page of a list, found without counting the list: it reads one row past the page to know if more follow.

    A COUNT(*) over 100,000 runs or 1,000,000 audit entries costs more than the page itself, so the
    runs and audit pages say "Older →" when there is more rather than "page 3 of 40,000".
    """

    object_list: list[Any]
    number: int
    has_next: bool
    pages: int | None = None  # known when the list was counted (the inbox, up to INBOX_COUNT_CAP)
    paginator: None = None
    last_key: str = ""  # the id of the page's last row, where the next page starts (_pager.html's `after`)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.object_list)

    def __len__(self) -> int:
        return len(self.object_list)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    def has_other_pages(self) -> bool:
        return self.has_next or self.has_previous

    def next_page_number(self) -> int:
        return self.number + 1

    def previous_page_number(self) -> int:
        return self.number - 1


Keyset = Callable[[QuerySet[Any], str], QuerySet[Any] | None]


def _window(items: QuerySet[Any], request: HttpRequest, size: int, after: Keyset | None = None) -> _Window:
    """Return the requested page of `items` (page 1 for a missing or bad number), reading size + 1 rows.

    With `after` (how the list goes on from a row), the pager's next link names the last row
    shown: that page starts right after it, so a row added meanwhile does not show twice, as
    counting `page` rows from the top would. A link naming no row: by the number.
    """
    number = _page_number(request.GET.get("page", ""))
    following = after(items, request.GET.get("after", "")) if after is not None and number > 1 else None
    if following is not None:
        rows = _rows(following, 0, size + 1)
    else:
        rows = _rows(items, (number - 1) * size, number * size + 1)
    if not rows and number > 1:  # past the end (the list shrank, or a made-up number): the first page
        number, rows = 1, _rows(items, 0, size + 1)
    has_next = len(rows) > size
    last_key = str(rows[size - 1].pk) if has_next and after is not None else ""
    return _Window(object_list=rows[:size], number=number, has_next=has_next, last_key=last_key)


def _page_number(raw: str) -> int:
    """Return the page a `page` parameter names, up to MAX_PAGE; 1 for anything else.

    ASCII digits only: str.isdigit() admits "²" and "①", which int() refuses; and int() refuses
    over 4,300 digits, so a number longer than MAX_PAGE's is read as MAX_PAGE without it.
    """
    digits = raw.lstrip("0")
    if not (raw.isascii() and raw.isdigit()) or not digits:
        return 1
    return MAX_PAGE if len(digits) > len(str(MAX_PAGE)) else min(int(digits), MAX_PAGE)


def _rows(items: QuerySet[Any], start: int, stop: int) -> list[Any]:
    """Return items[start:stop]; past the first rows of a joined list, by their keys first, then in full.

    The rows skipped on the way to a later page of the inbox are then read for their keys only,
    not joined to the run and tool call each card shows, to be thrown away. A list without
    select_related (runs, audit) gains nothing from the second round trip.
    """
    if start == 0 or not items.query.select_related:
        return list(items[start:stop])
    keys = list(items.values_list("pk", flat=True)[start:stop])
    found = {row.pk: row for row in items.filter(pk__in=keys)}
    return [found[key] for key in keys if key in found]  # one decided in between is gone from the page


def _live_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Mark a page whose live list re-fetches itself (htmx) from the page's own URL.

    The fragment and the page share a URL: without `Vary` the browser's cache may hand the
    fragment to Back, and without `no-store` either may be replayed from the cache.
    """
    return vary_on_headers("HX-Request")(cache_control(no_store=True)(view))


def _query_without_page(params: QueryDict) -> str:
    """Return these filters as a query string, for pagination links (and what a saved filter keeps)."""
    return urlencode([(key, value) for key, value in params.items() if key not in ("page", "after") and value])


# -- inbox -------------------------------------------------------------------------------


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
    return {"count": min(count, INBOX_COUNT_CAP), "count_more": count > INBOX_COUNT_CAP}


@require_GET
@reviewer_required
@_live_page
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
    count = selectors.count_up_to(approvals, INBOX_COUNT_CAP + 1)
    oldest = filters.ordering == selectors.OLDEST
    after = selectors.oldest_first_after_row if oldest else selectors.newest_first_after_row
    page = _window(approvals, request, INBOX_PAGE_SIZE, after)
    if count <= INBOX_COUNT_CAP:
        page.pages = max(1, -(-count // INBOX_PAGE_SIZE))
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
        "query": _query_without_page(params),
        # Where the list is fetched again: this page, or (a refused save, answering a POST) the inbox it saves.
        "list_url": request.get_full_path() if save_form is None else f"/?{_query_without_page(params)}",
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


# -- bulk decisions ----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@signin_required
def approval_bulk(request: HttpRequest) -> HttpResponse:
    """Decide several cards at once: each a separate, audited decision through the same service.

    A GET is where signing in again leads after a bulk decision sent signed out: the inbox.
    """
    if request.method == "GET":
        return redirect("inbox")
    if not is_reviewer(request.user):
        raise PermissionDenied("reviewers only")
    form = BulkDecisionForm(request.POST)
    if not form.is_valid():
        # The note is shown back to copy: the inbox it was typed on is fetched again, empty.
        note = str(request.POST.get("note", "")).strip()
        refused = {
            "form_errors": _errors_text(form),
            "results": [],
            "unrecorded": [("Your note", note)] if note else [],
        }
        return render(request, "dashboard/bulk.html", refused, status=400)
    data = form.cleaned_data
    results = [
        _bulk_one(request, approval_id, digest, decision=data["decision"], note=data["note"])
        for approval_id, digest in data["cards"]
    ]
    done = sum(1 for result in results if result["ok"])
    voted = sum(1 for result in results if result["voted"])
    context = {"results": results, "done": done, "voted": voted, "decision": data["decision"], "total": len(results)}
    return render(request, "dashboard/bulk.html", context)


def _bulk_one(request: HttpRequest, approval_id: str, digest: str, *, decision: str, note: str) -> dict[str, Any]:
    """Decide one card of a bulk decision; return what happened to it, for the summary.

    `ok`: the call is now decided as asked. `voted`: an approval counted towards a quorum not
    reached yet, so the call still waits (`tally` says for how many more).
    """
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    refused = {"id": approval_id, "ok": False, "voted": False, "tally": ""}
    try:
        result = services.approval_decide(
            approval_id=approval_id,
            decision=decision,
            attempt=attempt,
            note=note,
            expect_digest=digest,  # empty: not bound (the card was not shown)
        )
    except services.NotFound:
        _refuse(request, approval_id, AuditEntry.Outcome.NOT_FOUND, "no such approval")
        return {**refused, "why": "no such approval"}
    except services.AlreadyDecided:
        return {**refused, "why": "someone decided it first"}
    except services.WrongState as exc:  # expired: its deadline decided it, not someone
        return {**refused, "why": exc.message}
    except (services.DigestMismatch, services.NotPermitted, services.InvalidInput) as exc:
        return {**refused, "why": exc.message}
    voted = result.outcome == AuditEntry.Outcome.VOTED
    # The same vote again is idempotent too: the call still waits for the rest of its quorum.
    again = result.outcome == AuditEntry.Outcome.IDEMPOTENT and result.approval.status == Approval.Status.PENDING
    if voted or again:
        return {**refused, "voted": True, "tally": result.approval.tally, "why": "already voted" if again else ""}
    return {**refused, "ok": True, "why": ""}


# -- one approval ------------------------------------------------------------------------


def _approval_or_404(approval_id: str) -> Approval:
    if text.problem(approval_id) is not None:  # no approval has such an id (and PostgreSQL refuses NUL)
        raise Http404("No such approval.")
    try:
        return selectors.approval_get(approval_id)
    except services.NotFound:
        raise Http404("No such approval.") from None


def _next_pending(request: HttpRequest, approval: Approval) -> Approval | None:
    """Return the call this reviewer may decide next, the longest waiting first."""
    among = eligibility.decidable(request.user, selectors.approval_list(order=selectors.OLDEST))
    return selectors.approval_next_pending(after=approval.id, among=among)


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
    prepare_cards(request.user, [approval])
    context = _approval_context(
        approval,
        DecisionForm(approval=approval),
        ws_url="/ws/approvals/?" + urlencode({"id": approval.id}),
        next_pending=_next_pending(request, approval),
    )
    return render(request, "dashboard/approval.html", context)


@require_http_methods(["GET", "POST"])
@signin_required
def approval_decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Record a decision; a decision already taken is shown (409), never an error page.

    Every attempt is audited, refused ones too (not a reviewer, unreadable input). The
    response fits where the request came from: the inbox card it replaces, the decision
    panel of the approval page, or (without htmx) the page itself. A GET is where signing in
    again leads after a decision sent signed out: the approval, to decide again (a 405 was blank).
    """
    if request.method == "GET":
        return redirect("approval", approval_id=approval_id)
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
    prepare_cards(request.user, [approval])
    conflict = status == 409 and not refusal
    unrecorded = _unrecorded(form) if conflict else []
    if status == 200:
        form = DecisionForm(approval=approval)  # a fresh form: the current arguments and their digest
    elif status != 422:
        form = _form_again(form, approval)
    context = {
        **CARD_DEFAULTS,
        "approval": approval,
        "form": form,
        "conflict": conflict,
        "unrecorded": unrecorded,
        "refusal": refusal,
        "next_pending": _next_pending(request, approval),
    }
    if request.htmx and request.htmx.target == f"card-{approval.id}":
        return _refusal_shown(render(request, "dashboard/_approval_card.html", context, status=status))
    if request.htmx:
        return _refusal_shown(render(request, "dashboard/_decision.html", context, status=status))
    if status == 200:
        return redirect("approval", approval_id=approval.id)
    return render(
        request,
        "dashboard/approval.html",
        _approval_context(approval, form, conflict=conflict, unrecorded=unrecorded, refusal=refusal, ws_url=""),
        status=status,
    )


# What a reviewer typed that a refused decision shows again; `arguments` only while they are still those the reviewer saw.
_TYPED_FIELDS = ("note", "feedback", "answer", "remember", "remember_scope")


def _form_again(refused: DecisionForm, approval: Approval) -> DecisionForm:
    """Return the form to show after a refusal (not permitted, arguments changed): with what the reviewer typed.

    A refusal leaves the call pending, for this reviewer to decide again with their note, answer
    and edit; only when the arguments changed meanwhile does the editor show the current ones
    (with their digest), so that a second click approves what the page shows.
    """
    typed = {name: refused.data.get(name) for name in _TYPED_FIELDS if refused.data.get(name) is not None}
    seen = str(refused.data.get("expect_digest", "")).strip().lower()  # whole, or the short one pages print
    if "arguments" in refused.data and approval.digest.startswith(seen):
        typed["arguments"] = refused.data.get("arguments")
    return DecisionForm(approval=approval, initial=typed)


_WORDS = (("note", "Your note"), ("feedback", "Your feedback"), ("answer", "Your answer"))


def _unrecorded(form: DecisionForm) -> list[tuple[str, str]]:
    """Return what a reviewer wrote with a decision that came too late, shown for them to copy: none of it was kept."""
    typed = [(label, str(form.cleaned_data.get(name) or "").strip()) for name, label in _WORDS]
    edited = form.edited_arguments()
    if edited is not None:
        typed.append(("Your arguments", shown_json(edited, indent=2)))
    return [(label, words) for label, words in typed if words]


# htmx swaps no 403 (a refused page, a failed CSRF check would land in a card): a partial that says
# why a decision was not permitted carries this header, and app.js swaps it like a 409.
REFUSAL_HEADER = "X-Agentfast-Refusal"


def _refusal_shown(response: HttpResponse) -> HttpResponse:
    """Mark a partial answering 403 (not an approver, four eyes, a grant refused) as the refusal to show."""
    if response.status_code == 403:
        response[REFUSAL_HEADER] = "not-permitted"
    return response


def _refuse(request: HttpRequest, approval_id: str, outcome: str, reason: str) -> None:
    decision = str(request.POST.get("decision", ""))
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    services.approval_refuse(
        approval_id=approval_id, decision=decision, attempt=attempt, outcome=outcome, reason=reason
    )


def _errors_text(form: forms.Form) -> str:
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
            remember=form.remembered(),
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
    return _refusal_shown(
        render(request, "dashboard/_deadline.html", {"approval": approval, "said": said}, status=status)
    )


# -- runs --------------------------------------------------------------------------------


@require_GET
@reviewer_required
@_live_page
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    filters = RunFilter(request.GET)
    page = _window(filters.runs(), request, RUNS_PAGE_SIZE, selectors.newest_first_after_row)
    data = getattr(filters, "cleaned_data", {})  # after runs(), which validates the filters
    # The pending counts of the visible runs only: one small query, not a join over every run.
    visible = [run.id for run in page]
    waiting = selectors.run_pending_and_scheduled(visible)
    run_url = links.route("run")
    for run in page:
        run.pending, run.scheduled_for = waiting.get(run.id, (0, None))
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
        "query": _query_without_page(request.GET),
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
@_live_page
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
        return _refusal_shown(
            render(request, "dashboard/_deadline.html", {"approval": scheduled, "said": said}, status=status)
        )
    if status != 200:
        return _run_page(request, selectors.run_get(run.id), cancel_error=said, status=status)
    return redirect("run", run_id=run.id)


# -- audit -------------------------------------------------------------------------------

AUDIT_DETAIL_SHOWN = ("note", "feedback", "arguments_diff", "error", "existing")


@require_GET
@admin_required
def audit(request: HttpRequest) -> HttpResponse:
    filters = AuditFilter(request.GET)
    page = _window(filters.entries(), request, AUDIT_PAGE_SIZE, selectors.newest_first_after_row)
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
        "query": _query_without_page(request.GET),
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
        message = f"Nothing exported: {_errors_text(filters)}\n"
        return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
    entries = filters.entries()
    name = f"agentfast-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"
    response = StreamingHttpResponse(audit_export.csv_lines(entries), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


# -- health ------------------------------------------------------------------------------


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
