"""Run lifecycle: create, lease (one driver at a time), suspend, finish, cancel, resume."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef
from django.utils import timezone

from agents import events, ids, queue, sql, text
from agents.models import Approval, Message, Run, RunEvent, ToolCall
from agents.policy import ConfigError, agent_from_config, get_policy
from agents.services import eligibility
from agents.services.errors import (
    InvalidInput,
    LeaseLost,
    NotFound,
    NotPermitted,
    Unavailable,
    WrongState,
    unsafe_text_refused,
)
from agents.sql.chain import Chain, ChainResult

if TYPE_CHECKING:
    from agents.services.approvals import Attempt

logger = logging.getLogger(__name__)

MAX_INPUT_CHARS = 100_000


def pending_suspend_approvals() -> Exists:
    """Return a subquery: the run (OuterRef pk) still waits on a suspend approval."""
    return Exists(
        Approval.objects.filter(run=OuterRef("pk"), mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING)
    )


def lease_expiry(ttl: float | None = None) -> datetime:
    return timezone.now() + timedelta(seconds=ttl if ttl is not None else settings.AGENTFAST_LEASE_SECONDS)


def run_create(
    *,
    agent: str,
    input: str,
    created_by: str = "",
    started_from: str = "",
    auto_resume: bool = True,
    enqueue: bool = True,
    agent_config: dict[str, Any] | None = None,
) -> Run:
    """Create a queued run with its user message and, unless told not to, enqueue it.

    `created_by` is a username (four eyes compare it), `started_from` where it was started
    (api, cli, playground). With `agent_config` the run carries its own agent definition (validated like an
    agentfast.yaml entry) instead of naming a configured one.
    """
    _require_agent(agent, agent_config)
    _require_clean(input, field="input")
    _require_clean(agent_config, field="agent_config")
    if not input.strip():
        raise InvalidInput("the prompt is empty", field="input")
    if len(input) > MAX_INPUT_CHARS:
        raise InvalidInput(f"the prompt is longer than {MAX_INPUT_CHARS} characters", field="input")
    now = timezone.now()
    run = Run(
        id=ids.new_run_id(),
        agent=agent,
        agent_config=agent_config,
        input=input,
        created_by=created_by,
        started_from=started_from,
        auto_resume=auto_resume,
        created_at=now,
        updated_at=now,
    )
    # The run and its prompt in one write (one statement on PostgreSQL, agents.sql.chain).
    chain = sql.chain.inserting(run, returning=("id",))
    chain.insert(Message, [{"run_id": run.id, "seq": 1, "role": Message.Role.USER, "content": input}])
    chain.run()
    run._state.adding, run._state.db = False, Run.objects.db  # as the ORM leaves a row it saved
    if enqueue:
        queue.start_on_commit(run.id)
    return run


def _require_agent(name: str, config: dict[str, Any] | None) -> None:
    """Refuse an agent the file does not configure, or a run's own definition that is not valid.

    A file that cannot be read is the server's fault, not the caller's: Unavailable, its
    problem (which names the server's path to it) logged for the operator.
    """
    if config is not None:
        try:
            agent_from_config(name, config)
        except ConfigError as exc:
            raise InvalidInput(str(exc), field="agent_config") from None
        return
    try:
        policy = get_policy()
    except ConfigError as exc:
        logger.error("a run of %r was refused: %s", name, exc)
        raise Unavailable(
            "the server's agentfast.yaml cannot be read, so no run can start; the server log says why"
        ) from None
    try:
        policy.agent(name)
    except ConfigError as exc:
        raise InvalidInput(str(exc), field="agent") from None


def run_lease(*, run_id: str, owner: str, ttl: float | None = None) -> Run | None:
    """Take the run's lease if it is free and there is work; return the run, or None.

    A compare-and-set on lease_expires_at: of any number of concurrent callers exactly one
    gets the run (invariant 5). A suspended run is only leased once no suspend approval of
    it is pending. One statement, which returns what the driver needs.
    """
    row = sql.run_lease(run_id=run_id, owner=owner, now=timezone.now(), expires_at=lease_expiry(ttl))
    if row is None:
        return None
    agent, steps, prompt, auto_resume, has_own_agent, created_by, kind = row
    # Most runs name a configured agent: read the JSON definition only for those that carry one.
    agent_config = Run.objects.values_list("agent_config", flat=True).get(pk=run_id) if has_own_agent else None
    return Run(
        id=run_id,
        agent=agent,
        agent_config=agent_config,
        steps=steps,
        input=prompt,
        auto_resume=bool(auto_resume),
        status=Run.Status.RUNNING,
        lease_owner=owner,
        created_by=created_by,  # rules and grants read run.created_by (four eyes)
        kind=kind,  # the driver trusts a fresh run's history to be its prompt only for runs run_create made
    )


def run_write(
    *,
    run_id: str,
    owner: str | None,
    items: Sequence[tuple[str, dict[str, Any]]] = (),
    rows: Callable[[Chain], object] | None = None,
    release: bool = False,
    add_steps: int = 0,
    **fields: str,
) -> ChainResult:
    """Update the run as its driver, with the rows that hang on it and its events: all or nothing.

    The update is fenced by the lease (`lease_owner = owner`; LeaseLost if another driver
    took the run, and then nothing is written), extends the lease or releases it, sets
    `fields` and adds `add_steps`. `rows` adds the write's other rows to the chain; the
    events `items` get the seqs the update reserved and are pushed after commit. One
    statement on PostgreSQL (agents.sql.chain). With `owner=None` it applies to any run that
    has not ended (a failure recorded from outside a drive).
    """
    chain = sql.run_write(
        run_id=run_id,
        owner=owner,
        now=timezone.now(),
        events=len(items),
        lease_until=None if release else lease_expiry(),
        add_steps=add_steps,
        fields=fields,
    )
    if rows is not None:
        rows(chain)
    push = events.record_in(chain, run_id=run_id, items=list(items))
    result = chain.run()
    if result is None:
        raise LeaseLost(f"{owner or 'nobody'} cannot write {run_id}: another driver holds it or it has ended")
    push(result)
    return result


def run_renew_lease(*, run_id: str, owner: str, ttl: float | None = None) -> None:
    """Extend the lease this owner holds; raise LeaseLost if another driver took it."""
    if not Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=lease_expiry(ttl)):
        raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")


def run_suspend(*, run_id: str, owner: str) -> bool:
    """Give up the lease of a run that waits on a person; return False if it no longer waits.

    The pending approval is re-checked under the run's row lock (agents.sql.run_suspend): one
    decided since the driver looked must not leave a suspended run that nobody resumes.
    """
    if sql.run_suspend(run_id=run_id, owner=owner, now=timezone.now()):
        return True
    run_renew_lease(run_id=run_id, owner=owner)  # still ours: keep driving
    return False


def run_complete(*, run_id: str, owner: str, seq: int, content: str) -> None:
    """Record the final answer and finish the run."""
    content = text.repair(content)
    items: list[tuple[str, dict[str, Any]]] = [
        (RunEvent.Type.MESSAGE, {"seq": seq, "role": "assistant", "content": content}),
        (RunEvent.Type.RUN_STATUS, {"status": "completed", "output": content}),
    ]
    answer = {"run_id": run_id, "seq": seq, "role": Message.Role.ASSISTANT, "content": content}
    run_write(
        run_id=run_id,
        owner=owner,
        items=items,
        rows=lambda chain: chain.insert(Message, [answer]),
        release=True,
        status=Run.Status.COMPLETED,
        output=content,
    )


def run_fail(*, run_id: str, owner: str | None, error: str) -> None:
    """Mark a run failed with a reason; with an owner, only if that owner still drives it."""
    error = text.repair(error)
    items: list[tuple[str, dict[str, Any]]] = [(RunEvent.Type.RUN_STATUS, {"status": "failed", "error": error})]
    run_write(run_id=run_id, owner=owner, items=items, release=True, status=Run.Status.FAILED, error=error)


def run_cancel(*, run_id: str, attempt: Attempt) -> Run:
    """Cancel a run that has not ended: its pending approvals expire and no call of it runs any more.

    1. Lock the run row: a decision (approval_decide) locks it first too, so the two never
       interleave; whichever comes second sees the other's outcome.
    2. Refuse while a claimed call is running (its effect is under way), so no effect ever
       lands on a cancelled run; the caller may try again once it has finished. Refuse, audited,
       a reviewer who may not decide one of its pending calls (cancel_refusal).
    3. Cancel, expire pending approvals, and give every call that was not claimed the
       outcome "run cancelled" (an approved call never runs after this).
    4. Audit who cancelled and from where, and announce it, in the same transaction.
    """
    from agents.services.approvals import audit_run

    if not attempt.actor.strip():  # as for a decision: the audit says who, never "(anonymous)"
        raise InvalidInput("who cancels is required", field="by")
    try:
        return _cancel(run_id, attempt)
    except NotPermitted as exc:  # audited once the refused transaction is rolled back
        audit_run(run_id=run_id, attempt=attempt, action="cancelled", detail={"error": exc.message}, refused=True)
        raise


def _cancel(run_id: str, attempt: Attempt) -> Run:
    from agents.services.approvals import approval_expire, audit_run

    with transaction.atomic():
        run = _locked(run_id)
        if run.is_terminal:
            raise WrongState(f"run {run_id} is {run.status}; only a run that has not ended can be cancelled")
        if reason := cancel_refusal(run, attempt):
            raise NotPermitted(reason)
        running = ToolCall.objects.filter(run_id=run_id, status=ToolCall.Status.RUNNING, result__isnull=True)
        if running:
            calls = ", ".join(
                f"{name} (claimed at {claimed:%H:%M:%S} UTC)"
                for name, claimed in running.order_by("executed_at").values_list("name", "executed_at")
            )
            raise WrongState(
                f"run {run_id} is running {calls} now; cancel it once that has finished "
                "(if its worker died, it is marked in doubt once its claim runs out)"
            )
        Run.objects.filter(pk=run_id).update(
            status=Run.Status.CANCELLED, lease_owner="", lease_expires_at=None, updated_at=timezone.now()
        )
        for approval in Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING):
            approval_expire(approval=approval, actor=attempt.decider, reason="the run was cancelled", resume=False)
        unclaimed = ToolCall.objects.filter(run_id=run_id, executed_at__isnull=True, result__isnull=True)
        stopped = list(unclaimed.values_list("call_id", flat=True))
        unclaimed.update(status=ToolCall.Status.REJECTED, result=_CANCELLED_OUTPUT)
        audit_run(run_id=run_id, attempt=attempt, action="cancelled", detail={"calls_stopped": stopped})
        events.publish(
            run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "cancelled", "by": attempt.decider}
        )
    return _get(run_id)


def cancel_refusal(run: Run, attempt: Attempt) -> str | None:
    """Return why `attempt` may not cancel the run (None: it may).

    A cancel stops the run's pending calls as a rejection would, so a reviewer who may not decide
    one of them (not among its approvers) may not cancel the run either, unless they started it
    or are an admin. The command line, run on the server with no signed-in user, may.
    """
    user = attempt.user
    if user is None or run.created_by == attempt.actor or user.has_perm(eligibility.ADMIN):
        return None
    for approval in Approval.objects.filter(run_id=run.id, status=Approval.Status.PENDING).select_related("run"):
        if why := eligibility.restriction(user, approval):
            return (
                f"{why}; cancelling run {run.id} would stop it: only its approvers, "
                f"the run's starter ({run.created_by or 'unknown'}) or an admin may"
            )
    return None


_CANCELLED_OUTPUT = {
    "ok": False,
    "error_code": "RUN_CANCELLED",
    "message": "The run was cancelled; the call did not run.",
}


def _locked(run_id: str) -> Run:
    """Return the run with its row locked until the transaction ends (SQLite: its writes are serialized anyway)."""
    try:
        return Run.objects.select_for_update().get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None


def _require_clean(value: Any, *, field: str) -> None:
    with unsafe_text_refused():
        text.require_clean(value, field=field)


def run_request_resume(*, run_id: str, enqueue: bool = True, attempt: Attempt | None = None) -> Run:
    """Check that a run has work to do and enqueue it; refuse, saying why, when it has none.

    Without `enqueue` the caller drives the run itself (the CLI's --inline, the playground).
    With an `attempt` (a resume over HTTP), a run started with auto_resume off is resumed
    only by whoever started it or an admin: its creator means to drive and stream it.
    """
    if attempt is not None:
        _require_may_resume(_get(run_id), attempt)
    with transaction.atomic():
        run = _get(run_id)
        if run.kind == Run.Kind.EXTERNAL:
            raise WrongState(f"run {run_id} is an external agent's session: that agent drives it, not agentfast")
        if run.status == Run.Status.FAILED:
            # An explicit resume retries a failed run (a model endpoint that was down). Say so in
            # its events: replayed, the `failed` before it would otherwise read as the run's end.
            if Run.objects.filter(pk=run_id, status=Run.Status.FAILED).update(
                status=Run.Status.QUEUED, error="", updated_at=timezone.now()
            ):
                events.publish(run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "queued"})
        elif run.is_terminal:
            raise WrongState(f"run {run_id} is {run.status}; there is nothing to resume")
        elif run.status == Run.Status.SUSPENDED:
            waiting = list(
                Approval.objects.filter(
                    run_id=run_id, mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING
                ).values_list("id", flat=True)
            )
            if waiting:
                raise WrongState(f"run {run_id} waits on {len(waiting)} pending approval(s): {', '.join(waiting)}")
            if run.auto_resume and (held := _held_until(run_id)) is not None:
                # Its wake-up is on its way: a drive now only holds the call again and sends one more.
                raise WrongState(
                    f"run {run_id} waits until {held:%Y-%m-%d %H:%M:%S} UTC for a decided call its tool put off; "
                    "it resumes by itself then"
                )
        elif run.lease_expires_at and run.lease_expires_at > timezone.now():
            raise WrongState(
                f"run {run_id} is being driven by {run.lease_owner} (lease until {run.lease_expires_at:%H:%M:%S})"
            )
        if enqueue:
            queue.drive_on_commit(run_id)
    return _get(run_id)


def _held_until(run_id: str) -> datetime | None:
    """Return when the held call of a suspended run runs, if that is all it waits for; else None.

    None when a decided suspend call of it has nothing to wait for (one decided with --no-resume):
    a resume runs that one.
    """
    now = timezone.now()
    calls = ToolCall.objects.filter(
        run_id=run_id,
        hitl_mode=Approval.Mode.SUSPEND,
        result__isnull=True,
        status__in=[ToolCall.Status.APPROVED, ToolCall.Status.REJECTED],
    )
    if calls.filter(ToolCall.due(now)).exists():
        return None
    return calls.filter(not_before__gt=now).aggregate(at=Min("not_before"))["at"]


def _require_may_resume(run: Run, attempt: Attempt) -> None:
    """Refuse, and audit, a resume of a run its creator drives, by anyone but them or an admin."""
    from agents.services.approvals import audit_run

    reason = resume_refusal(run, attempt)
    if reason is None:
        return
    audit_run(run_id=run.id, attempt=attempt, action="resume", detail={"error": reason}, refused=True)
    raise NotPermitted(reason)


def resume_refusal(run: Run, attempt: Attempt) -> str | None:
    """Return why `attempt` may not resume the run (None: it may): its creator drives it, with auto_resume off.

    Only they or an admin may. A run that records no creator (started by code, not by a
    person) is anyone's to resume. An external agent's session is never resumed here, so a
    resume takes it from nobody (run_request_resume says why it has none).
    """
    user = attempt.user
    if (
        run.auto_resume
        or run.kind == Run.Kind.EXTERNAL
        or run.created_by in ("", attempt.actor)
        or (user is not None and user.has_perm(eligibility.ADMIN))
    ):
        return None
    return (
        f"run {run.id} was started by {run.created_by} with auto_resume off, to drive it themselves; "
        "only they or an admin may resume it"
    )


def _get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None
