"""Request and response shapes of the JSON API, as OpenAPI documents them.

Responses mirror agents.serializers (the CLI's --json) field for field; the API returns
those dicts, and tests check that both stay equal. Requests are strict: unknown fields,
wrong JSON types and text a database cannot store (NUL, lone surrogates) are refused with 400.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field

from agents.services.approvals import MAX_TEXT_CHARS
from agents.services.runs import MAX_INPUT_CHARS


def _storable(value: Any) -> Any:
    """Refuse what no database column can hold: NUL, lone UTF-16 surrogates, NaN and infinities."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # ValueError for NaN, ±Infinity
    if "\\u0000" in text:
        raise ValueError("NUL characters are not allowed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (a lone surrogate is not)") from None
    return value


def _text(*, max_length: int, min_length: int = 0, description: str = "") -> Any:
    field = Field(min_length=min_length, max_length=max_length, description=description or None)
    return Annotated[str, field, AfterValidator(_storable)]


JsonObject = Annotated[dict[str, Any], AfterValidator(_storable)]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
# Ids and names are plain words; refusing anything else keeps odd bytes out of the queries.
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$")]
# Query filters: an empty value (a form's "any") means no filter.
Name = Annotated[str, Field(max_length=100, pattern=r"^[A-Za-z0-9_.:-]*$")]
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "all", ""]
RunStatus = Literal["queued", "running", "suspended", "completed", "failed", "cancelled", "all", ""]


class _Strict(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- requests ----------------------------------------------------------------------------


class RunCreateIn(_Strict):
    agent: _text(min_length=1, max_length=100, description="An agent of agentfast.yaml")
    input: _text(min_length=1, max_length=MAX_INPUT_CHARS, description="The user's prompt")
    auto_resume: bool = Field(True, description="Resume in a worker once its approvals are decided")


class DecideIn(_Strict):
    decision: Literal["approved", "rejected"]
    note: _text(max_length=MAX_TEXT_CHARS, description="Why; the model reads it on a rejection") = ""
    feedback: _text(max_length=MAX_TEXT_CHARS, description="Rejections only: a user message to revise with") = ""
    arguments: JsonObject | None = Field(
        None, description="Approvals only: edited arguments, checked against the tool's schema"
    )
    payload: JsonObject | None = Field(None, description="The answer to a tool that asked for a decision itself")
    decided_by: _text(min_length=1, max_length=150) | None = Field(
        None, description="Defaults to you; another name needs the 'decide on behalf' permission"
    )
    auto_resume: bool | None = Field(
        None, description="false: leave the resume to the caller (default: the run's setting)"
    )
    expect_digest: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{12,64}$")] | None = Field(
        None,
        description="The arguments_digest you saw (whole, or its first 12 hex digits): "
        "refused with 409 if the arguments changed since",
    )


# -- responses ---------------------------------------------------------------------------


class ErrorOut(Schema):
    error_code: str
    message: str
    field: str | None = None


class ApprovalSummaryOut(Schema):
    id: str
    run_id: str
    tool: str
    arguments: dict[str, Any] | None
    mode: str
    status: str
    created_at: Timestamp | None


class ApprovalDetailOut(ApprovalSummaryOut):
    agent: str
    request: dict[str, Any] | None
    decided_by: str | None
    decided_at: Timestamp | None
    note: str
    feedback: str
    edited_arguments: dict[str, Any] | None
    payload: dict[str, Any] | None
    expires_at: Timestamp | None


class DecisionOut(ApprovalDetailOut):
    outcome: Literal["decided", "idempotent"]
    resume_enqueued: bool


class ConflictOut(ErrorOut):
    approval: ApprovalDetailOut | None = None
    arguments_digest: str | None = None  # digest_mismatch: what the arguments are now


class LeaseHeldOut(ErrorOut):
    lease_owner: str | None = None
    lease_expires_at: Timestamp | None = None


class MessageOut(Schema):
    seq: int
    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None


class ToolCallOut(Schema):
    call_id: str
    name: str
    arguments: dict[str, Any] | None
    status: str
    executed_at: Timestamp | None
    executed_arguments: dict[str, Any] | None
    result: dict[str, Any] | None
    in_doubt: bool


class RunApprovalOut(Schema):
    id: str
    tool: str
    mode: str
    status: str
    decided_by: str | None
    note: str


class RunSummaryOut(Schema):
    id: str
    agent: str
    status: str
    input: str
    created_at: Timestamp | None


class RunDetailOut(RunSummaryOut):
    auto_resume: bool
    created_by: str
    updated_at: Timestamp | None
    lease_owner: str | None
    lease_expires_at: Timestamp | None
    output: str
    error: str
    messages: list[MessageOut]
    tool_calls: list[ToolCallOut]
    approvals: list[RunApprovalOut]


class _Page(Schema):
    count: int = Field(description="How many match, on all pages")
    limit: int
    offset: int


class ApprovalPageOut(_Page):
    items: list[ApprovalSummaryOut]


class RunPageOut(_Page):
    items: list[RunSummaryOut]
