"""ASGI guards in front of Django: refuse bodies before reading them, and keep streams threadless.

Django reads a whole request body (spooling it) before any view or authentication runs, so an
anonymous 800 MB POST was read in full before its 401. `BodyLimit` answers from the headers
alone: 413 when Content-Length is over AGENTFAST_MAX_BODY_BYTES, 401 for an unsafe /api/
request with neither a bearer token nor a session cookie (or with a token that is unknown or
revoked), 415 for a multipart body to /api/ (the API takes JSON); a body without a length
(chunked) is cut off with a 413 at the same cap.

daphne itself buffers a body before it calls the application, so `guard_daphne` applies the
same header checks inside daphne's HTTP parser, where a refusal ends the connection before
the body is sent (other ASGI servers hand the body over as it arrives, and `BodyLimit`
suffices).

Django runs each request in its own ThreadSensitiveContext, which holds a thread for as
long as the request lasts: an SSE stream open for hours held a thread for hours (2,000
streams, 1,833 threads). `SharedStreamThread` runs the thread-sensitive calls of every
stream request (authentication, middleware, the short table reads) on one shared thread
instead; streams wait on the event loop, so they cost no thread.

`EndFailedResponses` ends a response whose view failed after its status went out (a stream
whose read failed), which daphne would otherwise leave open for ever.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import connection

from dashboard.auth import UNKNOWN_TOKEN
from dashboard.live import wire

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_STREAM_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sse-shared")


def max_body() -> int:
    """Return the largest request body accepted, in bytes."""
    return int(getattr(settings, "AGENTFAST_MAX_BODY_BYTES", settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 64 * 1024))


# -- deciding from the headers -----------------------------------------------------------


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in raw}


def _bearer(headers: dict[bytes, bytes]) -> str | None:
    scheme, _, token = headers.get(b"authorization", b"").decode("latin1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _has_session(headers: dict[bytes, bytes]) -> bool:
    name = settings.SESSION_COOKIE_NAME.encode()
    return any(part.strip().startswith(name + b"=") for part in headers.get(b"cookie", b"").split(b";"))


def _is_multipart(headers: dict[bytes, bytes]) -> bool:
    return headers.get(b"content-type", b"").strip().lower().startswith(b"multipart/")


def refusal(method: str, path: str, raw_headers: list[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
    """Return (status, error_code, message) if the headers alone refuse the request, else None."""
    headers = _headers(raw_headers)
    length = headers.get(b"content-length")
    if length is not None and not (length.isascii() and length.strip().isdigit()):
        return 400, "invalid", "Content-Length must be a number"
    # Who asks comes first: an anonymous caller learns nothing about the limits.
    if method in UNSAFE_METHODS and path.startswith("/api/") and not _bearer(headers) and not _has_session(headers):
        return 401, "unauthenticated", "sign in, or send Authorization: Bearer <token> (agentfast tokens create USER)"
    if method in UNSAFE_METHODS and path.startswith("/api/") and _is_multipart(headers):
        return 415, "unsupported_media_type", "the API takes JSON: send Content-Type: application/json"
    if length is not None and int(length) > max_body():
        return 413, "body_too_large", f"the request body is over the {max_body() // 1024} KiB limit"
    return None


# How long a token found live is taken as live by these header checks. They only decide
# whether to read a body (at most max_body() bytes): the API authenticates every request
# itself, so a token revoked within this window is still refused, after its body is read.
# Without it, every POST with a token paid two extra lookups (daphne's check and
# BodyLimit's), each on a fresh database connection.
LIVE_FOR_SECONDS = 5.0
_MAX_REMEMBERED = 10_000
_live_until: dict[str, float] = {}  # sha256 of a token → monotonic time its last check stops counting


def _remembered_live(token: str) -> bool:
    """Return whether the token was found live within LIVE_FOR_SECONDS (no database, no thread)."""
    return _live_until.get(hashlib.sha256(token.encode()).hexdigest(), 0.0) > time.monotonic()


def _token_is_live(token: str) -> bool:
    if _remembered_live(token):
        return True
    key = hashlib.sha256(token.encode()).hexdigest()
    from agents import services

    try:
        live = services.token_authenticate(token) is not None
    finally:
        connection.close()  # a pool thread outside any request: nobody else closes it
    if live:
        if len(_live_until) >= _MAX_REMEMBERED:
            _live_until.clear()  # bounded: forgetting only costs a lookup
        _live_until[key] = time.monotonic() + LIVE_FOR_SECONDS
    return live


def _body(status: int, code: str, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"error_code": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="agentfast"'))
    return headers, body


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    headers, body = _body(status, code, message)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- the ASGI middlewares ----------------------------------------------------------------


class BodyLimit:
    """Refuse oversized and unauthenticated request bodies before reading them."""

    def __init__(self, application: Callable[..., Awaitable[None]]) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        method = scope["method"].upper()
        found = refusal(method, scope["path"], scope.get("headers", []))
        if found is None and method in UNSAFE_METHODS and scope["path"].startswith("/api/"):
            token = _bearer(_headers(scope.get("headers", [])))
            if (
                token is not None
                and not _remembered_live(token)
                and not await sync_to_async(_token_is_live, thread_sensitive=False)(token)
            ):
                found = 401, "unauthenticated", UNKNOWN_TOKEN
        if found is not None:
            return await _answer(send, *found)
        return await self.application(scope, _Capped(receive, send, max_body()), send)


class _Capped:
    """A receive() that answers 413 and reports a disconnect once the body passes the cap."""

    def __init__(self, receive: Receive, send: Send, cap: int) -> None:
        self.receive, self.send, self.cap, self.seen = receive, send, cap, 0

    async def __call__(self) -> dict[str, Any]:
        message = await self.receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.cap:
                await _answer(
                    self.send, 413, "body_too_large", f"the request body is over the {self.cap // 1024} KiB limit"
                )
                return {"type": "http.disconnect"}  # Django stops reading and answers nothing more
        return message


def scope_wants_stream(scope: Scope) -> bool:
    """Return whether the request asks for server-sent events (`Accept: text/event-stream`)."""
    return any(name.lower() == b"accept" and b"text/event-stream" in value for name, value in scope.get("headers", []))


_WAIT_PATH = re.compile(r"/api/approvals/[^/]+/wait")


def scope_is_long_poll(scope: Scope) -> bool:
    """Return whether the request is an external call's wait: a long poll, held as long as a stream."""
    return scope.get("method") in ("GET", "HEAD") and _WAIT_PATH.fullmatch(scope.get("path", "")) is not None


