"""The JSON shapes of runs, approvals and effects: one definition for the CLI's --json and the API.

Each shape is a pydantic model built from the rows (`ApprovalDetail.of(approval)`); the CLI
prints `model_dump(mode="json")`, and the API names the same classes as its response
schemas, so OpenAPI documents exactly what both print. Stored text is repaired on the way
out (agents.text), so a row written by an older version can always be shown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, PlainSerializer, model_validator

from agents import text
from agents.models import Approval, Message, Run, SideEffect, ToolCall, Vote
from agents.services import eligibility

JsonObject = dict[str, Any] | None
# ISO 8601 as datetime.isoformat() writes it ("+00:00"), which scripts already parse.
Timestamp = Annotated[datetime | None, PlainSerializer(lambda value: value.isoformat() if value else None)]


class _Shape(BaseModel):
    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _repaired(cls, data: Any) -> Any:
        """Repair every stored value: rows may predate the text rules, and must still be shown."""
        return text.repair(data, max_depth=text.MAX_STORED_DEPTH) if isinstance(data, dict) else data

    def as_json(self) -> dict[str, Any]:
        """Return the shape as plain JSON types (what the CLI prints and the API sends)."""
        return self.model_dump(mode="json")


class ApprovalSummary(_Shape):
    id: str
    run_id: str
    tool: str
    arguments: JsonObject
    mode: str
    status: str
    created_at: Timestamp

    @classmethod
    def of(cls, approval: Approval) -> Self:
        return cls(**_approval_summary(approval))


class VoteShape(_Shape):
    """One person's vote, bound to the digest of the arguments it approves or rejects."""

    voter: str
    decision: str
    arguments_digest: str
    counts: bool  # an approval of the current arguments: it counts towards the quorum
    arguments: JsonObject  # this voter's edit, if any
    note: str
    payload: JsonObject  # this voter's answer to a question, if any
    source: str
    policy_version: str
    created_at: Timestamp

    @classmethod
    def of(cls, vote: Vote, *, counts: bool = False) -> Self:
        return cls(
            voter=vote.voter,
            decision=vote.decision,
            arguments_digest=vote.arguments_digest,
            counts=counts,
            arguments=vote.arguments,
            note=vote.note,
            payload=vote.payload,
            source=vote.source,
            policy_version=vote.policy_version,
            created_at=vote.created_at,
        )


class ApprovalDetail(ApprovalSummary):
    agent: str
    request: JsonObject
    decided_by: str | None
    decided_at: Timestamp
    note: str
    feedback: str
    edited_arguments: JsonObject
    payload: JsonObject
    expires_at: Timestamp
    # Who decides and how far it is: the digest of the arguments a decision now approves
    # (compare it with `expect_digest`), the approvers (groups or user:NAME; empty: any
    # reviewer), the quorum, four eyes, the votes, and "1 of 2 approvals: bob".
    arguments_digest: str
    approvers: list[str]
    quorum: int
    four_eyes: bool
    policy_version: str
    votes: list[VoteShape]
    tally: str

    @classmethod
    def of(cls, approval: Approval) -> Self:
        return cls(**_approval_detail(approval))


class Decision(ApprovalDetail):
    """What deciding answers: the approval as it now stands, and what the decision did."""

    outcome: Literal["decided", "voted", "idempotent"]
    resume_enqueued: bool
    grant_id: str | None = None  # the standing grant the decision created (`remember`)

    @classmethod
    def of_decision(
        cls,
        approval: Approval,
        *,
        outcome: str,
        resume_enqueued: bool,
        grant_id: str = "",
        votes: list[Vote] | None = None,
    ) -> Self:
        """Shape a decision's answer; `votes`, when the decision knows them all, saves reading them back."""
        return cls.model_validate(
            {
                **_approval_detail(approval, votes),
                "outcome": outcome,
                "resume_enqueued": resume_enqueued,
                "grant_id": grant_id or None,
            }
        )


class MessageShape(_Shape):
    seq: int
    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None

    @classmethod
    def of(cls, message: Message) -> Self:
        return cls(
            seq=message.seq,
            role=message.role,
            content=message.content,
            tool_calls=message.tool_calls,
            tool_call_id=message.tool_call_id or None,
        )


