"""Bytes worked out once, written straight to each of thousands of daphne connections.

A live event reaches every open inbox and approval stream of the process. Through the
normal ASGI path each connection costs a message dict, a trip through the application's
send, and twisted's write, which only queues: it registers the socket for writability and
deregisters it once written, two epoll calls per connection per event. Here, under daphne
and only when nothing waits before them, the bytes go to the socket at once; anything
else (another server, TLS, a connection closing, bytes still queued) takes the normal path.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any

# The ASGI `send` of the stream request being handled (dashboard.limits.SharedStreamThread sets it),
# so that a stream can find its daphne connection.
stream_send: ContextVar[Any] = ContextVar("stream_send", default=None)


def write_now(transport: Any, data: bytes) -> None:
    """Write to a plain TCP socket at once when nothing waits before it, else queue it as twisted does."""
    if (
        getattr(transport, "TLS", True)
        or transport.dataBuffer
        or transport._tempDataBuffer
        or not transport.connected
        or transport.disconnecting
        or transport._writeDisconnected
    ):
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except BlockingIOError:
        sent = 0
    except OSError:
        return  # the connection is going: twisted sees it on its next read
    if sent < len(data):
        transport.write(data[sent:])


def _daphne_reply(send: Any) -> functools.partial[Any] | None:
    """Return daphne's send behind an ASGI send, or None for any other send.

    daphne's send is `partial(server.handle_reply, protocol)`, which Channels' session
    middleware may wrap (as `real_send`).
    """
    inner = getattr(getattr(send, "__self__", None), "real_send", send)
    if isinstance(inner, functools.partial) and inner.args and getattr(inner.func, "__name__", "") == "handle_reply":
        return inner
    return None


def daphne_websocket(send: Any) -> tuple[Any, Any] | None:
    """Return the daphne websocket protocol (and server) an ASGI send writes to; None under anything else."""
    reply = _daphne_reply(send)
    if reply is None or not hasattr(reply.args[0], "sendPreparedMessage"):
        return None
    server = getattr(reply.func, "__self__", None)
    if not isinstance(getattr(server, "connections", None), dict):
        return None
    return reply.args[0], server


class StreamWire:
    """The daphne HTTP response a stream writes its body to, bypassing the ASGI path when that is safe."""

    def __init__(self, request: Any) -> None:
        self.request = request

    @classmethod
    def of(cls, send: Any) -> StreamWire | None:
        """Return the wire of a daphne HTTP response's send; None under another server (or no send)."""
        try:
            from twisted.web.http import Request
        except ImportError:  # served by another ASGI server
            return None
        reply = _daphne_reply(send)
        return cls(reply.args[0]) if reply is not None and isinstance(reply.args[0], Request) else None

    def write(self, data: bytes) -> bool:
        """Write one body part as twisted's Request.write would; False (nothing written) when it cannot now.

        Only once the response head is out (the stream sent its first part) and while the
        response is open; the caller then sends it the normal way.
        """
        request = self.request
        if request.finished or request._disconnected or not request.startedWriting:
            return False
        channel = getattr(request, "channel", None)  # twisted drops it once the response is done
        if channel is None:
            return False
        request.sentLength += len(data)
        write_now(channel.transport, b"%x\r\n%s\r\n" % (len(data), data) if request.chunked else data)
        return True
