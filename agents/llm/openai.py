"""Any OpenAI-compatible chat-completions endpoint, through the `openai` SDK."""

from __future__ import annotations

import functools
import os
from typing import Any

import openai

from agents.llm.base import AssistantTurn, DeltaSink, ModelError, ProposedCall


class OpenAIModel:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.client = _client(
            base_url or os.environ.get("OPENAI_BASE_URL") or None,
            # Local OpenAI-compatible servers accept any key; the SDK insists on one.
            api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            float(os.environ.get("OPENAI_TIMEOUT", "60")),
            # The SDK retries 408, 409, 429, 5xx and dropped connections with backoff (about 7 s
            # over 4 tries): its default 2 failed about one run in 500 at a 10% error rate.
            int(os.environ.get("OPENAI_MAX_RETRIES", "4")),
            os.getpid(),
        )

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> AssistantTurn:
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            request["tools"] = tools
        try:
            if on_delta is None:
                return _from_message(self.client.chat.completions.create(**request))
            stream = self.client.chat.completions.create(**request, stream=True)
            return _from_stream(stream, on_delta)
        except (openai.OpenAIError, ModelError) as exc:
            # Name the model in every failure: it becomes the run's error a person reads.
            raise ModelError(f"{self.name}: {exc}") from exc


@functools.lru_cache(maxsize=32)
def _client(base_url: str | None, api_key: str, timeout: float, max_retries: int, pid: int) -> openai.OpenAI:
    """Return this process's client for an endpoint, shared by every run and thread.

    A client per drive built an SSL context each time (loading the CA bundle: about half a
    worker's CPU under load) and opened a new connection per turn; one client is
    thread-safe and keeps its connections alive. `pid` keys it per process: a forked child
    must not share its parent's sockets.
    """
    return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)


def _from_message(completion: Any) -> AssistantTurn:
    # A body that is not JSON (a proxy's error page) comes back from the SDK as a str.
    if not getattr(completion, "choices", None):
        raise ModelError(f"the endpoint returned no choices: {str(completion)[:200]!r}")
    message = completion.choices[0].message
    calls = [
        ProposedCall(id=call.id or "", name=call.function.name or "", arguments=call.function.arguments or "")
        for call in (message.tool_calls or [])
    ]
    return AssistantTurn(content=message.content or "", tool_calls=calls)


def _from_stream(stream: Any, on_delta: DeltaSink) -> AssistantTurn:
    """Join streamed chunks: text deltas go to on_delta, tool-call fragments by index."""
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finished = False
    for chunk in stream:
        if not chunk.choices:
            continue
        finished = finished or chunk.choices[0].finish_reason is not None
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
            on_delta(delta.content)
        for fragment in delta.tool_calls or []:
            call = calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = fragment.id or call["id"]
            if fragment.function is not None:
                call["name"] += fragment.function.name or ""
                call["arguments"] += fragment.function.arguments or ""
    if not finished:
        # A dropped connection ends the stream quietly: half an answer must not pass as whole.
        raise ModelError("the stream ended before the model finished its turn (no finish_reason)")
    proposed = [ProposedCall(**calls[index]) for index in sorted(calls)]
    return AssistantTurn(content="".join(text), tool_calls=proposed)
