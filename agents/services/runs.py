"""Run lifecycle: create, lease (one driver at a time), suspend, finish, cancel, resume."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agents import events, ids, queue
from agents.models import Approval, Message, Run, RunEvent
from agents.policy import ConfigError, get_policy
from agents.services.errors import InvalidInput, LeaseLost, NotFound, WrongState

MAX_INPUT_CHARS = 100_000


def pending_suspend_approvals() -> Exists:
    """Return a subquery: the run (OuterRef pk) still waits on a suspend approval."""
    return Exists(
        Approval.objects.filter(run=OuterRef("pk"), mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING)
    )


def lease_expiry(ttl: float | None = None) -> datetime:
    return timezone.now() + timedelta(seconds=ttl if ttl is not None else settings.AGENTFAST_LEASE_SECONDS)


def run_create(
    *, agent: str, input: str, created_by: str = "", auto_resume: bool = True, enqueue: bool = True
) -> Run:
    """Create a queued run with its user message and, unless told not to, enqueue it."""
    try:
        get_policy().agent(agent)
    except ConfigError as exc:
        raise InvalidInput(str(exc), field="agent") from None
    if not input.strip():
        raise InvalidInput("the prompt is empty", field="input")
    if len(input) > MAX_INPUT_CHARS:
        raise InvalidInput(f"the prompt is longer than {MAX_INPUT_CHARS} characters", field="input")
    with transaction.atomic():
        run = Run.objects.create(
            id=ids.new_run_id(), agent=agent, input=input, created_by=created_by, auto_resume=auto_resume
        )
        Message.objects.create(run=run, seq=1, role=Message.Role.USER, content=input)
        if enqueue:
            queue.drive_on_commit(run.id)
    return run


def run_lease(*, run_id: str, owner: str, ttl: float | None = None) -> Run | None:
    """Take the run's lease if it is free and there is work; return the run, or None.

    A compare-and-set on lease_expires_at: of any number of concurrent callers exactly one
    gets the run (invariant 5). A suspended run is only leased once no suspend approval of
    it is pending.
    """
    now = timezone.now()
    free = Run.objects.filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now), pk=run_id)
    lease = {"status": Run.Status.RUNNING, "lease_owner": owner, "lease_expires_at": lease_expiry(ttl), "updated_at": now}
    with transaction.atomic():
        resumed = free.filter(~pending_suspend_approvals(), status=Run.Status.SUSPENDED).update(**lease)
        if resumed:
            events.publish(run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "running", "resumed": True})
        elif not free.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(**lease):
            return None
    return Run.objects.get(pk=run_id)


def run_renew_lease(*, run_id: str, owner: str, ttl: float | None = None) -> None:
    """Extend the lease this owner holds; raise LeaseLost if another driver took it."""
    if not Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=lease_expiry(ttl)):
        raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")


def run_suspend(*, run_id: str, owner: str) -> None:
    """Give up the lease of a run that waits on a person; no process holds it afterwards."""
    updated = Run.objects.filter(pk=run_id, lease_owner=owner).update(
        status=Run.Status.SUSPENDED, lease_owner="", lease_expires_at=None, updated_at=timezone.now()
    )
    if not updated:
        raise LeaseLost(f"{owner} no longer holds the lease of {run_id}")


def run_complete(*, run_id: str, owner: str, seq: int, content: str) -> None:
    """Record the final answer and finish the run."""
    with transaction.atomic():
        _finish(run_id=run_id, owner=owner, status=Run.Status.COMPLETED, output=content)
        Message.objects.create(run_id=run_id, seq=seq, role=Message.Role.ASSISTANT, content=content)
        events.publish(run_id=run_id, type=RunEvent.Type.MESSAGE, data={"seq": seq, "role": "assistant", "content": content})
        events.publish(run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "completed", "output": content})


def run_fail(*, run_id: str, owner: str | None, error: str) -> None:
    """Mark a run failed with a reason; with an owner, only if that owner still drives it."""
    with transaction.atomic():
        _finish(run_id=run_id, owner=owner, status=Run.Status.FAILED, error=error)
        events.publish(run_id=run_id, type=RunEvent.Type.RUN_STATUS, data={"status": "failed", "error": error})


def _finish(*, run_id: str, owner: str | None, status: str, output: str = "", error: str = "") -> None:
    runs = Run.objects.filter(pk=run_id).exclude(status__in=Run.TERMINAL)
    if owner is not None:
        runs = runs.filter(lease_owner=owner)
    updated = runs.update(
        status=status, output=output, error=error, lease_owner="", lease_expires_at=None, updated_at=timezone.now()
    )
    if not updated:
        raise LeaseLost(f"{owner or 'nobody'} cannot finish {run_id}: another driver holds it or it has ended")


def run_cancel(*, run_id: str, by: str) -> Run:
    """Cancel a run that has not ended; its pending approvals expire."""
    from agents.services.approvals import approval_expire

    with transaction.atomic():
        updated = Run.objects.filter(pk=run_id).exclude(status__in=Run.TERMINAL).update(
            status=Run.Status.CANCELLED, lease_owner="", lease_expires_at=None, updated_at=timezone.now()
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
                Approval.objects.filter(run_id=run_id, mode=Approval.Mode.SUSPEND, status=Approval.Status.PENDING)
                .values_list("id", flat=True)
            )
            if waiting:
                raise WrongState(f"run {run_id} waits on {len(waiting)} pending approval(s): {', '.join(waiting)}")
        elif run.lease_expires_at and run.lease_expires_at > timezone.now():
            raise WrongState(f"run {run_id} is being driven by {run.lease_owner} (lease until {run.lease_expires_at:%H:%M:%S})")
        if enqueue:
            queue.drive_on_commit(run_id)
    return _get(run_id)


def _get(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"no run {run_id}") from None
