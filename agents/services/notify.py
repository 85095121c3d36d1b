"""State changes of notifications: deliveries and their attempts, Slack links, one-click links."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone

from agents import text
from agents.models import Approval, AuditEntry
from agents.notify import payloads
from agents.notify.models import Delivery, DeliveryAttempt, OneClickLink, PrunedFailures, SlackLink, SlackRequest
from agents.services.approvals import Attempt, audit_run
from agents.services.errors import InvalidInput, NotFound, WrongState

# Seconds to wait after each failed attempt: about a day in all, then the delivery is given up.
BACKOFF = (5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 10800, 21600, 21600, 21600)
MAX_ATTEMPTS = len(BACKOFF) + 1
# A claimed delivery is not claimed again for this long: its worker is sending it (and renews the
# claim while it does, up to KEEP_CLAIM_SECONDS in all: a send hung past that is tried again).
CLAIM_SECONDS = 60
KEEP_CLAIM_SECONDS = 600
REPLAY_WINDOW = timedelta(minutes=10)  # longer than the 5 minutes a signed Slack request is accepted for
# The deliveries a person reads, which ask them to decide while the call waits.
HUMAN_KINDS = (Delivery.Kind.EMAIL, Delivery.Kind.SLACK)
GONE = "its approval no longer exists"  # what deliveries_settled says of a call whose approval was deleted


@dataclass(frozen=True)
class Target:
    kind: str  # Delivery.Kind
    target: str
    payload: dict[str, Any]


def deliveries_open(*, event_type: str, approval_id: str, targets: list[Target]) -> list[int]:
    """Store one pending delivery per target, due now; return their ids."""
    now = timezone.now()
    rows = [
        Delivery(
            kind=t.kind,
            target=text.repair(t.target)[:500],
            event_type=event_type,
            approval_id=approval_id,
            # As deep as stored values go: arguments 30 levels deep sit deeper than that in the payload,
            # and cut there, a mailed link's digest of them would never match the call's again.
            payload=text.repair(t.payload, max_depth=text.MAX_STORED_DEPTH),
            next_attempt_at=now,
        )
        for t in targets
    ]
    with transaction.atomic():
        for row in rows:
            row.save(force_insert=True)  # one by one: bulk_create returns no ids on every backend
    return [row.pk for row in rows]


def delivery_claim(*, delivery_id: int, now: datetime | None = None, force: bool = False) -> Delivery | None:
    """Take a pending, due delivery for one attempt; None if it is not due, done, or another worker has it."""
    now = now or timezone.now()
    due = Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING)
    if not force:
        due = due.filter(next_attempt_at__lte=now)
    until = now + timedelta(seconds=CLAIM_SECONDS)
    if not due.update(next_attempt_at=until, sending_until=until):
        return None
    return Delivery.objects.get(pk=delivery_id)


def delivery_keep_claim(*, delivery: Delivery) -> bool:
    """Renew the claim of an attempt still under way; False once it is no longer this attempt's.

    `delivery` is as delivery_claim returned it; its next_attempt_at becomes the renewed claim.
    """
    until = timezone.now() + timedelta(seconds=CLAIM_SECONDS)
    if not _still_claimed(delivery).update(next_attempt_at=until, sending_until=until):
        return False
    delivery.next_attempt_at = delivery.sending_until = until
    return True


def delivery_record(
    *,
    delivery: Delivery,
    ok: bool,
    status_code: int | None,
    error: str,
    duration_ms: int,
    now: datetime | None = None,
    final: bool = False,
) -> Delivery:
    """Store an attempt; mark the delivery delivered, due again after its backoff, or failed for good.

    `delivery` is as delivery_claim returned it: its next_attempt_at is this attempt's claim. An
    attempt that outlived its claim (a slow mail server) may find another one under way or done:
    its success still delivers, but its failure only joins the log, never undoing the other's.
    `final`: the receiver refused it in a way no retry changes: failed now, not after a day.
    """
    now = now or timezone.now()
    attempts = delivery.attempts + 1
    if ok:
        mine = Delivery.objects.filter(pk=delivery.pk).exclude(status=Delivery.Status.DELIVERED)
        fields: dict[str, Any] = {"status": Delivery.Status.DELIVERED, "delivered_at": now, "next_attempt_at": None}
    else:
        mine = _still_claimed(delivery)
        if attempts >= MAX_ATTEMPTS or final:
            fields = {"status": Delivery.Status.FAILED, "next_attempt_at": None}
        else:
            fields = {"next_attempt_at": now + timedelta(seconds=BACKOFF[attempts - 1])}
    fields.update(sending_until=None, attempts=F("attempts") + 1, last_error="" if ok else text.repair(error)[:2000])
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=delivery, status_code=status_code, error=text.repair(error)[:2000], duration_ms=duration_ms
        )
        mine.update(**fields)
    delivery.refresh_from_db()
    return delivery


def delivery_supersede(*, delivery: Delivery, reason: str) -> Delivery:
    """Give up a claimed delivery unsent because what it asks is settled; its claim must still be current."""
    _still_claimed(delivery).update(
        status=Delivery.Status.SUPERSEDED,
        next_attempt_at=None,
        sending_until=None,
        last_error=text.repair(reason)[:2000],
    )
    delivery.refresh_from_db()
    return delivery


def _still_claimed(delivery: Delivery) -> QuerySet[Delivery]:
    """Return the delivery while it is pending under this attempt's claim (its next_attempt_at as claimed)."""
    return Delivery.objects.filter(
        pk=delivery.pk, status=Delivery.Status.PENDING, next_attempt_at=delivery.next_attempt_at
    )


