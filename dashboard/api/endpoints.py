"""The JSON API (django-ninja): runs, approvals, decisions, and their SSE streams.

Each endpoint parses its input, calls a service or a selector, and answers with the CLI's
--json shape (agents.schemas, which OpenAPI names as the response schemas). Every refusal
is `{"error_code", "message"}` (plus `field` when one field is to blame) with its HTTP
status; decision attempts refused before
they reach the engine (not permitted, unreadable body) are audited here, the others by
the engine itself.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from django.utils.datastructures import MultiValueDict
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Query, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.operation import Operation
from ninja.parser import Parser
from ninja.types import DictStrAny

from agents import schemas, selectors, services, text
from agents.gateway.selectors import external_run_get
from agents.models import Approval, AuditEntry, Run
from agents.services import Attempt
from dashboard.api.auth import ApiError, Forbidden, Unauthenticated, error_response, reviewers, signed_in
from dashboard.api.gateway import REPORT, sessions_of
from dashboard.api.pages import MAX_OFFSET, paged
from dashboard.api.schemas import (
    ApprovalStatus,
    ConflictOut,
    DecideIn,
    ErrorOut,
    ExtendIn,
    Id,
    LeaseHeldOut,
    Name,
    RunCreateIn,
    RunStatus,
)
from dashboard.auth import ON_BEHALF, attempt_from, is_reviewer
from dashboard.live import sse

logger = logging.getLogger(__name__)

DECIDE = "approval_decide"  # the url name whose refusals the handlers audit

DESCRIPTION = """
Drive agentfast over HTTP. Authenticate with `Authorization: Bearer <token>`
(`agentfast tokens create USER`) or, from a browser, the session cookie plus the
`X-CSRFToken` header on POSTs. Only reviewers and admins may call it, but for what an
agent account's token may do: the gate (`/api/gate` and its calls' wait, claim and
result) and the events of its own sessions' runs.

Errors are `{"error_code": "...", "message": "...", "field": "..."}` with the status
saying what kind: 400 invalid input (`field` names it; a JSON object naming a key twice is
`duplicate_key`; a query parameter given twice, one a list does not take, or one that is not UTF-8 text, is refused too), 401, 403, 404 (also any other URL under /api/), 405 a method the URL does
not take (HEAD is answered wherever GET is), 409 (already decided: `approval` shows the decision that stands; or a run another
process drives: `lease_owner`), 413 body over 256 KiB, 415 a multipart or compressed body (send JSON, uncompressed),
422 wrong state (e.g. an expired approval).

**Lists.** `GET /api/approvals` and `GET /api/runs` are newest first, `limit` rows a page.
Page on with `cursor` set to the page's `next_cursor` (null on the last page): every page
then costs what the first does, and rows added meanwhile shift nothing. `offset` still
works, but the database walks past every row it skips. Cursors are opaque and signed; one
this list did not return is a 400 with `field: "cursor"`.

**Server-sent events.** `GET /api/runs/{run_id}/events` replays a run's events, then
streams them live, and closes after its `run_status` completed, failed or cancelled
(an agent's token follows its own external sessions: the gate's `run_id`).
Each frame is `id: <seq>`, `event: <type>`, `data: {"run_id", "seq", "event", "data"}`;
reconnect with `Last-Event-ID` (or `?after=<seq>`) to get exactly what you missed.
`delta` frames carry streamed tokens and have no id. `GET /api/events` streams every
run's `approval_required` and `approval_decided`, and without `Last-Event-ID` it starts
from now. There is no single seq across runs, and events do not commit in the order of
their RunEvent primary keys, so its ids are cursors: `<pk>` (every event up to that pk)
or `<pk>:<pk>,<pk>…` (and these after it). Reconnect with the last one (`Last-Event-ID`, or
`?after=`) to get every event you lack, each once; a plain pk still works, as "every event
up to it". Treat the id as opaque: the `data` has the event's `run_id` and `seq`.
Comment lines (`: heartbeat`) keep idle streams open every 15 s; `: live` says the
replay is over and the stream is subscribed.

