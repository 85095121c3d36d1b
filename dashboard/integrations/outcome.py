"""The same words for a call's outcome in every channel."""

from __future__ import annotations

from agents.models import Approval


def outcome_line(approval: Approval) -> str:
    """Return what became of an approval: "already approved by bob", or that it still waits."""
    if approval.status == Approval.Status.PENDING:
        return f"{approval.tool} still waits for a decision"
    who = approval.decided_by or "the system"
    return f"{approval.tool} was already {approval.status} by {who}"


def vote_line(approval: Approval, voter: str) -> str:
    """Return what a vote short of the quorum did: it counts, and the call still waits for the others."""
    return (
        f"{approval.tool} still waits: {voter}'s approval is counted ({approval.tally}); it runs at {approval.quorum}"
    )
