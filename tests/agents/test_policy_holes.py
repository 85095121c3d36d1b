"""Ways around the policy that a hurried reviewer or an attacker might try, each closed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from agents import schemas, services
from agents.models import Approval, AuditEntry, Grant
from agents.policy import ConfigError, get_policy
from agents.policy.rules import CallFacts, evaluate
from agents.services import eligibility
from agents.services.audit import entry_fields, entry_hash
from agents.services.deadlines import approval_deadline_fire
from agents.services.errors import NotPermitted
from tests.agents.test_deadlines import past_deadline
from tests.support.flows import decide, pending, resume, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"
HOUR = services.Remember(scope="exact", seconds=3600)


def _reviewer(name: str, *groups: str) -> User:
    user, _ = services.user_create(username=name, role="reviewer", groups=groups)
    return user


# -- agentfast.yaml ------------------------------------------------------------------


def test_it_refuses_a_tool_listed_twice_in_the_file(agent_config: Callable[[str], Path]):
    path = agent_config(
        """
agents:
  support: {tools: [lookup_order, refund_request]}
tool_overrides:
  refund_request: {risk: high, approvers: [finance], four_eyes: true}
  send_email: {risk: high, hitl_mode: defer}
  refund_request: {risk: low}
"""
    )

    with pytest.raises(ConfigError) as raised:
        get_policy()

    assert str(raised.value).startswith(f"{path}: ")
    assert "refund_request" in str(raised.value) and "twice" in str(raised.value)
    assert "line 7" in str(raised.value)


def test_it_refuses_a_key_given_twice_inside_an_entry(agent_config: Callable[[str], Path]):
    agent_config(
        """
tool_overrides:
  refund_request:
    risk: high
    four_eyes: true
    four_eyes: false
"""
    )

    with pytest.raises(ConfigError, match="four_eyes.*twice"):
        get_policy()


def test_it_still_lets_an_entry_override_what_it_merges_from_an_anchor(agent_config: Callable[[str], Path]):
    agent_config(
        """
tool_overrides:
  send_email: &gated {risk: high, hitl_mode: defer, approvers: [finance]}
  refund_request: {<<: *gated, hitl_mode: suspend}
