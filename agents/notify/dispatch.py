"""Fan an event out to the channels that want it, and send one delivery."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import connections

from agents import queue
from agents.models import Approval
from agents.notify import channels, payloads
from agents.notify.config import EmailChannel, SlackChannel, WebhookChannel
from agents.notify.models import Delivery
from agents.policy.config import USER_PREFIX, get_policy
from agents.services import eligibility
from agents.services import notify as notify_services
from agents.services.notify import Target

logger = logging.getLogger(__name__)
# The backend that holds permissions (django-axes, first in AUTHENTICATION_BACKENDS, holds none).
PERMISSIONS_BACKEND = "django.contrib.auth.backends.ModelBackend"
HUMAN_KINDS = notify_services.HUMAN_KINDS


def fan_out(event_type: str, approval_id: str) -> list[int]:
    """Store a delivery per receiver that wants the event, and enqueue each; return their ids."""
    wanted = [channel for channel in get_policy().notifications if channel.hears(event_type)]
    if not wanted:
        return []
    approval = Approval.objects.select_related("run", "tool_call").filter(pk=approval_id).first()
    if approval is None:
        return []
    if approval.on_timeout == Approval.OnTimeout.RUN and event_type in payloads.WAITING:
        # A scheduled call runs at its time by itself: nobody is asked, so no message offers to decide it
        # (a tool's run_at is not announced either).
        return []
    payload = payloads.event(event_type, approval)
    targets = [target for channel in wanted for target in _targets(channel, payload, approval)]
    ids = notify_services.deliveries_open(event_type=event_type, approval_id=approval_id, targets=targets)
    from agents.notify.tasks import deliver

    for delivery_id in ids:
        deliver.delay_on_commit(delivery_id)  # outside a transaction: sent at once, a broker error only logged
    return ids


def _targets(channel: Any, payload: dict[str, Any], approval: Approval) -> list[Target]:
    if isinstance(channel, WebhookChannel):
        return [Target(Delivery.Kind.WEBHOOK, channel.url, payload)]
    if isinstance(channel, SlackChannel):
        return [Target(Delivery.Kind.SLACK, channel.webhook_url_env, payload)]
    assert isinstance(channel, EmailChannel)
    mail = {**payload, "one_click": channel.one_click and payload["type"] != "approval.decided"}
    names = channel.to
    if payload["type"] == "approval.escalated":
        # The people it escalates to are told, whether or not the entry's `to:` names them: they
        # are the ones the escalation is for (the entry's own recipients are told as well).
        names = (*names, *_recipient_names(approval.escalate_to))
    return [Target(Delivery.Kind.EMAIL, username, mail) for username in recipients(names)]


def _recipient_names(approvers: list[str]) -> list[str]:
    """Return approver names (a group, or user:NAME) as an email entry's `to:` writes them (group:NAME, or NAME)."""
    return [name.removeprefix(USER_PREFIX) if name.startswith(USER_PREFIX) else f"group:{name}" for name in approvers]


def recipients(names: tuple[str, ...]) -> list[str]:
    """Return the reviewers with an address that an email entry names (usernames, or group:NAME), each once.

    Only people who may read calls (active, with the reviewer role or an admin's): a mail shows the
    call's arguments and prompt, which someone whose role ended must not go on receiving.
    """
    found: dict[str, None] = {}
    # Django's own query of who holds a permission (superusers, directly or through a group), as has_perm judges it.
    readers = User.objects.with_perm(eligibility.DECIDE, backend=PERMISSIONS_BACKEND).values("pk")
    for name in names:
        if name.startswith("group:"):
            users = User.objects.filter(groups__name=name.removeprefix("group:"), is_active=True)
        else:  # user:NAME as approvers write it, or NAME (no username holds a colon)
            users = User.objects.filter(username=name.removeprefix(USER_PREFIX), is_active=True)
        usernames = list(
            users.filter(pk__in=readers).exclude(email="").order_by("username").values_list("username", flat=True)
        )
        if not usernames:
            _say_unreached(name)
        found.update(dict.fromkeys(usernames))
    return list(found)


def _say_unreached(name: str) -> None:
    """Log a name that reaches nobody: nothing is stored for it, so the deliveries page cannot show it."""
    bare = not name.startswith(("group:", USER_PREFIX))
    hint = f" (a group is written group:{name})" if bare and Group.objects.filter(name=name).exists() else ""
    logger.warning(
        "email notifications: %r is no active reviewer with an email address%s; nobody is mailed for it", name, hint
    )


