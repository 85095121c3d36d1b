"""A scripted OpenAI-compatible chat-completions server, for tests that must not mock the SDK.

The `openai` provider is tested against a real HTTP server on 127.0.0.1: the SDK, its HTTP
client and its SSE parser all run for real; only the model behind the endpoint is a script.

    from tests.support.fake_openai import Reply, fake_openai  # noqa: F401 (the fixture)

    def test_it_answers(fake_openai):
        fake_openai.script(lambda body: Reply(content="Hello"))
        model = OpenAIModel("test-model", base_url=fake_openai.base_url)
        ...
        assert fake_openai.requests[0]["messages"][-1]["content"] == "Hi"

The script is a function `respond(request_body) -> Reply`; it sees every request (the whole
conversation so far), so a reply can depend on what the agent sent, e.g. on how many tool
messages there are (`tool_messages(body)`). The server answers

- `POST /v1/chat/completions`: a `chat.completion` object, or with `"stream": true` a
  `text/event-stream` of `chat.completion.chunk` objects ending in `data: [DONE]`. Streamed
  text comes one word per chunk (`text_pieces`); each tool call comes as a first fragment
  with its index, id and name, then its arguments text in several pieces (`argument_pieces`).
- `GET /v1/models`: the one model name it pretends to be.

A `Reply` with `status` other than 200 is sent as an OpenAI-style error body, one with
`raw_body` as that text (an HTML page), one with `truncate` as half a stream; a script that
raises is answered with 500 and its traceback is kept in `server.errors`, so a broken
script fails loudly instead of looking like a flaky model.

Run it by hand (for the playground) with `python -m tests.support.fake_openai --port 8001`;
it then answers every request with an echo of the last user message.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.support.receiver import QuietServer

MODEL = "test-model"
ToolCallSpec = tuple[str, str, str]  # (id, name, arguments JSON text, sent as is)


@dataclass(frozen=True)
class Reply:
    """One scripted answer of the model."""

    content: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    delay: float = 0.0  # seconds to wait before answering (timeouts, slow models)
    status: int = 200  # anything else is sent as an OpenAI error body
    chunk_delay: float = 0.0  # seconds between streamed chunks (to watch streaming live)
    interleave: bool = False  # stream the fragments of several tool calls round-robin
    truncate: bool = False  # streamed: stop halfway, no finish_reason nor [DONE] (a dropped connection)
    raw_body: str | None = None  # sent as is, as text/html with this status (a proxy's error page)
    # Sent as they are, as JSON, instead of what the fields above make: a server bending the protocol.
    body: dict[str, Any] | None = None  # the whole answer
    chunks: list[dict[str, Any]] | None = None  # the streamed chunks (then [DONE])


Responder = Callable[[dict[str, Any]], Reply]


def echo(body: dict[str, Any]) -> Reply:
    """The default script: repeat the last user message."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return Reply(content=f"You said: {users[-1]['content']}" if users else "Hello from the fake OpenAI server.")


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the tool-result messages of a request, oldest first, their content parsed."""
    found = []
    for message in body.get("messages", []):
        if message.get("role") == "tool":
            try:
                content = json.loads(message.get("content") or "")
            except ValueError:
                content = message.get("content")
            found.append({**message, "content": content})
    return found


def text_pieces(text: str) -> list[str]:
    """Split text the way the server streams it: one word and its trailing space a chunk."""
    return re.findall(r"\s*\S+\s*", text) if text.strip() else ([text] if text else [])


def argument_pieces(arguments: str, parts: int = 3) -> list[str]:
    """Split arguments text into `parts` non-empty pieces (fewer for very short text)."""
    if not arguments:
        return []
    size = max(1, -(-len(arguments) // parts))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


class FakeOpenAI:
    """The server and the handle a test holds: base_url, script(), requests, errors."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, respond: Responder = echo) -> None:
        self._respond = respond
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self.peers: list[tuple[str, int]] = []  # the client's address of each request: one per connection kept
        self.errors: list[str] = []
        self.httpd = QuietServer((host, port), _handler_for(self))
        # A short poll interval: shutdown() waits up to one, after every test.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), name="fake-openai", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every chat-completions request body received, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    def script(self, respond: Responder) -> None:
        """Set the function that answers every following request."""
        self._respond = respond

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self.peers.clear()
            self.errors.clear()

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _answer(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self._requests.append(body)
        try:
            return self._respond(body)
        except Exception:  # noqa: BLE001 — reported to the test through `errors` and a 500
            error = traceback.format_exc()
            with self._lock:
                self.errors.append(error)
            return Reply(content=f"the test's script raised:\n{error}", status=500)


def _handler_for(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as model endpoints are: a client sends its next request on the same connection.
        protocol_version = "HTTP/1.1"
        timeout = 60  # an idle kept-alive connection is closed after this many seconds

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep test output clean

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/v1/models":
                self._json(404, _error_body(404, f"no route GET {self.path}"))
                return
            self._json(
                200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "fake"}]}
            )

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, _error_body(404, f"no route POST {self.path}"))
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            except ValueError as exc:
                self._json(400, _error_body(400, f"the body is not JSON: {exc}"))
                return
            with server._lock:
                server.peers.append(self.client_address[:2])
            reply = server._answer(body)
            if reply.delay:
                time.sleep(reply.delay)
            try:
                self._reply(body, reply)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a killed worker, a timeout): nobody to answer

        def _reply(self, body: dict[str, Any], reply: Reply) -> None:
            if reply.raw_body is not None:
                self._raw(reply.status, reply.raw_body)
            elif reply.status != 200:
                self._json(reply.status, _error_body(reply.status, reply.content or "scripted failure"))
            elif body.get("stream"):
                self._stream(body, reply)
            else:
                self._json(200, reply.body if reply.body is not None else _completion(body, reply))

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _raw(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, body: dict[str, Any], reply: Reply) -> None:
            # Chunked, on a kept-alive connection; a cut-off stream is the close-delimited kind
            # whose connection drops quietly halfway (what a proxy's dropped stream looks like).
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            if reply.truncate:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunks = reply.chunks if reply.chunks is not None else list(_chunks(body, reply))
            if reply.truncate:
                chunks = chunks[: max(1, (len(chunks) - 1) // 2)]  # never the finishing chunk
            for chunk in chunks:
                self._send_part(f"data: {json.dumps(chunk)}\n\n".encode(), chunked=not reply.truncate)
                if reply.chunk_delay:
                    time.sleep(reply.chunk_delay)
            if reply.truncate:
                return
            self._send_part(b"data: [DONE]\n\n", chunked=True)
            self._send_part(b"", chunked=True)  # the last chunk: the body ends, the connection stays

        def _send_part(self, data: bytes, *, chunked: bool) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            self.wfile.flush()

    return Handler


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _envelope(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": kind, "created": int(time.time()), "model": body.get("model", MODEL)}


def _finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
            for id_, name, arguments in reply.tool_calls
        ]
    return {
        **_envelope(body, "chat.completion"),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply), "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chunks(body: dict[str, Any], reply: Reply) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return {**_envelope(body, "chat.completion.chunk"), "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in text_pieces(reply.content):
        yield chunk({"content": piece})
    for fragment in _tool_call_fragments(reply):
        yield chunk({"tool_calls": [fragment]})
    yield chunk({}, _finish_reason(reply))
    if (body.get("stream_options") or {}).get("include_usage"):
        # As OpenAI does: a last chunk with no choices, only usage.
        yield {
            **_envelope(body, "chat.completion.chunk"),
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


def _tool_call_fragments(reply: Reply) -> Iterator[dict[str, Any]]:
    per_call: list[list[dict[str, Any]]] = []
    for index, (id_, name, arguments) in enumerate(reply.tool_calls):
        first = {"index": index, "id": id_, "type": "function", "function": {"name": name, "arguments": ""}}
        rest = [{"index": index, "function": {"arguments": piece}} for piece in argument_pieces(arguments)]
        per_call.append([first, *rest])
    if not reply.interleave:
        for fragments in per_call:
            yield from fragments
        return
    for position in range(max((len(f) for f in per_call), default=0)):
        for fragments in per_call:
            if position < len(fragments):
                yield fragments[position]


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running fake OpenAI server for one test; it echoes until the test scripts it."""
    with FakeOpenAI() as server:
        yield server
        assert not server.errors, "the fake OpenAI server's script raised:\n" + "\n".join(server.errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    with FakeOpenAI(args.host, args.port) as server:
        print(f"fake OpenAI server at {server.base_url} (model {MODEL!r}); Ctrl-C stops it", flush=True)
        try:
            server.thread.join()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
