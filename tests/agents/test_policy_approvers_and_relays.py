"""More ways around the policy, each closed: approvers nobody can be, relays by a run's starter, stale tallies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import runtime, services
from agents.models import Approval, AuditEntry, Run
from agents.policy import ConfigError, get_policy
from tests.support.flows import decide, pending, start
from tests.support.policies import SUPPORT, support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def _reviewer(name: str, *groups: str) -> User:
    user, _ = services.user_create(username=name, role="reviewer", groups=groups)
    return user


def _bearer(username: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {services.token_create(username=username)[1]}"}


# -- approver names nobody can have ------------------------------------------------------

DEADLINE = "timeout: 1h, on_timeout: escalate"


@pytest.mark.parametrize(
    ("refund", "key"),
    [
        ('{approvers: [""]}', "tool_overrides.refund_request.approvers[0]"),
        ('{approvers: [finance, "user:"]}', "tool_overrides.refund_request.approvers[1]"),
        ('{approvers: ["   "]}', "tool_overrides.refund_request.approvers[0]"),
        ('{approvers: ["user:  "]}', "tool_overrides.refund_request.approvers[0]"),
        ('{approvers: [" finance"]}', "tool_overrides.refund_request.approvers[0]"),
        ('{approvers: ["user: alice"]}', "tool_overrides.refund_request.approvers[0]"),
        ('{approvers: [finance, agent]}', "tool_overrides.refund_request.approvers[1]"),
        (f'{{{DEADLINE}, escalate_to: ["user:"]}}', "tool_overrides.refund_request.escalate_to[0]"),
        (
            '{rules: [{name: big, action: ask, approvers: ["user:"]}]}',
            "tool_overrides.refund_request.rules[0].approvers[0]",
        ),
        ('{rules: [{name: big, action: ask, approvers: [""]}]}', "tool_overrides.refund_request.rules[0].approvers[0]"),
        (
            f'{{rules: [{{name: big, action: ask, {DEADLINE}, escalate_to: [" "]}}]}}',
            "tool_overrides.refund_request.rules[0].escalate_to[0]",
        ),
    ],
)
def test_it_refuses_an_approver_name_nobody_can_have_naming_the_tool_and_key(
    agent_config: Callable[[str], Path], refund: str, key: str
):
    path = agent_config(SUPPORT.format(refund=refund))

    with pytest.raises(ConfigError) as raised:
        get_policy()

    message = str(raised.value)
    assert message.startswith(f"{path}: {key}: ")
    assert "\n" not in message and "nobody could approve" in message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            "agents:\n  support:\n    tools: [refund_request]\n    tool_overrides:\n      refund_request: {approvers: ['']}\n",
            "agents.support.tool_overrides.refund_request.approvers[0]",
        ),
        ("mcp:\n  files:\n    delete: {approvers: ['user:']}\n", "mcp.files.delete.approvers[0]"),
    ],
)
def test_it_refuses_an_approver_name_nobody_can_have_in_an_agents_entry_and_under_mcp(
    agent_config: Callable[[str], Path], text: str, key: str
):
    path = agent_config(text)

    with pytest.raises(ConfigError) as raised:
        get_policy()

    assert str(raised.value).startswith(f"{path}: {key}: ") and "nobody could approve" in str(raised.value)


def test_it_still_accepts_groups_and_users_as_approvers(agent_config: Callable[[str], Path]):
    agent_config(
        support_yaml(
            approvers=["finance leads", "user:alice"], escalate_to=["user:carol"], on_timeout="escalate", timeout="1h"
        )
    )

    assert get_policy().tool_overrides["refund_request"].approvers == ("finance leads", "user:alice")


# -- four eyes and relayed decisions -----------------------------------------------------


def _started_by(username: str) -> Approval:
    run = services.run_create(agent="support", input=REFUND, created_by=username, enqueue=False)
    runtime.drive(run.id, stream=False)
    [approval] = pending(Run.objects.get(pk=run.id))
    return approval


@pytest.mark.parametrize("decision", ["approved", "rejected"])
def test_it_refuses_a_decision_the_runs_starter_relays_in_someone_elses_name_with_four_eyes(
    agent_config: Callable[[str], Path], alice: User, carol: User, decision: str
):
    agent_config(support_yaml(four_eyes=True))
    approval = _started_by("carol")  # carol is an admin: she may relay decisions for others

    response = Client().post(
        f"/api/approvals/{approval.id}/decide",
        data={"decision": decision, "decided_by": "alice"},
        content_type="application/json",
        headers=_bearer("carol"),
    )

    assert response.status_code == 403, response.content
    assert "carol started this run" in response.json()["message"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and not approval.votes.exists()
    [refusal] = AuditEntry.objects.filter(approval_id=approval.id, outcome=AuditEntry.Outcome.NOT_PERMITTED)
    assert (refusal.actor, refusal.on_behalf_of, refusal.action) == ("carol", "alice", decision)
    assert "carol started this run" in refusal.detail["error"]


@pytest.mark.parametrize(("starter", "four_eyes"), [("bob", True), ("carol", False)])
def test_it_still_lets_relays_through_that_four_eyes_do_not_concern(
    agent_config: Callable[[str], Path], alice: User, carol: User, starter: str, four_eyes: bool
):
    # Someone who did not start the run relays under four eyes; the starter relays without them.
    agent_config(support_yaml(four_eyes=four_eyes))
    approval = _started_by(starter)

    response = Client().post(
        f"/api/approvals/{approval.id}/decide",
        data={"decision": "approved", "decided_by": "alice", "auto_resume": False},
        content_type="application/json",
        headers=_bearer("carol"),
    )

    assert (response.status_code, response.json()["decided_by"]) == (200, "alice")


# -- what reviewers see of a quorum ------------------------------------------------------


@pytest.fixture
def finance_pair(agent_config: Callable[[str], Path], alice: User, bob: User) -> Approval:
    """A refund two of finance must approve; dave, erin and frank are in finance, alice is not."""
    agent_config(support_yaml(approvers=["finance"], quorum=2))
    for name in ("dave", "erin", "frank"):
        _reviewer(name, "finance")
    [approval] = pending(start(REFUND))
    return approval


def _inbox(user: User, query: str = "?show=all") -> str:
    client = Client()
    client.force_login(user)
    response = client.get("/" + query)
    assert response.status_code == 200
    return response.content.decode()


def test_it_shows_on_cards_only_the_votes_the_decision_still_counts(finance_pair: Approval, alice: User):
    decide(finance_pair, "approved", by="dave", auto_resume=False)
    services.user_set_groups(username="dave", groups=())  # dave left finance: his vote no longer counts
    decide(finance_pair, "approved", by="erin", auto_resume=False)

    page = _inbox(alice)

    assert "1 of 2 approvals: erin" in page and "dave" not in page
    assert "Waits for finance (1 of 2)" in page
    assert Approval.objects.get(pk=finance_pair.pk).tally == "1 of 2 approvals: erin"
    detail = Client().get(f"/api/approvals/{finance_pair.id}", headers=_bearer("alice")).json()
    assert detail["tally"] == "1 of 2 approvals: erin"
    assert [(vote["voter"], vote["counts"]) for vote in detail["votes"]] == [("dave", False), ("erin", True)]


def test_it_shows_a_deactivated_voters_approval_as_not_counted(finance_pair: Approval, alice: User):
    decide(finance_pair, "approved", by="dave", auto_resume=False)
    User.objects.filter(username="dave").update(is_active=False)

    page = _inbox(alice)

    assert "0 of 2 approvals" in page and "Waits for finance (0 of 2)" in page
    assert Approval.objects.get(pk=finance_pair.pk).tally == "0 of 2 approvals"


def test_it_audits_the_votes_that_decided_without_those_that_stopped_counting(finance_pair: Approval):
    decide(finance_pair, "approved", by="dave", auto_resume=False)
    services.user_set_groups(username="dave", groups=())
    decide(finance_pair, "approved", by="erin", auto_resume=False)

    result = decide(finance_pair, "approved", by="frank", auto_resume=False)

    assert result.approval.status == Approval.Status.APPROVED
    decided = AuditEntry.objects.get(approval_id=finance_pair.id, outcome=AuditEntry.Outcome.DECIDED)
    assert decided.detail["votes"] == ["erin", "frank"]
    assert Approval.objects.get(pk=finance_pair.pk).tally == "2 of 2 approvals: erin, frank"


def _inbox_queries(user: User) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as queries:
        page = _inbox(user)
    return len(queries.captured_queries), page


def test_it_reads_the_tallies_of_a_page_of_cards_in_a_fixed_number_of_queries(finance_pair: Approval, alice: User):
    decide(finance_pair, "approved", by="dave", auto_resume=False)
    few, page = _inbox_queries(alice)
    assert page.count("1 of 2 approvals: dave") == 1

    for voter in ("erin", "frank", "dave", "erin", "frank"):
        [approval] = pending(start(REFUND))
        decide(approval, "approved", by=voter, auto_resume=False)
    User.objects.filter(username="frank").update(is_active=False)
    many, page = _inbox_queries(alice)

    assert page.count("1 of 2 approvals: dave") == 2 and page.count("1 of 2 approvals: erin") == 2
    assert page.count("0 of 2 approvals") == 2  # frank's, who was deactivated
    assert many == few