"""
    )

    refund = get_policy().tool_policy("refund_request")

    assert (refund.risk, refund.hitl_mode, refund.approvers) == ("high", "suspend", ("finance",))


# -- an agent's own tool_overrides ------------------------------------------------------


def test_it_never_lets_a_runs_own_agent_escalate_to_people_the_file_did_not_name(
    agent_config: Callable[[str], Path], alice: User, bob: User
):
    agent_config(support_yaml(approvers=["finance"]))
    _reviewer("fiona", "finance")
    own = {
        "tools": ["lookup_order", "refund_request"],
        "tool_overrides": {
            "refund_request": {"timeout": 0.2, "on_timeout": "escalate", "escalate_to": ["user:bob"]},
        },
    }
    run = services.run_create(agent="one-off", input=REFUND, agent_config=own, created_by="bob", enqueue=False)
    [approval] = pending(resume(run))

    assert (approval.on_timeout, approval.escalate_to) == ("reject", [])

    assert approval_deadline_fire(approval_id=past_deadline(approval).id) == "expired"
    approval.refresh_from_db()
    assert (approval.status, approval.approvers) == (Approval.Status.EXPIRED, ["finance"])


# -- quorum ------------------------------------------------------------------------------


def test_it_stops_counting_a_vote_once_its_voter_left_the_approvers(
    agent_config: Callable[[str], Path], alice: User, bob: User
):
    agent_config(support_yaml(approvers=["finance"], quorum=2))
    _reviewer("dave", "finance")
    _reviewer("erin", "finance")
    _reviewer("frank", "finance")
    [approval] = pending(start(REFUND))
    decide(approval, "approved", by="dave", auto_resume=False)

    services.user_set_groups(username="dave", groups=())
    result = decide(approval, "approved", by="erin", auto_resume=False)

    assert (result.outcome, result.approval.status) == ("voted", Approval.Status.PENDING)
    voted = AuditEntry.objects.get(approval_id=approval.id, actor="erin")
    assert (voted.outcome, voted.detail["tally"]) == ("voted", "1 of 2 approvals: erin")
    assert decide(approval, "approved", by="frank", auto_resume=False).approval.status == Approval.Status.APPROVED


def test_it_stops_counting_a_vote_once_its_voter_is_deactivated(
    agent_config: Callable[[str], Path], alice: User, bob: User
):
    agent_config(support_yaml(quorum=2))
    _reviewer("dave")
    [approval] = pending(start(REFUND))
    decide(approval, "approved", by="dave", auto_resume=False)

    dave = User.objects.get(username="dave")
    dave.is_active = False
    dave.save()
    result = decide(approval, "approved", by="alice", auto_resume=False)

    assert (result.outcome, result.approval.status) == ("voted", Approval.Status.PENDING)


def test_it_shows_a_decided_quorum_as_it_was_reached_after_a_voter_leaves(
    agent_config: Callable[[str], Path], alice: User, carol: User
):
    agent_config(support_yaml(quorum=2))
    _reviewer("dave")
    _reviewer("erin")
    [approval] = pending(start(REFUND))
    decide(approval, "approved", by="dave", auto_resume=False)
    assert decide(approval, "approved", by="erin", auto_resume=False).approval.status == Approval.Status.APPROVED

    dave = User.objects.get(username="dave")
    dave.is_active = False
    dave.save()

    decided = Approval.objects.get(pk=approval.pk)
    assert decided.tally == "2 of 2 approvals: dave, erin"  # not "1 of 2": it was approved by two
    eligibility.mark(alice, [decided])
    assert decided.tally == "2 of 2 approvals: dave, erin"  # a page of cards reads it alike
    detail = schemas.ApprovalDetail.of(decided).model_dump()
    assert detail["tally"] == "2 of 2 approvals: dave, erin"
    assert [vote["counts"] for vote in detail["votes"]] == [True, True]


# -- edits -------------------------------------------------------------------------------


def test_it_refuses_an_edit_onto_arguments_a_remembered_rejection_refuses(alice: User, bob: User):
    [first] = pending(start("Refund order A1002 for 25.00 USD"))
    decide(first, "rejected", by="alice", note="never A1002", remember=HOUR)
    grant = Grant.objects.get()
    [other] = pending(start(REFUND))

    with pytest.raises(NotPermitted, match="remembered rejection"):
        decide(other, "approved", by="bob", arguments=first.tool_call.arguments, auto_resume=False)

    other.refresh_from_db()
    assert other.status == Approval.Status.PENDING
    facts = CallFacts(tool="refund_request", args=first.tool_call.arguments, agent="support", run={"created_by": "x"})
    verdict = evaluate(get_policy(), facts, grant_lookup=services.grant_match)
    assert verdict.grant_id == grant.id  # the grant still refuses these arguments for the model
    refused = AuditEntry.objects.get(approval_id=other.id, outcome="not_permitted")
    assert refused.actor == "bob" and "remembered rejection" in refused.detail["error"]


def test_it_refuses_a_decision_recorded_for_a_deactivated_reviewer(alice: User, bob: User):
    [approval] = pending(start(REFUND))  # open to any reviewer: the CLI's --by names who decides
    bob.is_active = False
    bob.save()

    with pytest.raises(NotPermitted, match="not an active reviewer"):
        decide(approval, "approved", by="bob")

    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert AuditEntry.objects.filter(approval_id=approval.id, actor="bob", outcome="not_permitted").exists()


def test_it_refuses_a_decision_recorded_for_an_agent_account(alice: User):
    services.user_create(username="robot", role="agent")
    [approval] = pending(start(REFUND))

    with pytest.raises(NotPermitted):
        decide(approval, "approved", by="robot")


# -- the audit chain ---------------------------------------------------------------------


@pytest.mark.parametrize("number", [1e23, 1e300, -4.5e21, 1e16, 2.0])
def test_it_verifies_an_entry_holding_a_large_integral_float(db, number: float):
    # A reviewer's payload is free JSON: PostgreSQL's jsonb gives 1e23 back as the integer 10**23.
    services.audit_append(
        approval_id="", action="note", actor="alice", source="api", outcome="decided", detail={"payload": [number]}
    )

    report = services.audit_verify()

    assert report.ok, report.message
    assert report.entries == 1


def test_it_still_verifies_an_entry_hashed_with_the_exact_value_of_a_float(db):
    if connection.vendor == "postgresql":
        pytest.skip("jsonb gives such a float back as an integer: no entry was ever hashed this way and verified")
    entry = services.audit_append(
        approval_id="", action="note", actor="alice", source="api", outcome="decided", detail={"n": 1.5}
    )
    fields = {**entry_fields(entry), "detail": {"n": 1e23}}
    legacy = entry_hash(entry.prev_hash, fields, legacy=True)
    assert legacy != entry_hash(entry.prev_hash, fields)
    AuditEntry.objects.filter(pk=entry.pk).update(detail={"n": 1e23}, hash=legacy)  # as an older version wrote it

    report = services.audit_verify()

    assert report.ok, report.message


# -- what a reviewer asked for ------------------------------------------------------------


def test_it_refuses_to_remember_a_decision_taken_already_rather_than_drop_the_request(alice: User, bob: User):
    [approval] = pending(start(REFUND))
    decide(approval, "approved", by="alice", auto_resume=False)

    with pytest.raises(services.AlreadyDecided, match="remember"):
        decide(approval, "approved", by="alice", remember=HOUR)

    assert not Grant.objects.exists()
    refused = AuditEntry.objects.filter(approval_id=approval.id, actor="alice").order_by("id").last()
    assert refused.outcome == "already_decided" and refused.detail["remember"]["scope"] == "exact"
