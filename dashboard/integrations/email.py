"""One-click links from notification mails: a GET shows a confirmation, only the POST decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from agents import services
from agents.models import Approval, AuditEntry
from agents.notify.channels import ONE_CLICK_MAX_AGE, ONE_CLICK_SALT
from agents.notify.models import OneClickLink
from agents.services import notify as notify_services
from dashboard.auth import client_address, is_reviewer
from dashboard.integrations.outcome import outcome_line, vote_line

TEMPLATE = "dashboard/integrations/one_click.html"


@dataclass(frozen=True)
class Link:
    approval: Approval
    username: str
    nonce: str
    decision: str
    digest: str  # of the arguments the mail showed


CHANGED = "The call changed since this mail was sent. Open the approval in agentfast instead."


class LinkRefused(Exception):
    """The link cannot be used; the message says why, in plain words."""


@never_cache
@require_http_methods(["GET", "POST"])
def one_click(request: HttpRequest, token: str) -> HttpResponse:
    """Show what a mailed link would decide; decide it on the confirming POST, once."""
    try:
        link = _link(token)
    except LinkRefused as exc:
        return render(request, TEMPLATE, {"refused": str(exc)}, status=400)
    if not _may_read(link.username):
        # The mail outlives the role (a forwarded mail, a leaver's mailbox): nothing of the call is
        # shown, whatever became of it. A POST goes on to _decide, which refuses it audited.
        if request.method == "POST":
            return _decide(request, link, {})
        return render(request, TEMPLATE, {"refused": f"{link.username} may not decide approvals."}, status=403)
    context: dict[str, Any] = {"link": link, "approval": link.approval}
    if link.approval.status != Approval.Status.PENDING and request.method == "GET":
        return render(request, TEMPLATE, {**context, "outcome": outcome_line(link.approval)}, status=409)
    if link.decision == Approval.Status.APPROVED and link.approval.request is not None:
        # Mailed before questions lost their Approve link: approving one needs the reviewer's answer.
        refused = f"{link.approval.tool} asked a question: approve it with your answer on its page in agentfast."
        return render(request, TEMPLATE, {**context, "refused": refused}, status=400)
    if request.method == "GET":
        return render(request, TEMPLATE, context)
    return _decide(request, link, context)


def _link(token: str) -> Link:
    """Return the link a token stands for, or refuse it: forged, expired, used, or for changed arguments."""
    try:
        claims = signing.loads(token, salt=ONE_CLICK_SALT, max_age=ONE_CLICK_MAX_AGE)
    except signing.SignatureExpired:
        raise LinkRefused("This link has expired. Open the approval in agentfast instead.") from None
    except signing.BadSignature:
        raise LinkRefused("This link is not valid.") from None
    approval = Approval.objects.select_related("tool_call", "run").filter(pk=claims.get("a", "")).first()
    if approval is None or claims.get("k") not in ("approved", "rejected"):
        raise LinkRefused("This link is not valid.")
    # The current arguments (a quorum vote may have edited them), not the model's: those are what it would approve.
    if claims.get("d") != approval.digest:
        raise LinkRefused(CHANGED)
    used = OneClickLink.objects.filter(nonce=claims.get("n", ""), approval_id=approval.id, username=claims.get("u"))
    if not used.filter(used_at__isnull=True).exists():
        raise LinkRefused("This link was already used; each link works once.")
    return Link(approval=approval, username=claims["u"], nonce=claims["n"], decision=claims["k"], digest=claims["d"])


def _may_read(username: str) -> bool:
    """Return whether a link's recipient is still a reviewer (or an admin), active: whom its page may show the call."""
    user = User.objects.filter(username=username).first()
    return user is not None and is_reviewer(user)


def _decide(request: HttpRequest, link: Link, context: dict[str, Any]) -> HttpResponse:
    attempt = services.Attempt(actor=link.username, source=AuditEntry.Source.EMAIL, origin=client_address(request))
    if not _may_read(link.username):
        services.approval_refuse(
            approval_id=link.approval.id,
            decision=link.decision,
            attempt=attempt,
            outcome=AuditEntry.Outcome.NOT_PERMITTED,
            reason="not a reviewer",
        )
        return render(request, TEMPLATE, {"refused": f"{link.username} may not decide approvals."}, status=403)
    if not notify_services.oneclick_use(nonce=link.nonce, approval_id=link.approval.id, username=link.username):
        return render(request, TEMPLATE, {"refused": "This link was already used; each link works once."}, status=400)
    try:
        # Bound to the digest under the decision's locks too: an edit between the page and the press refuses it.
        services.approval_decide(
            approval_id=link.approval.id, decision=link.decision, attempt=attempt, expect_digest=link.digest
        )
    except (services.AlreadyDecided, services.WrongState):
        link.approval.refresh_from_db()
        return render(request, TEMPLATE, {**context, "outcome": outcome_line(link.approval)}, status=409)
    except (services.DigestMismatch, services.InvalidInput, services.NotPermitted, services.NotFound) as exc:
        # Refused, nothing decided: the press gives its use back, so the mail's other link (Reject
        # after a refused Approve) still works, as the same buttons in Slack do.
        notify_services.oneclick_release(nonce=link.nonce, approval_id=link.approval.id, username=link.username)
        if isinstance(exc, services.DigestMismatch):
            return render(request, TEMPLATE, {**context, "refused": CHANGED}, status=409)
        status = 422 if isinstance(exc, services.InvalidInput) else 403  # 403: outside the approvers, four eyes
        return render(request, TEMPLATE, {**context, "refused": exc.message}, status=status)
    link.approval.refresh_from_db()
    if link.approval.status == Approval.Status.PENDING:  # a vote short of the quorum: the call still waits
        return render(request, TEMPLATE, {**context, "outcome": vote_line(link.approval, link.username)})
    return render(request, TEMPLATE, {**context, "done": True})
