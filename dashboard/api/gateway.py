"""The external-agent gate over HTTP: gate a call, wait for its decision, claim it once, report it.

Tokens of the `agent` role (`agentfast users create NAME --role agent`, then `agentfast
tokens create NAME`) call these; they see only their own calls (another account's are
404). Reviewers and admins may wait on any external call, never claim or report it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from django.contrib.auth.models import User
from django.http import HttpRequest, JsonResponse
from ninja import Query, Router, Schema
from pydantic import ConfigDict, Field

from agents import events
from agents.gateway import services as gateway
from agents.gateway.selectors import GATE_PERMISSION, ExternalCall, external_call_get
from agents.models import Approval
from dashboard.api.auth import Forbidden, Unauthenticated, signed_in
from dashboard.api.schemas import ErrorOut, Id, JsonObject
from dashboard.auth import UNKNOWN_TOKEN, is_reviewer
from dashboard.live import sse
from dashboard.live.hub import Watch, read

MAX_WAIT_SECONDS = 60
RECHECK_SECONDS = 1.0  # a missed push (a restarted channel layer) costs at most this much

router = Router(auth=signed_in(), tags=["gate"])


class _Strict(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


class GateIn(_Strict):
    agent: str = Field(min_length=1, max_length=100, description="The external agent's name (its runs list it)")
    session: str = Field(min_length=1, max_length=200, description="The external run or thread id: one run each")
    call_id: str = Field(min_length=1, max_length=200, description="The call's id, unique in its session")
    tool: str = Field(pattern=r"^[A-Za-z0-9_.:/-]{1,100}$", description="The tool; agentfast.yaml rules apply")
    arguments: JsonObject = Field(description="The call's arguments, a JSON object")
    description: str = Field("", max_length=10_000, description="What the call does, for the reviewer")
    metadata: JsonObject = Field(default_factory=dict, description="Anything else to keep with the call")


class GateOut(Schema):
    decision: Literal["allowed", "denied", "pending", "rejected", "expired"]
    approval_id: str
    reason: str = Field(description="The policy's or the reviewer's words")
    rule: str | None = Field(description="The rule of agentfast.yaml that decided, if one did")
    idempotency_key: str = Field(description="Pass it to the real tool: it identifies this call")
    run_id: str = Field(description="The session's run; its events stream at /api/runs/{run_id}/events")


class ConflictGateOut(ErrorOut):
    state: str | None = None
    stored: Any = None


class WaitOut(Schema):
    approval_id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    decision: Literal["allowed", "denied", "pending", "rejected", "expired"] = Field(
        description="What the gate answers now: denied when a rule or a standing grant refused, rejected when a person did"
    )
    decided_by: str = Field(description="A person, policy:<rule> or grant:<id>; empty while pending")
    note: str
    feedback: str = Field(description="A rejecting reviewer's words for the agent to revise with; empty otherwise")
    payload: JsonObject | None = Field(description="The reviewer's answer (a question's `answer`, or free JSON)")
    edited: bool = Field(description="A reviewer edited the arguments: claim returns the edited ones")


class ClaimOut(Schema):
    claimed: bool = Field(description="True for exactly one caller: that caller runs the call, once")
    state: str = Field(description="The call: running, succeeded, failed or in_doubt")
    arguments: JsonObject | None = Field(None, description="What to run (a reviewer's edit if any); claimed only")
    idempotency_key: str
    result: Any = Field(None, description="The reported outcome, once there is one")


class ResultIn(_Strict):
    ok: bool
    result: Any = Field(None, description="What the tool returned (any JSON)")
    # No max_length: the call ran, so a long error is cut to 10,000 characters, never refused.
    error: str = Field("", description="What went wrong (cut to 10,000 characters); kept with a success too")


class ResultOut(Schema):
    approval_id: str
    stored: bool = Field(description="False: the same outcome was already stored")
    outcome: JsonObject


_ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ConflictGateOut}


def _conflict(exc: gateway.GateConflict) -> JsonResponse:
    return JsonResponse({"error_code": exc.code, "message": exc.message, **exc.details}, status=409)


def _agent(request: HttpRequest) -> str:
    """Return the calling agent account's name, or refuse a caller without the agent role."""
    user: User = request.auth  # type: ignore[attr-defined]
    if not user.has_perm(GATE_PERMISSION):
        raise Forbidden("only agent accounts may gate, claim and report calls (agentfast users create --role agent)")
    return user.get_username()


REPORT = "approval_result"  # the url name of a result report, which the API's body parser reads leniently


@router.post("/gate", response={200: GateOut, **_ERRORS})
def gate(request: HttpRequest, body: GateIn) -> Any:
    """Ask the policy about a call: allowed, denied (with the reason) or pending (wait, then claim)."""
    call = gateway.GateRequest(**body.dict())
    try:
        answer = gateway.gate_call(owner=_agent(request), request=call)
    except gateway.GateConflict as exc:
        return _conflict(exc)
    return {**answer.__dict__, "rule": answer.rule or None}


