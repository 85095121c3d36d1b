"""A small client of agentfast's gate: ask before a risky tool call, run it once when approved."""

from __future__ import annotations

from agentfast_client._core import (
    AlreadyClaimed,
    AsyncGate,
    Denied,
    Gate,
    GateError,
    Permit,
    Rejected,
    StillPending,
    call_id_for,
)

__all__ = [
    "AlreadyClaimed",
    "AsyncGate",
    "Denied",
    "Gate",
    "GateError",
    "Permit",
    "Rejected",
    "StillPending",
    "call_id_for",
]
