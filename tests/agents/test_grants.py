"""Standing grants: a remembered decision decides matching calls, never widens authority, and is audited."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agents import services
from agents.cli import main as cli_main
from agents.models import Approval, AuditEntry, Grant, Run, ToolCall
from agents.policy import get_policy
from agents.policy.rules import CallFacts
from agents.services.deadlines import approval_deadline_fire
from agents.services.errors import InvalidInput, NotPermitted
from tests.support import flows

ROOT = Path(__file__).resolve().parents[2]
HOUR = services.Remember(scope="exact", seconds=3600)
TOOL_HOUR = services.Remember(scope="tool", seconds=3600)


@pytest.fixture
def policy_file(agent_config):
    """The project's agentfast.yaml, with `extra` appended to refund_request's entry."""
    base = (ROOT / "agentfast.yaml").read_text()

    def write(extra: str = "") -> None:
        text = base.replace(
            "    risk: high\n    hitl_mode: suspend\n", f"    risk: high\n    hitl_mode: suspend\n{extra}", 1
        )
        assert extra == "" or text != base
        agent_config(text)

    return write


def _asked(prompt: str) -> tuple[Run, Approval]:
    run = flows.start(prompt)
    [approval] = flows.pending(run)
    return run, approval


def _refund_approval(run: Run) -> Approval:
    return Approval.objects.get(run=run, tool="refund_request")


def test_it_runs_the_next_identical_call_without_asking_once_remembered(alice, bob):
    _, first = _asked("Refund order A1001 for 25.00 USD")

    decision = flows.decide(first, "approved", by="alice", remember=HOUR)
    run = flows.start("Refund order A1001 for 25.00 USD")

    grant = Grant.objects.get()
    assert decision.grant == grant
    assert (grant.created_by, grant.scope, grant.tool, grant.agent) == ("alice", "exact", "refund_request", "support")
    assert run.status == Run.Status.COMPLETED and flows.pending(run) == []
    approval = _refund_approval(run)
    assert (approval.status, approval.decided_by) == ("approved", f"grant:{grant.id}")
    assert ToolCall.objects.get(run=run, name="refund_request").status == ToolCall.Status.SUCCEEDED
    used = AuditEntry.objects.get(approval_id=approval.id)
    assert (used.actor, used.action, used.detail["grant"]) == (f"grant:{grant.id}", "approved", grant.id)
    assert AuditEntry.objects.filter(approval_id=first.id, action="remembered", actor="alice").exists()
    grant.refresh_from_db()
    assert grant.uses == 1 and grant.last_used_at is not None


def test_it_still_asks_for_other_arguments_under_an_exact_grant(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=HOUR)

    _, other = _asked("Refund order A1002 for 25.00 USD")

    assert other.tool == "refund_request" and other.status == Approval.Status.PENDING
    assert Grant.objects.get().uses == 0


def test_it_runs_any_arguments_of_the_tool_under_a_tool_grant(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=TOOL_HOUR)

    run = flows.start("Refund order A1002 for 30.00 USD")

    assert run.status == Run.Status.COMPLETED
    assert _refund_approval(run).decided_by == f"grant:{Grant.objects.get().id}"


def test_it_refuses_a_call_under_a_remembered_rejection(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "rejected", note="not this one", remember=HOUR)

    run = flows.start("Refund order A1001 for 25.00 USD")

    grant = Grant.objects.get()
    approval = _refund_approval(run)
    assert (approval.status, approval.decided_by) == ("rejected", f"grant:{grant.id}")
    output = ToolCall.objects.get(run=run, name="refund_request").result
    assert output["error_code"] == "POLICY_DENIED"
    assert "a remembered rejection by alice" in output["message"]


def test_it_prefers_a_remembered_rejection_to_a_remembered_approval(alice, bob):
    _, first = _asked("Refund order A1002 for 25.00 USD")
    flows.decide(first, "rejected", by="bob", remember=HOUR)
    _, second = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(second, "approved", by="alice", remember=TOOL_HOUR)

    run = flows.start("Refund order A1002 for 25.00 USD")

    assert _refund_approval(run).status == Approval.Status.REJECTED


def test_it_stops_applying_a_grant_once_it_expires(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=HOUR)
    facts = CallFacts(tool="refund_request", args=first.tool_call.arguments, agent="support", run={"created_by": "bob"})
    tool = get_policy().tool_policy("refund_request")

    now = services.grant_match(facts, tool)
    later = services.grant_match(CallFacts(**{**facts.__dict__, "now": timezone.now() + timedelta(hours=2)}), tool)

    assert now is not None and now.action == "allow"
    assert later is None


def test_it_asks_again_after_a_revoke_and_only_lets_the_creator_or_an_admin_revoke(alice, bob, carol):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    grant = flows.decide(first, "approved", remember=HOUR).grant

    with pytest.raises(NotPermitted, match="only their own"):
        services.grant_revoke(grant_id=grant.id, actor="bob", source="cli")
    services.grant_revoke(grant_id=grant.id, actor="carol", source="cli")
    _, again = _asked("Refund order A1001 for 25.00 USD")

    grant.refresh_from_db()
    assert (grant.revoked_by, again.status) == ("carol", Approval.Status.PENDING)
    assert AuditEntry.objects.filter(action="revoked", actor="carol", outcome="decided").exists()
    assert AuditEntry.objects.filter(action="revoke", actor="bob", outcome="not_permitted").exists()


# -- never widening authority ----------------------------------------------------------


def _refused_remember(approval: Approval, decision: str = "approved", by: str = "alice", match: str = "") -> None:
    with pytest.raises(NotPermitted, match=match):
        flows.decide(approval, decision, by=by, remember=HOUR)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING  # refused as a whole: nothing was decided
    assert not Grant.objects.exists()
    assert AuditEntry.objects.filter(approval_id=approval.id, outcome="not_permitted", actor=by).exists()


def test_it_refuses_to_remember_an_approval_that_needs_a_quorum(alice):
    _, approval = _asked("Refund order A1004 for 75.00 USD")  # the "large refunds" rule: quorum 2

    _refused_remember(approval, match="needs 2 approvers")


def test_it_refuses_to_remember_for_a_name_that_is_no_reviewer(alice):
    _, approval = _asked("Refund order A1001 for 25.00 USD")

    _refused_remember(approval, by="somebody", match="no active user")


def test_it_refuses_to_remember_for_a_non_approver(policy_file, alice, bob):
    policy_file("    approvers: ['user:alice']\n")
    _, approval = _asked("Refund order A1001 for 25.00 USD")

    _refused_remember(approval, by="bob", match="not among the approvers")


def test_it_refuses_to_remember_for_the_runs_own_starter_under_four_eyes(policy_file, bob):
    policy_file("    four_eyes: true\n")
    _, approval = _asked("Refund order A1001 for 25.00 USD")  # started by bob

    _refused_remember(approval, by="bob", match="four eyes")


def test_it_refuses_to_remember_for_someone_who_decides_through_the_escalation(policy_file, alice, bob):
    # A grant applies only where the policy asks its author: bob's would never decide a call.
    policy_file(
        "    approvers: ['user:alice']\n    timeout: 1h\n    on_timeout: escalate\n    escalate_to: ['user:bob']\n"
    )
    _, approval = _asked("Refund order A1001 for 25.00 USD")
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_deadline_fire(approval_id=approval.id) == "escalated"

    _refused_remember(approval, by="bob", match="the policy asks user:alice for such calls")
    assert flows.decide(approval, "approved", by="bob").outcome == "decided"  # his say on this one call stands


def test_it_refuses_to_remember_on_a_tool_without_grants(policy_file, alice):
    policy_file("    grants: false\n")
    _, approval = _asked("Refund order A1001 for 25.00 USD")

    _refused_remember(approval, match="grants: false")


def test_it_lets_a_deny_rule_win_over_a_grant(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=TOOL_HOUR)

    run = flows.start("Refund order A1010 for 1,500.00 USD")  # "huge refunds" denies

    approval = _refund_approval(run)
    assert (approval.status, approval.decided_by) == ("rejected", "policy:huge refunds")
    assert Grant.objects.get().uses == 0


def test_it_does_not_apply_a_tool_grant_where_the_policy_now_needs_a_quorum(alice):
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=TOOL_HOUR)

    _, large = _asked("Refund order A1004 for 75.00 USD")  # "large refunds": quorum 2

    assert (large.status, large.quorum) == (Approval.Status.PENDING, 2)


def test_it_does_not_apply_a_grant_once_the_tool_turns_grants_off(policy_file, alice):
    policy_file()
    _, first = _asked("Refund order A1001 for 25.00 USD")
    flows.decide(first, "approved", remember=HOUR)
    policy_file("    grants: false\n")

    _, again = _asked("Refund order A1001 for 25.00 USD")

    assert again.status == Approval.Status.PENDING


def test_it_does_not_let_a_grant_approve_its_creators_own_run_under_four_eyes(policy_file, alice, bob):
    policy_file("    four_eyes: true\n")
    _, first = _asked("Refund order A1001 for 25.00 USD")  # started by bob
    flows.decide(first, "approved", by="alice", remember=TOOL_HOUR)
    run = services.run_create(
        agent="support", input="Refund order A1002 for 25.00 USD", created_by="alice", enqueue=False
    )

    flows.resume(run)

    approval = _refund_approval(run)
    assert (approval.status, approval.decided_by) == (Approval.Status.PENDING, ""), approval.decided_by


def test_it_refuses_a_duration_out_of_bounds_or_unreadable():
    with pytest.raises(InvalidInput, match="7 days"):
        services.Remember.of("exact", 8 * 86400)
    with pytest.raises(InvalidInput, match="exact' or 'tool"):
        services.Remember.of("everything", 3600)
    with pytest.raises(InvalidInput, match="not a duration"):
        services.parse_duration("forever")
    assert [services.parse_duration(d) for d in ("30m", "1h", "8h", "24h")] == [1800, 3600, 28800, 86400]


# -- the command line ------------------------------------------------------------------


def test_it_remembers_lists_and_revokes_from_the_command_line(alice, capsys):
    _, first = _asked("Refund order A1001 for 25.00 USD")

    assert (
        cli_main(["approvals", "approve", first.id, "--by", "alice", "--remember", "8h", "--remember-scope", "tool"])
        == 0
    )
    grant = Grant.objects.get()
    assert f"Remembered as grant {grant.id}" in capsys.readouterr().out
    assert grant.scope == "tool" and grant.expires_at - grant.created_at == timedelta(hours=8)

    assert cli_main(["grants", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["id"], listed["created_by"], listed["state"], listed["uses"]) == (grant.id, "alice", "live", 0)

    assert cli_main(["grants", "revoke", grant.id, "--by", "alice"]) == 0
    assert f"Revoked {grant.id}" in capsys.readouterr().out
    assert cli_main(["grants", "list"]) == 0
    assert "No standing decisions." in capsys.readouterr().out


def test_it_refuses_a_bad_remember_flag_on_the_command_line_and_decides_nothing(alice, capsys):
    _, first = _asked("Refund order A1001 for 25.00 USD")

    assert cli_main(["approvals", "reject", first.id, "--by", "alice", "--remember", "forever"]) == 1

    err = capsys.readouterr().err
    assert "not a duration" in err and len(err.strip().splitlines()) == 1
    first.refresh_from_db()
    assert first.status == Approval.Status.PENDING


# -- the external gate -------------------------------------------------------------------

GATE_POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""


def _gate(owner: str, call_id: str, **arguments: object) -> object:
    from agents.gateway import services as gateway

    request = gateway.GateRequest(
        agent="billing", session="s1", call_id=call_id, tool="wire_money", arguments=arguments
    )
    return gateway.gate_call(owner=owner, request=request)


def test_it_lets_a_grant_decide_an_external_agents_call(agent_config, alice, bob):
    agent_config(GATE_POLICY)
    robot = services.user_create(username="robot", role="agent")[0].username
    first = _gate(robot, "c1", cents=2000)
    flows.decide(first.approval_id, "approved", by="alice", remember=HOUR)
    second = _gate(robot, "c2", cents=3000)
    flows.decide(second.approval_id, "rejected", by="bob", remember=HOUR)

    allowed, denied, other = _gate(robot, "c3", cents=2000), _gate(robot, "c4", cents=3000), _gate(robot, "c5", cents=1)

    approve_grant, reject_grant = Grant.objects.get(created_by="alice"), Grant.objects.get(created_by="bob")
    assert (allowed.decision, Approval.objects.get(pk=allowed.approval_id).decided_by) == (
        "allowed",
        f"grant:{approve_grant.id}",
    )
    assert denied.decision == "denied" and "a remembered rejection by bob" in denied.reason
    assert other.decision == "pending"
    assert (approve_grant.uses, reject_grant.uses) == (1, 1)


def test_it_lets_a_grant_on_an_external_call_decide_only_that_accounts_calls(agent_config, alice):
    agent_config(GATE_POLICY)
    bot1, bot2 = (services.user_create(username=name, role="agent")[0].username for name in ("bot1", "bot2"))
    first = _gate(bot1, "c1", cents=5000)
    flows.decide(first.approval_id, "approved", by="alice", remember=TOOL_HOUR)

    other_account, same_account = _gate(bot2, "c1", cents=99999), _gate(bot1, "c2", cents=99999)

    grant = Grant.objects.get()
    assert (grant.kind, grant.account, grant.agent) == ("external", "bot1", "billing")
    assert other_account.decision == "pending"
    assert (same_account.decision, Approval.objects.get(pk=same_account.approval_id).decided_by) == (
        "allowed",
        f"grant:{grant.id}",
    )
    assert Grant.objects.get().uses == 1


def test_it_names_the_account_of_an_external_grant_on_the_command_line(agent_config, alice, capsys):
    agent_config(GATE_POLICY)
    bot1 = services.user_create(username="bot1", role="agent")[0].username
    flows.decide(_gate(bot1, "c1", cents=5000).approval_id, "approved", by="alice", remember=TOOL_HOUR)
    grant = Grant.objects.get()
    capsys.readouterr()

    assert cli_main(["grants", "list"]) == 0
    assert "billing (account bot1)" in capsys.readouterr().out
    assert cli_main(["grants", "revoke", grant.id, "--by", "alice"]) == 0
    assert "for billing of account bot1) as alice" in capsys.readouterr().out


def _gate_refund(owner: str, order_id: str) -> object:
    from agents.gateway import services as gateway

    arguments = {"order_id": order_id, "amount_cents": 2500}
    request = gateway.GateRequest(
        agent="support", session="s1", call_id=order_id, tool="refund_request", arguments=arguments
    )
    return gateway.gate_call(owner=owner, request=request)


def test_it_never_lets_a_grant_cross_between_internal_runs_and_external_calls(alice):
    robot = services.user_create(username="robot", role="agent")[0].username
    external = _gate_refund(robot, "A1001")
    flows.decide(external.approval_id, "approved", by="alice", remember=TOOL_HOUR)

    _, internal = _asked("Refund order A1002 for 25.00 USD")  # the built-in agent of the same name still asks
    flows.decide(internal, "approved", by="alice", remember=TOOL_HOUR)
    impostor = services.user_create(username="impostor", role="agent")[0].username

    assert _gate_refund(impostor, "A1003").decision == "pending"  # naming itself "support" is not enough
    assert _gate_refund(robot, "A1004").decision == "allowed"  # its own grant
    assert [(g.kind, g.account, g.uses) for g in Grant.objects.order_by("created_at")] == [
        ("external", "robot", 1),
        ("internal", "", 0),
    ]


def test_it_keeps_the_grants_from_before_accounts_to_their_own_principal(transactional_db, alice):
    """Internal grants keep working; external ones match their run's account, or nothing once the run is gone."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    robot, gone = (services.user_create(username=name, role="agent")[0].username for name in ("robot", "gone"))
    for approval_id in (_gate_refund(robot, "A1001").approval_id, _gate_refund(gone, "A1002").approval_id):
        flows.decide(approval_id, "approved", by="alice", remember=TOOL_HOUR)
    _, internal = _asked("Refund order A1003 for 25.00 USD")
    flows.decide(internal, "approved", by="alice", remember=TOOL_HOUR)
    Run.objects.filter(kind=Run.Kind.EXTERNAL, created_by=gone).delete()  # a run no longer stored

    executor = MigrationExecutor(connection)
    executor.migrate([("agents", "0015_approval_created_index")])  # before grants named their account
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert sorted((g.kind, g.account) for g in Grant.objects.all()) == [
        ("external", ""),
        ("external", "robot"),
        ("internal", ""),
    ]
    assert _gate_refund(robot, "A1004").decision == "allowed"
    assert _gate_refund(gone, "A1005").decision == "pending"
    assert flows.pending(flows.start("Refund order A1006 for 25.00 USD")) == []
