"""Any OpenAI-compatible chat-completions endpoint, through the `openai` SDK."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import openai
from django.conf import settings

from agents.llm.base import AssistantTurn, DeltaSink, ModelError, ProposedCall

_PATH = "/chat/completions"
_T = TypeVar("_T")


class OpenAIModel:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.client = _client(
            base_url or os.environ.get("OPENAI_BASE_URL", "").strip() or None,
            # Local OpenAI-compatible servers accept any key; the SDK insists on one.
            api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            settings.OPENAI_TIMEOUT,
            settings.OPENAI_MAX_RETRIES,
            os.getpid(),
        )

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> AssistantTurn:
        """Ask for the next turn; with `on_delta`, streamed, each text piece passed on as it comes.

        The request goes through the SDK's client (its retries, timeouts, errors and SSE
        reader) as the plain JSON it already is, and the answer comes back as plain JSON: the
        typed `chat.completions.create` walked every message against its type hints and built
        a pydantic object per streamed chunk, about a third of a worker's CPU under load.
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if on_delta is not None:
            body["stream"] = True
        try:
            # Read as a stream either way, a whole JSON answer as one event, so that
            # OPENAI_TURN_TIMEOUT and MAX_ANSWER_CHARS bound it while it comes: the SDK's own read
            # of a turn asked for whole (drive(stream=False)) bounds each read only, and a server
            # trickling a byte a second held its thread for ever.
            reader = _Stream[object] if on_delta is not None else _Answer[object]
            chunks = self.client.post(_PATH, body=body, cast_to=object, stream=True, stream_cls=reader)
            return _from_chunks(chunks, on_delta or _unheard)
        except ValueError as exc:
            # The SDK parses each streamed event (and a body it is told is JSON) as JSON and lets
            # the JSONDecodeError out: a proxy's page inside a stream is the endpoint's fault.
            sent = f": {exc.doc[:200]!r}" if isinstance(exc, json.JSONDecodeError) else ""
            raise ModelError(f"{self.name}: the endpoint sent something that is not JSON ({exc}){sent}") from exc
        except (openai.OpenAIError, ModelError) as exc:
            # Name the model in every failure: it becomes the run's error a person reads.
            raise ModelError(f"{self.name}: {exc}") from exc


class _Stream(openai.Stream[_T]):
    """The SDK's stream of chunks, read to its end once `[DONE]` comes, and within OPENAI_TURN_TIMEOUT.

    The SDK stops reading at `[DONE]` and closes the response, and a response closed before
    its end takes its connection down with it: every streamed turn then opened a new
    connection (and TLS session) to the endpoint. Read to the end, it goes back to the pool.

    OPENAI_TIMEOUT bounds each read, not the answer: an endpoint that keeps sending (text
    that never finishes, or keep-alive comments) held a worker's thread, and the run whose
    lease that thread kept renewing, for ever.
    """

    whole = False  # the body is one whole answer, read as the stream's one event

    def _iter_events(self) -> Iterator[Any]:
        return _bounded_events(self, whole=_content_type(self.response) == "application/json")


# Not a subclass of _Stream: the SDK finds a stream's chunk type among its class's direct bases.
class _Answer(openai.Stream[_T]):
    """A turn asked for whole (no `stream`): any body but an event stream is the one answer, read within the same bounds."""

    whole = False

    def _iter_events(self) -> Iterator[Any]:
        return _bounded_events(self, whole=_content_type(self.response) != "text/event-stream")


def _bounded_events(stream: _Stream[Any] | _Answer[Any], *, whole: bool) -> Iterator[Any]:
    """Return the SDK's events of a stream, its body read within the bounds, to its end; `whole`: as one event."""
    # Every piece of the body passes the deadline check, comments included (the SSE
    # decoder never yields those): the SDK's own reader, its errors mapped as before.
    stream.whole = whole
    iter_bytes = _within_deadline(stream.response.iter_bytes)
    if whole:
        iter_bytes = _as_one_event(iter_bytes)
    stream.response.iter_bytes = iter_bytes  # type: ignore[method-assign]
    events = openai.Stream._iter_events(stream)
    for event in events:
        if event.data.startswith("[DONE]"):
            for _ in events:
                pass
        yield event


