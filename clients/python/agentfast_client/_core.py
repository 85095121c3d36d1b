"""The agentfast gate over HTTP, sync (`Gate`) and async (`AsyncGate`): gate, wait, claim once, report.

Both share the reading of answers (`_after_gate`, `_after_wait`, `_after_claim`), so they
raise the same errors for the same answers; only the transport differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import hashlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("agentfast_client")
MAX_WAIT_SECONDS = 60  # the server's longest single wait
# A server restarting, or a proxy saying it is busy: every request of the gate is safe to send
# again (gate and result are idempotent by call id, wait only reads, a second claim is refused),
# and a report given up on would lose the result of a call that ran. Retried for this long.
RETRY_SECONDS = 120.0
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_PAUSE_SECONDS = 5.0
MAX_ERROR_CHARS = 10_000  # what agentfast keeps of a reported error
TOO_LARGE = 413


class GateError(Exception):
    """agentfast refused a request (its status and message), or answered something unexpected."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Denied(GateError):
    """The policy denied the call; `reason` says why."""

    def __init__(self, reason: str, *, approval_id: str, rule: str | None = None) -> None:
        super().__init__(f"denied: {reason}" if reason else "denied by the policy")
        self.reason, self.approval_id, self.rule = reason, approval_id, rule


class Rejected(GateError):
    """A reviewer rejected the call (or its deadline passed); `note` and `feedback` are the reviewer's.

    `feedback` is what the reviewer asks the agent to change before it tries again (empty when
    they gave none). `decision` is "rejected" or "expired"; `status` stays the HTTP status, as
    on every GateError.
    """

    def __init__(self, note: str, *, approval_id: str, decision: str = "rejected", feedback: str = "") -> None:
        # The message is what the adapters hand the model: the feedback is what it revises with.
        said = f"{decision}: {note}" if note else decision
        super().__init__(f"{said}; the reviewer's feedback: {feedback}" if feedback else said)
        self.note, self.approval_id, self.decision, self.feedback = note, approval_id, decision, feedback


class StillPending(GateError):
    """Nobody decided within the time the caller would wait; ask again later with the same call id."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"approval {approval_id} is still pending")
        self.approval_id = approval_id


class AlreadyClaimed(GateError):
    """Another caller runs (or ran without reporting) this call: it must not run here."""

    def __init__(self, approval_id: str, state: str) -> None:
        super().__init__(f"approval {approval_id} was claimed by another caller (state: {state})")
        self.approval_id, self.state = approval_id, state


@dataclass(frozen=True)
class Permit:
    """What `require` hands back: run `arguments` once (claimed), or use the stored `result` (not claimed)."""

    approval_id: str
    claimed: bool
    arguments: dict[str, Any]
    idempotency_key: str
    result: Any = None  # the outcome stored by whoever ran it, when not claimed here
    note: str = ""  # the approving reviewer's note, when a reviewer approved it
    payload: dict[str, Any] | None = None  # the reviewer's answer (a question's `answer`), if they gave one


def call_id_for(tool: str, arguments: dict[str, Any]) -> str:
    """Return a call id derived from the tool and its arguments: the same call gets the same id."""
    body = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return "d_" + hashlib.sha256(body.encode()).hexdigest()[:32]


def _checked(response: httpx.Response) -> dict[str, Any]:
    """Return an answer's JSON object; raise GateError for a refusal or for something agentfast would not send."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        found = body if isinstance(body, dict) else {}
        message = found.get("message") or found.get("detail") or response.text[:200]
        raise GateError(
            f"{response.status_code}: {message}", status=response.status_code, code=str(found.get("error_code", ""))
        )
    if not isinstance(body, dict):
        raise GateError(
            f"{response.status_code}: not an answer of agentfast: {response.text[:200]!r}",
            status=response.status_code,
            code="bad_answer",
        )
    return body


