"""The agent loop: drive a run from its rows until it finishes or waits on a person.

The driver keeps nothing between calls: starting and resuming are the same operation,
reading the run's messages, tool calls and approvals and doing the next thing they call
for. Whoever holds the run's lease drives it; every write is fenced by that lease.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from agents import events, ids, queue, services, sql, text
from agents.llm import AssistantTurn, DeltaSink, ModelError, ProposedCall, get_model
from agents.models import Approval, Message, Run, RunEvent, ToolCall
from agents.policy import ConfigError, agent_for, get_policy
from agents.policy.rules import CallFacts, Verdict, evaluate
from agents.runtime import execution, outputs
from agents.runtime.history import model_messages
from agents.services import LeaseLost, PlannedCall
from agents.services.grants import GrantLapsed, grant_match_except
from agents.tools import FeedbackRequired, InvalidArguments, RunLater, Tool, ToolError, registry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriveResult:
    run_id: str
    driven: bool  # False: another driver holds the run, or it has nothing to do
    status: str


def owner_name() -> str:
    """Return a lease owner name unique to this call: host, process, and a nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def drive(
    run_id: str, *, owner: str | None = None, on_delta: DeltaSink | None = None, stream: bool = True
) -> DriveResult:
    """Take the run's lease and drive it until it finishes or suspends.

    A second concurrent caller finds the lease taken and returns at once with driven=False.
    With `stream`, the model's tokens are published as live `delta` events.
    """
    owner = owner or owner_name()
    run = services.run_lease(run_id=run_id, owner=owner)
    if run is None:
        status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status is None:
            raise services.NotFound(f"no run {run_id}")
        return DriveResult(run_id=run_id, driven=False, status=status)
    status = Run.Status.RUNNING
    with _lease_keeper.keeping(run_id, owner):
        try:
            status = _drive_through_database_blips(run, owner, on_delta=on_delta, stream=stream)
        except LeaseLost as exc:
            logger.warning("stopped driving %s: %s", run_id, exc)
        except ConfigError as exc:
            if _policy_unreadable():
                # A half-saved agentfast.yaml is passing, as decisions and deadlines take it: the
                # lease runs out and the sweeper drives the run again once the file reads.
                logger.error("could not drive %s: %s; it is driven again once its lease runs out", run_id, exc)
            else:
                services.run_fail(run_id=run_id, owner=owner, error=str(exc))
                status = Run.Status.FAILED
        except ModelError as exc:
            services.run_fail(run_id=run_id, owner=owner, error=str(exc))
            status = Run.Status.FAILED
        except Exception as exc:
            logger.exception("driving %s failed", run_id)
            services.run_fail(run_id=run_id, owner=owner, error=f"internal error: {type(exc).__name__}: {exc}")
            status = Run.Status.FAILED
    return DriveResult(run_id=run_id, driven=True, status=status)


def _policy_unreadable() -> bool:
    """Return whether agentfast.yaml cannot be read now (not: the run's agent is gone from it)."""
    try:
        get_policy()
    except ConfigError:
        return True
    return False


# Pauses before driving again after the database dropped a connection (a restart, a failover):
# about 7 s in all, long enough for a pool to replace what the server ended.
_DATABASE_RETRY_PAUSES = (0.25, 0.5, 1.0, 2.0, 3.0)


def _drive_through_database_blips(run: Run, owner: str, *, on_delta: DeltaSink | None, stream: bool) -> str:
    """Drive the run, and again from its rows when the database drops a connection midway.

    A pool hands out a connection the server has ended (a restart, a failover) once before it
    notices: the run failed with "internal error: OperationalError" for it, though every write
    is its own transaction and nothing was half done. The rows are the checkpoint, so driving
    again under the same lease goes on from the last write (a tool claimed without a result
    is in doubt, as after a crash). A database that stays down fails the run as before.
    """
    pauses = iter(_DATABASE_RETRY_PAUSES)
    again = False
    while True:
        try:
            if again:
                _reread(run, owner)
            return _Driver(run, owner, on_delta=on_delta, stream=stream).drive()
        except (OperationalError, InterfaceError) as exc:
            pause = next(pauses, None)
            if pause is None:
                raise
            logger.warning("the database failed while driving %s (%s); driving it again in %g s", run.id, exc, pause)
            _drop_connection()
            time.sleep(pause)
            again = True


