"""The JSON API, its OpenAPI schema (/api/openapi.json), docs (/api/docs) and SSE streams."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import URLPattern, URLResolver, path, re_path

from dashboard.api.endpoints import api, not_found

READ_METHODS = ("GET", "HEAD")


def _not_allowed(request: HttpRequest, allowed: str) -> JsonResponse:
    message = f"{request.method} is not allowed here; use {allowed}"
    answer = JsonResponse({"error_code": "method_not_allowed", "message": message}, status=405)
    answer["Allow"] = allowed
    return answer


def _json_not_allowed(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """Return Ninja's plain-text 405 (a method the path does not take) as the API's JSON error."""
    if not isinstance(response, HttpResponseNotAllowed):
        return response
    methods = {method.strip() for method in response["Allow"].split(",")}
    if "GET" in methods:
        methods.add("HEAD")  # answered by _as_get
    # Ninja lists the methods from a set: sorted, the header reads the same every time.
    return _not_allowed(request, ", ".join(sorted(methods)))


def _as_get(request: HttpRequest) -> bool:
    """Make a HEAD request a GET for Ninja, which routes by method; return whether it was HEAD.

    HEAD must be answered wherever GET is (RFC 9110, 9.1): Ninja answered it with a 405.
    """
    if request.method != "HEAD":
        return False
    request.method = "GET"
    return True


def _answer(request: HttpRequest, response: HttpResponseBase, *, head: bool) -> HttpResponseBase:
    """Return a view's response with a JSON 405, and as the answer to HEAD when the request was one."""
    if not head:
        return _json_not_allowed(request, response)
    request.method = "HEAD"  # for the 405's message and whatever logs the request
    return _head_of(_json_not_allowed(request, response))


def _head_of(response: HttpResponseBase) -> HttpResponseBase:
    """Return the answer to HEAD: the GET's status and headers, with no body."""
    head: HttpResponseBase
    if isinstance(response, HttpResponse):
        head = HttpResponse(status=response.status_code, headers={"Content-Length": str(len(response.content))})
    else:
        head = StreamingHttpResponse(_Unread(response), status=response.status_code)
    for name, value in response.items():
        head[name] = value
    head.cookies = response.cookies
    return head


class _Unread:
    """The empty body of HEAD on a stream; closed with the answer, it closes the stream never read.

    The stream holds one of its viewer's open-stream slots until it is closed.
    """

    def __init__(self, stream: HttpResponseBase) -> None:
        self.close = stream.close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        return
        yield b""  # an async generator that yields nothing


def _with_json_errors(pattern: URLPattern) -> URLPattern:
    """Return the pattern with its view answering a method it does not take with a JSON 405.

    Ninja's endpoints say which methods they take; its schema and docs pages (not CSRF-exempt:
    plain Django views) are read-only, so any other method is refused before the CSRF check,
    which would otherwise answer with Django's HTML 403 page.
    """
    view = pattern.callback
    endpoint = getattr(view, "csrf_exempt", False)  # Ninja's: its auth checks CSRF for sessions itself
    wrapped: Any
    if iscoroutinefunction(view):

        async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            head = _as_get(request)
            response = await view(request, *args, **kwargs)
            return _answer(request, response, head=head)

    else:

        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not endpoint and request.method not in READ_METHODS:
                return _not_allowed(request, ", ".join(READ_METHODS))
            head = endpoint and _as_get(request)
            return _answer(request, view(request, *args, **kwargs), head=head)

    functools.update_wrapper(wrapped, view)
    wrapped.csrf_exempt = True  # an endpoint checks CSRF itself; a page is only ever read
    return URLPattern(pattern.pattern, wrapped, pattern.default_args, pattern.name)


def _endpoints() -> tuple[list[URLPattern | URLResolver], str, str]:
    """Return Ninja's URL configuration (patterns, app name, namespace) with JSON 405s.

    Ninja's root page answers /api/ with Django's HTML 404: `not_found` answers it instead, under
    the root's name, which the schema reverses for the API's path prefix.
    """
    patterns, app_name, namespace = api.urls
    return [_json_pattern(each) if isinstance(each, URLPattern) else each for each in patterns], app_name, namespace


def _json_pattern(pattern: URLPattern) -> URLPattern:
    if pattern.name == "api-root":
        return URLPattern(pattern.pattern, not_found, pattern.default_args, pattern.name)
    return _with_json_errors(pattern)


urlpatterns: list[URLPattern | URLResolver] = [
    path("", _endpoints()),
    re_path(r"", not_found),
]
