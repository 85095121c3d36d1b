"""Request and error shapes of the JSON API, as OpenAPI documents them.

Answers are agents.schemas, the CLI's --json shapes. Requests are strict: unknown fields,
wrong JSON types and text a database cannot store (NUL, lone surrogates) are refused with 400.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field

from agents import text
from agents.policy.config import MAX_TIMEOUT_SECONDS
from agents.schemas import ApprovalDetail
from agents.services.approvals import MAX_TEXT_CHARS
from agents.services.grants import MAX_SECONDS as MAX_GRANT_SECONDS
from agents.services.grants import MIN_SECONDS as MIN_GRANT_SECONDS
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


Storable = AfterValidator(_storable)
JsonObject = Annotated[dict[str, Any], Storable]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


def _plain_name(value: str) -> str:
    """Refuse what no stored name holds: NUL, lone surrogates, control and invisible characters."""
    try:
        return text.require_plain_name(value, field="name")
    except text.UnsafeText as exc:
        raise ValueError(exc.message.removeprefix("name: ")) from None


# Ids are plain words; refusing anything else keeps odd bytes out of the queries.
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$")]
# Query filters by agent or tool: any name a run or an approval may have (the gate takes
# "Claude Desktop" and "github/create_issue"), up to its column's 100 characters; an empty
# value (a form's "any") means no filter.
Name = Annotated[str, Field(max_length=100), AfterValidator(_plain_name)]
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "all", ""]
RunStatus = Literal["queued", "running", "suspended", "completed", "failed", "cancelled", "all", ""]


class _Strict(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- requests ----------------------------------------------------------------------------


class RunCreateIn(_Strict):
    agent: Annotated[str, Field(min_length=1, max_length=100, description="An agent of agentfast.yaml"), Storable]
    input: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARS, description="The user's prompt"), Storable]
    auto_resume: bool = Field(True, description="Resume in a worker once its approvals are decided")


class RememberIn(_Strict):
    scope: Literal["exact", "tool"] = Field(
        description="exact: these arguments only; tool: any arguments of this tool from this agent"
    )
    for_seconds: Annotated[int, Field(strict=True, ge=MIN_GRANT_SECONDS, le=MAX_GRANT_SECONDS)]


class DecideIn(_Strict):
    decision: Literal["approved", "rejected"]
    note: Annotated[
        str, Field(max_length=MAX_TEXT_CHARS, description="Why; the model reads it on a rejection"), Storable
    ] = ""
    feedback: Annotated[
        str, Field(max_length=MAX_TEXT_CHARS, description="Rejections only: a user message to revise with"), Storable
    ] = ""
    arguments: JsonObject | None = Field(
        None, description="Approvals only: edited arguments, checked against the tool's schema"
    )
    payload: JsonObject | None = Field(None, description="The answer to a tool that asked for a decision itself")
    decided_by: Annotated[str, Field(min_length=1, max_length=150), Storable] | None = Field(
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
    remember: RememberIn | None = Field(
        None,
        description="Also decide this agent's matching calls for a while (a standing grant); "
        "403 if you could not have decided alone",
    )


class ExtendIn(_Strict):
    by_seconds: Annotated[float, Field(ge=1, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)] = Field(
        description="How many seconds later the deadline falls (at least 1)"
    )


# -- errors ------------------------------------------------------------------------------
# The answers themselves are the engine's shapes (agents.schemas), which the CLI prints too.


class ErrorOut(Schema):
    error_code: str
    message: str
    field: str | None = None


class ConflictOut(ErrorOut):
    approval: ApprovalDetail | None = None
    arguments_digest: str | None = None  # digest_mismatch: what the arguments are now


class LeaseHeldOut(ErrorOut):
    lease_owner: str | None = None
    lease_expires_at: Timestamp | None = None