class SharedStreamThread:
    """Run the thread-sensitive calls of SSE requests on one shared thread, not one per stream.

    It also tells the stream where its response goes (`wire.stream_send`), for live frames
    written straight to the connection.
    """

    def __init__(self, application: Callable[..., Awaitable[None]]) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope_wants_stream(scope) or scope_is_long_poll(scope)):
            return await self.application(scope, receive, send)
        # Django's own (inner) ThreadSensitiveContext reuses this one.
        async with ThreadSensitiveContext(executor=_STREAM_EXECUTOR):
            wire.stream_send.set(send)  # this request's task and those it starts see it (dashboard.live.wire)
            await self.application(scope, receive, send)


class EndFailedResponses:
    """End a response whose application failed after sending its status, rather than leave it open.

    Once the status line is out nothing can turn a response into a 500, and daphne's error
    page then cannot be sent: the connection stayed open with no more bytes for ever. A
    browser's download hung, and an EventSource (the inbox, a run's stream) waited on a dead
    stream instead of reconnecting from its Last-Event-ID. Ended, it reconnects; the CSV
    export ends its file with a line saying it stopped (audit_export), so it never reads as whole.
    """

    def __init__(self, application: Callable[..., Awaitable[None]]) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        started = ended = False

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.application(scope, receive, watched)
        except Exception:
            if not started or ended:
                raise  # the server answers a 500 (or has nothing left to do)
            logger.exception("%s %s failed after its response began; ending it", scope["method"], scope["path"])
            await send({"type": "http.response.body", "body": b"", "more_body": False})


# -- daphne ------------------------------------------------------------------------------


