"""Who may decide: approvers (groups, user:NAME) and four eyes, refused alike on the web, the API and the CLI."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry, Run
from agents.policy.config import ConfigError, get_policy
from dashboard import cli
from tests.support.flows import decide, pending, resume, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def bearer(username: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {services.token_create(username=username)[1]}"}


@pytest.fixture
def finance_only(agent_config: Callable[[str], Path], alice: User, bob: User) -> Approval:
    """A refund only finance may approve; alice is in finance, bob is not."""
    agent_config(support_yaml(approvers=["finance"]))
    services.user_set_groups(username="alice", groups=("finance",))
    [approval] = pending(start(REFUND))
    return approval


def refusals(approval: Approval) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(approval_id=approval.id, outcome=AuditEntry.Outcome.NOT_PERMITTED))


def test_it_copies_who_decides_from_the_config_onto_the_approval(finance_only: Approval):
    assert (finance_only.approvers, finance_only.quorum, finance_only.four_eyes) == (["finance"], 1, False)


def test_it_refuses_a_cli_reviewer_outside_the_approvers_with_one_line_and_audits_it(finance_only, capsys):
    code, out, err = run_cli(capsys, "approvals", "approve", finance_only.id, "--by", "bob")

    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "bob is not among the approvers" in err and "finance" in err
    [refusal] = refusals(finance_only)
    assert (refusal.actor, refusal.source, refusal.action) == ("bob", "cli", "approved")
    assert "finance" in refusal.detail["error"]
    finance_only.refresh_from_db()
    assert finance_only.status == Approval.Status.PENDING


def test_it_refuses_a_cli_by_that_names_no_user_when_the_call_names_approvers(finance_only, capsys):
    code, _, err = run_cli(capsys, "approvals", "reject", finance_only.id, "--by", "ghost")

    assert code == 1 and "'ghost' is no active user" in err
    assert len(refusals(finance_only)) == 1


def test_it_lets_an_approver_decide_from_the_cli(finance_only, capsys):
    code, out, _ = run_cli(capsys, "approvals", "approve", finance_only.id, "--by", "alice", "--no-resume")

    assert code == 0 and "Approved" in out
    finance_only.refresh_from_db()
    assert (finance_only.status, finance_only.decided_by) == ("approved", "alice")


def test_it_keeps_any_name_for_by_when_the_call_names_nobody(db, capsys):
    [approval] = pending(start(REFUND))

    code, _, _ = run_cli(capsys, "approvals", "approve", approval.id, "--by", "someone-unknown", "--no-resume")

    assert code == 0
    approval.refresh_from_db()
    assert approval.decided_by == "someone-unknown"


def test_it_refuses_a_reviewer_outside_the_approvers_on_the_web_with_403(finance_only: Approval, bob: User):
    response = signed_in(bob).post(f"/approvals/{finance_only.id}/decide", {"decision": "approved"})

    assert response.status_code == 403
    assert "not among the approvers" in response.content.decode()
    [refusal] = refusals(finance_only)
    assert (refusal.actor, refusal.source) == ("bob", "web")
    finance_only.refresh_from_db()
    assert finance_only.status == Approval.Status.PENDING


def test_it_refuses_a_reviewer_outside_the_approvers_on_the_api_with_403(finance_only: Approval, bob: User):
    response = Client().post(
        f"/api/approvals/{finance_only.id}/decide",
        data={"decision": "rejected"},
        content_type="application/json",
        headers=bearer("bob"),
    )

    assert response.status_code == 403
    assert response.json()["error_code"] == "not_permitted"
    [refusal] = refusals(finance_only)
    assert (refusal.actor, refusal.source, refusal.action) == ("bob", "api", "rejected")


def test_it_refuses_a_relayed_decision_for_someone_outside_the_approvers(finance_only: Approval, carol: User):
    response = Client().post(
        f"/api/approvals/{finance_only.id}/decide",
        data={"decision": "approved", "decided_by": "bob"},
        content_type="application/json",
        headers=bearer("carol"),
    )

    assert response.status_code == 403
    [refusal] = refusals(finance_only)
    assert (refusal.actor, refusal.on_behalf_of) == ("carol", "bob")


def test_it_accepts_a_user_named_in_the_approvers(agent_config, alice: User, bob: User):
    agent_config(support_yaml(approvers=["user:bob"]))
    [approval] = pending(start(REFUND))

    with pytest.raises(services.NotPermitted):
        decide(approval, "approved", by="alice")
    assert decide(approval, "approved", by="bob", auto_resume=False).outcome == "decided"


def test_it_refuses_the_runs_creator_with_four_eyes(agent_config, alice: User, bob: User):
    agent_config(support_yaml(four_eyes=True))
    [approval] = pending(start(REFUND))  # started by bob

    with pytest.raises(services.NotPermitted, match="bob started this run"):
        decide(approval, "approved", by="bob")
    assert refusals(approval)[0].detail["error"].startswith("bob started this run")
    assert decide(approval, "approved", by="alice", auto_resume=False).outcome == "decided"


def test_it_recognises_the_creator_of_a_run_started_through_the_api(agent_config, alice: User):
    agent_config(support_yaml(four_eyes=True))
    headers = bearer("alice")
    created = Client().post(
        "/api/runs", data={"agent": "support", "input": REFUND}, content_type="application/json", headers=headers
    )
    run = Run.objects.get(pk=created.json()["id"])
    assert (run.created_by, run.started_from) == ("alice", "api")
    [approval] = pending(resume(run))

    response = Client().post(
        f"/api/approvals/{approval.id}/decide",
        data={"decision": "approved"},
        content_type="application/json",
        headers=headers,
    )

    assert response.status_code == 403 and "four eyes" in response.json()["message"]


def test_it_recognises_the_creator_of_a_run_started_in_the_playground(agent_config, alice: User):
    agent_config(support_yaml(four_eyes=True))
    client = signed_in(alice)
    created = client.post("/playground/runs", {"agent": "support", "input": REFUND})
    run = Run.objects.get(pk=created.json()["run"]["id"])
    assert (run.created_by, run.started_from) == ("alice", "playground")
    [approval] = pending(resume(run))

    response = client.post(f"/approvals/{approval.id}/decide", {"decision": "approved"})

    assert response.status_code == 403
    assert refusals(approval)[0].actor == "alice"


def test_it_lets_an_agent_raise_but_never_lower_who_decides(agent_config):
    agent_config(
        """
