"""Rules and standing grants against odd values and odd paths: nothing odd ever allows what should be asked."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml

from agents import services
from agents.models import Approval, Grant, Run
from agents.policy import parse
from agents.policy.config import ConfigError
from agents.policy.rules import MACRO_ITEMS, CallFacts, evaluate
from agents.services import Remember
from tests.conftest import ROOT
from tests.support import flows

RULES = """
agents:
  support: {model: demo, tools: [lookup_order, refund_request, send_email]}
tool_overrides:
  refund_request:
    rules:
      - {name: small, when: "args.amount_cents <= 1000", action: allow}
      - {name: huge, when: "args.amount_cents > 100000", action: deny, reason: "too much"}
      - {name: large, when: "args.amount_cents > 5000", action: ask, quorum: 2}
"""
EXACT = Remember(scope="exact", seconds=3600)
TOOL = Remember(scope="tool", seconds=3600)
REFUND = "Refund order A1001 for 25.00 USD"

ODD_AMOUNTS = [
    math.nan,
    math.inf,
    2**64 + 5,
    2**63,
    10**400,
    "500",
    None,
    True,
    [500],
    {"amount": 500},
    "\ud800",
    "a\x00b",
]


def _policy() -> object:
    return parse(yaml.safe_load(RULES), Path("agentfast.yaml"), version="v1")


@pytest.mark.parametrize("amount", ODD_AMOUNTS, ids=repr)
def test_it_never_allows_a_call_whose_amount_is_odd(amount):
    args = {"order_id": "A1001", "amount_cents": amount}

    verdict = evaluate(_policy(), CallFacts(tool="refund_request", args=args, agent="support"))

    assert verdict.action in ("ask", "deny")


def test_it_never_allows_a_call_whose_amount_is_missing():
    args = {"order_id": "A1001"}

    verdict = evaluate(_policy(), CallFacts(tool="refund_request", args=args, agent="support"))

    assert verdict.action == "deny" and "could not be evaluated" in verdict.reason


def test_it_remembers_the_edited_arguments_and_still_asks_for_the_ones_it_replaced(alice):
    run = flows.start("Refund order A1001 for 25.00 USD")
    [first] = flows.pending(run)
    edited = {**first.tool_call.arguments, "amount_cents": 2000}

    flows.decide(first, "approved", arguments=edited, remember=EXACT)
    again = flows.start("Refund order A1001 for 25.00 USD")
    smaller = flows.start("Refund order A1001 for 20.00 USD")

    grant = Grant.objects.get()
    assert [a.status for a in flows.pending(again)] == [Approval.Status.PENDING]
    assert smaller.status == Run.Status.COMPLETED
    assert Approval.objects.get(run=smaller, tool="refund_request").decided_by == f"grant:{grant.id}"


SCHEDULED = """
agents:
  support: {model: demo, tools: [lookup_order, refund_request, send_email]}
tool_overrides:
  refund_request:
    rules:
      - {name: later, when: "args.amount_cents <= 1000", action: schedule, at: "now + duration('1h')"}