def _retry_after(response: httpx.Response | None) -> float | None:
    """Return the seconds a Retry-After header asks for (a number or an HTTP date), None without one."""
    value = response.headers.get("Retry-After", "").strip() if response is not None else ""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _pause(attempt: int, response: httpx.Response | None, deadline: float) -> float | None:
    """Return how long to wait before sending again (Retry-After, else backoff); None once the time is spent."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    told = _retry_after(response)
    return min(told if told is not None else min(0.25 * 2**attempt, MAX_PAUSE_SECONDS), left)


def _given_up(url: str, response: httpx.Response | None, failure: Exception | None) -> GateError:
    """Return the error for a request that failed until its retry time was spent."""
    if response is not None:
        try:
            _checked(response)
        except GateError as exc:
            return exc
    return GateError(f"cannot reach agentfast at {url}: {type(failure).__name__}: {failure}", code="unreachable")


def _after_gate(answer: dict[str, Any]) -> str | None:
    """Return the approval id to wait on (pending), None when allowed; raise for denied/rejected/expired."""
    decision = answer["decision"]
    if decision == "denied":
        raise Denied(answer.get("reason", ""), approval_id=answer["approval_id"], rule=answer.get("rule"))
    if decision in ("rejected", "expired"):
        raise Rejected(answer.get("reason", ""), approval_id=answer["approval_id"], decision=decision)
    return answer["approval_id"] if decision == "pending" else None


def _after_wait(state: dict[str, Any]) -> bool:
    """Return whether it was approved (False: still pending); raise when denied, rejected or expired."""
    decision = state.get("decision") or state["status"]  # an older server answers its status alone
    if decision == "denied":
        raise Denied(state.get("note", ""), approval_id=state["approval_id"])
    if decision in ("rejected", "expired"):
        note, feedback = state.get("note", ""), state.get("feedback", "")
        raise Rejected(note, approval_id=state["approval_id"], decision=decision, feedback=feedback)
    return state["status"] == "approved"


def _after_claim(
    approval_id: str, claim: dict[str, Any], arguments: dict[str, Any], decided: dict[str, Any] | None = None
) -> Permit:
    """Return the permit a claim gives; `decided`: the wait's answer that approved the call (its reviewer's words)."""
    words = {"note": (decided or {}).get("note", ""), "payload": (decided or {}).get("payload")}
    if claim["claimed"]:
        # A reviewer's edit may empty the arguments ({}): that is what runs, not the proposal.
        approved = claim.get("arguments")
        to_run = arguments if approved is None else approved
        return Permit(approval_id, True, to_run, claim["idempotency_key"], **words)
    outcome = claim.get("result")
    if outcome is None:
        raise AlreadyClaimed(approval_id, claim["state"])
    return Permit(approval_id, False, arguments, claim["idempotency_key"], result=outcome, **words)


def _outcome(value: Any) -> Any:
    """Return a function's value as JSON (text when it is not JSON), NaN and ±Infinity as null.

    JSON has no NaN or Infinity, and null is what agentfast stores for them in any result.
    """
    try:
        return json.loads(json.dumps(value), parse_constant=lambda name: None)
    except (TypeError, ValueError):
        return str(value)


def _report_request(ok: bool, result: Any, error: str) -> dict[str, Any]:
    """Return the report's body and headers: ASCII JSON, so a lone surrogate travels escaped.

    httpx's `json=` encodes UTF-8 and fails on one (a file name read with surrogateescape,
    say) after the call ran; agentfast repairs it to U+FFFD, as NUL, rather than lose the result.
    The error is cut where agentfast cuts it: sent whole, a long one could make the body too large.
    """
    body = json.dumps({"ok": ok, "result": _outcome(result), "error": error[:MAX_ERROR_CHARS]}, allow_nan=False)
    return {"content": body, "headers": {"Content-Type": "application/json"}}


def _too_large(request: dict[str, Any]) -> dict[str, Any]:
    """Return a report whose result, too large for one request body, is replaced by a note of its size.

    The call ran: its outcome (ok or not, and the error) must still be stored, or the call
    would be marked in doubt and a person asked to check a call that did what it should.
    """
    sent = json.loads(request["content"])
    size = len(request["content"])
    note = f"(a result of {size} bytes: too large to report; the caller got it, agentfast kept this note)"
    return _report_request(sent["ok"], note, sent["error"])


def _gate_request(body: dict[str, Any]) -> dict[str, Any]:
    """Return the gate request's body and headers, or GateError for arguments JSON cannot carry.

    ASCII JSON, as for a report: a lone surrogate travels escaped and agentfast names the field
    it refuses, where httpx would fail with a UnicodeEncodeError at a byte position.
    """
    try:
        content = json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise GateError(f"the arguments of {body['tool']} are not JSON: {exc}", code="invalid_arguments") from None
    return {"content": content, "headers": {"Content-Type": "application/json"}}


def _stored_value(permit: Permit) -> Any:
    """Return what the first run returned, or raise its error again."""
    outcome = permit.result or {}
    if not outcome.get("ok", True):
        raise GateError(f"the call already ran and failed: {outcome.get('error', '')}", code="already_failed")
    return outcome.get("result")


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def _report_kept_from_caller(approval_id: str) -> Iterator[None]:
    """Log, not raise, a report given up on: the call ran, so its caller gets its value or its own error.

    Raising would tell the caller the call failed, and it might run it again.
    """
    try:
        yield
    except GateError as exc:
        logger.warning(
            "agentfast: the call of approval %s ran but its result was not reported (%s); "
            "agentfast will mark it in doubt",
            approval_id,
            exc,
        )


def _bound(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return a call's arguments by parameter name: `*args` as a list, `**kwargs` as an object under their names."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _unbound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return fn taking the arguments _bound gave (a reviewer may have edited them) as keywords.

    `fn(**arguments)` would pass `*args` and `**kwargs` as two keywords named after them, and a
    positional-only parameter as a keyword, which Python refuses.
    """
    parameters = inspect.signature(fn).parameters.values()
    starred = any(parameter.kind is parameter.VAR_POSITIONAL for parameter in parameters)

    def call(**arguments: Any) -> Any:
        positional: list[Any] = []
        keywords, gap = dict(arguments), False
        for parameter in parameters:
            kind = parameter.kind
            if parameter.name not in keywords:
                gap = gap or kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
                continue
            if kind is parameter.VAR_POSITIONAL:
                if gap and keywords[parameter.name]:  # a parameter before them was removed: they would shift
                    raise TypeError(f"{fn.__name__}() got *{parameter.name} without every argument before it")
                positional.extend(keywords.pop(parameter.name))
            elif kind is parameter.VAR_KEYWORD:
                keywords.update(keywords.pop(parameter.name))
            elif not gap and (
                kind is parameter.POSITIONAL_ONLY or (starred and kind is parameter.POSITIONAL_OR_KEYWORD)
            ):
                positional.append(keywords.pop(parameter.name))  # before *args, a keyword would clash with it
        return fn(*positional, **keywords)

    return call


