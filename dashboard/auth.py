"""Who may see and decide approvals: reviewers and admins (groups made by `users create`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from agents.services import Attempt

DECIDE = "agents.decide_approval"
AUDIT = "agents.view_auditentry"
ON_BEHALF = "agents.decide_on_behalf"


def is_reviewer(user: Any) -> bool:
    """Return whether the user may see and decide approvals (admins may too)."""
    return bool(user.is_authenticated and user.is_active and user.has_perm(DECIDE))


def is_admin(user: Any) -> bool:
    """Return whether the user may read the audit history."""
    return bool(user.is_authenticated and user.is_active and user.has_perm(AUDIT))


def reviewer_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Send anonymous users to the login page; refuse (403) signed-in non-reviewers."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_reviewer(request.user):
            raise PermissionDenied("reviewers only")
        return view(request, *args, **kwargs)

    return login_required(wrapped)


def admin_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_admin(request.user):
            raise PermissionDenied("admins only")
        return view(request, *args, **kwargs)

    return login_required(wrapped)


def client_address(request: HttpRequest) -> str:
    """Return where a request came from, for the audit (the proxy's view if behind one)."""
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    return forwarded.split(",")[0].strip() or request.META.get("REMOTE_ADDR", "")


def attempt_from(request: HttpRequest, *, source: str, on_behalf_of: str = "") -> Attempt:
    """Return the decision attempt of an authenticated request: identity from the session or token."""
    return Attempt(
        actor=request.user.get_username(),
        source=source,
        origin=client_address(request),
        on_behalf_of="" if on_behalf_of == request.user.get_username() else on_behalf_of,
    )
