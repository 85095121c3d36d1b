"""A grant given on a call an `ask` rule sends to approvers of its own decides it, rather than looping for ever."""

from __future__ import annotations

import pytest

from agents import services, sql
from agents.models import Approval, Grant, Run
from agents.policy import get_policy
from agents.policy.rules import CallFacts
from agents.services.grants import grant_match_except
from tests.support import flows

TOOL = services.Remember(scope="tool", seconds=3600)
REFUND = "Refund order A1001 for 25.00 USD"
POLICY = """
agents:
  support: {model: demo, tools: [lookup_order, refund_request, send_email]}
tool_overrides:
  refund_request:
    risk: high
    hitl_mode: suspend
    approvers: [managers]
    rules:
      - {name: refunds, when: "args.amount_cents > 0", action: ask, approvers: [finance]}
"""


@pytest.fixture
def bounded_grant_use(monkeypatch):
    """Fail instead of hanging when the grant keeps lapsing at the write (the callers retry forever)."""
    real, calls = sql.grant_use, []

    def counted(**kwargs):
        calls.append(kwargs)
        if len(calls) > 5:
            raise RuntimeError("the grant matched and lapsed 5 times in a row: the caller would loop forever")
        return real(**kwargs)

    monkeypatch.setattr(sql, "grant_use", counted)
    return calls


def test_a_grant_on_a_call_an_ask_rule_sends_to_other_approvers_decides_without_looping(
    agent_config, alice, bounded_grant_use
):
    agent_config(POLICY)
    services.user_set_groups(username="alice", groups=("finance",))
    [first] = flows.pending(flows.start(REFUND))
    assert (first.approvers, first.rule) == (["finance"], "refunds")
    flows.decide(first, "approved", by="alice", remember=TOOL)
    grant = Grant.objects.get()

    run = flows.start(REFUND)  # the same call again: the policy asks finance, alice's grant stands in for her

    approval = Approval.objects.filter(run=run, tool="refund_request").get()
    assert (approval.status, approval.decided_by) == (Approval.Status.APPROVED, f"grant:{grant.id}")
    assert run.status == Run.Status.COMPLETED
    grant.refresh_from_db()
    assert grant.uses == 1


GATE_POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    risk: high
    approvers: [managers]
    rules:
      - {name: wires, when: "args.cents > 0", action: ask, approvers: [finance]}
"""


def _gate(owner: str, call_id: str):
    from agents.gateway import services as gateway

    request = gateway.GateRequest(
        agent="billing", session="s1", call_id=call_id, tool="wire_money", arguments={"cents": 2000}
    )
    return gateway.gate_call(owner=owner, request=request)


def test_the_gate_answers_an_external_call_a_grant_decides_under_an_ask_rules_approvers(
    agent_config, alice, bounded_grant_use
):
    agent_config(GATE_POLICY)
    robot = services.user_create(username="robot", role="agent")[0].username
    services.user_set_groups(username="alice", groups=("finance",))
    first = _gate(robot, "c1")
    grant = flows.decide(first.approval_id, "approved", by="alice", remember=TOOL).grant

    answer = _gate(robot, "c2")  # the HTTP gate's request: it must answer, not spin

    assert answer.decision == "allowed"
    assert Approval.objects.get(pk=answer.approval_id).decided_by == f"grant:{grant.id}"


def test_a_grant_that_lapsed_at_a_write_is_not_matched_again_by_the_same_caller(agent_config, alice):
    """Whatever makes a grant match and then lapse, the caller's next plan goes without it: no loop."""
    agent_config(POLICY)
    services.user_set_groups(username="alice", groups=("finance",))
    [first] = flows.pending(flows.start(REFUND))
    flows.decide(first, "approved", by="alice", remember=TOOL)
    grant = Grant.objects.get()
    facts = CallFacts(tool="refund_request", args=first.tool_call.arguments, agent="support", run={}, now=None)
    tool = get_policy().tool_policy("refund_request")

    assert grant_match_except(set())(facts, tool).id == grant.id
    assert grant_match_except({grant.id})(facts, tool) is None