_GATE_KEYWORDS = ("call_id", "session")


def _gate_keywords(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], tuple[str | None, str | None]]:
    """Return what takes the guard's own keywords (`call_id`, `session`) out of a call's keywords.

    A keyword the function takes itself is the function's: taken as the guard's, the function
    ran with its default while the reviewer saw (and approved) that default, not what was passed.
    """
    own = {
        parameter.name
        for parameter in inspect.signature(fn).parameters.values()
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }
    mine = [name for name in _GATE_KEYWORDS if name not in own]

    def take(kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
        found = {name: kwargs.pop(name) for name in mine if name in kwargs}
        return found.get("call_id"), found.get("session")

    return take


class _Base:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        agent: str = "python",
        session: str = "default",
        timeout: float = 300,
        retry_for: float = RETRY_SECONDS,
    ) -> None:
        self.url, self.agent, self.session, self.timeout = url.rstrip("/"), agent, session, timeout
        self.retry_for = retry_for
        self._headers = {"Authorization": f"Bearer {token}"}

    def _gate_body(
        self, tool: str, args: dict[str, Any], session: str | None, call_id: str | None, **extra: Any
    ) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "session": session or self.session,
            "call_id": call_id or call_id_for(tool, args),
            "tool": tool,
            "arguments": args,
            **{key: value for key, value in extra.items() if value},
        }


