"""The "Standing decisions" page: remembered approvals and rejections, and revoking them."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents import selectors, services
from agents.models import AuditEntry
from dashboard.auth import is_admin, reviewer_required


@require_GET
@reviewer_required
def grant_list(request: HttpRequest) -> HttpResponse:
    """List the live standing decisions; every reviewer sees all, with a revoke button on those they may revoke."""
    grants = list(selectors.grant_list())
    admin = is_admin(request.user)
    for grant in grants:
        grant.revocable = admin or grant.created_by == request.user.get_username()  # type: ignore[attr-defined]
    return render(request, "dashboard/grants.html", {"grants": grants})


@require_POST
@reviewer_required
def grant_revoke(request: HttpRequest, grant_id: str) -> HttpResponse:
    """Revoke a standing decision: its creator's own, or any for an admin."""
    try:
        services.grant_revoke(grant_id=grant_id, actor=request.user.get_username(), source=AuditEntry.Source.WEB)
    except services.NotFound:
        raise Http404("No such standing decision.") from None
    except services.NotPermitted as exc:
        raise PermissionDenied(exc.message) from None
    return redirect("grants")