"""


@pytest.mark.parametrize("risk", ["high", "low"])
@pytest.mark.parametrize("amount", ["500", None, math.nan], ids=repr)
def test_it_asks_rather_than_schedules_when_a_schedule_rules_condition_cannot_be_evaluated(amount, risk):
    # A scheduled call runs by itself at its time: a rule that cannot say whether it applies must not run it.
    text = SCHEDULED.replace("    rules:", f"    risk: {risk}\n    rules:")
    policy = parse(yaml.safe_load(text), Path("agentfast.yaml"), version="v1")
    args = {"order_id": "A1001", "amount_cents": amount}

    verdict = evaluate(policy, CallFacts(tool="refund_request", args=args, agent="support"))

    assert (verdict.action, verdict.rule, verdict.run_at, verdict.decided_by) == ("ask", "later", None, "")
    assert "rule 'later' could not be evaluated" in verdict.reason


# -- standing grants after their creator changed -------------------------------------------


def test_it_stops_applying_a_grant_once_its_creator_is_deactivated(alice):
    [first] = flows.pending(flows.start(REFUND))
    flows.decide(first, "approved", remember=TOOL)
    alice.is_active = False
    alice.save()

    [again] = flows.pending(flows.start(REFUND))

    assert (again.status, again.decided_by) == (Approval.Status.PENDING, "")
    assert Grant.objects.get().uses == 0


def test_it_stops_applying_a_grant_once_its_creator_leaves_the_approvers(agent_config, alice):
    text = (ROOT / "agentfast.yaml").read_text()
    agent_config(text.replace("    hitl_mode: suspend\n", "    hitl_mode: suspend\n    approvers: [finance]\n", 1))
    services.user_set_groups(username="alice", groups=("finance",))
    [first] = flows.pending(flows.start(REFUND))
    assert first.approvers == ["finance"]
    flows.decide(first, "approved", remember=TOOL)
    services.user_set_groups(username="alice", groups=())

    [again] = flows.pending(flows.start(REFUND))

    assert (again.status, again.decided_by) == (Approval.Status.PENDING, "")
    assert Grant.objects.get().uses == 0


@pytest.mark.parametrize("risk", ["high", "low"])
def test_it_leaves_a_call_to_a_person_when_its_schedule_rule_reads_a_missing_argument(agent_config, alice, risk):
    text = SCHEDULED.replace("args.amount_cents <= 1000", "args.note == 'night'")
    agent_config(text.replace("    rules:", f"    risk: {risk}\n    rules:"))

    run = flows.start(REFUND)

    [approval] = flows.pending(run)
    assert run.status == Run.Status.SUSPENDED
    assert (approval.tool, approval.expires_at, approval.rule) == ("refund_request", None, "later")
    assert approval.on_timeout != Approval.OnTimeout.RUN


# -- macros: a rule may walk a list, never for ever ------------------------------------------

MACROS = """
agents:
  support: {model: demo, tools: [lookup_order, refund_request, send_email]}
tool_overrides:
  send_email:
    rules:
      - {name: inside, when: "args.to.all(r, r.endsWith('@corp.com'))", action: allow}
      - {name: doubled, when: "args.to.map(r, r + r).exists(rr, rr == 'xx')", action: deny}
      - {name: at_night, when: "args.to.exists_one(r, r == 'night@corp.com')", action: schedule, at: "now + duration('1h')"}
"""


def _send_email(to: list[str]) -> object:
    policy = parse(yaml.safe_load(MACROS), Path("agentfast.yaml"), version="v1")
    return evaluate(policy, CallFacts(tool="send_email", args={"to": to, "subject": "hi"}, agent="support"))


def test_it_loads_rules_whose_macros_bind_a_loop_variable():
    assert _send_email(["ann@corp.com", "bob@corp.com"]).action == "allow"
    assert _send_email(["ann@corp.com", "x"]).action == "deny"
    assert _send_email(["ann@example.com"]).action == "ask"
    assert _send_email(["night@corp.com", "x@example.com"]).action == "schedule"


def test_it_still_refuses_a_variable_no_macro_binds():
    text = MACROS.replace("r.endsWith('@corp.com'))", "s.endsWith('@corp.com'))")

    with pytest.raises(ConfigError, match=r"rules\[0\]\.when: unknown variable 's'"):
        parse(yaml.safe_load(text), Path("agentfast.yaml"), version="v1")


@pytest.mark.parametrize("to_many", [MACRO_ITEMS + 1, 200_000])
def test_it_fails_closed_on_a_list_too_long_for_a_rules_macros(to_many):
    # CEL has no cost limit and its map is quadratic: 200,000 items would hold the process for hours.
    started = time.perf_counter()
    verdict = _send_email([f"u{i}@corp.com" for i in range(to_many)])

    assert time.perf_counter() - started < 5
    assert verdict.action == "deny"  # the deny rule counts as matching; the allow rule does not
    assert f"a list or map of {to_many} items is more than a rule's macros walk ({MACRO_ITEMS})" in verdict.reason


def test_it_evaluates_a_list_as_long_as_a_rules_macros_walk():
    assert _send_email([f"u{i}@corp.com" for i in range(MACRO_ITEMS)]).action == "allow"


def test_it_asks_instead_of_scheduling_over_a_list_too_long_for_a_rules_macros():
    only_schedule = "\n".join(
        line for line in MACROS.splitlines() if "name: inside" not in line and "name: doubled" not in line
    )
    policy = parse(yaml.safe_load(only_schedule), Path("agentfast.yaml"), version="v1")
    to = ["night@corp.com", *(f"u{i}@x.com" for i in range(MACRO_ITEMS))]

    verdict = evaluate(policy, CallFacts(tool="send_email", args={"to": to}, agent="support"))

    assert (verdict.action, verdict.run_at) == ("ask", None)
    assert "rule 'at_night' could not be evaluated (a list or map of 1001 items" in verdict.reason