`POST /api/runs/{run_id}/resume` with `Accept: text/event-stream` drives the run in the
request and streams it the same way, ending with `event: end`
(`{"run_id", "status", "driven"}`) once the run completes, fails or waits again.
A user may hold 20 open streams per server process (`AGENTFAST_STREAMS_PER_USER`); one
more is a 429. A stream whose viewer's access ends (logout, revoked token, deactivated,
role removed) ends with `event: access_ended`. Bodies over `AGENTFAST_MAX_BODY_BYTES`, and
unauthenticated POSTs, are refused before the body is read.
"""


class _Api(NinjaAPI):
    def get_operation_id(self, operation: Operation) -> str:
        return operation.view_func.__name__  # "approval_decide", not "dashboard_api_approval_decide"


class _EncodedBody(ValueError):
    """A request body sent compressed (Content-Encoding), which the API does not decode."""

    def __init__(self, coding: str) -> None:
        super().__init__(coding)
        self.coding = coding


class UnsupportedBody(ApiError):
    status = 415
    code = "unsupported_media_type"


class _UniqueKeysParser(Parser):
    """Read JSON bodies and query strings refusing a key given twice (text.unique_object for JSON)."""

    def parse_body(self, request: HttpRequest) -> DictStrAny:
        coding = request.headers.get("Content-Encoding", "").strip().lower()
        if coding not in ("", "identity"):
            raise _EncodedBody(coding)  # a gzip body was read as bytes of JSON: "malformed", the client never knew why
        match = request.resolver_match
        if match is not None and match.url_name == REPORT:
            # A report says what already ran: refused, it would be lost. Read as JSON reads it,
            # keeping what Python's reader cannot hold (too deep, too many digits) in a form it can.
            return cast(DictStrAny, text.loads_report(request.body))
        return cast(DictStrAny, json.loads(request.body, object_pairs_hook=text.unique_object))

    def parse_querydict(
        self, data: MultiValueDict[str, Any], list_fields: list[str], request: HttpRequest
    ) -> DictStrAny:
        # Ninja keeps the last of `?status=a&status=b`: a client asking for two got one, unwarned.
        # (Each query model of an endpoint reads the whole query string: a list field, were one
        # added beside the pagination's, would need naming in every model.)
        for key, values in data.lists():
            if len(values) > 1 and key not in list_fields:
                error = {
                    "loc": ("query", key),
                    "type": "repeated_parameter",
                    "msg": "given more than once; give it once",
                }
                raise ValidationError([error])
        return super().parse_querydict(data, list_fields, request)


api = _Api(
    title="agentfast",
    version="1",
    description=DESCRIPTION,
    auth=reviewers(),
    urls_namespace="api",
    parser=_UniqueKeysParser(),
)

api.add_router("/", "dashboard.api.gateway.router")  # the external-agent gate: POST /api/gate and its approvals

_AUTH_ERRORS: dict[int, Any] = {401: ErrorOut, 403: ErrorOut}
_READ_ERRORS: dict[int, Any] = {**_AUTH_ERRORS, 400: ErrorOut, 404: ErrorOut}
_WRITE_ERRORS: dict[int, Any] = {**_READ_ERRORS, 413: ErrorOut, 422: ErrorOut}


def _streams(description: str) -> dict[str, Any]:
    """Document a 200 that is (or may be) a text/event-stream, in OpenAPI's terms."""
    content = {"text/event-stream": {"schema": {"type": "string"}}}
    return {"responses": {200: {"description": description, "content": content}}}


class LeaseHeld(ApiError):
    status = 409
    code = "lease_held"


class NotPermitted(ApiError):
    """Refused by a view after it audited the attempt (Forbidden is audited by the handler)."""

    status = 403
    code = "not_permitted"


# -- runs --------------------------------------------------------------------------------


@api.post("/runs", response={201: schemas.RunDetail, **_WRITE_ERRORS, 503: ErrorOut}, tags=["runs"])
def run_create(request: HttpRequest, body: RunCreateIn) -> Status[schemas.RunDetail]:
    """Start a run of an agent; a worker drives it."""
    run = services.run_create(
        agent=body.agent,
        input=body.input,
        auto_resume=body.auto_resume,
        created_by=request.user.get_username(),
        started_from="api",
    )
    return Status(201, schemas.RunDetail.of_created(run))


@api.get("/runs", response={200: list[schemas.RunSummary], **_READ_ERRORS}, tags=["runs"])
@paged(schemas.RunSummary, "runs")
def run_list(request: HttpRequest, status: RunStatus = "all", agent: Name | None = None) -> QuerySet[Run]:
    """List runs, newest first."""
    return selectors.run_list(status=status or "all", agent=agent or None)


@api.get("/runs/{run_id}", response={200: schemas.RunDetail, **_READ_ERRORS}, tags=["runs"])
def run_detail(request: HttpRequest, run_id: Id) -> schemas.RunDetail:
    """A run with its messages, tool calls and approvals."""
    return schemas.RunDetail.of(selectors.run_get(run_id))


