"""A name that leaves its person (an account renamed or deleted) takes nothing along to whoever takes it next.

Runs name their starter, votes their voter and grants their creator and account by user name:
the renamed person keeps their runs and the votes that still count, and a new account given a
departed name inherits no grant, vote, run or external session.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.gateway import services as gateway
from agents.gateway.selectors import external_run_get
from agents.models import Approval, AuditEntry, Grant, Run, ToolCall, Vote
from agents.services.runs import resume_refusal
from tests.support import flows
from tests.support.policies import support_yaml

HOUR = services.Remember(scope="exact", seconds=3600)
TOOL_HOUR = services.Remember(scope="tool", seconds=3600)
PROMPT = "Refund order A1001 for 25.00 USD"


def _granted_by_alice() -> Grant:
    run = flows.start(PROMPT)
    [approval] = flows.pending(run)
    return flows.decide(approval, "approved", by="alice", remember=HOUR).grant


@pytest.mark.parametrize("leaves", ["deleted", "renamed"])
def test_a_new_user_named_like_a_departed_grant_creator_does_not_revive_the_grant(alice, leaves):
    grant = _granted_by_alice()
    if leaves == "deleted":
        alice.delete()  # Django admin (a superuser) or the shell
    else:
        alice.username = "alicia"  # Django admin's user change form
        alice.save()

    services.user_create(username="alice", role="reviewer", password="another-alice-pw")  # someone else
    run = flows.start(PROMPT)

    approval = Approval.objects.get(run=run, tool="refund_request")
    assert approval.decided_by != f"grant:{grant.id}"
    assert run.status != Run.Status.COMPLETED


def test_the_grants_a_name_takes_away_are_revoked_by_the_system_and_audited(alice):
    grant = _granted_by_alice()

    alice.username = "alicia"
    alice.save()

    grant.refresh_from_db()
    assert (grant.revoked_by, grant.revoked_at is not None) == ("system", True)
    [entry] = AuditEntry.objects.filter(action="revoked", actor="system")
    assert entry.detail["reason"] == "alice was renamed alicia"


def test_a_login_saves_no_extra_read_for_the_rename_check(alice, django_assert_num_queries):
    alice.last_name = "Liddell"
    with django_assert_num_queries(1):  # the UPDATE of the named field alone
        alice.save(update_fields=["last_name"])


# -- runs and votes ----------------------------------------------------------------------


GATE_POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""


def _rename(user: User, name: str) -> None:
    user.username = name  # Django admin's user change form
    user.save()


def _leave(user: User, leaves: str) -> None:
    """Take the name away from its person: delete the account, or rename it."""
    if leaves == "deleted":
        user.delete()  # Django admin (a superuser) or the shell
    else:
        _rename(user, "alicia")


def _started_by_alice(*, auto_resume: bool = True) -> Run:
    run = services.run_create(
        agent="support",
        input=PROMPT,
        created_by="alice",
        started_from="playground",
        auto_resume=auto_resume,
        enqueue=False,
    )
    return flows.resume(run)


def _as(user: User) -> services.Attempt:
    return services.Attempt(actor=user.username, source="web", user=user)


def _in_playground_history(run: Run, user: User) -> bool:
    client = Client()
    client.force_login(user)
    return f'data-run-id="{run.id}"' in client.get("/playground/").content.decode()


def _gate(owner: str, session: str = "s1", call_id: str = "c1") -> gateway.GateAnswer:
    request = gateway.GateRequest(agent="billing", session=session, call_id=call_id, tool="wire_money", arguments={})
    return gateway.gate_call(owner=owner, request=request)


def test_a_renamed_starter_still_may_not_approve_their_own_runs_call_under_four_eyes(agent_config, alice, bob):
    agent_config(support_yaml(four_eyes=True))
    [approval] = flows.pending(_started_by_alice())

    _rename(alice, "alicia")

    with pytest.raises(services.NotPermitted, match="alicia started this run"):
        flows.decide(approval, "approved", by="alicia")
    assert Run.objects.get(pk=approval.run_id).created_by == "alicia"


def test_a_renamed_starter_keeps_cancelling_resuming_and_seeing_their_runs(agent_config, alice):
    agent_config(support_yaml(approvers=["finance"]))  # alice is no approver: only a starter may cancel
    run = _started_by_alice(auto_resume=False)

    _rename(alice, "alicia")

    run.refresh_from_db()
    assert _in_playground_history(run, alice)
    assert resume_refusal(run, _as(alice)) is None
    assert services.run_cancel(run_id=run.id, attempt=_as(alice)).status == Run.Status.CANCELLED


def test_a_new_user_named_like_a_deleted_starter_inherits_none_of_their_runs(agent_config, alice):
    agent_config(support_yaml(approvers=["finance"], four_eyes=True))
    run = _started_by_alice(auto_resume=False)

    alice.delete()
    newcomer, _ = services.user_create(username="alice", role="reviewer", password="another-alice-pw")

    run.refresh_from_db()
    assert run.created_by == "alice (deleted)"  # what the runs pages and the API show
    assert not _in_playground_history(run, newcomer)
    assert resume_refusal(run, _as(newcomer)) is not None
    with pytest.raises(services.NotPermitted):
        services.run_cancel(run_id=run.id, attempt=_as(newcomer))
    services.user_set_groups(username="alice", groups=("finance",))
    [approval] = flows.pending(run)
    assert flows.decide(approval, "approved", by="alice", auto_resume=False).outcome == "decided"  # not her run


@pytest.mark.parametrize("source", ["web", "cli"])
def test_a_new_user_named_like_a_deleted_voter_does_not_inherit_the_vote(agent_config, alice, bob, source):
    agent_config(support_yaml(quorum=2))
    [approval] = flows.pending(flows.start(PROMPT))
    services.approval_decide(
        approval_id=approval.id, decision="approved", attempt=services.Attempt(actor="alice", source=source, user=alice)
    )

    alice.delete()
    services.user_create(username="alice", role="reviewer", password="another-alice-pw")

    assert Approval.objects.get(pk=approval.id).counted_voters == []
    assert flows.decide(approval, "approved", by="bob", auto_resume=False).approval.status == Approval.Status.PENDING


def test_a_renamed_voter_keeps_their_vote_and_a_new_user_of_the_old_name_gets_none(agent_config, alice, bob):
    agent_config(support_yaml(quorum=2))
    [approval] = flows.pending(flows.start(PROMPT))
    flows.decide(approval, "approved", by="alice", auto_resume=False)

    _rename(alice, "alicia")
    services.user_create(username="alice", role="reviewer", password="another-alice-pw")

    assert Approval.objects.get(pk=approval.id).counted_voters == ["alicia"]
    decided = flows.decide(approval, "approved", by="alice", auto_resume=False)  # the new alice: a second person
    assert (decided.outcome, decided.approval.status) == ("decided", Approval.Status.APPROVED)


def test_a_decided_approval_keeps_its_voters_names_as_they_were(agent_config, alice, bob):
    agent_config(support_yaml(quorum=2))
    [approval] = flows.pending(flows.start(PROMPT))
    flows.decide(approval, "approved", by="alice", auto_resume=False)
    flows.decide(approval, "approved", by="bob", auto_resume=False)

    _rename(alice, "alicia")

    assert sorted(Vote.objects.filter(approval=approval).values_list("voter", flat=True)) == ["alice", "bob"]
    assert Approval.objects.get(pk=approval.id).counted_voters == ["alice", "bob"]


def test_a_renamed_agent_account_keeps_its_external_calls(agent_config, alice):
    agent_config(GATE_POLICY)
    robot, _ = services.user_create(username="robot", role="agent")
    answer = _gate("robot")
    flows.decide(answer.approval_id, "approved", by="alice")

    _rename(robot, "robot2")

    assert gateway.external_call_claim(owner="robot2", approval_id=answer.approval_id).claimed
    assert external_run_get(owner="robot2", run_id=answer.run_id).id == answer.run_id


def test_a_new_agent_account_named_like_a_deleted_one_owns_none_of_its_calls(agent_config, alice):
    agent_config(GATE_POLICY)
    robot, _ = services.user_create(username="robot", role="agent")
    answer = _gate("robot")
    flows.decide(answer.approval_id, "approved", by="alice")

    robot.delete()
    services.user_create(username="robot", role="agent")

    with pytest.raises(services.NotFound):
        gateway.external_call_claim(owner="robot", approval_id=answer.approval_id)
    with pytest.raises(services.NotFound):
        external_run_get(owner="robot", run_id=answer.run_id)
    with pytest.raises(gateway.Conflict, match="new session"):
        _gate("robot", call_id="c2")  # the same session: the departed account's run
    assert ToolCall.objects.filter(run_id=answer.run_id).count() == 1
    assert _gate("robot", session="s2").decision == "pending"  # a session of its own


@pytest.mark.parametrize("leaves", ["deleted", "renamed"])
def test_a_grant_for_a_departed_agent_accounts_calls_does_not_decide_a_new_accounts(agent_config, alice, leaves):
    agent_config(GATE_POLICY)
    robot, _ = services.user_create(username="robot", role="agent")
    flows.decide(_gate("robot").approval_id, "approved", by="alice", remember=TOOL_HOUR)
    if leaves == "deleted":
        robot.delete()
    else:
        _rename(robot, "robot2")

    services.user_create(username="robot", role="agent")

    assert _gate("robot", session="s2").decision == "pending"
    assert Grant.objects.get().revoked_by == "system"


def test_what_a_rename_hands_on_is_audited_once_by_the_system(agent_config, alice, bob):
    agent_config(support_yaml(quorum=2))
    [approval] = flows.pending(flows.start(PROMPT))
    flows.decide(approval, "approved", by="alice", auto_resume=False)
    _started_by_alice()

    _rename(alice, "alicia")

    [entry] = AuditEntry.objects.filter(actor="system", source=AuditEntry.Source.SYSTEM)
    assert (entry.action, entry.outcome) == ("renamed", AuditEntry.Outcome.DECIDED)
    assert entry.detail == {"reason": "alice was renamed alicia", "runs": 1, "votes": 1}


def test_a_rename_onto_a_name_that_voted_the_same_on_a_pending_call_merges_the_two_votes(agent_config, alice, bob):
    agent_config(support_yaml(quorum=3))
    [approval] = flows.pending(flows.start(PROMPT))
    flows.decide(approval, "approved", by="alice", auto_resume=False)
    cli = services.Attempt(actor="ops-bot", source="cli")  # `agentfast approvals approve ID --by ops-bot`
    services.approval_decide(approval_id=approval.id, decision="approved", attempt=cli, auto_resume=False)

    _rename(alice, "ops-bot")  # Django admin's user change form: it saves, nothing refused

    assert User.objects.filter(username="ops-bot").exists()
    assert Approval.objects.get(pk=approval.id).counted_voters == ["ops-bot"]  # one name, one vote
    [entry] = AuditEntry.objects.filter(actor="system", action="renamed")
    assert entry.detail == {"reason": "alice was renamed ops-bot", "runs": 0, "votes": 0, "merged": 1}
    decided = flows.decide(approval, "approved", by="bob", auto_resume=False)
    assert (decided.outcome, decided.approval.status) == ("voted", Approval.Status.PENDING)
