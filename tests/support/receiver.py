"""A real local HTTP receiver for notifications: it records what it is sent and can be down."""

from __future__ import annotations

import json
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


class QuietServer(ThreadingHTTPServer):
    """A test server that says nothing when a client hangs up (a worker killed, a connection
    reset): socketserver prints each such one as a traceback into the suite's output."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Received:
    headers: dict[str, str]
    body: dict[str, Any]
    verified: bool


@dataclass
class Receiver:
    """Listens on 127.0.0.1:`port` while started; checks Standard Webhooks signatures when given a secret."""

    secret: str | None = None
    port: int = 0
    answer: int | None = None  # the status every request gets (None: 204, or 400 for a bad signature)
    hold: threading.Event | None = None  # a slow receiver: each request is answered once this is set (10 s at most)
    received: list[Received] = field(default_factory=list)
    _server: QuietServer | None = None

    def __post_init__(self) -> None:
        if not self.port:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {key.lower(): value for key, value in self.headers.items()}
                receiver.received.append(Received(headers, json.loads(raw), receiver._verify(raw, headers)))
                if receiver.hold is not None:
                    receiver.hold.wait(10)
                self.send_response(receiver.answer or (204 if receiver.received[-1].verified else 400))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        QuietServer.allow_reuse_address = True
        self._server = QuietServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _verify(self, raw: bytes, headers: dict[str, str]) -> bool:
        if self.secret is None:
            return True
        try:
            Webhook(self.secret).verify(raw, headers)
        except WebhookVerificationError:
            return False
        return True

    def ids(self) -> list[str]:
        return [item.headers.get("webhook-id", "") for item in self.received]
