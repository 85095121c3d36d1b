"""One approval: its page, a reviewer's decision (one card, or several at once), its deadline and schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents import selectors, services, text
from agents.models import Approval, AuditEntry
from agents.services import eligibility
from agents.tools import registry
from dashboard.auth import attempt_from, is_reviewer, reviewer_required, signin_required
from dashboard.templatetags.agentfast import shown_json
from dashboard.web.forms import BulkDecisionForm, DecisionForm
from dashboard.web.inbox import CARD_DEFAULTS, describe_cards, prepare_cards
from dashboard.web.pages import HtmxHttpRequest, errors_text, refusal_shown


@require_http_methods(["GET", "POST"])
@signin_required
def approval_bulk(request: HttpRequest) -> HttpResponse:
    """Decide several cards at once: each a separate, audited decision through the same service.

    A GET is where signing in again leads after a bulk decision sent signed out: the inbox.
    """
    if request.method == "GET":
        return redirect("inbox")
    form = BulkDecisionForm(request.POST)
    if not is_reviewer(request.user):
        # Each card is a decision attempt: refused, and audited, as one card's would be.
        if form.is_valid():
            for approval_id, _ in form.cleaned_data["cards"]:
                _refuse(request, approval_id, AuditEntry.Outcome.NOT_PERMITTED, "not a reviewer")
        raise PermissionDenied("reviewers only")
    if not form.is_valid():
        # The note is shown back to copy: the inbox it was typed on is fetched again, empty.
        note = str(request.POST.get("note", "")).strip()
        refused = {
            "form_errors": errors_text(form),
            "results": [],
            "unrecorded": [("Your note", note)] if note else [],
        }
        return render(request, "dashboard/bulk.html", refused, status=400)
    data = form.cleaned_data
    results = [
        _bulk_one(request, approval_id, digest, decision=data["decision"], note=data["note"])
        for approval_id, digest in data["cards"]
    ]
    _name_results(results)
    done = sum(1 for result in results if result["ok"])
    voted = sum(1 for result in results if result["voted"])
    undecided = len(results) - done - voted
    context = {
        "results": results,
        "done": done,
        "voted": voted,
        "refused": undecided,
        "decision": data["decision"],
        "total": len(results),
        # The note went with the calls decided, not with those refused: shown to copy for them.
        "unrecorded": [(_note_label(undecided, len(results)), data["note"])] if undecided and data["note"] else [],
    }
    return render(request, "dashboard/bulk.html", context)


def _name_results(results: list[dict[str, Any]]) -> None:
    """Give each result its call as a card shows it (summary, link), so that a reviewer knows which one it was."""
    approvals = selectors.approvals_in(result["id"] for result in results)
    describe_cards(list(approvals.values()))
    for result in results:
        result["approval"] = approvals.get(result["id"])


def _note_label(refused: int, total: int) -> str:
    """Name the bulk note shown back: it was kept with every call decided, so it is shown for the others."""
    if refused == total:
        return "Your note"
    return "Your note, for the call not decided" if refused == 1 else "Your note, for the calls not decided"


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
    except services.NotFound:  # audited by the service
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
        _refuse(request, approval_id, AuditEntry.Outcome.INVALID_ARGUMENTS, errors_text(form))
        status = 422
    prepare_cards(request.user, [approval])
    conflict = status == 409 and not refusal
    # Decided first, or no longer this reviewer's to decide (approvers changed, four eyes): the form
    # is not shown again, so what they typed is, to copy.
    shut_out = status == 403 and not getattr(approval, "decidable", True)
    unrecorded = _unrecorded(form) if conflict or shut_out else []
    if status == 409 and refusal and form.is_valid():  # the arguments changed: the editor shows the new ones
        unrecorded = [(label, words) for label, words in _unrecorded(form) if label == "Your arguments"]
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
        return refusal_shown(render(request, "dashboard/_approval_card.html", context, status=status))
    if request.htmx:
        return refusal_shown(render(request, "dashboard/_decision.html", context, status=status))
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


def _refuse(request: HttpRequest, approval_id: str, outcome: str, reason: str, decision: str | None = None) -> None:
    """Audit a refused decision attempt: the decision asked for (the form's, unless given)."""
    decision = str(request.POST.get("decision", "")) if decision is None else decision
    attempt = attempt_from(request, source=AuditEntry.Source.WEB)
    services.approval_refuse(
        approval_id=approval_id, decision=decision, attempt=attempt, outcome=outcome, reason=reason
    )


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
@signin_required
def approval_run_now(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Run a scheduled call now; answer with the deadline's part."""
    if not is_reviewer(request.user):
        # Run now approves the call: a refused press is audited as a refused decision is.
        _refuse(request, approval_id, AuditEntry.Outcome.NOT_PERMITTED, "not a reviewer", Approval.Status.APPROVED)
        raise PermissionDenied("reviewers only")
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
    except services.NotFound as exc:  # Run now on a call that is not scheduled
        status, said = 404, exc.message
    approval = selectors.approval_get(approval.id)
    eligibility.mark(request.user, [approval])
    if not request.htmx:
        return redirect("approval", approval_id=approval.id)
    return refusal_shown(
        render(request, "dashboard/_deadline.html", {"approval": approval, "said": said}, status=status)
    )
