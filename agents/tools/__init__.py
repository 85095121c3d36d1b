from __future__ import annotations

from agents.tools.registry import (
    FeedbackRequired,
    InvalidArguments,
    Tool,
    ToolContext,
    ToolError,
    feedback_required,
    registry,
    tool,
)

__all__ = [
    "FeedbackRequired",
    "InvalidArguments",
    "Tool",
    "ToolContext",
    "ToolError",
    "feedback_required",
    "registry",
    "tool",
]