@api.post(
    "/runs/{run_id}/resume",
    response={200: schemas.RunDetail, 409: LeaseHeldOut, **_WRITE_ERRORS},
    tags=["runs"],
    openapi_extra=_streams("The run; with `Accept: text/event-stream`, the events of its drive, then `end`"),
)
def run_resume(request: HttpRequest, run_id: Id, after: int | None = Query(None, ge=0, le=MAX_OFFSET)) -> Any:
    """Resume a run in a worker; with `Accept: text/event-stream`, drive it here and stream it.

    A run started with auto_resume off is resumed only by whoever started it or an admin (403 otherwise, audited).
    """
    _refuse_if_driven(selectors.run_get(run_id))
    attempt = attempt_from(request, source=AuditEntry.Source.API)
    if not sse.wants_stream(request):
        return schemas.RunDetail.of(services.run_request_resume(run_id=run_id, attempt=attempt))
    run = services.run_request_resume(run_id=run_id, enqueue=False, attempt=attempt)
    return sse.response(sse.drive_stream(run_id, sse.resume_point(request, after, default=run.last_event_seq)))


@api.post("/runs/{run_id}/cancel", response={200: schemas.RunDetail, **_WRITE_ERRORS}, tags=["runs"])
def run_cancel(request: HttpRequest, run_id: Id) -> schemas.RunDetail:
    """Cancel a run that has not ended; its pending approvals expire."""
    attempt = attempt_from(request, source=AuditEntry.Source.API)
    return schemas.RunDetail.of(services.run_cancel(run_id=run_id, attempt=attempt))


@api.get(
    "/runs/{run_id}/events",
    response=_READ_ERRORS,
    tags=["events"],
    auth=signed_in(),
    openapi_extra=_streams("The run's events, ids by seq"),
)
async def run_events(
    request: HttpRequest, run_id: Id, after: int | None = Query(None, ge=0, le=MAX_OFFSET)
) -> HttpResponseBase:
    """Server-sent events of one run: replayed after `Last-Event-ID` / `after`, then live.

    Reviewers and admins watch any run; an agent account, its own external sessions' runs
    (the gate answers with the run's id; another account's run is a 404, as its calls are).
    """
    own_session = await sync_to_async(_watchable)(request.auth, run_id)  # type: ignore[attr-defined]
    viewer = await sse.viewer_of(request, own_session=own_session)
    return sse.response(sse.run_stream(run_id, sse.resume_point(request, after, default=0), viewer), viewer)


def _watchable(user: User, run_id: str) -> bool:
    """Refuse whoever may not watch the run (404 when it is none of theirs); return whether it is an agent's own."""
    owner = sessions_of(user, refusal="only reviewers and admins may use the API")
    if owner is None:
        selectors.run_get(run_id)
        return False
    external_run_get(owner=owner, run_id=run_id)
    return True


def _refuse_if_driven(run: Run) -> None:
    if run.lease_expires_at is not None and run.lease_expires_at > timezone.now():
        raise LeaseHeld(
            f"run {run.id} is being driven by {run.lease_owner} (lease until {run.lease_expires_at:%H:%M:%S} UTC)",
            lease_owner=run.lease_owner,
            lease_expires_at=run.lease_expires_at.isoformat(),
        )


# -- approvals ---------------------------------------------------------------------------


@api.get("/approvals", response={200: list[schemas.ApprovalSummary], **_READ_ERRORS}, tags=["approvals"])
@paged(schemas.ApprovalSummary, "approvals")
def approval_list(
    request: HttpRequest, status: ApprovalStatus = "pending", agent: Name | None = None, tool: Name | None = None
) -> QuerySet[Approval]:
    """List approvals, newest first; pending ones unless `status` says otherwise."""
    return selectors.approval_list(status=status or "pending", agent=agent or None, tool=tool or None)


@api.get("/approvals/{approval_id}", response={200: schemas.ApprovalDetail, **_READ_ERRORS}, tags=["approvals"])
def approval_detail(request: HttpRequest, approval_id: Id) -> schemas.ApprovalDetail:
    """One approval: the call, who decided it and how."""
    return schemas.ApprovalDetail.of(selectors.approval_get(approval_id))


