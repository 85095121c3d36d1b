"""Odd model servers met by the driver: every oddity ends the turn with a ModelError naming the model, never a hang.

Only the model is replaced, by a real local server speaking the OpenAI protocol.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest

from agents import services
from agents.llm import ModelError
from agents.llm.openai import OpenAIModel
from agents.models import Run
from agents.runtime import drive

USER = [{"role": "user", "content": "Where is order A1001?"}]


@pytest.fixture(autouse=True)
def _fast_failures(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.OPENAI_MAX_RETRIES = 0
    settings.OPENAI_TIMEOUT = 2
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


class _Raw:
    """A local endpoint that answers each chat request with bytes a test writes as it likes."""

    def __init__(self, write: Any) -> None:
        handle = write

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    handle(self)
                except OSError:  # the client went away
                    pass

        self.stop_event = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _sse_headers(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def _part(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def test_it_gives_up_on_a_stream_that_keeps_talking_and_never_finishes(settings: Any) -> None:
    settings.OPENAI_TURN_TIMEOUT = 1.5

    def endless(handler: BaseHTTPRequestHandler) -> None:
        _sse_headers(handler)
        while not server.stop_event.is_set():
            _part(handler, _chunk({"content": "la "}))
            time.sleep(0.05)

    with _Raw(endless) as server:
        started = time.monotonic()
        with pytest.raises(ModelError, match="openai:test-model"):
            OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=lambda text: None)
        assert time.monotonic() - started < 6


def test_it_gives_up_on_a_stream_that_only_sends_keep_alive_comments(settings: Any) -> None:
    settings.OPENAI_TURN_TIMEOUT = 1.5

    def pings(handler: BaseHTTPRequestHandler) -> None:
        _sse_headers(handler)
        _part(handler, _chunk({"role": "assistant", "content": ""}))
        while not server.stop_event.is_set():
            _part(handler, b": keep-alive\n\n")
            time.sleep(0.2)

    with _Raw(pings) as server:
        started = time.monotonic()
        with pytest.raises(ModelError, match="openai:test-model"):
            OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=lambda text: None)
        assert time.monotonic() - started < 6


def test_it_names_the_model_when_a_streamed_event_is_not_json() -> None:
    def garbage(handler: BaseHTTPRequestHandler) -> None:
        _sse_headers(handler)
        _part(handler, b"data: <html>Bad gateway</html>\n\n")
        _part(handler, b"data: [DONE]\n\n")
        _part(handler, b"")

    with _Raw(garbage) as server, pytest.raises(ModelError, match="openai:test-model"):
        OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=lambda text: None)


def test_it_gives_up_on_a_stream_that_would_fill_the_workers_memory(settings: Any) -> None:
    settings.OPENAI_TURN_TIMEOUT = 60
    sent = []

    def flood(handler: BaseHTTPRequestHandler) -> None:
        _sse_headers(handler)
        piece = _chunk({"content": "x" * 65536})
        while not server.stop_event.is_set():
            _part(handler, piece)
            sent.append(len(piece))

    with _Raw(flood) as server:
        with pytest.raises(ModelError, match="openai:test-model.*characters"):
            OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=lambda text: None)
        assert sum(sent) < 64 * 1024 * 1024  # stopped early, not at the deadline


def _trickling_json(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    """Answer with a JSON body that never ends: a space every tenth of a second, each read well within OPENAI_TIMEOUT."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    _part(handler, b'{"choices": ')
    while not stop.is_set():
        _part(handler, b" ")
        time.sleep(0.1)


def test_it_gives_up_on_a_whole_answer_that_trickles_in_for_ever(settings: Any) -> None:
    settings.OPENAI_TURN_TIMEOUT = 1.5

    with _Raw(lambda handler: _trickling_json(handler, server.stop_event)) as server:
        started = time.monotonic()
        with pytest.raises(ModelError, match="openai:test-model: .*OPENAI_TURN_TIMEOUT"):
            OpenAIModel("test-model", base_url=server.base_url).complete(USER, [])
        assert time.monotonic() - started < 6


def test_it_gives_up_on_a_whole_answer_that_would_fill_the_workers_memory(settings: Any) -> None:
    settings.OPENAI_TURN_TIMEOUT = 60
    sent = []

    def flood(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        _part(handler, b'{"choices": [{"message": {"content": "')
        piece = b"x" * 65536
        while not server.stop_event.is_set():
            _part(handler, piece)
            sent.append(len(piece))

    with _Raw(flood) as server:
        with pytest.raises(ModelError, match="openai:test-model.*characters"):
            OpenAIModel("test-model", base_url=server.base_url).complete(USER, [])
        assert sum(sent) < 64 * 1024 * 1024  # stopped early, not at the deadline


@pytest.fixture(params=["stream", "whole"])
def support_agent(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Raw]:
    """An agent whose model never finishes its answer: a stream that goes on, or a JSON body that trickles in."""

    def endless(handler: BaseHTTPRequestHandler) -> None:
        if request.param == "whole":
            return _trickling_json(handler, server.stop_event)
        _sse_headers(handler)
        while not server.stop_event.is_set():
            _part(handler, _chunk({"content": "thinking "}))
            time.sleep(0.05)

    with _Raw(endless) as server:
        config = {"agents": {"support": {"model": "openai:test-model", "base_url": server.base_url, "tools": []}}}
        path = tmp_path / "agentfast.yaml"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
        yield server


def test_it_fails_a_run_whose_model_never_finishes_instead_of_holding_it_for_ever(
    db: None, settings: Any, support_agent: _Raw
) -> None:
    settings.OPENAI_TURN_TIMEOUT = 1
    run_id = services.run_create(agent="support", input="Where is order A1001?", enqueue=False).id

    result = drive(run_id)

    run = Run.objects.get(pk=run_id)
    assert (result.status, run.status) == ("failed", "failed")
    assert "OPENAI_TURN_TIMEOUT" in run.error and "openai:test-model" in run.error
    assert "internal error" not in run.error
    assert run.lease_owner == "" and run.lease_expires_at is None


def _whole_json(handler: BaseHTTPRequestHandler, body: dict[str, Any], content_type: str = "application/json") -> None:
    data = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_it_reads_a_whole_answer_from_an_endpoint_that_does_not_stream() -> None:
    """Some OpenAI-compatible servers ignore `stream: true` and answer with one chat.completion."""
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'},
            }
        ],
    }
    completion = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    pieces: list[str] = []

    with _Raw(lambda handler: _whole_json(handler, completion)) as server:
        turn = OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=pieces.append)

    assert turn.content == "Let me look." and pieces == ["Let me look."]
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("call_1", "lookup_order", '{"order_id": "A1"}')]


def test_it_says_what_came_when_a_stream_is_a_web_page() -> None:
    with (
        _Raw(lambda handler: _whole_json(handler, {}, "text/html")) as server,
        pytest.raises(ModelError, match="openai:test-model.*text/html"),
    ):
        OpenAIModel("test-model", base_url=server.base_url).complete(USER, [], on_delta=lambda text: None)
