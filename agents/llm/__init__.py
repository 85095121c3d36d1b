from __future__ import annotations

from agents.llm.base import AssistantTurn, ChatModel, DeltaSink, ModelError, ProposedCall, get_model

__all__ = ["AssistantTurn", "ChatModel", "DeltaSink", "ModelError", "ProposedCall", "get_model"]