class ToolCallShape(_Shape):
    call_id: str
    name: str
    arguments: JsonObject
    status: str
    executed_at: Timestamp
    executed_arguments: JsonObject
    result: JsonObject
    in_doubt: bool
    # A decided call whose tool asked to run later: it is not run before this time (None: no such wait).
    not_before: Timestamp

    @classmethod
    def of(cls, call: ToolCall) -> Self:
        return cls(
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            status=call.status,
            executed_at=call.executed_at,
            executed_arguments=call.executed_arguments,
            result=call.result,
            in_doubt=call.in_doubt,
            not_before=call.not_before,
        )


class RunApproval(_Shape):
    id: str
    tool: str
    mode: str
    status: str
    decided_by: str | None
    note: str

    @classmethod
    def of(cls, approval: Approval) -> Self:
        return cls(
            id=approval.id,
            tool=approval.tool,
            mode=approval.mode,
            status=approval.status,
            decided_by=approval.decided_by or None,
            note=approval.note,
        )


class RunSummary(_Shape):
    id: str
    agent: str
    status: str
    input: str
    created_at: Timestamp

    @classmethod
    def of(cls, run: Run) -> Self:
        return cls(**_run_summary(run))


class RunDetail(_Shape):
    # Not a RunSummary subclass: the fields keep the order the CLI has always printed.
    id: str
    agent: str
    status: str
    input: str
    auto_resume: bool
    created_by: str
    created_at: Timestamp
    updated_at: Timestamp
    lease_owner: str | None
    lease_expires_at: Timestamp
    output: str
    error: str
    messages: list[MessageShape]
    tool_calls: list[ToolCallShape]
    approvals: list[RunApproval]

    @classmethod
    def of(cls, run: Run) -> Self:
        return cls(
            **cls._header(run),
            messages=[MessageShape.of(m) for m in run.messages.order_by("seq")],
            tool_calls=[ToolCallShape.of(c) for c in run.tool_calls.order_by("step", "id")],
            approvals=[RunApproval.of(a) for a in run.approvals.order_by("created_at")],
        )

    @classmethod
    def of_created(cls, run: Run) -> Self:
        """The run as services.run_create made it (its prompt, no calls yet), without reading it back."""
        prompt = MessageShape(seq=1, role=Message.Role.USER, content=run.input, tool_calls=None, tool_call_id=None)
        return cls(**cls._header(run), messages=[prompt], tool_calls=[], approvals=[])

    @staticmethod
    def _header(run: Run) -> dict[str, Any]:
        return {
            **_run_summary(run),
            "auto_resume": run.auto_resume,
            "created_by": run.created_by,
            "updated_at": run.updated_at,
            "lease_owner": run.lease_owner or None,
            "lease_expires_at": run.lease_expires_at,
            "output": run.output,
            "error": run.error,
        }


class SideEffectShape(_Shape):
    tool: str
    idempotency_key: str
    arguments: JsonObject
    created_at: Timestamp

    @classmethod
    def of(cls, effect: SideEffect) -> Self:
        return cls(
            tool=effect.tool,
            idempotency_key=effect.idempotency_key,
            arguments=effect.arguments,
            created_at=effect.created_at,
        )


def _approval_summary(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.id,
        "run_id": approval.run_id,
        "tool": approval.tool,
        "arguments": approval.tool_call.arguments,
        "mode": approval.mode,
        "status": approval.status,
        "created_at": approval.created_at,
    }


def _approval_detail(approval: Approval, votes: list[Vote] | None = None) -> dict[str, Any]:
    # One read of the votes gives both the list and the tally (counted_voters' order).
    if votes is None:
        votes = list(approval.votes.order_by("created_at", "id"))
    digest = approval.digest
    counted = eligibility.counted_voters(approval, votes)
    last = {vote.voter: vote for vote in votes}  # each voter's last vote: the one that can count
    return {
        **_approval_summary(approval),
        "agent": approval.run.agent,
        "request": approval.request,
        "decided_by": approval.decided_by or None,
        "decided_at": approval.decided_at,
        "note": approval.note,
        "feedback": approval.feedback,
        "edited_arguments": approval.arguments,
        "payload": approval.payload,
        "expires_at": approval.expires_at,
        "arguments_digest": digest,
        "approvers": list(approval.approvers or []),
        "quorum": approval.quorum,
        "four_eyes": approval.four_eyes,
        "policy_version": approval.policy_version,
        "votes": [VoteShape.of(vote, counts=last[vote.voter] is vote and vote.voter in counted) for vote in votes],
        "tally": approval.tally_of(counted),
    }


def _run_summary(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "input": run.input,
        "created_at": run.created_at,
    }
