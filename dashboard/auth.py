"""Who may see and decide approvals: reviewers and admins (groups made by `users create`)."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from functools import wraps
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils.crypto import constant_time_compare

from agents.models import AuditEntry
from agents.services import Attempt, token_authenticate

DECIDE = "agents.decide_approval"
AUDIT = "agents.view_auditentry"
ON_BEHALF = "agents.decide_on_behalf"
_ORIGIN_CHARS = AuditEntry._meta.get_field("origin").max_length


def is_reviewer(user: Any) -> bool:
    """Return whether the user may see and decide approvals (admins may too)."""
    return bool(user.is_authenticated and user.is_active and user.has_perm(DECIDE))


def session_holds(user: Any, session_key: str | None) -> bool:
    """Return whether the session is still this user's sign-in, as django.contrib.auth.get_user judges it.

    A session signed in before the password changed (Django's session hash) is over.
    """
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if str(session.get(SESSION_KEY)) != str(user.pk):
        return False
    signed = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(signed, digest) for digest in hashes)


def is_admin(user: Any) -> bool:
    """Return whether the user may read the audit history."""
    return bool(user.is_authenticated and user.is_active and user.has_perm(AUDIT))


SIGNED_OUT = "You are signed out, so nothing was done: sign in again, then try again."


def signin_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Send anonymous users to the login page; answer an anonymous htmx request with a 401 instead.

    htmx follows a redirect like any XHR and would swap the login page into the card or panel
    that asked, over what the reviewer typed. It does not swap a 401 (base.html's
    responseHandling), so app.js can say the decision was not recorded and keep the text.
    """
    redirecting = login_required(view)

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.headers.get("HX-Request") == "true" and not request.user.is_authenticated:
            return HttpResponse(SIGNED_OUT, status=401, content_type="text/plain; charset=utf-8")
        return redirecting(request, *args, **kwargs)

    return wrapped


def reviewer_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Send anonymous users to the login page (htmx: a 401); refuse (403) signed-in non-reviewers."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not is_reviewer(request.user):
            raise PermissionDenied("reviewers only")
        return view(request, *args, **kwargs)

    return signin_required(wrapped)


UNKNOWN_TOKEN = "the bearer token is unknown or revoked"


def bearer_token(request: HttpRequest) -> str | None:
    """Return the token of an `Authorization: Bearer …` header ("" when it has none), or None without one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def bearer_accepted(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Let a request carrying `Authorization: Bearer af_…` act as the token's user, for scripts.

    Without the header the session decides, as on every page. A token that is unknown or
    revoked is a 401 here: sent on to the sign-in page, a script would save that page as the file.
    """

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        token = bearer_token(request)
        if token is None:
            return view(request, *args, **kwargs)
        user = token_authenticate(token)
        if user is None:
            response = HttpResponse(f"{UNKNOWN_TOKEN}\n", status=401, content_type="text/plain; charset=utf-8")
            response["WWW-Authenticate"] = 'Bearer realm="agentfast"'
            return response
        request.user = user
        return view(request, *args, **kwargs)

    return wrapped


def admin_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not is_admin(request.user):
            raise PermissionDenied("admins only")
        return view(request, *args, **kwargs)

    return signin_required(wrapped)


def client_address(request: HttpRequest) -> str:
    """Return where a request came from, for the audit: X-Forwarded-For only from a trusted proxy.

    1. The peer (REMOTE_ADDR) is the answer unless it is one of AGENTFAST_TRUSTED_PROXIES.
    2. Otherwise walk X-Forwarded-For from the right (the hop nearest us), skipping trusted
       proxies; the first other address is the client. Left of it anyone may have written anything.
    3. A hop that is no IP address is not believed: the last trusted address stands.

    An IPv4 address written as IPv6 (::ffff:10.0.0.5, how a server listening on `::` names an
    IPv4 peer) is read as the IPv4 address: a proxy listed as 10.0.0.5 was not recognised, so
    the audit named the proxy for every decision and one guesser locked a user out for everyone.
    """
    address = _written(request.META.get("REMOTE_ADDR", ""))
    if not _is_trusted_proxy(address):
        return address[:_ORIGIN_CHARS]
    hops = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed([hop.strip() for hop in hops if hop.strip()]):
        ip = ip_of(hop)
        if ip is None:
            break
        address = str(ip)
        if not _is_trusted_proxy(address):
            break
    return address[:_ORIGIN_CHARS]


def ip_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the IP address the text is (an IPv4 address written as IPv6, ::ffff:a.b.c.d, as IPv4), or None."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _written(text: str) -> str:
    """Return an address as it reads best (::ffff:a.b.c.d as a.b.c.d); text that is none, as it is."""
    address = ip_of(text)
    return text if address is None else str(address)


def _is_trusted_proxy(text: str) -> bool:
    address = ip_of(text)
    if address is None:
        return False
    networks = (ipaddress.ip_network(each, strict=False) for each in settings.AGENTFAST_TRUSTED_PROXIES)
    return any(address in network for network in networks)


def login_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str:
    """Return the user name a sign-in attempt counts against (`Admin ` and `admin` are one)."""
    from axes.models import AccessAttempt

    name = str((credentials or {}).get("username") or request.POST.get("username", "")).strip().casefold()
    # Cut to what the throttle's rows hold: the sign-in form passes a name of any length on
    # (no account has a longer one), and PostgreSQL refuses to store it whole (a 500).
    return name[: AccessAttempt._meta.get_field("username").max_length]


def attempt_from(request: HttpRequest, *, source: str, on_behalf_of: str = "") -> Attempt:
    """Return the decision attempt of an authenticated request: identity from the session or token."""
    return Attempt(
        actor=request.user.get_username(),
        source=source,
        origin=client_address(request),
        on_behalf_of="" if on_behalf_of == request.user.get_username() else on_behalf_of,
        user=request.user,
    )


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict[str, Any] | None
) -> HttpResponse:
    """Answer a locked-out sign-in (django-axes) with the sign-in page's look and a clear message (429)."""
    from axes.helpers import get_cool_off, get_failure_limit

    cool_off = get_cool_off(request)
    context = {
        "username": login_username(request, credentials),
        "failure_limit": get_failure_limit(request, credentials),
        "cooloff_minutes": math.ceil(cool_off.total_seconds() / 60) if cool_off else 0,
    }
    return render(request, "registration/locked_out.html", context, status=429)