@router.get("/approvals/{approval_id}/wait", response={200: WaitOut, **_ERRORS, 429: ErrorOut})
async def approval_wait(
    request: HttpRequest, approval_id: Id, timeout: float = Query(30, ge=0, le=MAX_WAIT_SECONDS)
) -> Any:
    """Wait up to `timeout` seconds (60 at most) for a decision; answer at once when there is one.

    A caller may hold AGENTFAST_WAITS_PER_USER waits open in this process; one more is a 429
    (clients retry after its Retry-After).
    """
    viewer = await sse.viewer_of(request)
    release = sse.open_waits.take(viewer.user_id)
    if release is None:
        limit = sse.open_waits.limit()
        message = f"too many open waits: at most {limit} per user; retry when one has answered"
        error = {"error_code": "too_many_waits", "message": message}
        return JsonResponse(error, status=429, headers={"Retry-After": "1"})
    try:
        return await _wait(viewer, approval_id, timeout)
    finally:
        release()


async def _wait(viewer: sse.Viewer, approval_id: str, timeout: float) -> dict[str, Any]:
    found = await read(_call_for, viewer, approval_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # Any message of the run's group or of the caller's access groups, or a quiet tick, is
    # the cue to read the call (and the caller's access) again.
    groups = (events.run_group(found.call.run_id), *viewer.groups)
    async with Watch(groups, tick=RECHECK_SECONDS, poll=sse.POLL_SECONDS) as watch:
        while True:
            state = _state(found)
            remaining = deadline - loop.time()
            if state["status"] != Approval.Status.PENDING or remaining <= 0:
                return state
            await watch.next(remaining)
            found = await read(_call_for, viewer, approval_id)


def sessions_of(user: User, *, refusal: str) -> str | None:
    """Return whose external sessions the user may follow: any (None: a reviewer), or their own (an agent).

    Anyone else is refused with `refusal`.
    """
    if is_reviewer(user):
        return None
    if user.has_perm(GATE_PERMISSION):
        return user.get_username()
    raise Forbidden(refusal)


def _call_for(viewer: sse.Viewer, approval_id: str) -> ExternalCall:
    """Return the call as the caller may see it; refuse, as their next request would be, once their access ended."""
    owner = sessions_of(
        _still_signed_in(viewer), refusal="only agent accounts and reviewers may wait on external calls"
    )
    return external_call_get(owner=owner, approval_id=approval_id)


def _still_signed_in(viewer: sse.Viewer) -> User:
    """Return the caller while their user is active and their token (or session) still holds."""
    user = sse.signed_in_user(viewer)
    if user is None and viewer.token_id is not None:
        raise Unauthenticated(UNKNOWN_TOKEN)
    if user is None:
        raise Unauthenticated("your sign-in ended: sign in again")
    return user


def _state(found: ExternalCall) -> dict[str, Any]:
    """Return what a wait answers: the decision, or expired for an allowed call that may no longer run."""
    approval = found.approval  # None: an unlisted tool, allowed with nobody asked
    status, decided_by, note = (
        (approval.status, approval.decided_by, approval.note) if approval else ("approved", "", "")
    )
    # Every word a reviewer gave goes back to the agent, as the model of a run reads them.
    feedback, payload = (approval.feedback, approval.payload) if approval else ("", None)
    if found.allowed and found.stopped:  # as a claim (refused) and a gate say
        status, note = Approval.Status.EXPIRED, f"the run was {found.call.run.status}"
    edited = approval is not None and approval.arguments is not None
    return {
        "approval_id": found.approval_id,
        "status": status,
        "decision": found.decision,
        "decided_by": decided_by,
        "note": note,
        "feedback": feedback,
        "payload": payload,
        "edited": edited,
    }


@router.post("/approvals/{approval_id}/claim", response={200: ClaimOut, **_ERRORS})
def approval_claim(request: HttpRequest, approval_id: Id) -> Any:
    """Claim the execution of an allowed or approved call: exactly one caller gets `claimed: true`."""
    try:
        claim = gateway.external_call_claim(owner=_agent(request), approval_id=approval_id)
    except gateway.GateConflict as exc:
        return _conflict(exc)
    return claim.__dict__


@router.post("/approvals/{approval_id}/result", response={200: ResultOut, **_ERRORS}, url_name=REPORT)
def approval_result(request: HttpRequest, approval_id: Id, body: ResultIn) -> Any:
    """Report what the claimed call did; stored once (the same report again is fine, another is 409)."""
    try:
        outcome, stored = gateway.external_call_report(
            owner=_agent(request), approval_id=approval_id, ok=body.ok, result=body.result, error=body.error
        )
    except gateway.GateConflict as exc:
        return _conflict(exc)
    return {"approval_id": approval_id, "stored": stored, "outcome": outcome}