def send(delivery_id: int, *, now: Any = None, force: bool = False) -> str:
    """Make one attempt at a due delivery; return what became of it.

    1. Claim it (a compare-and-set: a duplicate message or the sweeper's re-enqueue finds it taken).
    2. Drop a mail or chat message asking for a decision that was made meanwhile (superseded).
    3. Send it; a 2xx (or a mail handed to the backend) delivers it.
    4. Store the attempt; a failure is due again after its backoff, re-enqueued with that countdown
       (beat's sweep enqueues it instead when it is far off).
    """
    delivery = notify_services.delivery_claim(delivery_id=delivery_id, now=now, force=force)
    if delivery is None:
        return "skipped"
    if reason := _settled(delivery):
        return notify_services.delivery_supersede(delivery=delivery, reason=reason).status
    started = time.monotonic()
    try:
        with _claim_kept(delivery):
            status_code = channels.send(delivery)
        ok, error = status_code is None or 200 <= status_code < 300, ""
        if not ok:
            error = f"HTTP {status_code}"
    except Exception as exc:  # noqa: BLE001 — any failure of a receiver is one failed attempt
        status_code, ok, error = None, False, f"{type(exc).__name__}: {exc}"
    final = not ok and _refused_for_good(delivery, status_code)
    if final:
        error += f" {SLACK_REFUSED}"
    duration_ms = int((time.monotonic() - started) * 1000)
    delivery = notify_services.delivery_record(
        delivery=delivery, ok=ok, status_code=status_code, error=error, duration_ms=duration_ms, now=now, final=final
    )
    if delivery.status == Delivery.Status.PENDING and delivery.next_attempt_at is not None:
        _retry_later(delivery)
    return delivery.status


@contextmanager
def _claim_kept(delivery: Delivery) -> Iterator[None]:
    """Renew the delivery's claim while its attempt runs, so that the sweep starts no second copy beside it.

    A slow mail server answers each step within its timeout and can still take minutes in all
    (an HTTP attempt is bounded whole, a mail's steps only one by one). A worker that dies stops
    renewing, and the claim runs out as before; a send hung for KEEP_CLAIM_SECONDS is let go.
    """
    stop = threading.Event()

    def keep() -> None:
        deadline = time.monotonic() + notify_services.KEEP_CLAIM_SECONDS
        try:
            while not stop.wait(notify_services.CLAIM_SECONDS / 3) and time.monotonic() < deadline:
                if not notify_services.delivery_keep_claim(delivery=delivery):
                    return
        finally:
            connections.close_all()  # this thread's own, if it opened one

    keeper = threading.Thread(target=keep, name=f"delivery-{delivery.pk}-claim", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()  # the attempt is recorded against the claim as last renewed


def _settled(delivery: Delivery) -> str:
    """Return why a person's message asking for a decision is no longer worth sending, or "" while the call waits.

    A mail or chat message retried after its call was decided (the mail server was down for an
    hour) would still ask for a decision and offer buttons that can only be refused. A webhook
    is sent regardless: it is a record of the event for a program, not a question to a person.
    """
    settled = notify_services.deliveries_settled([delivery]).get(delivery.pk)
    if settled is None:
        return ""
    if settled == notify_services.GONE:
        return f"not sent: {settled}"
    return f"not sent: {settled} before this message went out"


# Slack answers these for a message it will never take, however often sent: a webhook URL removed
# or mistyped (404 no_service), an archived channel (410), blocks it refuses (400), a press's
# response_url past its 30 minutes (404). 408, 429 and 5xx are passing, and retried.
SLACK_REFUSED_FOR_GOOD = (400, 403, 404, 410)
SLACK_REFUSED = "(Slack refuses this message for good: not tried again; fix the webhook URL or the channel)"


def _refused_for_good(delivery: Delivery, status_code: int | None) -> bool:
    """Return whether a Slack answer says no retry can deliver the message (a webhook's receiver may recover)."""
    slack = delivery.kind in (Delivery.Kind.SLACK, Delivery.Kind.SLACK_RESPONSE)
    return slack and status_code in SLACK_REFUSED_FOR_GOOD


def _retry_later(delivery: Delivery) -> None:
    """Enqueue the next attempt for its due time, unless that is too far off for the broker: beat sweeps it then."""
    from django.utils import timezone

    from agents.notify.tasks import deliver

    due = delivery.next_attempt_at or timezone.now()
    countdown = max(0.0, (due - timezone.now()).total_seconds())
    if countdown > queue.longest_eta_seconds():
        return  # too far off to sit in the broker once: deliveries_sweep enqueues it when due
    try:
        deliver.apply_async((delivery.pk,), countdown=countdown)
    except Exception as exc:  # noqa: BLE001 — the sweeper finds it by next_attempt_at
        logger.warning("could not schedule delivery %s again (the sweeper will): %s", delivery.pk, exc)
