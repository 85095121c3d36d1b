"""Websocket origin check: a browser page may open a socket only from this site's own origin.

Channels' AllowedHostsOriginValidator matches the Origin's host against ALLOWED_HOSTS and
ignores scheme and port, so a page on any other localhost port could open the inbox socket
with a reviewer's cookie. Here the Origin must equal the request's own origin (scheme from
the scope, or the proxy's SSL header; host and port from the Host header) or be listed in
CSRF_TRUSTED_ORIGINS; a request without an Origin header is refused too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _normalized(origin: str) -> tuple[str, str, int] | None:
    """Return (scheme, host, port) of an origin URL, or None if it is not one."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin1")
    return None


def _scheme(scope: dict[str, Any]) -> str:
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        meta_name = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        if _header(scope, meta_name) == secure_value:
            return "https"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def own_origin(scope: dict[str, Any]) -> tuple[str, str, int] | None:
    """Return the origin the request was made to, if its Host is an allowed one."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return _normalized(f"{_scheme(scope)}://{host}")


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Return whether the websocket's Origin is this site's own origin or a trusted one."""
    origin = _header(scope, b"origin")
    if origin is None:
        return False
    claimed = _normalized(origin)
    if claimed is None:
        return False
    trusted = {_normalized(o) for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", [])}
    return claimed == own_origin(scope) or claimed in trusted - {None}


class SameOriginValidator:
    """Refuse a websocket handshake (403) whose Origin is not exactly an allowed one."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
