"""Middleware of the site: probes, static files, query strings, the Content-Security-Policy and no caching of private answers."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from csp.constants import HEADER
from csp.middleware import CheckableLazyObject, CSPMiddleware, PolicyParts
from csp.utils import build_policy
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.loader import render_to_string
from django.utils.cache import add_never_cache_headers
from django.utils.deprecation import MiddlewareMixin
from whitenoise.middleware import WhiteNoiseMiddleware

from agents import text
from dashboard.api.auth import ApiError, error_response


class ProbeMiddleware:
    """Answer a load balancer's health check and Prometheus' scrape before the Host and HTTPS checks.

    Both ask one web process by its own address over plain HTTP (`http://10.0.0.7:8321/healthz`):
    with DJANGO_ALLOWED_HOSTS naming the site, every probe was a 400 (the process looked dead to
    the balancer), and with DJANGO_SECURE_SSL_REDIRECT a 301 to an https:// the process does not
    speak. Neither view builds a URL from the Host, and a scraper's token has already crossed the
    wire by the time a redirect could answer, so nothing is gained by refusing them.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        from dashboard import metrics
        from dashboard.web import health

        self.get_response = get_response
        self.probes: dict[str, Callable[[HttpRequest], HttpResponseBase]] = {
            "/healthz": health.healthz,
            "/metrics": metrics.metrics_view,
        }
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        probe = self.probes.get(request.path_info)
        if self.async_mode:
            return self._acall(request, probe)
        return self.get_response(request) if probe is None else _private(probe(request))

    async def _acall(self, request: HttpRequest, probe: Callable[[HttpRequest], HttpResponseBase] | None) -> Any:
        if probe is None:
            return await self.get_response(request)
        return _private(await sync_to_async(probe)(request))


def _private(response: HttpResponseBase) -> HttpResponseBase:
    add_never_cache_headers(response)  # a cache between must not keep the figures
    return response


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


class QueryTextMiddleware:
    """Refuse (400) a query string holding a parameter that is not valid text, naming it, on every page and endpoint.

    Django reads bytes that are not UTF-8 as U+FFFD, so `/api/approvals?tool=%FF`, `/runs?q=%C3`
    or the inbox's `?agent=%FF` listed nothing, with a 200, as if nothing matched. The API
    answers with its JSON error; a page with the 400 page, saying which parameter it was.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        refusal = _query_refusal(request)
        if self.async_mode:
            return self._acall(request, refusal)
        return self.get_response(request) if refusal is None else refusal

    async def _acall(self, request: HttpRequest, refusal: HttpResponseBase | None) -> HttpResponseBase:
        if refusal is not None:
            return refusal
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return await response


def _query_refusal(request: HttpRequest) -> HttpResponseBase | None:
    """Return the 400 for a query parameter that is not valid text, or None when every one is."""
    name = text.undecodable_parameter(request.META.get("QUERY_STRING", ""))
    if name is None:
        return None
    name = name[:100]
    if request.path_info.startswith("/api/"):
        return error_response(ApiError(f"{name}: not valid text (its bytes are not UTF-8)", field=name))
    reason = f"The parameter “{name}” in the address is not valid text (its bytes are not UTF-8)."
    if request.path_info.endswith(".csv"):  # read by scripts: plain words, as the export's other refusals
        return HttpResponse(f"Nothing exported: {reason}\n", status=400, content_type="text/plain; charset=utf-8")
    return HttpResponse(render_to_string("400.html", {"reason": reason}), status=400)


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's policy, with this host's websocket origin added to connect-src.

    The policy is the same for every response to a host (no view customizes it, no page uses
    a nonce), so it is built once per origin: django-csp builds it anew for each response,
    copying the settings twice (dataclasses.asdict), about a fifteenth of an API request's CPU.
    A response a view customized, a nonce or a report-only policy goes django-csp's own way.
    """

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if _customized(request, response) or getattr(settings, "CONTENT_SECURITY_POLICY_REPORT_ONLY", None):
            return super().process_response(request, response)
        if response.status_code in (500, 404) and settings.DEBUG:
            return response  # Django's debug pages, as django-csp leaves them
        prefixes = tuple((getattr(settings, "CONTENT_SECURITY_POLICY", None) or {}).get("EXCLUDE_URL_PREFIXES") or ())
        exempt = getattr(response, "_csp_exempt", False) or request.path_info.startswith(prefixes)
        if HEADER not in response and not exempt:
            response[HEADER] = _policy(_socket_origin(request), id(settings.CONTENT_SECURITY_POLICY))
        if getattr(request, "_csp_nonce", None) is None:
            # As django-csp does: a nonce asked for after the header was written is an error, not a silent gap.
            request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)  # type: ignore[attr-defined]
        return response

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        origin = _socket_origin(request)
        if origin is None:
            return parts  # the 400 page for a bad Host: no socket to allow
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", []), origin]
        parts.update = update
        return parts


def _socket_origin(request: HttpRequest) -> str | None:
    """Return the page's own websocket origin (not every browser counts it as 'self'), or None for a bad Host."""
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    return f"{'wss' if request.is_secure() else 'ws'}://{host}"


def _customized(request: HttpRequest, response: HttpResponseBase) -> bool:
    """Return whether a view's django-csp decorator or a nonce shapes this response's policy."""
    names = ("_csp_config", "_csp_update", "_csp_replace")
    return getattr(request, "_csp_nonce", None) is not None or any(hasattr(response, name) for name in names)


@functools.lru_cache(maxsize=64)
def _policy(origin: str | None, settings_id: int) -> str:
    """Return the policy for pages whose websocket origin this is, under these settings (their id: overrides)."""
    return build_policy(update={"connect-src": [origin]} if origin else None)


class NoStoreMiddleware(MiddlewareMixin):
    """Forbid caching every API answer and every page shown to a signed-in user."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        # A shared or back/forward cache must not keep approvals, runs or audit rows.
        user = getattr(request, "user", None)
        if request.path.startswith("/api/") or (user is not None and user.is_authenticated):
            add_never_cache_headers(response)
        return response
