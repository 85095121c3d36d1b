"""Webhooks delivered by a real Celery worker, off the pause and decision paths, through a receiver outage."""

from __future__ import annotations

import pytest

from agents import services
from agents.models import Approval, Run
from agents.notify.models import Delivery
from tests.agents.test_notify import AGENT, SECRET
from tests.conftest import wait_for
from tests.support.flows import decide
from tests.support.receiver import Receiver

REFUND = "Refund order A1001 for 25.00 USD"


@pytest.mark.integration
def test_it_delivers_each_event_once_through_a_worker_even_when_the_receiver_was_down(start_worker, agent_config):
    receiver = Receiver(secret=SECRET).start()
    try:
        path = agent_config(
            AGENT + f"notifications:\n  - kind: webhook\n    url: {receiver.url}\n    secret_env: TEST_WEBHOOK_SECRET\n"
        )
        start_worker(AGENTFAST_CONFIG=str(path), TEST_WEBHOOK_SECRET=SECRET)
        run = services.run_create(agent="support", input=REFUND)
        wait_for(lambda: Run.objects.get(pk=run.id).status == "suspended", what="the run to pause")
        approval = Approval.objects.get(run_id=run.id)
        wait_for(lambda: len(receiver.received) == 1, what="approval.required at the receiver")

        receiver.stop()  # down when the decision is made
        decide(approval, "rejected", by="alice", feedback="not this one")
        decided = wait_for(
            lambda: Delivery.objects.filter(event_type="approval.decided", attempts__gte=1).first(),
            what="a failed attempt at approval.decided",
        )
        assert decided.status == "pending" and decided.last_error
        receiver.start()  # back on the same port: the retry lands
        wait_for(
            lambda: Delivery.objects.get(pk=decided.pk).status == "delivered", timeout=60, what="the retry to land"
        )
        assert [item.body["type"] for item in receiver.received] == ["approval.required", "approval.decided"]
        assert all(item.verified for item in receiver.received)
        assert len(set(receiver.ids())) == 2
        assert Delivery.objects.get(pk=decided.pk).attempt_log.count() >= 2
    finally:
        receiver.stop()
