"""Any OpenAI-compatible chat-completions endpoint, through the `openai` SDK."""

from __future__ import annotations

import functools
import json
import os
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
            base_url or os.environ.get("OPENAI_BASE_URL") or None,
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
        try:
            if on_delta is None:
                return _from_completion(self.client.post(_PATH, body=body, cast_to=object))
            chunks = self.client.post(
                _PATH, body={**body, "stream": True}, cast_to=object, stream=True, stream_cls=_Stream[object]
            )
            return _from_chunks(chunks, on_delta)
        except (openai.OpenAIError, ModelError) as exc:
            # Name the model in every failure: it becomes the run's error a person reads.
            raise ModelError(f"{self.name}: {exc}") from exc


class _Stream(openai.Stream[_T]):
    """The SDK's stream of chunks, which also reads the body to its end once `[DONE]` comes.

    The SDK stops reading at `[DONE]` and closes the response, and a response closed before
    its end takes its connection down with it: every streamed turn then opened a new
    connection (and TLS session) to the endpoint. Read to the end, it goes back to the pool.
    """

    def _iter_events(self) -> Iterator[Any]:
        events = super()._iter_events()
        for event in events:
            if event.data.startswith("[DONE]"):
                for _ in events:
                    pass
            yield event


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


def _from_completion(body: object) -> AssistantTurn:
    choice = _first_choice(body)
    if choice is None:
        # A body that is not JSON (a proxy's error page) comes back from the SDK as a str.
        raise ModelError(f"the endpoint returned no choices: {str(body)[:200]!r}")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError(f"the endpoint's choice has no message: {str(choice)[:200]!r}")
    _require_whole(choice.get("finish_reason"))
    calls = [_proposed(call) for call in _dicts(message.get("tool_calls"))]
    return AssistantTurn(content=_said(message), tool_calls=calls)


def _from_chunks(chunks: Iterable[object], on_delta: DeltaSink) -> AssistantTurn:
    """Join streamed chunks: text deltas go to on_delta, tool-call fragments by index."""
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finished = False
    for chunk in chunks:
        choice = _first_choice(chunk)
        if choice is None:  # the last chunk may carry usage alone
            continue
        if choice.get("finish_reason") is not None:
            _require_whole(choice["finish_reason"])
            finished = True
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            continue
        piece = _said(delta)
        if piece:
            text.append(piece)
            on_delta(piece)
        for position, fragment in enumerate(_dicts(delta.get("tool_calls"))):
            index = fragment.get("index")
            call = calls.setdefault(
                index if isinstance(index, int) else position, {"id": "", "name": "", "arguments": ""}
            )
            call["id"] = _text(fragment.get("id")) or call["id"]
            function = fragment.get("function")
            if isinstance(function, dict):
                call["name"] += _text(function.get("name"))
                call["arguments"] += _arguments(function.get("arguments"))
    if not finished:
        # A dropped connection ends the stream quietly: half an answer must not pass as whole.
        raise ModelError("the stream ended before the model finished its turn (no finish_reason)")
    proposed = [ProposedCall(**calls[index]) for index in sorted(calls)]
    return AssistantTurn(content="".join(text), tool_calls=proposed)


# Reasons an endpoint gives for stopping before the model finished what it was saying.
_CUT_OFF = {
    "length": "the answer was cut off at the model's output token limit (finish_reason 'length')",
    "content_filter": "the endpoint's content filter stopped the answer (finish_reason 'content_filter')",
}


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