@api.post(
    "/approvals/{approval_id}/decide",
    url_name=DECIDE,
    response={200: schemas.Decision, 409: ConflictOut, **_WRITE_ERRORS, 422: ConflictOut},
    tags=["approvals"],
)
def approval_decide(request: HttpRequest, approval_id: Id, body: DecideIn) -> schemas.Decision:
    """Approve or reject; a rejection or the quorum's last approval decides, repeating a vote changes nothing.

    An approval that needs more approvers answers `outcome: voted` with the votes so far;
    one the caller may not decide (approvers, four eyes) is refused with 403.
    """
    attempt = attempt_from(request, source=AuditEntry.Source.API, on_behalf_of=body.decided_by or "")
    _refuse_unless_may_speak_for(request, approval_id, body.decision, attempt)
    decision = services.approval_decide(
        approval_id=approval_id,
        decision=body.decision,
        attempt=attempt,
        note=body.note,
        feedback=body.feedback,
        arguments=body.arguments,
        payload=body.payload,
        auto_resume=body.auto_resume,
        expect_digest=body.expect_digest or "",
        remember=services.Remember.of(body.remember.scope, body.remember.for_seconds) if body.remember else None,
    )
    grant_id = decision.grant.id if decision.grant else ""
    # The approval as the decision left it (its row was read under the lock and updated in memory).
    return schemas.Decision.of_decision(
        decision.approval,
        outcome=decision.outcome,
        resume_enqueued=decision.resume_enqueued,
        grant_id=grant_id,
        votes=decision.votes,
    )


@api.post(
    "/approvals/{approval_id}/extend",
    response={200: schemas.ApprovalDetail, 409: ConflictOut, **_WRITE_ERRORS},
    tags=["approvals"],
)
def approval_extend(request: HttpRequest, approval_id: Id, body: ExtendIn) -> schemas.ApprovalDetail:
    """Push a pending approval's deadline later; only someone who may decide it may (403 otherwise), audited."""
    attempt = attempt_from(request, source=AuditEntry.Source.API)
    services.approval_extend(approval_id=approval_id, by_seconds=body.by_seconds, attempt=attempt)
    return schemas.ApprovalDetail.of(selectors.approval_get(approval_id))


@api.get(
    "/events",
    response=_AUTH_ERRORS | {400: ErrorOut},
    tags=["events"],
    openapi_extra=_streams("Approval events of every run, ids are cursors over RunEvent pks"),
)
async def approval_events(request: HttpRequest, after: str | None = Query(None, max_length=20_000)) -> HttpResponseBase:
    """Server-sent approval events of every run; each id is a cursor to resume from (`Last-Event-ID` or `after`).

    A cursor is `<pk>` (every event up to that RunEvent pk) or `<pk>:<pk>,<pk>…` (and these
    after it): events commit out of their pks' order, so a bare pk could skip one.
    """
    start = sse.approval_resume_point(request, after)
    viewer = await sse.viewer_of(request)
    return sse.response(sse.approval_stream(start, viewer), viewer)


def _refuse_unless_may_speak_for(request: HttpRequest, approval_id: str, decision: str, attempt: Attempt) -> None:
    """Refuse (and audit) a decided_by naming someone else, unless the caller may relay for that user.

    The person named must be one who may decide (an active reviewer or admin), as the API
    asks of a caller: relaying must not lend an agent or a bare account a say.
    """
    if not attempt.on_behalf_of:
        return
    named = selectors.user_get_active_by_name(attempt.on_behalf_of)
    if not request.user.has_perm(ON_BEHALF):
        reason = f"deciding as {attempt.on_behalf_of!r} needs the 'decide on behalf' permission"
    elif named is None:
        reason = f"decided_by {attempt.on_behalf_of!r} is no active user: a decision is recorded for a person"
    elif not is_reviewer(named):
        reason = f"decided_by {attempt.on_behalf_of!r} may not decide approvals (not a reviewer or admin)"
    else:
        return
    services.approval_refuse(
        approval_id=approval_id,
        decision=decision,
        attempt=attempt,
        outcome=AuditEntry.Outcome.NOT_PERMITTED,
        reason=reason,
    )
    raise NotPermitted(reason, field="decided_by")