def _reread(run: Run, owner: str) -> None:
    """Read again what a failed attempt may have changed of the run (its steps); LeaseLost if it is no longer ours."""
    steps = (
        Run.objects.filter(pk=run.id, lease_owner=owner, status=Run.Status.RUNNING)
        .values_list("steps", flat=True)
        .first()
    )
    if steps is None:
        raise LeaseLost(f"{owner} no longer drives {run.id}")
    run.steps = steps


def _drop_connection() -> None:
    """Let go of this thread's broken connection, and of the pool's others the server ended with it.

    A restart or a failover ends every connection at once. The pool discards a broken one only
    when it comes back to it, so a pool holding more idle connections than the driver has
    retries handed out a dead one at each retry and the run failed: the pool's idle ones are
    checked now (a round trip each, after a failure only), so the next query gets a working one.
    """
    try:
        connection.close()
    except Exception:
        logger.debug("could not close a broken connection", exc_info=True)
    pool = getattr(connection, "pool", None)
    if pool is not None:
        try:
            pool.check()
        except Exception:
            logger.debug("could not check the pool's connections", exc_info=True)


# A tool that has run this long is taken for hung, as a deferred call's claim is (the sweeper):
# its lease is no longer renewed, and the run goes on in another worker with the call in doubt.
# A worker's threads have no other limit: Celery's time limits need the prefork pool.
TOOL_LEASE_SECONDS = 15 * 60.0


class _LeaseKeeper:
    """Renew, from one background thread per process, the leases of the runs it drives.

    A slow model or tool must not lose its run to the sweeper. If the process dies the
    renewals stop with it, the leases run out, and the sweeper hands the runs to another
    worker. One shared thread keeps drive() free of a thread start per call. A tool running
    past TOOL_LEASE_SECONDS loses its lease the same way: a hung thread must not hold its run.
    """

    def __init__(self) -> None:
        self._leases: dict[str, str] = {}
        self._tools: dict[str, float] = {}  # owner → when its running tool started (monotonic)
        self._given_up: set[str] = set()  # owners whose hung tool's lease is left to run out
        self._lock = threading.Lock()
        self._pid: int | None = None

    @contextmanager
    def keeping(self, run_id: str, owner: str) -> Iterator[None]:
        self._ensure_started()
        with self._lock:
            self._leases[owner] = run_id
        try:
            yield
        finally:
            with self._lock:
                self._leases.pop(owner, None)

    @contextmanager
    def running_tool(self, owner: str) -> Iterator[None]:
        """Mark the owner's drive as waiting on a tool, whose lease is renewed for TOOL_LEASE_SECONDS at most."""
        with self._lock:
            self._tools[owner] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._tools.pop(owner, None)
                self._given_up.discard(owner)

    def _ensure_started(self) -> None:
        # Again after a fork (Celery's prefork children): threads do not survive it.
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._leases.clear()
                self._tools.clear()
                self._given_up.clear()
                threading.Thread(target=self._renew_forever, name="agentfast-leases", daemon=True).start()
                self._pid = os.getpid()

    def _renew_forever(self) -> None:
        # Nothing may end this loop: a dead keeper would let every slow run lose its lease.
        while True:
            time.sleep(settings.AGENTFAST_LEASE_SECONDS / 3)
            held = self._held()
            if held:
                self._renew(held)

    def _held(self) -> list[tuple[str, str]]:
        """Return the (owner, run) leases to renew: all but those whose tool has run past TOOL_LEASE_SECONDS.

        A hung tool's lease is left to run out, not dropped: if the tool does come back before
        another worker took the run, renewals go on for the rest of the drive.
        """
        now = time.monotonic()
        held = []
        with self._lock:
            for owner, run_id in self._leases.items():
                started = self._tools.get(owner)
                if started is None or now - started <= TOOL_LEASE_SECONDS:
                    held.append((owner, run_id))
                elif owner not in self._given_up:
                    self._given_up.add(owner)
                    logger.warning(
                        "stopped renewing the lease of %s: its tool has run for %.0f s; another worker "
                        "takes the run on, with the call in doubt",
                        run_id,
                        now - started,
                    )
        return held

    def _renew(self, held: list[tuple[str, str]]) -> None:
        for owner, run_id in held:
            try:
                services.run_renew_lease(run_id=run_id, owner=owner)
            except LeaseLost:
                pass  # finished or suspended meanwhile: given up on purpose
            except Exception:
                logger.warning("could not renew the lease of %s", run_id, exc_info=True)
        try:
            close_old_connections()
        except Exception:
            logger.debug("could not close this thread's old connections", exc_info=True)