def delivery_redeliver(*, delivery_id: int, attempt: Attempt) -> Delivery:
    """Send a delivery again now, with the same webhook-id, whatever happened to it; audited.

    Refused (WrongState) for a person's message asking to decide a call that no longer waits:
    sent again, it would only be superseded at once (see deliveries_settled); and while an
    attempt is under way: a second one started beside it would send a second copy.
    """
    from agents.notify.tasks import deliver  # the tasks call these services

    with transaction.atomic():
        delivery = Delivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None:
            raise NotFound(f"no delivery {delivery_id}")
        if delivery_id in (settled := deliveries_settled([delivery])):
            raise WrongState(redeliver_refusal(delivery, settled[delivery_id]), delivery=delivery_id)
        if delivery.sending:
            raise WrongState(SENDING_REFUSAL, delivery=delivery_id)
        Delivery.objects.filter(pk=delivery_id).update(
            status=Delivery.Status.PENDING, next_attempt_at=timezone.now(), attempts=0
        )
        audit_run(
            run_id="",
            attempt=attempt,
            action="redeliver",
            detail={
                "delivery": delivery_id,
                "kind": delivery.kind,
                "target": delivery.target,
                "approval_id": delivery.approval_id,
                "event": delivery.event_type,
            },
        )
        deliver.delay_on_commit(delivery_id)
    delivery.refresh_from_db()
    return delivery


SENDING_REFUSAL = "it is being sent right now; Redeliver once that attempt has ended, if it failed"


def deliveries_settled(deliveries: Iterable[Delivery]) -> dict[int, str]:
    """Return, by delivery id, what became of the call of each person's message asking to decide one that is over.

    "the call was approved by bob", "the call expired", "its approval no longer exists"; one
    query for them all (a page of the deliveries log). A webhook, or an event that asks nobody
    anything (approval.decided), is never settled: it is a record, sent regardless.
    """
    asking = {
        delivery.pk: delivery.approval_id
        for delivery in deliveries
        if delivery.kind in HUMAN_KINDS and delivery.event_type in payloads.WAITING
    }
    if not asking:
        return {}
    approvals = {
        approval.pk: approval
        for approval in Approval.objects.filter(pk__in=set(asking.values())).only("status", "decided_by")
    }
    settled = {}
    for delivery_id, approval_id in asking.items():
        approval = approvals.get(approval_id)
        if approval is None:
            settled[delivery_id] = GONE
        elif approval.status == Approval.Status.EXPIRED:
            settled[delivery_id] = "the call expired"
        elif approval.status != Approval.Status.PENDING:
            settled[delivery_id] = f"the call was {approval.status} by {payloads.one_line(approval.decided_by)}"
    return settled


def redeliver_refusal(delivery: Delivery, settled: str) -> str:
    """Return why a person's message asking for a decision is not sent again, in words for whoever asked."""
    what = "mail" if delivery.kind == Delivery.Kind.EMAIL else "Slack message"
    return f"this {what} asks for a decision, and {settled}: sent again, it would only be superseded at once"


def deliveries_resend_due(*, now: datetime | None = None) -> list[int]:
    """Return the pending deliveries due for longer than the sweep's grace, to send again; restart their grace.

    A delivery's own message (its first, or its retry's eta) takes it once it is due. One still
    due a grace period later lost that message (Redis restarted, a worker died holding it) or
    waits behind a backlog. Its due time moves to now, so a backlog longer than the grace gets
    one more message per delivery each grace period, not one at every sweep (every 5 s), all
    of them work for the broker and the workers. A claim taken meanwhile is left alone: its
    due time is in the future, which the update's filter does not match.
    """
    now = now or timezone.now()
    overdue = Delivery.objects.filter(
        status=Delivery.Status.PENDING,
        next_attempt_at__lte=now - timedelta(seconds=settings.AGENTFAST_SWEEP_GRACE_SECONDS),
    )
    ids = list(overdue.order_by("next_attempt_at", "pk").values_list("pk", flat=True))  # the longest waiting first
    if ids:
        overdue.filter(pk__in=ids).update(next_attempt_at=now)
    return ids


# A delivery that reached its end (delivered, failed, superseded): the one kind pruning deletes.
SETTLED = (Delivery.Status.DELIVERED, Delivery.Status.FAILED, Delivery.Status.SUPERSEDED)


