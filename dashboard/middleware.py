"""Response headers every page gets: the Content-Security-Policy and no caching of private answers."""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import add_never_cache_headers
from django.utils.deprecation import MiddlewareMixin


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's policy, with this host's websocket origin added to connect-src."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()
        except DisallowedHost:
            return parts  # the 400 page for a bad Host: no socket to allow
        # Not every browser counts ws:// of the page's own host as 'self'; name it.
        scheme = "wss" if request.is_secure() else "ws"
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", []), f"{scheme}://{host}"]
        parts.update = update
        return parts


class NoStoreMiddleware(MiddlewareMixin):
    """Forbid caching every API answer and every page shown to a signed-in user."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        # A shared or back/forward cache must not keep approvals, runs or audit rows.
        user = getattr(request, "user", None)
        if request.path.startswith("/api/") or (user is not None and user.is_authenticated):
            add_never_cache_headers(response)
        return response