_lease_keeper = _LeaseKeeper()


class _Driver:
    def __init__(self, run: Run, owner: str, *, on_delta: DeltaSink | None, stream: bool) -> None:
        self.run = run
        self.owner = owner
        self.on_delta = on_delta
        self.stream = stream
        self.agent = agent_for(run.agent, run.agent_config)
        self.tools: dict[str, Tool] = {name: registry.tools[name] for name in self.agent.tools}
        self.steps = run.steps
        self.messages: list[Message] = []
        self.calls: list[ToolCall] = []
        self.approvals: dict[int, Approval] = {}
        self.lapsed_grants: set[str] = set()  # grants that matched a call of this drive and lapsed at its write
        self.wake_at: datetime | None = None  # the earliest time a held call of the open step waits for

    # -- the loop --------------------------------------------------------------------

    def drive(self) -> str:
        """Loop: settle the open step, then ask the model, until done or waiting; return the status.

        1. Load the rows. 2. Settle the last turn's tool calls (run, memoized, rejected,
        in doubt); if a suspend approval is pending, suspend. 3. Tell the model about
        deferred calls that ended. 4. Ask the model. 5. No tool calls: complete. 6. Tool calls
        past max_steps: fail. Otherwise record the turn (suspending in the same transaction
        when nothing can run now).
        """
        model = get_model(self.agent.model, base_url=self.agent.base_url)
        while True:
            self._load()
            if not self._settle_open_step():
                if services.run_suspend(run_id=self.run.id, owner=self.owner):
                    return Run.Status.SUSPENDED
                continue  # decided while we settled the step: settle it again
            self._report_deferred()
            execution.release_connection()  # while the model thinks
            deltas = _Deltas(self.run.id) if self.stream else None
            try:
                turn = model.complete(
                    model_messages(self.agent.system_prompt, self.messages),
                    [tool.spec() for tool in self.tools.values()],
                    on_delta=self._delta_sink(deltas),
                )
            finally:
                if deltas is not None:
                    deltas.flush()
            if not turn.tool_calls:
                services.run_complete(run_id=self.run.id, owner=self.owner, seq=self._next_seq(), content=turn.content)
                return Run.Status.COMPLETED
            # Checked after the model spoke: a final answer after the last allowed tool turn completes.
            if self.steps >= self.agent.max_steps:
                error = f"step limit reached: {self.agent.max_steps} model turns with tool calls"
                services.run_fail(run_id=self.run.id, owner=self.owner, error=error)
                return Run.Status.FAILED
            if self._record_turn(turn):
                return Run.Status.SUSPENDED

    def _load(self) -> None:
        if self.steps == 0 and not self.messages and self.run.kind == Run.Kind.INTERNAL:
            # A run before its first tool turn holds only the prompt run_create stored (a final
            # answer would have ended it), and run_lease returned that prompt: save both queries.
            self.messages = [Message(run_id=self.run.id, seq=1, role=Message.Role.USER, content=self.run.input)]
            self.calls, self.approvals = [], {}
            return
        # No tool turn yet (steps == 0), no tool calls: their query is saved.
        self.messages, self.calls = sql.run_history(self.run.id, with_calls=self.steps > 0)
        self.approvals = {c.pk: c.approval for c in self.calls if _has_approval(c)}

    def _next_seq(self) -> int:
        return self.messages[-1].seq + 1 if self.messages else 1

    def _delta_sink(self, deltas: _Deltas | None) -> DeltaSink | None:
        if deltas is None and self.on_delta is None:
            return None

        def sink(text: str) -> None:
            if deltas is not None:
                deltas.add(text)
            if self.on_delta is not None:
                self.on_delta(text)

        return sink

    # -- a model turn ----------------------------------------------------------------

    def _record_turn(self, turn: AssistantTurn) -> bool:
        """Record a turn with tool calls; return True when the run suspended with it."""
        seq = self._next_seq()
        taken = {call.call_id for call in self.calls}
        call_ids: list[str] = []
        wire: list[dict[str, Any]] = []
        for index, proposed in enumerate(turn.tool_calls, start=1):
            call_id = _call_id(proposed.id, seq, index, taken)
            taken.add(call_id)
            call_ids.append(call_id)
            wire.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": proposed.name, "arguments": proposed.arguments},
                }
            )
        while True:
            planned = [self._plan(call_id, call) for call_id, call in zip(call_ids, turn.tool_calls, strict=True)]
            nothing_runs_now = all(call.status != ToolCall.Status.PROPOSED for call in planned)
            suspend = nothing_runs_now and any(call.hitl_mode == Approval.Mode.SUSPEND for call in planned)
            try:
                services.step_open(
                    run_id=self.run.id,
                    owner=self.owner,
                    seq=seq,
                    content=turn.content,
                    tool_calls=wire,
                    calls=planned,
                    suspend=suspend,
                )
            except GrantLapsed as exc:  # it lapsed between its match and the write, which wrote nothing
                self.lapsed_grants.add(exc.grant_id)  # plan without it
                continue
            self.steps += 1
            return suspend

    def _plan(self, call_id: str, proposed: ProposedCall) -> PlannedCall:
        """Classify a proposed call: an error told at once, a low-risk call, or a gated one."""

        def refused(name: str, arguments: Any, code: str, message: str) -> PlannedCall:
            output = outputs.error(code, message)
            return PlannedCall(
                call_id=call_id,
                name=name[:_NAME_CHARS],  # a model may name a tool with any text, of any length
                arguments=_as_object(arguments),
                status=ToolCall.Status.FAILED,
                output=output,
            )

        try:
            # Repaired before anything reads them: the check, the policy, the reviewer and the
            # tool all see the arguments as they are stored. Nesting is refused before parsing,
            # since json's recursion would overflow on a few thousand brackets.
            arguments = text.loads_lenient(proposed.arguments or "{}")
        except ValueError as exc:
            message = f"the arguments cannot be read as JSON ({exc}); send a JSON object"
            return refused(proposed.name, None, "INVALID_ARGUMENTS", message)
        tool = self.tools.get(proposed.name)
        if tool is None:
            available = ", ".join(self.tools) or "none"
            message = f"there is no tool named {proposed.name!r}; available: {available}"
            return refused(proposed.name, arguments, "UNKNOWN_TOOL", message)
        try:
            # Checks before asking: a call that cannot succeed never reaches a person.
            tool.check_arguments(tool.validate(arguments))
        except InvalidArguments as exc:
            return refused(tool.name, arguments, "INVALID_ARGUMENTS", exc.message)
        except ToolError as exc:
            return refused(tool.name, arguments, exc.code, exc.message)
        verdict = self._verdict(tool.name, arguments)
        if verdict.action == "deny":
            # Nobody is asked: the model reads the reason, the row and the audit say which rule refused.
            return PlannedCall(
                call_id=call_id,
                name=tool.name,
                arguments=arguments,
                status=ToolCall.Status.REJECTED,
                output=outputs.error("POLICY_DENIED", verdict.reason),
                verdict=verdict,
            )
        if verdict.action == "allow":
            # Runs at once; a rule's (or a grant's) allowance is recorded as a decision, an unlisted tool's is not.
            return PlannedCall(
                call_id=call_id,
                name=tool.name,
                arguments=arguments,
                status=ToolCall.Status.PROPOSED,
                verdict=verdict if verdict.automatic else None,
            )
        if verdict.action == "schedule":
            return self._scheduled(call_id, tool.name, arguments, verdict)
        expires_at = timezone.now() + timedelta(seconds=verdict.timeout_seconds) if verdict.timeout_seconds else None
        output = None
        if verdict.mode == Approval.Mode.DEFER:
            output = outputs.pending(tool.name, ids.approval_id(self.run.id, call_id))
        return PlannedCall(
            call_id=call_id,
            name=tool.name,
            arguments=arguments,
            status=ToolCall.Status.AWAITING_APPROVAL,
            hitl_mode=verdict.mode,
            output=output,
            expires_at=expires_at,
            verdict=verdict,
        )

    def _scheduled(self, call_id: str, name: str, arguments: dict[str, Any], verdict: Verdict) -> PlannedCall:
        """Plan a call a schedule rule delays: a suspend approval its time (expires_at) runs; now: it runs."""
        run_at = verdict.held_until(timezone.now())
        if run_at is None:
            return PlannedCall(call_id=call_id, name=name, arguments=arguments, status=ToolCall.Status.PROPOSED)
        return PlannedCall(
            call_id=call_id,
            name=name,
            arguments=arguments,
            status=ToolCall.Status.AWAITING_APPROVAL,
            hitl_mode=Approval.Mode.SUSPEND,
            expires_at=run_at,
            verdict=verdict,
        )

    def _verdict(self, tool_name: str, arguments: dict[str, Any]) -> Verdict:
        """Return what agentfast.yaml says about this call of this run."""
        run = {"id": self.run.id, "agent": self.run.agent, "created_by": self.run.created_by, "input": self.run.input}
        facts = CallFacts(tool=tool_name, args=arguments, agent=self.agent.name, run=run, now=timezone.now())
        return evaluate(get_policy(), facts, agent=self.agent, grant_lookup=grant_match_except(self.lapsed_grants))

    # -- settling the open step ------------------------------------------------------

    def _settle_open_step(self) -> bool:
        """Give every call of the last turn its output; return False if one still waits."""
        turn = next((m for m in reversed(self.messages) if m.role == Message.Role.ASSISTANT), None)
        if turn is None or not turn.tool_calls:
            return True
        answered = {m.tool_call_id for m in self.messages if m.seq > turn.seq and m.role == Message.Role.TOOL}
        waiting = False
        self.wake_at = None
        for call in (c for c in self.calls if c.step == turn.seq and c.call_id not in answered):
            waiting = self._settle(call) or waiting
        if self.wake_at is not None and self.run.auto_resume:
            # One message for the step, at its earliest held time: one per held call would
            # multiply at every hop (each drive they start sending as many again).
            queue.drive_at_on_commit(self.run.id, self.wake_at)
        if waiting:
            return False
        self._append_feedback(turn.seq)
        return True

    def _settle(self, call: ToolCall) -> bool:
        """Bring one call to an output the model can read; return True if it waits on a person."""
        approval = self.approvals.get(call.pk)
        if call.result is not None or call.executed_at is not None or call.status == ToolCall.Status.IN_DOUBT:
            self._from_claim(call)
        elif approval is None:
            return self._execute(call, None)
        elif approval.status == Approval.Status.PENDING:
            return approval.mode == Approval.Mode.SUSPEND
        elif approval.status in (Approval.Status.REJECTED, Approval.Status.EXPIRED):
            self._finish(call, ToolCall.Status.REJECTED, outputs.declined(call.name, approval.status, approval.note))
        elif self._held(call):
            return True
        else:
            return self._execute(call, approval)
        return False

    def _held(self, call: ToolCall) -> bool:
        """Return whether a decided call waits for the time its tool asked for (and wake the run then)."""
        until = call.held_until(timezone.now())
        if until is None:
            return False
        self._wake_by(until)
        return True

    def _wake_by(self, when: datetime) -> None:
        """Have the run driven again by `when`: the drive message goes once the step is settled, for
        its earliest held call (_settle_open_step), not one per call."""
        self.wake_at = when if self.wake_at is None else min(self.wake_at, when)

    def _execute(self, call: ToolCall, approval: Approval | None) -> bool:
        """Claim and run a call once; return True if its tool asked a person first."""
        tool = self.tools.get(call.name) or registry.get(call.name)
        if tool is None:
            self._finish(call, ToolCall.Status.FAILED, outputs.error("UNKNOWN_TOOL", f"tool {call.name!r} is gone"))
            return False
        try:
            arguments = execution.arguments_to_run(tool, call, approval)
        except InvalidArguments as exc:  # the tool's schema changed since the call was proposed
            self._finish(call, ToolCall.Status.FAILED, outputs.error("INVALID_ARGUMENTS", exc.message))
            return False
        refused = execution.held_refusal(call, approval, arguments)
        if refused is not None:  # held, and a deny rule added while it waited matches it now
            self._finish(call, ToolCall.Status.REJECTED, refused)
            return False
        claimed_at = services.toolcall_claim(tool_call=call)
        if claimed_at is None:
            # Someone else holds the claim: reuse their result, never run the effect again.
            call.refresh_from_db()
            self._from_claim(call)
            return False
        ctx = execution.context(call, approval)
        try:
            with _lease_keeper.running_tool(self.owner):
                status, output = execution.invoke(tool, ctx, arguments)
        except FeedbackRequired as exc:
            # Nobody was asked (no approval, or a rule's, a grant's or a schedule's allowance): a person
            # answers now. Asked after a person's (or a deadline's) decision, the tool had its answer: it fails.
            if approval is None or approval.decided_by_policy:
                request = execution.jsonable(exc.payload)
                services.toolcall_ask(
                    owner=self.owner,
                    tool_call=call,
                    claimed_at=claimed_at,
                    request=request,
                    expires_at=None,
                    allowance=approval,
                )
                return True
            status = ToolCall.Status.FAILED
            output = outputs.error("TOOL_ERROR", f"{call.name} asked for a decision again after one was given")
        except RunLater as exc:
            if approval is None:  # nobody decided: the schedule is an approval of its own ("run now")
                services.toolcall_schedule(owner=self.owner, tool_call=call, claimed_at=claimed_at, run_at=exc.when)
                return True
            if not ctx.released:  # decided, by a person or a rule: the decision waits for the tool's time
                services.toolcall_hold(owner=self.owner, tool_call=call, claimed_at=claimed_at, run_at=exc.when)
                self._wake_by(exc.when)
                return True
            status = ToolCall.Status.FAILED
            output = outputs.error("TOOL_ERROR", f"{call.name} asked to run later again after its time came")
        self._finish(call, status, output, arguments)
        return False

    def _from_claim(self, call: ToolCall) -> None:
        """Answer a call that was claimed before: its memoized result, or in doubt if it has none."""
        if call.result is not None:
            self._finish(call, call.status, call.result, call.executed_arguments)
        else:  # claimed by a driver that died before storing a result: never run it again
            self._finish(call, ToolCall.Status.IN_DOUBT, outputs.in_doubt(call.name), call.executed_arguments)

    def _finish(
        self, call: ToolCall, status: str, output: dict[str, Any], executed: dict[str, Any] | None = None
    ) -> None:
        seq = self._next_seq()
        services.toolcall_finish(
            owner=self.owner, tool_call=call, seq=seq, status=status, output=output, executed_arguments=executed
        )
        self._remember(seq, Message.Role.TOOL, json.dumps(output), tool_call_id=call.call_id)

    def _append(
        self,
        role: str,
        content: str,
        *,
        tool_call_id: str = "",
        reports: list[ToolCall] | None = None,
        feedback: list[tuple[str, str]] | None = None,
    ) -> None:
        seq = self._next_seq()
        services.message_append(
            owner=self.owner,
            run_id=self.run.id,
            seq=seq,
            role=role,
            content=content,
            tool_call_id=tool_call_id,
            reports=reports,
            feedback=feedback,
        )
        self._remember(seq, role, content, tool_call_id=tool_call_id)
        for offset, (call_id, words) in enumerate(feedback or [], start=1):
            self._remember(seq + offset, Message.Role.USER, words, tool_call_id=call_id)

    def _remember(self, seq: int, role: str, content: str, *, tool_call_id: str = "") -> None:
        """Keep a message just stored in the in-memory history the model reads next."""
        self.messages.append(
            Message(run_id=self.run.id, seq=seq, role=role, content=content, tool_call_id=tool_call_id)
        )

    def _append_feedback(self, step: int) -> None:
        """After a step's outputs, add each rejection's feedback as a user message (revise)."""
        # A deferred call's feedback follows its rejection, which is reported later (_report_deferred).
        calls = [c for c in self.calls if c.step == step and c.hitl_mode != Approval.Mode.DEFER]
        for call_id, words in self._feedback(calls):
            self._append(Message.Role.USER, words, tool_call_id=call_id)

    def _feedback(self, calls: list[ToolCall]) -> list[tuple[str, str]]:
        """Return (call id, feedback) of each of these calls rejected with feedback the model has not read."""
        given = {m.tool_call_id for m in self.messages if m.role == Message.Role.USER and m.tool_call_id}
        approvals = [(c.call_id, self.approvals.get(c.pk)) for c in calls if c.call_id not in given]
        return [(call_id, approval.feedback) for call_id, approval in approvals if approval and approval.feedback]

    def _report_deferred(self) -> None:
        """Tell the model, once, the outcome of deferred calls decided since it last spoke, and any feedback."""
        reports = [
            c
            for c in self.calls
            if c.hitl_mode == Approval.Mode.DEFER and (c.result is not None or c.in_doubt) and c.reported_at is None
        ]
        if not reports:
            return
        content = "\n".join(
            f"Update on a deferred call: {c.name} ({c.call_id}) → {json.dumps(_deferred_outcome(c))}" for c in reports
        )
        self._append(Message.Role.SYSTEM, content, reports=reports, feedback=self._feedback(reports))


