"""Serve Django's sync views on a pool of threads, middleware and all, as a threaded WSGI server does.

Under ASGI, Django handles a request to a sync view by hopping from the event loop to a
thread and back once per sync middleware hook and once for the view (about a dozen hops
per API call), on a thread made for that request alone, whose database connection dies
with it. Here a request whose view is sync is read by the event loop, handled whole on
one long-lived pool thread by a sync handler (the same MIDDLEWARE, loaded in sync mode,
with that thread's own database connection), and its answer written by the event loop.
Async views, streams (`Accept: text/event-stream`) and websockets go the usual way.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.http import HttpResponseBase
from django.urls import Resolver404, get_resolver, set_script_prefix

from dashboard.limits import scope_wants_stream

Scope = dict[str, Any]


class ThreadedSyncViews(ASGIHandler):
    """Django's ASGI handler, with sync views served on `threads` threads (0: Django's own way)."""

    def __init__(self, *, threads: int) -> None:
        super().__init__()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="web") if threads > 0 else None
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)

    async def handle(self, scope: Scope, receive: Any, send: Any) -> None:
        if self._pool is None or scope_wants_stream(scope) or not _is_sync_view(_path_info(scope)):
            await super().handle(scope, receive, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(self._pool, self._respond, scope, body_file)
            try:
                await self.send_response(response, send)
            finally:
                if response.streaming:
                    await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _respond(self, scope: Scope, body_file: Any) -> HttpResponseBase:
        """Handle one request on this pool thread: the request_started/finished signals close or keep its connection."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, refusal = self.create_request(scope, body_file)  # a malformed request: its error response
        response = refusal if request is None else self._sync.get_response(request)
        assert response is not None  # create_request gives a request or a response
        if response.streaming:
            # The event loop reads the stream; this thread's connection goes back now.
            close_old_connections()
        else:
            response.close()  # sends request_finished here, on the thread that holds the connection
        return response


def _path_info(scope: Scope) -> str:
    """Return the path the URLconf sees: the request's path less the prefix it is mounted under."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _is_sync_view(path: str) -> bool:
    """Return whether the path's view is a sync function (a path no view serves gets the sync 404 page)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return True
    return not iscoroutinefunction(match.func)
