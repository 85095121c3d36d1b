from __future__ import annotations

from agents.tools.registry import (
    FeedbackRequired,
    InvalidArguments,
    RunLater,
    Tool,
    ToolContext,
    ToolError,
    feedback_required,
    registry,
    run_at,
    tool,
)

__all__ = [
    "FeedbackRequired",
    "InvalidArguments",
    "RunLater",
    "Tool",
    "ToolContext",
    "ToolError",
    "feedback_required",
    "registry",
    "run_at",
    "tool",
]
