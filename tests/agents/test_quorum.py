"""Quorum and bound decisions: distinct approvals of the same arguments, digests, and exactly one execution."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import runtime, services
from agents.models import Approval, AuditEntry, Run, SideEffect, Vote, arguments_digest
from dashboard import cli
from dashboard.live import consumers
from tests.agents.test_races import RUNNERS, N
from tests.support.flows import decide, pending, resume, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def canonical_digest(arguments: dict) -> str:
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def two_needed(agent_config: Callable[[str], Path], alice: User, bob: User, carol: User) -> Approval:
    agent_config(support_yaml(quorum=2))
    [approval] = pending(start(REFUND))
    return approval


def test_it_stores_the_digest_of_the_canonical_json_of_the_arguments(two_needed: Approval):
    expected = canonical_digest(two_needed.tool_call.arguments)

    assert two_needed.arguments_digest == expected == arguments_digest(two_needed.tool_call.arguments)
    assert two_needed.short_digest == expected[:12]


def test_it_runs_the_call_once_two_distinct_reviewers_approved(two_needed: Approval):
    first = decide(two_needed, "approved", by="alice", auto_resume=False)
    assert (first.outcome, first.approval.status, first.approval.tally) == (
        "voted",
        "pending",
        "1 of 2 approvals: alice",
    )

    again = decide(two_needed, "approved", by="alice", auto_resume=False)
    assert again.outcome == "idempotent"
    assert Vote.objects.filter(approval=two_needed).count() == 1

    last = decide(two_needed, "approved", by="bob", auto_resume=False)
    assert (last.outcome, last.approval.status, last.approval.decided_by) == ("decided", "approved", "bob")
    run = resume(two_needed.run)
    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(idempotency_key=two_needed.id).count() == 1
    outcomes = list(AuditEntry.objects.filter(approval_id=two_needed.id).order_by("id").values_list("outcome", "actor"))
    assert outcomes == [("voted", "alice"), ("idempotent", "alice"), ("decided", "bob")]


def test_it_rejects_at_once_on_one_eligible_rejection(two_needed: Approval):
    decide(two_needed, "approved", by="alice", auto_resume=False)

    result = decide(two_needed, "rejected", by="bob", note="no", auto_resume=False)

    assert (result.outcome, result.approval.status) == ("decided", "rejected")
    assert list(Vote.objects.filter(approval=two_needed).values_list("voter", "decision")) == [
        ("alice", "approved"),
        ("bob", "rejected"),
    ]


def test_it_counts_only_approvals_of_the_current_arguments_after_an_edit(two_needed: Approval):
    original = two_needed.tool_call.arguments
    decide(two_needed, "approved", by="alice", auto_resume=False)
    edited = {**original, "amount_cents": original["amount_cents"] - 500}

    by_bob = decide(two_needed, "approved", by="bob", arguments=edited, auto_resume=False)

    # Bob's edit is his approval of the new arguments; alice's approval of the old ones no longer counts.
    assert (by_bob.outcome, by_bob.approval.tally) == ("voted", "1 of 2 approvals: bob")
    two_needed.refresh_from_db()
    assert two_needed.arguments_digest == canonical_digest(edited) != canonical_digest(original)
    by_alice = decide(two_needed, "approved", by="alice", auto_resume=False)
    assert (by_alice.outcome, by_alice.approval.status) == ("decided", "approved")
    resume(two_needed.run)
    [effect] = SideEffect.objects.filter(idempotency_key=two_needed.id)
    assert effect.arguments["amount_cents"] == edited["amount_cents"]
    votes = Vote.objects.filter(approval=two_needed).order_by("id")
    assert [(v.voter, v.arguments_digest == canonical_digest(edited)) for v in votes] == [
        ("alice", False),
        ("bob", True),
        ("alice", True),
    ]


def test_it_binds_every_vote_to_the_digest_and_the_policy_version(two_needed: Approval):
    Approval.objects.filter(pk=two_needed.pk).update(policy_version="v-test")  # engineer A's loader fills it
    decide(two_needed, "approved", by="alice", auto_resume=False)
    decide(two_needed, "approved", by="bob", auto_resume=False)

    votes = Vote.objects.filter(approval=two_needed)
    assert {(v.arguments_digest, v.policy_version) for v in votes} == {(two_needed.arguments_digest, "v-test")}
    decided = AuditEntry.objects.get(approval_id=two_needed.id, outcome="decided")
    assert (decided.detail["arguments_digest"], decided.detail["policy_version"]) == (
        two_needed.arguments_digest,
        "v-test",
    )


def test_it_refuses_a_stale_digest_on_the_api_with_409_and_the_current_digest(two_needed: Approval):
    stale = two_needed.arguments_digest
    edited = {**two_needed.tool_call.arguments, "amount_cents": 100}
    decide(two_needed, "approved", by="bob", arguments=edited, auto_resume=False)
    token = services.token_create(username="alice")[1]

    response = Client().post(
        f"/api/approvals/{two_needed.id}/decide",
        data={"decision": "approved", "expect_digest": stale},
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )

    assert response.status_code == 409
    body = response.json()
    assert (body["error_code"], body["arguments_digest"]) == ("digest_mismatch", canonical_digest(edited))
    refused = AuditEntry.objects.get(approval_id=two_needed.id, outcome="digest_mismatch")
    assert (refused.actor, refused.detail["expect_digest"]) == ("alice", stale)
    assert Vote.objects.filter(approval=two_needed, voter="alice").count() == 0


def test_it_accepts_the_current_digest_on_the_api_and_answers_with_the_votes(two_needed: Approval):
    token = services.token_create(username="alice")[1]

    response = Client().post(
        f"/api/approvals/{two_needed.id}/decide",
        data={"decision": "approved", "expect_digest": two_needed.arguments_digest[:12]},
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )

    assert response.status_code == 200
    body = response.json()
    assert (body["outcome"], body["status"], body["tally"], body["quorum"]) == (
        "voted",
        "pending",
        "1 of 2 approvals: alice",
        2,
    )
    assert [(v["voter"], v["counts"]) for v in body["votes"]] == [("alice", True)]
    assert body["arguments_digest"] == two_needed.arguments_digest


def test_it_refuses_a_stale_digest_on_the_web_with_409(two_needed: Approval, alice: User):
    stale = two_needed.arguments_digest
    decide(two_needed, "approved", by="bob", arguments={**two_needed.tool_call.arguments, "amount_cents": 100})
    client = Client()
    client.force_login(alice)

    response = client.post(f"/approvals/{two_needed.id}/decide", {"decision": "approved", "expect_digest": stale})

    assert response.status_code == 409
    assert "the arguments changed since you saw them" in response.content.decode()
    assert AuditEntry.objects.filter(approval_id=two_needed.id, outcome="digest_mismatch").count() == 1


def test_it_refuses_a_stale_digest_in_the_cli_and_prints_the_vote_otherwise(two_needed: Approval, capsys):
    stale = two_needed.arguments_digest[:12]
    code = cli.main(["approvals", "approve", two_needed.id, "--by", "alice", "--expect-digest", stale])
    out = capsys.readouterr().out
    assert code == 0 and "1 of 2 approvals: alice" in out

    decide(two_needed, "approved", by="bob", arguments={**two_needed.tool_call.arguments, "amount_cents": 100})
    code = cli.main(["approvals", "approve", two_needed.id, "--by", "carol", "--expect-digest", stale])
    err = capsys.readouterr().err
    assert code == 1 and "the arguments changed since you saw them" in err


def test_it_shows_the_digest_and_the_votes_in_approvals_show(two_needed: Approval, capsys):
    decide(two_needed, "approved", by="alice")

    assert cli.main(["approvals", "show", two_needed.id]) == 0
    out = capsys.readouterr().out

    assert f"digest:      {two_needed.arguments_digest[:12]}" in out
    assert "votes:       1 of 2 approvals: alice" in out


def test_the_next_approver_reads_why_the_others_approved(two_needed: Approval, bob: User, capsys):
    note = "Checked with <b>finance</b>:\nthe limit holds"
    decide(two_needed, "approved", by="alice", note=note)
    client = Client()
    client.force_login(bob)

    assert two_needed.notes_so_far == [("alice", note)]
    shown = "Notes so far: alice: “Checked with &lt;b&gt;finance&lt;/b&gt;:\nthe limit holds”"
    for page in (f"/approvals/{two_needed.id}", "/"):  # on the approval page and the inbox card
        assert shown in client.get(page).content.decode(), page
    assert cli.main(["approvals", "show", two_needed.id]) == 0
    assert f"noted:       alice: {note}\n" in capsys.readouterr().out

    decide(two_needed, "approved", by="alice", note="and the address")  # new words: her note now
    decide(two_needed, "approved", by="alice")  # the same vote again, no words: her note stays
    assert two_needed.notes_so_far == [("alice", "and the address")]

    decide(two_needed, "approved", by="bob", note="fine")
    two_needed.refresh_from_db()
    assert (
        two_needed.status == "approved" and two_needed.notes_so_far == []
    )  # decided: the notes are the votes' and the audit's
    assert "Notes so far" not in client.get(f"/approvals/{two_needed.id}").content.decode()


def test_the_inbox_reads_the_notes_of_all_its_cards_at_once(two_needed: Approval, bob: User):
    client = Client()
    client.force_login(bob)

    def queries_with_noted_cards(count: int) -> int:
        while Approval.objects.filter(status="pending").count() < count:
            pending(start(REFUND))
        for approval in Approval.objects.filter(status="pending"):
            decide(approval, "approved", by="alice", note=f"checked {approval.pk}")
        with CaptureQueriesContext(connection) as page:
            html = client.get("/").content.decode()
        assert html.count("Notes so far: alice: “checked ") == count
        return len(page.captured_queries)

    assert queries_with_noted_cards(1) == queries_with_noted_cards(4)


def test_a_pushed_card_reads_its_votes_once_for_every_variant(two_needed: Approval):
    decide(two_needed, "approved", by="alice", note="checked")

    with CaptureQueriesContext(connection) as reads:
        approval = consumers._described_approval(two_needed.id)
        cards = [
            consumers._card_html(approval, decidable, replace, "top")
            for decidable in (True, False)
            for replace in (True, False)
        ]

    assert all("1 of 2 approvals: alice" in card and "Notes so far: alice: “checked”" in card for card in cards)
    vote_reads = [query["sql"] for query in reads.captured_queries if "agents_vote" in query["sql"]]
    assert len(vote_reads) == 1, vote_reads  # not one for the tally and one for the notes, per variant


@pytest.mark.parametrize("runner", RUNNERS)
def test_it_executes_once_when_32_eligible_reviewers_race_to_approve(transactional_db, agent_config, runner):
    agent_config(support_yaml(approvers=["finance"], quorum=3))
    for i in range(N):
        services.user_create(username=f"reviewer{i}", role="reviewer", groups=("finance",))
    run = start(REFUND)
    [approval] = pending(run)

    def vote(i: int) -> str:
        return decide(approval.id, "approved", by=f"reviewer{i}", auto_resume=False).outcome

    results = RUNNERS[runner](vote)

    counts = Counter(results)
    assert (counts["voted"], counts["decided"], counts["idempotent"]) == (2, 1, N - 3), results
    assert AuditEntry.objects.filter(approval_id=approval.id).count() == N  # every vote audited
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert len(approval.counted_voters) == 3
    runtime.drive(run.id, stream=False)
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1


def test_it_stops_counting_the_approval_of_someone_whose_account_was_deleted(two_needed: Approval):
    services.user_create(username="dave", role="reviewer")
    signed_in = services.Attempt(actor="dave", source=AuditEntry.Source.WEB, origin="tests")
    services.approval_decide(approval_id=two_needed.id, decision="approved", attempt=signed_in, auto_resume=False)
    User.objects.filter(username="dave").delete()  # as the admin site does: like a deactivation, dave has no say

    assert Approval.objects.get(pk=two_needed.pk).tally == "0 of 2 approvals"
    second = decide(two_needed, "approved", by="alice", auto_resume=False)
    assert (second.outcome, second.approval.status) == ("voted", "pending")
    # A name the CLI records as given, which no account ever had, still counts as before.
    last = decide(two_needed, "approved", by="night-shift", auto_resume=False)
    assert (last.outcome, last.approval.status) == ("decided", "approved")
    decided = AuditEntry.objects.get(approval_id=two_needed.id, outcome=AuditEntry.Outcome.DECIDED)
    assert decided.detail["votes"] == ["alice", "night-shift"]
