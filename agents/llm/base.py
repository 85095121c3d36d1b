"""The one small interface every model provider implements.

Messages and tool specs go in (OpenAI chat format); an assistant turn comes out: text and
proposed tool calls whose arguments are kept as the raw JSON text the model wrote, so that
malformed JSON becomes a tool error the model reads instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

DeltaSink = Callable[[str], None]


@dataclass(frozen=True)
class ProposedCall:
    id: str
    name: str
    arguments: str  # raw JSON text


@dataclass(frozen=True)
class AssistantTurn:
    content: str = ""
    tool_calls: list[ProposedCall] = field(default_factory=list)


class ModelError(Exception):
    """The model endpoint failed (unreachable, refused, returned nonsense)."""


class ChatModel(Protocol):
    name: str

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> AssistantTurn: ...


def preload_providers(models: Iterable[str]) -> None:
    """Import the providers of these `model` settings now, at a worker's start, not on its first drive.

    Importing the openai package costs over half a second of CPU; done lazily, the first
    drive of every thread queued behind it on the import lock while the worker took work.
    """
    if any(model.startswith("openai:") for model in models):
        import agents.llm.openai  # noqa: F401


def get_model(model: str, *, base_url: str | None = None) -> ChatModel:
    """Return the provider for an agent's `model` setting: 'demo' or 'openai:<name>'."""
    if model == "demo":
        from agents.llm.demo import DemoModel

        return DemoModel()
    if model.startswith("openai:"):
        from agents.llm.openai import OpenAIModel

        return OpenAIModel(model.removeprefix("openai:"), base_url=base_url)
    raise ModelError(f"unknown model {model!r}: use 'demo' or 'openai:<model name>'")