class _Deltas:
    """Publish a turn's streamed text as live `delta` events, joined into one at most every DELTA_SECONDS.

    A model streams a token a chunk; a push per token cost a channel-layer send each (and
    each viewer a frame) for text a person reads no faster at 20 updates a second. The
    first piece goes at once, so the stream starts without delay; `flush` sends the rest
    when the turn ends.
    """

    DELTA_SECONDS = 0.05

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.pieces: list[str] = []
        self.sent_at = -self.DELTA_SECONDS

    def add(self, text: str) -> None:
        self.pieces.append(text)
        if time.monotonic() - self.sent_at >= self.DELTA_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pieces:
            text, self.pieces = "".join(self.pieces), []
            events.publish(run_id=self.run_id, type=RunEvent.Type.DELTA, data={"text": text}, persist=False)
            self.sent_at = time.monotonic()


_NAME_CHARS = ToolCall._meta.get_field("name").max_length or 100


def _call_id(proposed: str, seq: int, index: int, taken: set[str]) -> str:
    """Return the model's id for a call if it is safe and new in the run, else one made from the turn.

    A made id may itself have been proposed, earlier in the turn or by an earlier turn: two
    calls with one id would make the whole turn fail to store.
    """
    if ids.is_safe_call_id(proposed) and proposed not in taken:
        return proposed
    call_id, attempt = f"call_{seq}_{index}", 1
    while call_id in taken:
        attempt += 1
        call_id = f"call_{seq}_{index}_{attempt}"
    return call_id


def _deferred_outcome(call: ToolCall) -> dict[str, Any]:
    """Return what the model reads of a deferred call's end: its result, or in doubt when its worker died."""
    # The sweeper marks such a claim in doubt without a result: a late result of the worker may still land.
    return call.result if call.result is not None else outputs.in_doubt(call.name)


def _has_approval(call: ToolCall) -> bool:
    try:
        return call.approval is not None
    except Approval.DoesNotExist:
        return False


def _as_object(arguments: Any) -> dict[str, Any] | None:
    return arguments if isinstance(arguments, dict) else None
