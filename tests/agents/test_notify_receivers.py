"""A webhook receiver that answers 2xx at once, then sends its body slowly or at length."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.notify import channels, dispatch
from agents.notify.models import Delivery
from tests.support.flows import pending, start

SECRET = "whsec_" + base64.b64encode(b"a test secret of thirty-two bytes").decode()
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: webhook
    url: %s
    secret_env: TEST_WEBHOOK_SECRET
    events: [approval.required]
"""


class TwoHundredThenBody:
    """Answers every request `200 OK` at once (status line and headers flushed), then sends a body:
    `trickle` one byte a second, or `size` bytes as fast as the client reads them."""

    def __init__(self, *, trickle: int = 0, size: int = 0) -> None:
        self.trickle, self.size = trickle, size
        self.requests = 0
        self.body_bytes_sent = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:  # the client went away
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                rest += chunk
            self.requests += 1
            total = self.trickle or self.size
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % total)
            try:
                if self.trickle:
                    for _ in range(self.trickle):
                        time.sleep(1)
                        conn.sendall(b".")
                        self.body_bytes_sent += 1
                else:
                    chunk = b"x" * (1 << 20)
                    while self.body_bytes_sent < self.size:
                        conn.sendall(chunk)
                        self.body_bytes_sent += len(chunk)
            except OSError:
                pass

    def stop(self) -> None:
        self._sock.close()


def _paused_delivery(url: str, agent_config: Callable[[str], Path], capture: Callable[..., Any]) -> Delivery:
    agent_config(CONFIG % url)
    with capture(execute=True):
        run = start("Refund order A1001 for 25.00 USD")
    approval = pending(run)[0]
    return Delivery.objects.get(approval_id=approval.id, kind="webhook")


def test_a_receiver_that_answered_200_is_not_sent_the_delivery_again_however_slow_its_body(
    db, agent_config, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    monkeypatch.setattr(channels, "ATTEMPT_SECONDS", 2.0)  # the real bound is 30 s: same behaviour, sooner
    server = TwoHundredThenBody(trickle=5)  # 200 OK at once; its 5-byte body takes 5 s
    try:
        delivery = _paused_delivery(server.url, agent_config, django_capture_on_commit_callbacks)

        outcome = dispatch.send(delivery.pk)

        delivery.refresh_from_db()
        [attempt] = delivery.attempt_log.all()
        # The receiver took the event and said 200 OK: the README promises it is not sent again.
        assert (outcome, delivery.status, attempt.status_code, attempt.error) == ("delivered", "delivered", 200, "")
    finally:
        server.stop()


def test_a_worker_does_not_read_a_receivers_whole_answer_into_memory(
    db, agent_config, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    server = TwoHundredThenBody(size=64 << 20)  # 200 OK, then 64 MiB of body (a download, a hostile receiver)
    try:
        delivery = _paused_delivery(server.url, agent_config, django_capture_on_commit_callbacks)

        assert dispatch.send(delivery.pk) == "delivered"

        time.sleep(0.5)
        # Only the status matters: past the sockets' buffers (a few MiB), the worker would hold it all in memory.
        assert server.body_bytes_sent < 32 << 20, f"the worker read {server.body_bytes_sent >> 20} MiB of the answer"
    finally:
        server.stop()
