"""Retries of a delivery never wait in the broker longer than it keeps an unacknowledged message; beat sends those."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from agents.notify import dispatch
from agents.notify.models import Delivery
from agents.notify.tasks import deliveries_sweep
from agents.services import notify as notify_services
from agents.services.notify import Target
from tests.agents.test_notify import AGENT, REFUND, SECRET, _paused
from tests.conftest import wait_for
from tests.support.broker import take_queued
from tests.support.flows import pending, start
from tests.support.receiver import Receiver

DELIVER = "agents.notify.tasks.deliver"


def test_it_never_leaves_a_retry_in_the_broker_past_its_visibility_timeout_and_the_sweep_finds_it(
    db, broker, agent_config: Callable[[str], Path], monkeypatch, django_capture_on_commit_callbacks
):
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert max(notify_services.BACKOFF) > visibility  # the retries this is about
    receiver = Receiver(secret=SECRET)  # never started: every attempt is refused
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    agent_config(
        AGENT + f"notifications:\n  - kind: webhook\n    url: {receiver.url}\n    secret_env: TEST_WEBHOOK_SECRET\n"
    )
    delivery = Delivery.objects.get(approval_id=_paused(django_capture_on_commit_callbacks).id)
    take_queued(broker, DELIVER)  # the first attempt's message

    scheduled, swept = [], []
    for backoff in notify_services.BACKOFF:
        before = timezone.now()
        assert (
            dispatch.send(delivery.pk, force=True) == "pending"
        )  # force: the attempt is made now, not at its due time
        delivery.refresh_from_db()
        due = delivery.next_attempt_at
        assert due - before >= timedelta(seconds=backoff)
        queued = take_queued(broker, DELIVER)
        for args, _, eta in queued:
            # Redis hands an unacknowledged message out again after the visibility timeout:
            # an eta (which a worker holds unacknowledged until then) must come well before it.
            assert args == [delivery.pk] and eta is not None
            assert eta - before <= timedelta(seconds=visibility / 2 + 5), backoff  # + the attempt's own time
            assert abs(eta - due) < timedelta(seconds=1)
        (scheduled if queued else swept).append(backoff)
        # Either way beat's sweep finds it once due for its grace period (and not before): nothing waits on a
        # message alone, and one that comes on time is not doubled.
        overdue = due + timedelta(seconds=settings.AGENTFAST_SWEEP_GRACE_SECONDS)
        assert delivery.pk not in notify_services.deliveries_resend_due(now=overdue - timedelta(seconds=1))
        assert delivery.pk in notify_services.deliveries_resend_due(now=overdue)

    assert scheduled == [b for b in notify_services.BACKOFF if b <= visibility / 2]
    assert swept == [b for b in notify_services.BACKOFF if b > visibility / 2]
    assert dispatch.send(delivery.pk, force=True) == "failed"
    assert take_queued(broker, DELIVER) == []


@pytest.mark.integration
def test_it_delivers_what_no_message_carries_through_beats_sweep(
    start_worker, broker, agent_config: Callable[[str], Path], monkeypatch
):
    receiver = Receiver(secret=SECRET).start()
    try:
        monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
        path = agent_config(
            AGENT + f"notifications:\n  - kind: webhook\n    url: {receiver.url}\n    secret_env: TEST_WEBHOOK_SECRET\n"
        )
        approval = pending(start(REFUND))[0]
        delivery = Delivery.objects.get(approval_id=approval.id)
        # Its message is gone, as for a retry too far off to enqueue (or a lost one): only the row says it is due.
        assert take_queued(broker, DELIVER) == [([delivery.pk], {}, None)]

        start_worker(AGENTFAST_CONFIG=str(path), TEST_WEBHOOK_SECRET=SECRET)
        wait_for(lambda: Delivery.objects.get(pk=delivery.pk).status == "delivered", what="the sweep to send it")
        assert receiver.ids() == [f"msg_{delivery.pk}"] and receiver.received[0].verified
    finally:
        receiver.stop()


def test_it_keeps_a_delivery_delivered_when_an_attempt_that_outlived_its_claim_fails(
    db, agent_config: Callable[[str], Path], monkeypatch, django_capture_on_commit_callbacks
):
    # A slow mail server: attempt A outlives its claim, the sweep's attempt B delivers, then A fails.
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)
    agent_config(
        AGENT + "notifications:\n  - kind: webhook\n    url: http://127.0.0.1:9/\n    secret_env: TEST_WEBHOOK_SECRET\n"
    )
    delivery = Delivery.objects.get(approval_id=_paused(django_capture_on_commit_callbacks).id)
    slow = notify_services.delivery_claim(delivery_id=delivery.pk, force=True)
    later = timezone.now() + timedelta(seconds=notify_services.CLAIM_SECONDS + 1)
    fast = notify_services.delivery_claim(delivery_id=delivery.pk, now=later)
    assert slow is not None and fast is not None  # A's claim ran out: B took it

    notify_services.delivery_record(delivery=fast, ok=True, status_code=200, error="", duration_ms=5, now=later)
    after = notify_services.delivery_record(
        delivery=slow, ok=False, status_code=None, error="SMTPServerDisconnected", duration_ms=95_000, now=later
    )

    assert (after.status, after.last_error) == (Delivery.Status.DELIVERED, "")
    assert after.attempt_log.count() == 2  # both attempts are in its log


def test_beats_sweep_sends_a_backlog_again_once_a_grace_period_not_at_every_sweep(
    db, broker, django_capture_on_commit_callbacks
):
    # Deliveries due for a while: their messages were lost, or wait behind a backlog no worker has reached yet.
    grace = timedelta(seconds=settings.AGENTFAST_SWEEP_GRACE_SECONDS)
    hook = Target(Delivery.Kind.WEBHOOK, "http://127.0.0.1:9/hook", {"n": 1})
    ids = notify_services.deliveries_open(event_type="approval.required", approval_id="appr_x", targets=[hook] * 3)
    Delivery.objects.update(next_attempt_at=timezone.now() - grace - timedelta(seconds=1))
    claimed = notify_services.delivery_claim(delivery_id=ids[2])  # a worker has this one in hand
    assert claimed is not None

    for _ in range(3):  # beat's sweep, three times in a row
        with django_capture_on_commit_callbacks(execute=True):
            deliveries_sweep()

    # One message more for each, not one at every sweep (each a claim that finds it taken, at scale a flood).
    assert sorted(args for args, _, _ in take_queued(broker, DELIVER)) == [[ids[0]], [ids[1]]]
    now = timezone.now()
    assert notify_services.deliveries_resend_due(now=now + grace - timedelta(seconds=1)) == []
    assert notify_services.deliveries_resend_due(now=now + grace) == ids[:2]  # still unsent a grace later: again
    assert Delivery.objects.get(pk=ids[2]).next_attempt_at == claimed.next_attempt_at  # the claim left alone
