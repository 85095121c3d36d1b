"""A deny rule added while a call waits refuses its approval, from every entry point; rejecting it still works."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import services
from agents.models import Approval, AuditEntry, Run, SideEffect, Vote
from agents.services.deadlines import toolcall_run_now
from tests.support.flows import decide, pending, resume, start, tool_outputs
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"  # 2,500 cents
FROZEN = {"name": "frozen", "when": "args.amount_cents > 2000", "action": "deny", "reason": "refunds are frozen"}
ELSEWHERE = {"name": "huge", "when": "args.amount_cents > 100000", "action": "deny", "reason": "too large"}


@pytest.fixture
def policy(agent_config: Callable[[str], Path], alice: User, bob: User) -> Callable[..., Path]:
    """Write agentfast.yaml with refund_request's entry holding these keys (any reviewer decides by default)."""

    def configure(**keys: Any) -> Path:
        return agent_config(support_yaml(**keys))

    return configure


def refusals(approval: Approval) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(approval_id=approval.id, outcome="not_permitted").order_by("id"))


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# -- the service ------------------------------------------------------------------------


def test_it_refuses_to_approve_a_waiting_call_a_deny_rule_added_since_matches_and_audits_it(policy):
    policy()
    run = start(REFUND)
    [approval] = pending(run)
    policy(rules=[FROZEN])  # the operator freezes refunds while the call waits

    denied = r"the policy now denies this call \(rule 'frozen': refunds are frozen\)"
    with pytest.raises(services.NotPermitted, match=denied) as refused:
        decide(approval, "approved", by="alice")

    assert refused.value.details["field"] == "arguments"
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("pending", "")
    assert not Vote.objects.filter(approval=approval).exists()
    [entry] = refusals(approval)
    assert (entry.actor, entry.action, entry.source) == ("alice", "approved", "cli")
    assert entry.detail["rule"] == "frozen" and "refunds are frozen" in entry.detail["error"]
    assert entry.detail["asked_under"] == approval.policy_version != entry.detail["policy_version"]
    resume(run)
    assert not SideEffect.objects.exists()


def test_it_still_takes_a_rejection_of_a_call_the_policy_now_denies(policy):
    policy()
    run = start(REFUND)
    [approval] = pending(run)
    policy(rules=[FROZEN])
    with pytest.raises(services.NotPermitted):
        decide(approval, "approved", by="alice")

    decision = decide(approval, "rejected", by="alice", note="frozen", auto_resume=False)
    run = resume(run)

    assert (decision.outcome, decision.approval.status) == ("decided", "rejected")
    assert [e.outcome for e in AuditEntry.objects.filter(approval_id=approval.id).order_by("id")] == [
        "not_permitted",
        "decided",
    ]
    assert tool_outputs(run)[-1]["error_code"] == "APPROVAL_REJECTED"
    assert not SideEffect.objects.exists()


def test_it_refuses_a_quorum_vote_once_the_policy_denies_the_call_and_counts_none_after(policy):
    policy(quorum=2)
    [approval] = pending(start(REFUND))
    assert decide(approval, "approved", by="alice", auto_resume=False).outcome == "voted"
    policy(quorum=2, rules=[FROZEN])

    with pytest.raises(services.NotPermitted, match="rule 'frozen'"):
        decide(approval, "approved", by="bob", auto_resume=False)  # the vote that would reach the quorum
    with pytest.raises(services.NotPermitted, match="rule 'frozen'"):
        decide(approval, "approved", by="alice", auto_resume=False)  # nor may a voter repeat theirs

    approval.refresh_from_db()
    assert approval.status == "pending" and approval.tally == "1 of 2 approvals: alice"
    assert decide(approval, "rejected", by="bob", auto_resume=False).approval.status == "rejected"


def test_it_approves_once_the_deny_rule_is_gone_or_matches_other_arguments(policy):
    policy()
    [first, second] = [pending(start(REFUND))[0] for _ in range(2)]
    policy(rules=[FROZEN])
    with pytest.raises(services.NotPermitted):
        decide(first, "approved", by="alice", auto_resume=False)

    policy(rules=[ELSEWHERE])  # a deny rule for other arguments: these still run
    assert decide(first, "approved", by="alice", auto_resume=False).approval.status == "approved"
    policy()
    assert decide(second, "approved", by="alice", auto_resume=False).approval.status == "approved"


def test_it_takes_an_edit_of_a_denied_call_to_arguments_the_policy_lets_through(policy):
    policy()
    run = start(REFUND)
    [approval] = pending(run)
    policy(rules=[FROZEN])

    edited = {**approval.tool_call.arguments, "amount_cents": 1500}
    decision = decide(approval, "approved", by="alice", arguments=edited, auto_resume=False)
    resume(run)

    assert decision.approval.status == "approved"
    assert SideEffect.objects.get().arguments["amount_cents"] == 1500


def test_it_keeps_an_unedited_approval_to_the_people_it_was_opened_for_when_an_ask_rule_asks_more(policy):
    # The choice for stricter ask rules: a waiting call keeps the quorum it paused with (its
    # policy version says so); an edit meets the new rule, a deny rule refuses it (above).
    policy()
    [approval] = pending(start(REFUND))
    policy(rules=[{"name": "every refund", "when": "true", "action": "ask", "quorum": 2}])

    with pytest.raises(services.NotPermitted, match=r"need 2 approvals from any reviewer \(rule every refund\)"):
        decide(approval, "approved", by="alice", arguments={**approval.tool_call.arguments, "amount_cents": 2400})
    decision = decide(approval, "approved", by="alice", auto_resume=False)

    assert (decision.outcome, decision.approval.status, decision.approval.quorum) == ("decided", "approved", 1)


