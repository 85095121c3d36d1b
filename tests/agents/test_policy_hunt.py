"""Policy holes a hunt found: a schedule rule that fails, an agent's raised quorum, a schedule the policy took back."""

from __future__ import annotations

from typing import Any

import pytest

from agents import services
from agents.gateway import services as gateway
from agents.models import Approval

SCHEDULE_THEN_ASK = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    approvers: [user:alice, user:carol]
    rules:
      - {name: delayed, when: "args.delay_hours > 0", action: schedule, at: "now + duration(string(args.delay_hours) + 'h')"}
      - {name: large, when: "args.cents > 5000", action: ask, quorum: 2}
"""


@pytest.fixture
def robot(db: None) -> str:
    user, _ = services.user_create(username="robot", role="agent")
    return user.username


def _gate(owner: str, call_id: str, **arguments: Any) -> Approval:
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id=call_id, tool="wire_money", arguments=arguments
    )
    answer = gateway.gate_call(owner=owner, request=request)
    return Approval.objects.get(pk=answer.approval_id)


def test_a_schedule_rule_that_cannot_be_evaluated_does_not_skip_a_stricter_ask_rule(agent_config, robot):
    agent_config(SCHEDULE_THEN_ASK)
    honest = _gate(robot, "c1", cents=250_000, delay_hours=0)
    assert (honest.status, honest.rule, honest.quorum) == ("pending", "large", 2)

    # The same wire, with a delay the schedule rule cannot read: its condition fails, so it "asks a person".
    odd = _gate(robot, "c2", cents=250_000, delay_hours="soon")
    assert odd.status == "pending"
    # It should still need the two approvals the `large` rule asks for such a wire.
    assert odd.quorum == 2, f"asked {odd.quorum} approval(s) by rule {odd.rule!r}"


RAISED = """
agents:
  support:
    tools: [lookup_order, refund_request, send_email, ask_human]
    tool_overrides:
      refund_request: {quorum: 3}      # this agent's refunds need three people
tool_overrides:
  refund_request:
    risk: high
    rules:
      - {name: huge refunds,  when: "args.amount_cents > 100000", action: deny, reason: "need a ticket"}
      - {name: large refunds, when: "args.amount_cents > 5000",   action: ask, quorum: 2}
"""


def test_an_ask_rule_does_not_lower_the_quorum_an_agent_raised(agent_config, alice):
    from tests.support.flows import pending, start

    agent_config(RAISED)
    [small] = pending(start("Refund order A1001 for 25.00 USD"))
    [large] = pending(start("Refund order A1004 for 75.00 USD"))

    assert small.quorum == 3
    # The larger refund matches the file's stricter rule, yet asks fewer people than the agent demands.
    assert large.quorum >= 3, f"a 75.00 refund needs {large.quorum} approvals (rule {large.rule!r}), a 25.00 one 3"


NIGHT = """
agents:
  support: {{model: demo, tools: [lookup_order, refund_request, send_email, ask_human]}}
tool_overrides:
  refund_request:
    risk: high
    approvers: [finance]
    quorum: 2
    rules:
{rules}
"""


def test_a_scheduled_call_does_not_run_by_itself_once_the_policy_asks_people_for_it(agent_config, alice):
    import time

    from agents.services.deadlines import approval_deadline_fire
    from tests.agents.test_deadlines import past_deadline
    from tests.support.flows import pending, start

    rule = "      - {name: later, action: schedule, at: \"now + duration('1h')\"}"
    path = agent_config(NIGHT.format(rules=rule))
    [approval] = pending(start("Refund order A1001 for 25.00 USD"))
    assert approval.on_timeout == Approval.OnTimeout.RUN

    # The operator turns the schedule into a gate: two people of finance must now approve such refunds.
    time.sleep(0.01)
    path.write_text(NIGHT.format(rules="      - {name: checked, when: 'true', action: ask}"))

    outcome = approval_deadline_fire(approval_id=past_deadline(approval).id)
    approval.refresh_from_db()
    assert (outcome, approval.status) == ("expired", Approval.Status.EXPIRED)  # as an `approve` deadline's would be