class Gate(_Base):
    """The gate of an agentfast server, for an account of the `agent` role (blocking calls)."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        super().__init__(url, token, **options)
        self.http = httpx.Client(base_url=self.url, headers=self._headers, timeout=MAX_WAIT_SECONDS + 15)

    def close(self) -> None:
        self.http.close()

    def _send(self, method: str, path: str, **request: Any) -> dict[str, Any]:
        """Send a request, again after a lost connection, a 429 or a 502-504, for up to `retry_for` seconds."""
        deadline, attempt = time.monotonic() + self.retry_for, 0
        while True:
            response, failure = None, None
            try:
                response = self.http.request(method, path, **request)
            except httpx.UnsupportedProtocol as exc:  # a URL without http(s)://: no retry will mend it
                raise GateError(f"not an agentfast URL: {self.url!r} ({exc})", code="bad_url") from None
            except httpx.TransportError as exc:
                failure = exc
            if response is not None and response.status_code not in RETRY_STATUSES:
                return _checked(response)
            pause = _pause(attempt, response, deadline)
            if pause is None:
                raise _given_up(self.url, response, failure)
            time.sleep(pause)
            attempt += 1

    def gate(self, tool: str, args: dict[str, Any], *, session: str | None = None, call_id: str | None = None,
             description: str = "", metadata: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Ask the policy about a call: its answer (allowed, denied or pending, with the approval id)."""
        body = self._gate_body(tool, args, session, call_id, description=description, metadata=metadata)
        return self._send("POST", "/api/gate", **_gate_request(body))

    def wait(self, approval_id: str, *, timeout: float = 30) -> dict[str, Any]:
        """Wait up to `timeout` seconds (60 at most) for a decision; return the approval's state."""
        params = {"timeout": min(timeout, MAX_WAIT_SECONDS)}
        return self._send("GET", f"/api/approvals/{approval_id}/wait", params=params)

    def claim(self, approval_id: str) -> dict[str, Any]:
        """Claim the execution of an approved call (exactly one caller gets `claimed: true`)."""
        return self._send("POST", f"/api/approvals/{approval_id}/claim")

    def report(self, approval_id: str, *, ok: bool, result: Any = None, error: str = "") -> dict[str, Any]:
        """Store what the claimed call did (once; the same report again is fine)."""
        request = _report_request(ok, result, error)
        try:
            return self._send("POST", f"/api/approvals/{approval_id}/result", **request)
        except GateError as exc:
            if exc.status != TOO_LARGE:
                raise
            return self._send("POST", f"/api/approvals/{approval_id}/result", **_too_large(request))

    def require(self, tool: str, args: dict[str, Any], *, session: str | None = None, call_id: str | None = None,
                description: str = "", metadata: dict[str, Any] | None = None,
                timeout: float | None = None) -> Permit:  # fmt: skip
        """Gate a call, wait for its decision, claim it: what to run, or Denied/Rejected/StillPending."""
        answer = self.gate(tool, args, session=session, call_id=call_id, description=description, metadata=metadata)
        approval_id = _after_gate(answer)
        decided = None
        if approval_id is not None:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            decided = self.wait(approval_id, timeout=max(0.0, deadline - time.monotonic()))
            while not _after_wait(decided):
                if time.monotonic() >= deadline:
                    raise StillPending(approval_id)
                decided = self.wait(approval_id, timeout=max(0.0, deadline - time.monotonic()))
        return _after_claim(answer["approval_id"], self.claim(answer["approval_id"]), args, decided)

    def run(self, permit: Permit, fn: Callable[..., Any]) -> Any:
        """Run `fn(**arguments)` once for a claimed permit and report it (a lost report is logged); else the stored result."""
        if not permit.claimed:
            return _stored_value(permit)
        try:
            value = fn(**permit.arguments)
        except Exception as exc:
            with _report_kept_from_caller(permit.approval_id):
                self.report(permit.approval_id, ok=False, error=_failure(exc))
            raise
        with _report_kept_from_caller(permit.approval_id):
            self.report(permit.approval_id, ok=True, result=value)
        return value

    def guard(self, tool: str | None = None, *, description: str = "") -> Callable[[F], F]:
        """Decorate a function so each call is gated, waited on, claimed, run once and reported.

        The decorated function takes two extra keyword arguments: `call_id` (default: a digest
        of the tool and arguments, so the same call returns the stored result) and `session`,
        unless it has a parameter of that name itself: then the keyword is its own.
        """

        def decorate(fn: F) -> F:
            name = tool or fn.__name__
            call = _unbound(fn)  # the approved arguments, back into fn's own signature
            take = _gate_keywords(fn)

            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                call_id, session = take(kwargs)
                arguments = _bound(fn, args, kwargs)
                desc = description or (fn.__doc__ or "").strip()
                permit = self.require(name, arguments, session=session, call_id=call_id, description=desc)
                return self.run(permit, call)

            return guarded  # type: ignore[return-value]

        return decorate