# Exempt, as every Ninja view is: it reads nothing and changes nothing, and Django's CSRF
# check would otherwise answer a POST here (with a bearer token) with its HTML 403 page.
@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any other URL under /api/: a JSON 404, like the rest of the API."""
    return JsonResponse({"error_code": "not_found", "message": f"no API endpoint at {request.path}"}, status=404)


# -- errors ------------------------------------------------------------------------------

_SERVICE_STATUS = {
    services.NotFound: 404,
    services.InvalidInput: 400,
    services.AlreadyDecided: 409,
    services.WrongState: 422,
    services.LeaseLost: 409,
    services.NotPermitted: 403,
    services.DigestMismatch: 409,
    services.Unavailable: 503,
}


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    if isinstance(exc, Forbidden):
        _audit_unread_decision(request, AuditEntry.Outcome.NOT_PERMITTED, exc.message)
    return error_response(exc)


@api.exception_handler(services.ServiceError)
def _service_error(request: HttpRequest, exc: services.ServiceError) -> HttpResponse:
    """Map an engine refusal (already audited by the engine) to its status."""
    body: dict[str, Any] = {"error_code": exc.code, "message": exc.message}
    if "field" in exc.details:
        body["field"] = exc.details["field"]
    if "arguments_digest" in exc.details:  # what the arguments are now
        body["arguments_digest"] = exc.details["arguments_digest"]
    if "approval" in exc.details:  # the decision that stands
        body["approval"] = schemas.ApprovalDetail.of(exc.details["approval"]).as_json()
    return JsonResponse(body, status=_SERVICE_STATUS.get(type(exc), 400))


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    field, message = _first_problem(exc.errors)
    _audit_unread_decision(request, AuditEntry.Outcome.INVALID_ARGUMENTS, message)
    return error_response(ApiError(message, field=field))


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(
        Unauthenticated("sign in, or send Authorization: Bearer <token> (agentfast tokens create USER)")
    )


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # Ninja raises a 400 HttpError for one thing only: a body its JSON reader refuses, which
    # includes valid JSON nested deeper than the reader goes (thousands of levels), an
    # object naming a key twice, bytes that are not UTF-8 and a compressed body (the
    # parser's refusal is the error's cause).
    if exc.status_code != 400:
        return JsonResponse({"error_code": "error", "message": str(exc)}, status=exc.status_code)
    cause = exc.__cause__
    if isinstance(cause, _EncodedBody):
        coding = text.repair(cause.coding)[:50]
        error: ApiError = UnsupportedBody(f"the request body is {coding!r}-encoded: send it uncompressed")
    elif isinstance(cause, UnicodeDecodeError):
        error = ApiError("the request body is not UTF-8 text: send JSON as UTF-8", code="malformed_json")
    elif isinstance(cause, text.DuplicateKey):
        error = ApiError(f"the request body is ambiguous: {cause}", code="duplicate_key", field=cause.key)
    elif cause is not None and text.is_number_too_long(cause):
        error = ApiError("the request body holds a number too long to read (over 4,300 digits)", code="malformed_json")
    else:
        message = "the request body is not JSON that can be read: malformed, or nested too deeply"
        error = ApiError(message, code="malformed_json")
    _audit_unread_decision(request, AuditEntry.Outcome.INVALID_ARGUMENTS, error.message)
    response = error_response(error)
    if isinstance(error, UnsupportedBody):
        response["Accept-Encoding"] = "identity"  # what RFC 7694 has a server name: the codings it reads
    return response


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    message = "the request body is over the 256 KiB limit"
    _audit_unread_decision(request, AuditEntry.Outcome.INVALID_ARGUMENTS, message)
    return JsonResponse({"error_code": "body_too_large", "message": message}, status=413)


@api.exception_handler(Http404)
def _missing(request: HttpRequest, exc: Http404) -> HttpResponse:
    return JsonResponse({"error_code": "not_found", "message": str(exc) or "not found"}, status=404)


@api.exception_handler(Exception)
def _crash(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("API error on %s %s", request.method, request.path)
    return JsonResponse(
        {"error_code": "internal_error", "message": "internal error; the server log has the details"}, status=500
    )


def _first_problem(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """Return (field, message) of the first validation error, in the caller's terms."""
    error = errors[0]
    source, *path = [str(part) for part in error["loc"]]
    if source == "body":
        path = path[1:]  # ninja puts the parameter's own name first
    field = ".".join(path) or source
    if source == "body" and not path:
        return "body", "the request body must be a JSON object"
    if error["type"] == "extra_forbidden":
        return field, f"unknown field {field!r}"
    return field, f"{field}: {error['msg']}"


def _audit_unread_decision(request: HttpRequest, outcome: str, reason: str) -> None:
    """Audit a decision attempt refused before its body was read (identity known, intent not)."""
    match = request.resolver_match
    if match is None or match.url_name != DECIDE or not request.user.is_authenticated:
        return
    attempt = attempt_from(request, source=AuditEntry.Source.API)
    approval_id = match.kwargs["approval_id"][:200]  # an over-long id is one of the refusals
    services.approval_refuse(
        approval_id=approval_id, decision="unread", attempt=attempt, outcome=outcome, reason=reason
    )
