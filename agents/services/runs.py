"""Run lifecycle: create, lease (one driver at a time), suspend, finish, cancel, resume."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from agents import events, ids, queue
from agents.models import Approval, Message, Run, RunEvent
from agents.policy import ConfigError, agent_for
from agents.services.errors import InvalidInput, LeaseLost, NotFound, WrongState

MAX_INPUT_CHARS = 100_000


_RUN = "agents_run"
# NOT EXISTS / EXISTS body for raw statements on agents_run: a pending suspend approval.
_PENDING_SUSPEND = (
    "SELECT 1 FROM agents_approval WHERE agents_approval.run_id = agents_run.id"
    " AND agents_approval.mode = %s AND agents_approval.status = %s"
)
_PENDING_SUSPEND_PARAMS = [Approval.Mode.SUSPEND, Approval.Status.PENDING]


def pending_suspend_approvals() -> Exists:
    """Return a subquery: the run (OuterRef pk) still waits on a suspend approval."""
    return Exists(
        Approval.objects.filter(run=OuterRef("pk"), mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING)
    )


def _db_time(value: datetime) -> object:
    # Raw statements get datetimes in the form the ORM stores them (SQLite keeps text), so
    # rows written both ways compare alike.
    return connection.ops.adapt_datetimefield_value(value)


def lease_expiry(ttl: float | None = None) -> datetime:
    return timezone.now() + timedelta(seconds=ttl if ttl is not None else settings.AGENTFAST_LEASE_SECONDS)


def run_create(
    *,
    agent: str,
    input: str,
    created_by: str = "",
    auto_resume: bool = True,
    enqueue: bool = True,
    agent_config: dict[str, Any] | None = None,
) -> Run:
    """Create a queued run with its user message and, unless told not to, enqueue it.

    With `agent_config` the run carries its own agent definition (validated like an
    agentfast.yaml entry) instead of naming a configured one.
    """
    try:
        agent_for(agent, agent_config)
    except ConfigError as exc:
        raise InvalidInput(str(exc), field="agent_config" if agent_config is not None else "agent") from None
    if not input.strip():
        raise InvalidInput("the prompt is empty", field="input")
    if len(input) > MAX_INPUT_CHARS:
        raise InvalidInput(f"the prompt is longer than {MAX_INPUT_CHARS} characters", field="input")
    with transaction.atomic():
        run = Run.objects.create(
            id=ids.new_run_id(),
            agent=agent,
            agent_config=agent_config,
            input=input,
            created_by=created_by,
            auto_resume=auto_resume,
        )
        Message.objects.create(run=run, seq=1, role=Message.Role.USER, content=input)
        if enqueue:
            queue.drive_on_commit(run.id)
    return run


def run_lease(*, run_id: str, owner: str, ttl: float | None = None) -> Run | None:
    """Take the run's lease if it is free and there is work; return the run, or None.

    A compare-and-set on lease_expires_at: of any number of concurrent callers exactly one
    gets the run (invariant 5). A suspended run is only leased once no suspend approval of
    it is pending. One statement, which returns what the driver needs.
    """
    now = _db_time(timezone.now())
    sql = f"""
        UPDATE {_RUN} SET status = %s, lease_owner = %s, lease_expires_at = %s, updated_at = %s
        WHERE id = %s AND (lease_expires_at IS NULL OR lease_expires_at < %s)
          AND (status IN (%s, %s) OR (status = %s AND NOT EXISTS ({_PENDING_SUSPEND})))
        RETURNING agent, steps, input, auto_resume, agent_config IS NOT NULL"""
    params = [
        Run.Status.RUNNING,
        owner,
        _db_time(lease_expiry(ttl)),
        now,
        run_id,
        now,
        Run.Status.QUEUED,
        Run.Status.RUNNING,
        Run.Status.SUSPENDED,
        *_PENDING_SUSPEND_PARAMS,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    agent, steps, prompt, auto_resume, has_own_agent = row
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
    )


def run_write(
    *,
    run_id: str,
    owner: str | None,
    events: int = 0,
    release: bool = False,
    add_steps: int = 0,
    **fields: str,
) -> int:
    """Update the run row as its driver, in one statement; return the last reserved event seq.

    The update is fenced by the lease (`lease_owner = owner`; LeaseLost if another driver
    took the run), extends the lease or releases it, sets `fields`, adds `add_steps`, and
    reserves `events` seqs for agents.events.record. With `owner=None` it applies to any
    run that has not ended (a failure recorded from outside a drive).
    """
    sets = ["updated_at = %s", "last_event_seq = last_event_seq + %s"]
    params: list[object] = [_db_time(timezone.now()), events]
    if release:
        sets += ["lease_owner = ''", "lease_expires_at = NULL"]
    else:
        sets.append("lease_expires_at = %s")
        params.append(_db_time(lease_expiry()))
    if add_steps:
        sets.append("steps = steps + %s")
        params.append(add_steps)
    for column, value in fields.items():
        sets.append(f"{connection.ops.quote_name(column)} = %s")
        params.append(value)
    where, where_params = (
        ("lease_owner = %s", [owner]) if owner is not None else ("status NOT IN (%s, %s, %s)", list(Run.TERMINAL))
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_RUN} SET {', '.join(sets)} WHERE id = %s AND {where} RETURNING last_event_seq",
            [*params, run_id, *where_params],
        )
        row = cursor.fetchone()
    if row is None:
        raise LeaseLost(f"{owner or 'nobody'} cannot write {run_id}: another driver holds it or it has ended")
    return row[0]


def run_renew_lease(*, run_id: str, owner: str, ttl: float | None = None) -> None:
    """Extend the lease this owner holds; raise LeaseLost if another driver took it."""
    if not Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=lease_expiry(ttl)):
        raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")


def run_suspend(*, run_id: str, owner: str) -> bool:
    """Give up the lease of a run that waits on a person; return False if it no longer waits.

    The pending approval is re-checked in the same statement: one decided since the driver
    looked must not leave a suspended run that nobody resumes.
    """
    sql = f"""
        UPDATE {_RUN} SET status = %s, lease_owner = '', lease_expires_at = NULL, updated_at = %s
        WHERE id = %s AND lease_owner = %s AND EXISTS ({_PENDING_SUSPEND})"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [Run.Status.SUSPENDED, _db_time(timezone.now()), run_id, owner, *_PENDING_SUSPEND_PARAMS])
        if cursor.rowcount:
            return True
    run_renew_lease(run_id=run_id, owner=owner)  # still ours: keep driving
    return False