agents:
  support:
    tools: [refund_request]
    tool_overrides:
      refund_request: {quorum: 1, approvers: ["user:mallory"], four_eyes: true}
tool_overrides:
  refund_request: {approvers: [finance], quorum: 2}
"""
    )
    policy = get_policy()
    applied = policy.tool_policy("refund_request", agent=policy.agent("support"))

    assert (applied.approvers, applied.quorum, applied.four_eyes) == (("finance",), 2, True)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{quorum: 0}", "tool_overrides.refund_request.quorum: must be a whole number from 1 to 20"),
        ("{quorum: 21}", "tool_overrides.refund_request.quorum: must be a whole number from 1 to 20"),
        ("{four_eyes: 'yes'}", "tool_overrides.refund_request.four_eyes: must be true or false"),
        ("{approvers: finance}", "tool_overrides.refund_request.approvers: must be a list"),
        (
            "{rules: [{name: big, when: 'true', action: ask, quorum: 30}]}",
            "tool_overrides.refund_request.rules[0].quorum: must be a whole number from 1 to 20",
        ),
    ],
)
def test_it_refuses_bad_who_decides_keys_naming_the_key(agent_config, entry: str, problem: str):
    agent_config(f"agents: {{}}\ntool_overrides:\n  refund_request: {entry}\n")

    with pytest.raises(ConfigError, match=re.escape(problem)):
        get_policy()


def test_it_creates_users_in_groups_and_sets_their_groups_from_the_cli(db, capsys):
    code, out, _ = run_cli(
        capsys, "users", "create", "erin", "--role", "reviewer", "--group", "finance", "--group", "managers"
    )
    assert code == 0 and "created reviewer erin in finance, managers" in out
    erin = User.objects.get(username="erin")
    assert set(erin.groups.values_list("name", flat=True)) == {"reviewer", "finance", "managers"}

    code, out, _ = run_cli(capsys, "users", "groups", "erin", "finance-leads")

    assert code == 0 and out.strip() == "erin is in finance-leads"
    assert set(erin.groups.values_list("name", flat=True)) == {"reviewer", "finance-leads"}


def test_it_refuses_a_role_as_an_approver_group_from_the_cli(alice, capsys):
    code, _, err = run_cli(capsys, "users", "groups", "alice", "admin")

    assert code == 1 and "'admin' is a role" in err
    assert set(alice.groups.values_list("name", flat=True)) == {"reviewer"}