def guard_daphne() -> None:
    """Make daphne refuse from the headers, before it buffers a body (see the module docstring)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # served by another ASGI server
        return
    if getattr(WebRequest, "_agentfast_guarded", False):
        return
    original_got_length = WebRequest.gotLength
    original_chunk = WebRequest.handleContentChunk

    def gotLength(self: Any, length: int | None) -> None:
        self._agentfast_seen = 0
        # Twisted would parse a form or multipart POST body itself, for nobody (daphne hands
        # Django the raw body), and answer one it cannot parse (multipart without a boundary)
        # with a bare 400 of its own; Django parses bodies and answers for them.
        self._parsePOSTFormSubmission = False
        method = (self.channel._command or b"").decode("latin1").upper()
        path = (self.channel._path or b"").decode("latin1").split("?")[0]
        raw = [(name.lower(), value) for name, values in self.requestHeaders.getAllRawHeaders() for value in values]
        found = refusal(method, path, raw)
        if found is not None:
            original_got_length(self, 0)
            _refuse_in_daphne(self, *found)
            return
        original_got_length(self, length)
        token = _bearer(dict(raw)) if method in UNSAFE_METHODS and path.startswith("/api/") else None
        if token is not None and length != 0 and not _remembered_live(token):
            _check_token_in_daphne(self, token)

    def handleContentChunk(self: Any, data: bytes) -> None:
        # A chunked body has no length to check up front: stop it at the cap.
        if getattr(self, "_agentfast_refused", False):
            return
        self._agentfast_seen = getattr(self, "_agentfast_seen", 0) + len(data)
        if self._agentfast_seen > max_body():
            _refuse_in_daphne(
                self, 413, "body_too_large", f"the request body is over the {max_body() // 1024} KiB limit"
            )
            return
        original_chunk(self, data)

    WebRequest.gotLength = gotLength
    WebRequest.handleContentChunk = handleContentChunk
    WebRequest._agentfast_guarded = True
    _remember_content_types()
    _without_twisted_access_log()


def _remember_content_types() -> None:
    """Parse each distinct Content-Type once: Twisted builds an email message per POST to read it.

    That parse (twisted.web.http._parseContentType, a pure function of the header's bytes)
    was about a fifteenth of the web process's CPU per API decision.
    """
    from twisted.web import http

    original = http._parseContentType
    if not hasattr(original, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=256)(original)


def _without_twisted_access_log() -> None:
    """Stop Twisted formatting an access line per request that nobody reads.

    Twisted's HTTPFactory writes a combined-log line for every request into Twisted's global
    log, which daphne sends nowhere at verbosity 0 and 1 and to the `daphne.server` logger
    above that, where daphne's own access log (`--access-log`, or stdout at -v 1) already
    has the request. Formatting and dropping the line was about a tenth of the event loop's
    work per API decision.
    """
    from daphne.http_protocol import HTTPFactory

    HTTPFactory.log = lambda self, request: None


def _check_token_in_daphne(request: Any, token: str) -> None:
    """Stop reading the body until the token is checked (in a thread: it is a database read)."""
    from twisted.internet import threads

    channel = request.channel
    channel.pauseProducing()

    def checked(live: bool) -> None:
        if not live:
            _refuse_in_daphne(request, 401, "unauthenticated", UNKNOWN_TOKEN)
        elif channel.transport is not None:
            channel.resumeProducing()

    def failed(failure: Any) -> None:
        logger.warning("could not check a bearer token before its body: %s", failure.getErrorMessage())
        channel.resumeProducing()  # Django checks it again after reading

    threads.deferToThread(_token_is_live, token).addCallbacks(checked, failed)


_REASONS = {400: b"Bad Request", 401: b"Unauthorized", 413: b"Content Too Large", 415: b"Unsupported Media Type"}


def _refuse_in_daphne(request: Any, status: int, code: str, message: str) -> None:
    """Write the refusal straight to the connection and close it; the body is never read."""
    request._agentfast_refused = True
    headers, body = _body(status, code, message)
    head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"connection: close\r\n\r\n"
    transport = request.channel.transport
    transport.write(head + body)
    request.channel.dataReceived = lambda data: None  # the rest of the body is dropped unread
    transport.loseConnection()