class AsyncGate(_Base):
    """The gate of an agentfast server, for an account of the `agent` role (coroutines)."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        super().__init__(url, token, **options)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=MAX_WAIT_SECONDS + 15)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, path: str, **request: Any) -> dict[str, Any]:
        """Send a request, again after a lost connection, a 429 or a 502-504, for up to `retry_for` seconds."""
        deadline, attempt = time.monotonic() + self.retry_for, 0
        while True:
            response, failure = None, None
            try:
                response = await self.http.request(method, path, **request)
            except httpx.UnsupportedProtocol as exc:  # a URL without http(s)://: no retry will mend it
                raise GateError(f"not an agentfast URL: {self.url!r} ({exc})", code="bad_url") from None
            except httpx.TransportError as exc:
                failure = exc
            if response is not None and response.status_code not in RETRY_STATUSES:
                return _checked(response)
            pause = _pause(attempt, response, deadline)
            if pause is None:
                raise _given_up(self.url, response, failure)
            await asyncio.sleep(pause)
            attempt += 1

    async def gate(self, tool: str, args: dict[str, Any], *, session: str | None = None, call_id: str | None = None,
                   description: str = "", metadata: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Ask the policy about a call: its answer (allowed, denied or pending, with the approval id)."""
        body = self._gate_body(tool, args, session, call_id, description=description, metadata=metadata)
        return await self._send("POST", "/api/gate", **_gate_request(body))

    async def wait(self, approval_id: str, *, timeout: float = 30) -> dict[str, Any]:
        """Wait up to `timeout` seconds (60 at most) for a decision; return the approval's state."""
        params = {"timeout": min(timeout, MAX_WAIT_SECONDS)}
        return await self._send("GET", f"/api/approvals/{approval_id}/wait", params=params)

    async def claim(self, approval_id: str) -> dict[str, Any]:
        """Claim the execution of an approved call (exactly one caller gets `claimed: true`)."""
        return await self._send("POST", f"/api/approvals/{approval_id}/claim")

    async def report(self, approval_id: str, *, ok: bool, result: Any = None, error: str = "") -> dict[str, Any]:
        """Store what the claimed call did (once; the same report again is fine)."""
        request = _report_request(ok, result, error)
        try:
            return await self._send("POST", f"/api/approvals/{approval_id}/result", **request)
        except GateError as exc:
            if exc.status != TOO_LARGE:
                raise
            return await self._send("POST", f"/api/approvals/{approval_id}/result", **_too_large(request))

    async def require(self, tool: str, args: dict[str, Any], *, session: str | None = None,
                      call_id: str | None = None, description: str = "", metadata: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Permit:  # fmt: skip
        """Gate a call, wait for its decision, claim it: what to run, or Denied/Rejected/StillPending."""
        answer = await self.gate(
            tool, args, session=session, call_id=call_id, description=description, metadata=metadata
        )
        approval_id = _after_gate(answer)
        decided = None
        if approval_id is not None:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            decided = await self.wait(approval_id, timeout=max(0.0, deadline - time.monotonic()))
            while not _after_wait(decided):
                if time.monotonic() >= deadline:
                    raise StillPending(approval_id)
                decided = await self.wait(approval_id, timeout=max(0.0, deadline - time.monotonic()))
        return _after_claim(answer["approval_id"], await self.claim(answer["approval_id"]), args, decided)

    async def run(self, permit: Permit, fn: Callable[..., Awaitable[Any] | Any]) -> Any:
        """Run `fn(**arguments)` once for a claimed permit (awaited if a coroutine) and report it (a lost report is logged)."""
        if not permit.claimed:
            return _stored_value(permit)
        try:
            value = fn(**permit.arguments)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            with _report_kept_from_caller(permit.approval_id):
                await self.report(permit.approval_id, ok=False, error=_failure(exc))
            raise
        with _report_kept_from_caller(permit.approval_id):
            await self.report(permit.approval_id, ok=True, result=value)
        return value

    def guard(self, tool: str | None = None, *, description: str = "") -> Callable[[F], F]:
        """Decorate a function (sync or async) so each call is gated, claimed, run once and reported."""

        def decorate(fn: F) -> F:
            name = tool or fn.__name__
            call = _unbound(fn)  # the approved arguments, back into fn's own signature
            take = _gate_keywords(fn)

            @functools.wraps(fn)
            async def guarded(*args: Any, **kwargs: Any) -> Any:
                call_id, session = take(kwargs)
                arguments = _bound(fn, args, kwargs)
                desc = description or (fn.__doc__ or "").strip()
                permit = await self.require(name, arguments, session=session, call_id=call_id, description=desc)
                return await self.run(permit, call)

            return guarded  # type: ignore[return-value]

        return decorate