def _unheard(text: str) -> None:
    """Take the text of a turn nobody follows as it comes."""


def _within_deadline(iter_bytes: Any) -> Any:
    """Wrap a response's `iter_bytes` so that reading past OPENAI_TURN_TIMEOUT from now raises ModelError."""
    limit = settings.OPENAI_TURN_TIMEOUT
    deadline = time.monotonic() + limit

    def bounded(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        for piece in iter_bytes(*args, **kwargs):
            if time.monotonic() > deadline:
                raise ModelError(f"the answer took longer than {limit:g} s (OPENAI_TURN_TIMEOUT)")
            yield piece

    return bounded


def _content_type(response: Any) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()


def _as_one_event(iter_bytes: Any) -> Any:
    """Wrap the `iter_bytes` of a JSON body as one server-sent event, its lines as the event's data lines.

    Some OpenAI-compatible servers ignore `stream: true` and send one whole chat.completion:
    read as events, it held none, and every run on such a server failed as cut off.
    """

    def as_event(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        body = bytearray()
        for piece in iter_bytes(*args, **kwargs):
            body += piece
            if len(body) > _MAX_BODY_BYTES:
                raise ModelError(f"the answer is longer than {MAX_ANSWER_CHARS:,} characters; it was not kept")
        # Line breaks in JSON are only whitespace between tokens, never inside a string.
        lines = bytes(body).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        yield b"data: " + lines.replace(b"\n", b"\ndata: ") + b"\n\n"

    return as_event


@functools.lru_cache(maxsize=32)
def _client(base_url: str | None, api_key: str, timeout: float, max_retries: int, pid: int) -> openai.OpenAI:
    """Return this process's client for an endpoint, shared by every run and thread.

    A client per drive built an SSL context each time (loading the CA bundle: about half a
    worker's CPU under load) and opened a new connection per turn; one client is
    thread-safe and keeps its connections alive. `pid` keys it per process: a forked child
    must not share its parent's sockets.
    """
    return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)


# What the endpoint sends is untrusted: a shape the protocol does not allow is a ModelError
# (the run fails, saying why) or, inside a tool call, text the driver refuses to the model.


def _from_chunks(chunks: Iterable[object], on_delta: DeltaSink) -> AssistantTurn:
    """Join streamed chunks: text deltas go to on_delta, tool-call fragments by index.

    A whole chat.completion (asked for, or sent by a server that does not stream) is the one
    chunk, its choice carrying a `message`: whole once it could be read, finish_reason or not.
    """
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finished = False
    size = 0
    for chunk in chunks:
        choice = _first_choice(chunk)
        if choice is None:
            if getattr(chunks, "whole", False):
                raise ModelError(f"the endpoint returned no choices: {str(chunk)[:200]!r}")
            continue  # the last chunk of a stream may carry usage alone
        if choice.get("finish_reason") is not None:
            _require_whole(choice["finish_reason"])
            finished = True
        delta = choice.get("delta") if "delta" in choice else choice.get("message")
        if not isinstance(delta, dict):
            if getattr(chunks, "whole", False):
                raise ModelError(f"the endpoint's choice has no message: {str(choice)[:200]!r}")
            continue
        if "delta" not in choice:
            finished = True  # a whole chat.completion's message
        piece = _said(delta)
        if piece:
            text.append(piece)
            on_delta(piece)
        size += len(piece)
        for position, fragment in enumerate(_dicts(delta.get("tool_calls"))):
            index = fragment.get("index")
            call = calls.setdefault(
                index if isinstance(index, int) else position, {"id": "", "name": "", "arguments": ""}
            )
            _require_few_calls(len(calls))
            call["id"] = _text(fragment.get("id")) or call["id"]
            function = fragment.get("function")
            if isinstance(function, dict):
                name, arguments = _text(function.get("name")), _arguments(function.get("arguments"))
                call["name"] += name
                call["arguments"] += arguments
                size += len(name) + len(arguments)
        _require_bounded(size)
    if not finished:
        # A dropped connection ends the stream quietly: half an answer must not pass as whole.
        raise ModelError("the stream ended before the model finished its turn (no finish_reason)" + _not_sse(chunks))
    proposed = [ProposedCall(**calls[index]) for index in sorted(calls)]
    return AssistantTurn(content="".join(text), tool_calls=proposed)


def _not_sse(chunks: Iterable[object]) -> str:
    """Return, for an error, what the endpoint sent instead of an event stream (a proxy's page), if it did."""
    response = getattr(chunks, "response", None)
    kind = _content_type(response) if response is not None else "text/event-stream"
    return "" if kind == "text/event-stream" else f"; the endpoint answered with {kind or 'no content type'}"


# Reasons an endpoint gives for stopping before the model finished what it was saying.
_CUT_OFF = {
    "length": "the answer was cut off at the model's output token limit (finish_reason 'length')",
    "content_filter": "the endpoint's content filter stopped the answer (finish_reason 'content_filter')",
}


# Far above any model's output limit (about half a million tokens): only a broken or hostile
# endpoint says more in one turn, and each character is kept in the worker's memory, stored,
# and sent back to the model with every later turn.
MAX_ANSWER_CHARS = 2_000_000
# A whole answer's JSON may spell each character as a six-byte escape.
_MAX_BODY_BYTES = 6 * MAX_ANSWER_CHARS + 65_536


# Far above what a model proposes at once (a few dozen parallel calls): each call becomes rows,
# perhaps an approval and a notification, and a message sent back to the model with every later turn.
MAX_CALLS_PER_TURN = 128


def _require_few_calls(count: int) -> None:
    """Refuse a turn proposing more than MAX_CALLS_PER_TURN tool calls."""
    if count > MAX_CALLS_PER_TURN:
        raise ModelError(f"the answer proposes more than {MAX_CALLS_PER_TURN} tool calls in one turn; it was not kept")


def _require_bounded(size: int) -> None:
    """Refuse a turn longer than MAX_ANSWER_CHARS (text, call names and arguments together)."""
    if size > MAX_ANSWER_CHARS:
        raise ModelError(f"the answer is longer than {MAX_ANSWER_CHARS:,} characters; it was not kept")


def _require_whole(finish_reason: object) -> None:
    """Refuse a turn the endpoint stopped early: a cut answer or half a call's arguments must not pass as whole."""
    if isinstance(finish_reason, str) and finish_reason in _CUT_OFF:
        raise ModelError(_CUT_OFF[finish_reason])


def _said(message: dict[str, Any]) -> str:
    """Return what a message (or a streamed delta) says: its text, or the refusal a model gives instead."""
    # A refusal comes with no content: dropped, the run would end with an empty answer.
    return _text(message.get("content")) or _text(message.get("refusal"))


def _first_choice(body: object) -> dict[str, Any] | None:
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _proposed(call: dict[str, Any]) -> ProposedCall:
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    return ProposedCall(
        id=_text(call.get("id")), name=_text(function.get("name")), arguments=_arguments(function.get("arguments"))
    )


def _text(value: object) -> str:
    """Return a text field as text: a list of content parts joined, anything else not text as empty."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        # A part is text, or (type "refusal") a refusal, which is what the model said instead.
        return "".join(_part_text(part) for part in _dicts(value))
    return ""


def _part_text(part: dict[str, Any]) -> str:
    for key in ("text", "refusal"):
        if isinstance(part.get(key), str):
            return str(part[key])
    return ""


def _arguments(value: object) -> str:
    """Return a call's arguments as the JSON text the driver parses (some servers send an object)."""
    if value is None or isinstance(value, str):
        return value or ""
    return json.dumps(value)
