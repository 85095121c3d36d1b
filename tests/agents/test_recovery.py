"""Recovery with real worker processes: a lost broker, and workers killed mid-step."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agents import schemas, services
from agents.models import Approval, Run, SideEffect, ToolCall
from tests.conftest import RedisControl, wait_for
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import decide
from tests.support.processes import Worker

pytestmark = pytest.mark.integration

REFUND = "Refund order A1001 for 25.00 USD"


def status(run_id: str) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def approve_while_redis_is_down(approval: Approval, redis_server: RedisControl) -> None:
    """Approve with Redis stopped; it comes back empty, so the resume message is gone for good."""
    redis_server.stop()
    try:
        decision = decide(approval, "approved")  # the resume message cannot be sent
        assert decision.outcome == "decided"
        approval.refresh_from_db()
        assert approval.status == "approved"  # the decision is in the database
        assert status(approval.run_id) == "suspended"
    finally:
        redis_server.start()


def wait_for_the_sweeper(run_id: str, worker: Worker) -> None:
    """Wait until the worker's sweeper resumed the run to its end; fail at once, with its log, if the worker died."""
    wait_for(
        lambda: status(run_id) == "completed" or not worker.alive, timeout=60, what="the sweeper to resume the run"
    )
    assert worker.alive, f"the worker died:\n{worker.log_tail()}"


def test_it_loses_no_decision_when_redis_is_down_and_resumes_once_it_is_back(start_worker, redis_server):
    worker = start_worker()
    run = services.run_create(agent="support", input=REFUND)
    wait_for(lambda: status(run.id) == "suspended", what="the run to pause")
    approval = Approval.objects.get(run_id=run.id, status="pending")

    approve_while_redis_is_down(approval, redis_server)

    wait_for_the_sweeper(run.id, worker)
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1


DEADLINE = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend, timeout: 4h}
"""


def test_it_keeps_its_worker_when_redis_goes_away_while_the_worker_holds_a_message(
    start_worker, redis_server, agent_config
):
    """The worker holds the approval's deadline (an eta message, unacknowledged) as Redis goes away."""
    agent_config(DEADLINE)
    worker = start_worker()
    run = services.run_create(agent="support", input=REFUND)
    wait_for(lambda: status(run.id) == "suspended", what="the run to pause")
    held = b"agents.tasks.approval_deadline["
    wait_for(lambda: held in worker.log_path.read_bytes(), what="the worker to hold the deadline message")
    approval = Approval.objects.get(run_id=run.id, status="pending")

    approve_while_redis_is_down(approval, redis_server)

    wait_for_the_sweeper(run.id, worker)  # the worker reconnects, the sweeper finds the decision
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1


BILLING = """
agents:
  billing:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [charge_card]
tool_overrides:
{overrides}
"""


def billing_script(*, slow_second_turn: float = 0.0) -> Callable[[dict[str, Any]], Reply]:
    """Charge once, then report what the tool said; optionally hang on the first report."""
    reports = 0

    def respond(body: dict[str, Any]) -> Reply:
        nonlocal reports
        outputs = tool_messages(body)
        if not outputs:
            return Reply(
                tool_calls=[("call_charge", "charge_card", json.dumps({"customer": "c1", "amount_cents": 500}))]
            )
        reports += 1
        last = outputs[-1]["content"]
        delay = slow_second_turn if reports == 1 else 0.0
        return Reply(content=f"charge outcome: {last.get('error_code') or 'ok'}", delay=delay)

    return respond


def test_it_marks_a_claim_in_doubt_after_a_kill_between_effect_and_result(
    start_worker, agent_config, fake_openai, tmp_path
):
    """kill -9 after the claim and the side effect, before the result is stored."""
    agent_config(
        BILLING.format(base_url=fake_openai.base_url, overrides="  charge_card: {risk: high, hitl_mode: suspend}")
    )
    fake_openai.script(billing_script())
    doomed = start_worker(AGENTFAST_TEST_MARKER_DIR=str(tmp_path), AGENTFAST_TEST_TOOL_SLEEP="120")
    run = services.run_create(agent="billing", input="charge c1 5.00")
    wait_for(lambda: status(run.id) == "suspended", what="the run to pause")
    approval = Approval.objects.get(run_id=run.id)

    decide(approval, "approved")
    wait_for(lambda: (tmp_path / "call_charge.effect").exists(), what="the side effect")
    doomed.kill()
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.executed_at is not None and call.result is None  # claimed, no result

    start_worker()  # its beat sweeper finds the expired lease
    wait_for(lambda: status(run.id) == "completed", timeout=60, what="the run to finish via the sweeper")

    call.refresh_from_db()
    assert call.status == "in_doubt"
    assert SideEffect.objects.filter(tool="charge_card").count() == 1  # never re-run
    assert Run.objects.get(pk=run.id).output == "charge outcome: IN_DOUBT"
    assert schemas.RunDetail.of(Run.objects.get(pk=run.id)).as_json()["tool_calls"][0]["in_doubt"] is True


def test_it_finishes_a_run_whose_worker_was_killed_between_steps(start_worker, agent_config, fake_openai):
    """kill -9 while the model is thinking about step two; step one's effect is not repeated."""
    agent_config(BILLING.format(base_url=fake_openai.base_url, overrides="  {}"))
    fake_openai.script(billing_script(slow_second_turn=8))
    doomed = start_worker()
    run = services.run_create(agent="billing", input="charge c1 5.00")
    wait_for(lambda: len(fake_openai.requests) == 2, what="the second model call")
    assert SideEffect.objects.filter(tool="charge_card").count() == 1
    doomed.kill()

    start_worker()
    wait_for(lambda: status(run.id) == "completed", timeout=60, what="the run to finish via the sweeper")

    assert SideEffect.objects.filter(tool="charge_card").count() == 1
    assert ToolCall.objects.get(run_id=run.id).status == "succeeded"
    assert Run.objects.get(pk=run.id).output == "charge outcome: ok"
