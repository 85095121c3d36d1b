"""Rebuild the model's view of a run from its rows: the message history is the checkpoint."""

from __future__ import annotations

from typing import Any

from agents.models import Message


def model_messages(system_prompt: str, messages: list[Message]) -> list[dict[str, Any]]:
    """Return the conversation in OpenAI chat format."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for message in messages:
        if message.role == Message.Role.ASSISTANT:
            entry: dict[str, Any] = {"role": "assistant", "content": message.content or None}
            if message.tool_calls:
                entry["tool_calls"] = message.tool_calls
            out.append(entry)
        elif message.role == Message.Role.TOOL:
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content})
        else:
            out.append({"role": message.role, "content": message.content})
    return out