def run_complete(*, run_id: str, owner: str, seq: int, content: str) -> None:
    """Record the final answer and finish the run."""
    items = [
        (RunEvent.Type.MESSAGE, {"seq": seq, "role": "assistant", "content": content}),
        (RunEvent.Type.RUN_STATUS, {"status": "completed", "output": content}),
    ]
    with transaction.atomic():
        last = run_write(
            run_id=run_id, owner=owner, events=len(items), release=True, status=Run.Status.COMPLETED, output=content
        )
        Message.objects.create(run_id=run_id, seq=seq, role=Message.Role.ASSISTANT, content=content)
        events.record(run_id=run_id, last_seq=last, items=items)


def run_fail(*, run_id: str, owner: str | None, error: str) -> None:
    """Mark a run failed with a reason; with an owner, only if that owner still drives it."""
    items = [(RunEvent.Type.RUN_STATUS, {"status": "failed", "error": error})]
    with transaction.atomic():
        last = run_write(run_id=run_id, owner=owner, events=1, release=True, status=Run.Status.FAILED, error=error)
        events.record(run_id=run_id, last_seq=last, items=items)


def run_cancel(*, run_id: str, by: str) -> Run:
    """Cancel a run that has not ended; its pending approvals expire."""
    from agents.services.approvals import approval_expire

    with transaction.atomic():
        updated = (
            Run.objects.filter(pk=run_id)
            .exclude(status__in=Run.TERMINAL)
            .update(status=Run.Status.CANCELLED, lease_owner="", lease_expires_at=None, updated_at=timezone.now())
        )
        run = _get(run_id)
        if not updated:
            raise WrongState(f"run {run_id} is {run.status}; only a run that has not ended can be cancelled")
        for approval in Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING):
            approval_expire(approval=approval, actor=by, reason="the run was cancelled", resume=False)
        events.publish(run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "cancelled", "by": by})
    return run


def run_request_resume(*, run_id: str, enqueue: bool = True) -> Run:
    """Check that a run has work to do and enqueue it; refuse, saying why, when it has none.

    Without `enqueue` the caller drives the run itself (the CLI's --inline, the playground).
    """
    with transaction.atomic():
        run = _get(run_id)
        if run.status == Run.Status.FAILED:
            # An explicit resume retries a failed run (a model endpoint that was down).
            Run.objects.filter(pk=run_id, status=Run.Status.FAILED).update(status=Run.Status.QUEUED, error="")
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
        elif run.lease_expires_at and run.lease_expires_at > timezone.now():
            raise WrongState(
                f"run {run_id} is being driven by {run.lease_owner} (lease until {run.lease_expires_at:%H:%M:%S})"
            )
        if enqueue:
            queue.drive_on_commit(run_id)
    return _get(run_id)


def _get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None
