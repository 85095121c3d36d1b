"""A reviewer's edit meets the policy again; a repeated decision never drops what it says; a later vote replaces one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry, Run, SideEffect, Vote
from agents.runtime import outputs
from tests.support.flows import decide, pending, resume, start

SMALL_ORDER = "Refund order A1010 for 25.00 USD"  # 2,500 cents: the tool's own settings ask one reviewer
LARGE = "Refund order A1004 for 75.00 USD"  # 7,500 cents: the demo's `large refunds` rule asks two


def _edit(approval: Approval, cents: int) -> dict:
    return {**approval.tool_call.arguments, "amount_cents": cents}


# -- an edit is judged by the policy again ---------------------------------------------


def test_it_refuses_an_edit_that_a_deny_rule_refuses(db, alice: User):
    [approval] = pending(start(SMALL_ORDER))

    with pytest.raises(services.NotPermitted, match="refunds over 1,000.00 need a ticket") as refused:
        decide(approval, "approved", by="alice", arguments=_edit(approval, 200_000))

    assert refused.value.details["field"] == "arguments"
    approval.refresh_from_db()
    assert (approval.status, approval.arguments) == ("pending", None)
    assert not Vote.objects.filter(approval=approval).exists()
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.outcome, entry.detail["arguments"]["amount_cents"]) == ("not_permitted", 200_000)


def test_it_refuses_an_edit_that_needs_more_approvals_than_the_approval_asks(db, alice: User):
    [approval] = pending(start(SMALL_ORDER))
    assert approval.quorum == 1

    with pytest.raises(services.NotPermitted, match=r"need 2 approvals from any reviewer \(rule large refunds\)"):
        decide(approval, "approved", by="alice", arguments=_edit(approval, 7_500))

    approval.refresh_from_db()
    assert approval.status == "pending"
    resume(approval.run)
    assert not SideEffect.objects.exists()


def test_it_takes_an_edit_the_approval_already_asks_enough_for(db, alice: User):
    [approval] = pending(start(SMALL_ORDER))

    decision = decide(approval, "approved", by="alice", arguments=_edit(approval, 2_000), auto_resume=False)

    assert (decision.outcome, decision.approval.status) == ("decided", "approved")
    resume(approval.run)
    assert SideEffect.objects.get().arguments["amount_cents"] == 2_000


def test_it_answers_a_refused_edit_on_the_api_with_403_naming_the_rule(db, alice: User):
    [approval] = pending(start(SMALL_ORDER))
    client = Client()
    client.force_login(alice)

    response = client.post(
        f"/api/approvals/{approval.id}/decide",
        {"decision": "approved", "arguments": _edit(approval, 200_000)},
        content_type="application/json",
    )

    assert response.status_code == 403
    body = response.json()
    assert (body["error_code"], body["field"]) == ("not_permitted", "arguments")
    assert "refunds over 1,000.00 need a ticket" in body["message"]


# -- a repeat that says something new is refused, and audited with what it said ----------


def test_it_refuses_a_repeated_rejection_with_another_note_and_audits_it(db, alice: User, bob: User):
    [approval] = pending(start(SMALL_ORDER))
    decide(approval, "rejected", by="alice", note="first note", auto_resume=False)

    with pytest.raises(services.AlreadyDecided, match="your note was not recorded"):
        decide(approval, "rejected", by="bob", note="my own reason", auto_resume=False)
    with pytest.raises(services.AlreadyDecided, match="your feedback was not recorded"):
        decide(approval, "rejected", by="alice", feedback="please make it 10.00", auto_resume=False)

    approval.refresh_from_db()
    assert (approval.note, approval.feedback, approval.decided_by) == ("first note", "", "alice")
    refused = AuditEntry.objects.filter(approval_id=approval.id, outcome="already_decided").order_by("id")
    assert [(e.actor, e.detail.get("note"), e.detail.get("feedback")) for e in refused] == [
        ("bob", "my own reason", None),
        ("alice", "", "please make it 10.00"),
    ]


@pytest.mark.parametrize("note", ["first note", "", "  "])
def test_it_keeps_a_repeat_that_says_nothing_new_idempotent(db, alice: User, note: str):
    [approval] = pending(start(SMALL_ORDER))
    decide(approval, "rejected", by="alice", note="first note", auto_resume=False)

    assert decide(approval, "rejected", by="alice", note=note, auto_resume=False).outcome == "idempotent"


def test_it_keeps_a_retried_approval_that_sends_the_proposed_arguments_idempotent(db, alice: User):
    # A script (or a form) that always sends the arguments it showed: the same request again.
    [approval] = pending(start(SMALL_ORDER))
    proposed = dict(approval.tool_call.arguments)
    decide(approval, "approved", by="alice", arguments=proposed, auto_resume=False)

    assert decide(approval, "approved", by="alice", arguments=proposed, auto_resume=False).outcome == "idempotent"
    with pytest.raises(services.AlreadyDecided):
        decide(approval, "approved", by="alice", arguments=_edit(approval, 1500), auto_resume=False)


def test_it_refuses_a_second_answer_to_a_question_already_answered(db, alice: User):
    [approval] = pending(start("Ask a human whether to expedite order A1003"))
    decide(approval, "approved", by="alice", payload={"answer": "yes"}, auto_resume=False)

    with pytest.raises(services.AlreadyDecided, match="your answer was not recorded"):
        decide(approval, "approved", by="alice", payload={"answer": "NO, do not"}, auto_resume=False)
    assert decide(approval, "approved", by="alice", payload={"answer": "yes"}, auto_resume=False).outcome == (
        "idempotent"
    )


def test_it_answers_409_on_the_api_to_a_repeat_with_new_words(db, alice: User):
    [approval] = pending(start(SMALL_ORDER))
    decide(approval, "rejected", by="alice", note="first note", auto_resume=False)
    client = Client()
    client.force_login(alice)

    response = client.post(
        f"/api/approvals/{approval.id}/decide",
        {"decision": "rejected", "note": "second thoughts"},
        content_type="application/json",
    )

    assert response.status_code == 409
    assert "your note was not recorded" in response.json()["message"]


def test_it_keeps_a_voters_new_note_on_a_repeated_vote(db, alice: User, bob: User):
    [approval] = pending(start(LARGE))
    decide(approval, "approved", by="alice", note="looks right", auto_resume=False)

    again = decide(approval, "approved", by="alice", note="checked the order too", auto_resume=False)

    assert (again.outcome, again.approval.tally) == ("voted", "1 of 2 approvals: alice")
    assert list(Vote.objects.filter(approval=approval).values_list("voter", "note")) == [
        ("alice", "checked the order too")
    ]


# -- a voter's later vote replaces their earlier one ---------------------------------------


def test_it_does_not_count_a_vote_its_voter_replaced_with_an_edit(db, alice: User, bob: User):
    [approval] = pending(start(LARGE))
    original = approval.tool_call.arguments["amount_cents"]
    decide(approval, "approved", by="alice", auto_resume=False)
    decide(approval, "approved", by="alice", arguments=_edit(approval, 7_000), auto_resume=False)

    # Bob edits back to the amount alice approved first: her last vote is for 7,000, so only bob's counts.
    by_bob = decide(approval, "approved", by="bob", arguments=_edit(approval, original), auto_resume=False)

    assert (by_bob.outcome, by_bob.approval.status, by_bob.approval.tally) == (
        "voted",
        "pending",
        "1 of 2 approvals: bob",
    )
    # Alice approving the amount again makes it her vote once more: now two people approve it.
    by_alice = decide(approval, "approved", by="alice", auto_resume=False)
    assert (by_alice.outcome, by_alice.approval.status) == ("decided", "approved")
    assert resume(approval.run).status == Run.Status.COMPLETED
    assert SideEffect.objects.get().arguments["amount_cents"] == original


def test_it_marks_only_each_voters_last_vote_as_counting_on_the_api(db, alice: User, bob: User):
    [approval] = pending(start(LARGE))
    decide(approval, "approved", by="alice", auto_resume=False)
    decide(approval, "approved", by="alice", arguments=_edit(approval, 7_000), auto_resume=False)
    decide(approval, "approved", by="bob", arguments=_edit(approval, 7_500), auto_resume=False)
    client = Client()
    client.force_login(bob)

    body = client.get(f"/api/approvals/{approval.id}").json()

    assert [(v["voter"], v["counts"]) for v in body["votes"]] == [("alice", False), ("alice", False), ("bob", True)]
    assert body["tally"] == "1 of 2 approvals: bob"


def test_it_tells_the_model_no_reason_was_given_for_a_blank_note():
    assert outputs.rejected("refund_request", "   ")["message"] == "A human rejected 'refund_request': no reason given"
