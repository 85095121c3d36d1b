"""Middleware of the site: static files, the Content-Security-Policy and no caching of private answers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import add_never_cache_headers
from django.utils.deprecation import MiddlewareMixin
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, able to pass an async request (a stream, an async view) on without a thread.

    WhiteNoise's middleware is sync only, so Django ran it for every async request on a
    thread that then waited, through an async-to-sync bridge, for the rest of the request:
    SSE requests share one such thread (dashboard.limits), and each held it from start to
    answer, so 50 streams opening at once were handled one after the other.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        return self._acall(request) if self.async_mode else super().__call__(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return await response


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