def test_it_approves_nothing_while_the_policy_cannot_be_read_and_still_takes_a_rejection(policy):
    path = policy()
    [approval, other] = [pending(start(REFUND))[0] for _ in range(2)]
    path.write_text("agents: [")  # an edit half-saved: it may be the deny rule being added

    with pytest.raises(services.NotPermitted, match="the policy file cannot be read") as refused:
        decide(approval, "approved", by="alice", auto_resume=False)
    with pytest.raises(services.NotPermitted, match="the policy file cannot be read"):
        decide(other, "approved", by="alice", arguments={**other.tool_call.arguments, "amount_cents": 1500})

    assert refused.value.details["field"] == "decision"
    [entry] = refusals(approval)
    assert "not valid YAML" in entry.detail["policy_error"]
    assert decide(approval, "rejected", by="alice", auto_resume=False).approval.status == "rejected"
    policy()
    assert decide(other, "approved", by="alice", auto_resume=False).approval.status == "approved"


def _approve_queries(approval: Approval) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        decision = decide(approval, "approved", by="alice", auto_resume=False)
    assert decision.approval.status == "approved"
    return [query["sql"] for query in queries.captured_queries]


def test_it_reads_nothing_more_to_approve_whether_or_not_the_tool_has_deny_rules(policy):
    policy()
    [plain, judged] = [pending(start(REFUND))[0] for _ in range(2)]

    without_deny = _approve_queries(plain)
    policy(rules=[ELSEWHERE])  # evaluated in memory, against these arguments
    with_deny = _approve_queries(judged)

    assert len(with_deny) == len(without_deny)
    assert not [sql for sql in with_deny + without_deny if "agents_grant" in sql]  # no grant looked up


# -- the HTTP API and the dashboard -------------------------------------------------------


def test_it_answers_the_apis_approval_of_a_denied_call_with_403_naming_the_rule(policy, alice):
    policy()
    [approval] = pending(start(REFUND))
    policy(rules=[FROZEN])
    client = client_for(alice)

    approved = client.post(
        f"/api/approvals/{approval.id}/decide", {"decision": "approved"}, content_type="application/json"
    )
    rejected = client.post(
        f"/api/approvals/{approval.id}/decide",
        {"decision": "rejected", "auto_resume": False},
        content_type="application/json",
    )

    assert approved.status_code == 403
    body = approved.json()
    assert (body["error_code"], body["field"]) == ("not_permitted", "arguments")
    assert "the policy now denies this call (rule 'frozen': refunds are frozen)" in body["message"]
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    [entry] = refusals(approval)
    assert (entry.actor, entry.source, entry.detail["rule"]) == ("alice", "api", "frozen")


def test_it_shows_the_refusal_on_the_card_that_approved_a_denied_call(policy, alice):
    policy()
    [approval] = pending(start(REFUND))
    policy(rules=[FROZEN])

    response = client_for(alice).post(
        f"/approvals/{approval.id}/decide",
        {
            "decision": "approved",
            "arguments": json.dumps(approval.tool_call.arguments),
            "expect_digest": approval.digest,
        },
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"card-{approval.id}",
    )

    assert response.status_code == 403
    assert "the policy now denies this call (rule &#x27;frozen&#x27;: refunds are frozen)" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    [entry] = refusals(approval)
    assert (entry.source, entry.detail["rule"]) == ("web", "frozen")


# -- Run now -----------------------------------------------------------------------------

SCHEDULE = {"name": "later", "action": "schedule", "at": 'now + duration("1h")'}


def test_it_refuses_to_run_now_a_scheduled_call_the_policy_now_denies_and_audits_it(policy):
    policy(rules=[SCHEDULE])
    run = start(REFUND)
    [approval] = pending(run)
    assert approval.on_timeout == Approval.OnTimeout.RUN
    policy(rules=[SCHEDULE, FROZEN])
    alice = services.Attempt(actor="alice", source="cli", origin="tests")

    with pytest.raises(services.NotPermitted, match="rule 'frozen'"):
        toolcall_run_now(approval_id=approval.id, attempt=alice)

    approval.refresh_from_db()
    assert approval.status == "pending"
    [entry] = refusals(approval)
    assert (entry.actor, entry.action, entry.detail["note"], entry.detail["rule"]) == (
        "alice",
        "approved",
        "run now",
        "frozen",
    )
    services.run_cancel(run_id=run.id, attempt=alice)  # what is left to do with it
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    assert not SideEffect.objects.exists()


def test_it_says_on_the_page_why_run_now_was_refused(policy, alice):
    policy(rules=[SCHEDULE])
    [approval] = pending(start(REFUND))
    policy(rules=[SCHEDULE, FROZEN])

    response = client_for(alice).post(f"/approvals/{approval.id}/run-now", HTTP_HX_REQUEST="true")

    assert response.status_code == 403
    assert "the policy now denies this call" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    policy(rules=[SCHEDULE])  # lifted: it may run now
    assert client_for(alice).post(f"/approvals/{approval.id}/run-now", HTTP_HX_REQUEST="true").status_code == 200
    assert Approval.objects.get(pk=approval.pk).decided_by == "alice"
