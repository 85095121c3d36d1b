"""The file's policy is a floor: what an adversarial pass found lowering it.

- A low-risk file tool whose ask rule says how it is decided (mode, quorum, four eyes,
  deadline on the tool): an agent "raising" the tool to high/defer dropped those keys.
- A waiting call escalated at its deadline to people the file, as it stands then, no longer names.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from agents.models import Approval
from agents.policy import agent_from_config, parse
from agents.policy.rules import CallFacts, Verdict, evaluate
from agents.services.deadlines import approval_deadline_fire
from tests.agents.test_deadlines import past_deadline
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"
LOW_TOOL_ASKS = """
tool_overrides:
  refund_request:
    risk: low
    hitl_mode: suspend
    approvers: [finance]
    quorum: 2
    four_eyes: true
    timeout: 1h
    on_timeout: reject
    rules:
      - {name: large, when: "args.amount > 100", action: ask}
"""


@pytest.fixture
def verdicts() -> tuple[Verdict, Verdict]:
    """Return the verdict on a large refund: for no agent, and for a composed agent that sets the tool high/defer."""
    policy = parse(yaml.safe_load(LOW_TOOL_ASKS), Path("agentfast.yaml"))
    facts = CallFacts(tool="refund_request", args={"order_id": "A1", "amount": 500}, agent="x")
    agent = agent_from_config(
        "playground-x",
        {"tools": ["refund_request"], "tool_overrides": {"refund_request": {"risk": "high", "hitl_mode": "defer"}}},
    )
    return evaluate(policy, facts), evaluate(policy, facts, agent=agent)


def test_a_low_tools_ask_rule_asks_with_the_tools_keys(verdicts):
    alone, _ = verdicts
    assert (alone.action, alone.mode, alone.quorum, alone.four_eyes) == ("ask", "suspend", 2, True)


def test_an_agent_raising_a_low_tool_keeps_what_the_files_ask_rule_needs(verdicts):
    alone, raised = verdicts
    assert raised.action == "ask"
    assert raised.mode == "suspend"  # defer would let the run act before the file's ask is decided
    assert (raised.quorum, raised.four_eyes) == (alone.quorum, alone.four_eyes)
    assert (raised.timeout_seconds, raised.on_timeout) == (alone.timeout_seconds, alone.on_timeout)


RAISING_AGENT = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
    tool_overrides:
      refund_request: {risk: high, hitl_mode: defer}   # "raises" the tool
tool_overrides:
  refund_request:
    risk: low
    approvers: [user:alice, user:bob]
    quorum: 2
    four_eyes: true
    rules:
      - {name: every refund, when: "true", action: ask}
"""


def test_a_run_of_an_agent_raising_the_tool_waits_as_the_file_asks(agent_config, alice):
    agent_config(RAISING_AGENT)

    [approval] = pending(start(REFUND))

    assert (approval.mode, approval.quorum, approval.four_eyes) == (Approval.Mode.SUSPEND, 2, True)


ESCALATING = """
agents:
  support: {{model: demo, tools: [lookup_order, refund_request, send_email, ask_human]}}
tool_overrides:
  refund_request:
    risk: high
    approvers: [user:alice]
    timeout: 1h
{deadline}
"""


def test_a_deadline_the_file_no_longer_escalates_does_not_hand_the_call_to_the_old_escalate_to(agent_config, alice):
    path = agent_config(ESCALATING.format(deadline="    on_timeout: escalate\n    escalate_to: [user:mallory]"))
    [approval] = pending(start(REFUND))
    assert approval.on_timeout == Approval.OnTimeout.ESCALATE
    time.sleep(0.01)  # a new modification time: the policy is read again
    path.write_text(ESCALATING.format(deadline="    on_timeout: reject"))  # mallory's say is taken away

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"

    approval.refresh_from_db()
    assert "user:mallory" not in approval.approvers
    assert approval.status == Approval.Status.EXPIRED