@dataclass(frozen=True)
class Pruned:
    deliveries: int
    links: int


def notifications_prune(
    *, deliveries_before: datetime | None, links_before: datetime, batch: int = 1000, batches: int = 100
) -> Pruned:
    """Delete settled deliveries (with their attempts) created before `deliveries_before` (None: keep them all)
    and one-click nonces issued before `links_before`, whose links no longer open anyway.

    A pending delivery is kept whatever its age. Rows go `batch` at a time, each batch its own
    transaction, so no delete holds the table (SQLite's one writer) for long; at most `batches`
    of each per call: a first call over years of rows leaves the rest to the next.
    """
    deliveries = (
        Delivery.objects.none()
        if deliveries_before is None
        # Aged from its last attempt: one redelivered today is what the page shows of it today.
        else Delivery.objects.filter(status__in=SETTLED, created_at__lt=deliveries_before).exclude(
            Exists(DeliveryAttempt.objects.filter(delivery=OuterRef("pk"), created_at__gte=deliveries_before))
        )
    )
    links = OneClickLink.objects.filter(created_at__lt=links_before)
    return Pruned(
        deliveries=_delete_in_batches(deliveries, batch, batches, before_delete=_keep_failures_counted),
        links=_delete_in_batches(links, batch, batches),
    )


def _keep_failures_counted(delivery_ids: list[int]) -> None:
    """Add the failed attempts of deliveries about to go to PrunedFailures: /metrics' counter must never go down."""
    failed = DeliveryAttempt.objects.filter(delivery_id__in=delivery_ids).exclude(error="").count()
    if failed:
        PrunedFailures.objects.get_or_create(pk=1)
        PrunedFailures.objects.filter(pk=1).update(count=F("count") + failed)


def _delete_in_batches(
    rows: QuerySet[Any], batch: int, batches: int, before_delete: Callable[[list[int]], None] | None = None
) -> int:
    deleted = 0
    for _ in range(batches):
        with transaction.atomic():
            # Chosen and deleted under the rows' locks, the filter applied again: a row a Redeliver
            # made pending between a read and a delete by id alone would be deleted under it.
            ids = list(rows.select_for_update().order_by("created_at", "pk").values_list("pk", flat=True)[:batch])
            if ids and before_delete is not None:
                before_delete(ids)
            rows.filter(pk__in=ids).delete()  # a delivery's attempts go with it (CASCADE)
        if not ids:
            break
        deleted += len(ids)
    return deleted


def slacklink_set(*, username: str, slack_id: str) -> SlackLink:
    """Say which agentfast user a Slack user is (one Slack id per user, one user per Slack id)."""
    slack_id = slack_id.strip()
    if not slack_id or len(slack_id) > 40 or not (slack_id.isascii() and slack_id.isalnum()):
        raise InvalidInput(f"not a Slack user id: {text.repair(slack_id)[:60]!r} (it looks like U012AB3CD)")
    user = User.objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"no user {text.repair(username)[:150]!r}")
    with transaction.atomic():
        SlackLink.objects.filter(slack_id=slack_id).exclude(user=user).delete()
        link, _ = SlackLink.objects.update_or_create(user=user, defaults={"slack_id": slack_id})
    return link


def slack_request_remember(*, signature: str) -> bool:
    """Remember a verified request's signature; False if it was seen before (a replay)."""
    SlackRequest.objects.filter(created_at__lt=timezone.now() - REPLAY_WINDOW).delete()
    try:
        with transaction.atomic():
            SlackRequest.objects.create(signature=signature[:100])
    except IntegrityError:
        return False
    return True


def oneclick_issue(*, approval_id: str, username: str) -> str:
    """Store a fresh nonce for a mailed link; return it."""
    nonce = secrets.token_urlsafe(24)
    OneClickLink.objects.create(nonce=nonce, approval_id=approval_id, username=username)
    return nonce


def oneclick_use(*, nonce: str, approval_id: str, username: str) -> bool:
    """Spend a link's nonce; False if it was used already or belongs to another approval or person."""
    return bool(
        OneClickLink.objects.filter(
            nonce=nonce, approval_id=approval_id, username=username, used_at__isnull=True
        ).update(used_at=timezone.now())
    )


def oneclick_release(*, nonce: str, approval_id: str, username: str) -> None:
    """Give a spent nonce back: the press it was spent on was refused, and decided nothing."""
    OneClickLink.objects.filter(nonce=nonce, approval_id=approval_id, username=username).update(used_at=None)


def audit_refused_request(*, attempt: Attempt, action: str, reason: str, approval_id: str = "") -> None:
    """Audit a request refused before anyone was known (a bad signature, a replay)."""
    from agents.services.approvals import approval_refuse

    approval_refuse(
        approval_id=approval_id,
        decision=action,
        attempt=attempt,
        outcome=AuditEntry.Outcome.NOT_PERMITTED,
        reason=reason,
    )
