"""Recovery with real worker processes: a lost broker, and workers killed mid-step."""

from __future__ import annotations

import pytest

from agents import services
from agents.models import Approval, Run, SideEffect
from tests.conftest import wait_for
from tests.support.flows import decide

pytestmark = pytest.mark.integration

REFUND = "Refund order A1001 for 25.00 USD"


def status(run_id: str) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def test_it_loses_no_decision_when_redis_is_down_and_resumes_once_it_is_back(start_worker, redis_server):
    start_worker()
    run = services.run_create(agent="support", input=REFUND)
    wait_for(lambda: status(run.id) == "suspended", what="the run to pause")
    approval = Approval.objects.get(run_id=run.id, status="pending")

    redis_server.stop()
    try:
        decision = decide(approval, "approved")  # the resume message cannot be sent
        assert decision.outcome == "decided"
        approval.refresh_from_db()
        assert approval.status == "approved"  # the decision is in the database
        assert status(run.id) == "suspended"
    finally:
        redis_server.start()  # an empty Redis: the resume message is gone for good

    wait_for(lambda: status(run.id) == "completed", timeout=60, what="the sweeper to resume the run")
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1
