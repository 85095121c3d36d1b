"""Deciding from the dashboard when the decision is refused: what the reviewer typed stays on the page."""

from __future__ import annotations

import html
import json

import pytest

from agents import services
from agents.models import Approval, Grant
from tests.support.flows import decide, pending, start
from tests.support.policies import support_yaml


def decide_url(approval: Approval) -> str:
    return f"/approvals/{approval.id}/decide"


def test_it_keeps_the_note_and_edit_when_remembering_is_refused(client_for, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))  # quorum 2: cannot be remembered
    edited = {"order_id": "A1004", "amount_cents": 7100}

    response = client_for(alice).post(
        decide_url(approval),
        {
            "decision": "approved",
            "arguments": json.dumps(edited),
            "note": "checked with the customer",
            "remember": "3600",
            "expect_digest": approval.digest,
        },
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 403 and "cannot be remembered" in page
    assert ">checked with the customer</textarea>" in page
    assert '"amount_cents": 7100' in page
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and not Grant.objects.exists()


def test_it_keeps_the_note_and_edit_in_the_htmx_panel_when_remembering_is_refused(client_for, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))

    response = client_for(alice).post(
        decide_url(approval),
        {"decision": "approved", "note": "checked with the customer", "remember": "3600"},
        headers={"HX-Request": "true", "HX-Target": "decision"},
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 403 and "cannot be remembered" in page
    assert ">checked with the customer</textarea>" in page


def test_it_keeps_the_note_but_shows_the_new_arguments_when_they_changed_meanwhile(client_for, alice, bob, carol):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))  # quorum 2
    seen = approval.digest
    decide(approval, "approved", by="bob", arguments={"order_id": "A1004", "amount_cents": 6000})

    response = client_for(alice).post(
        decide_url(approval),
        {
            "decision": "approved",
            "arguments": json.dumps({"order_id": "A1004", "amount_cents": 7500}),
            "note": "fine by me",
            "expect_digest": seen,
        },
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 409 and "the arguments changed since you saw them" in page
    assert ">fine by me</textarea>" in page
    # The editor holds the arguments as they now are, bound to their digest: a second click approves what it shows.
    approval.refresh_from_db()
    assert '"amount_cents": 6000' in page and f'name="expect_digest" value="{approval.digest}"' in page
    assert approval.status == Approval.Status.PENDING


def test_it_keeps_an_edit_the_policy_refuses_for_the_reviewer_to_correct(client_for, alice):
    [approval] = pending(start("Refund order A1002 for 25.00 USD"))  # asks one approval
    typed = '{"order_id": "A1002", "amount_cents": 6000}'  # over 50.00 needs two

    response = client_for(alice).post(
        decide_url(approval),
        {"decision": "approved", "arguments": typed, "note": "as agreed", "expect_digest": approval.short_digest},
        headers={"HX-Request": "true", "HX-Target": "decision"},
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 403 and "these arguments need 2 approvals" in page
    assert f">{typed}</textarea>" in page and ">as agreed</textarea>" in page


def test_it_shows_what_the_reviewer_wrote_when_someone_decided_first(client_for, alice, bob, approval):
    decide(approval, "approved", by="bob")

    response = client_for(alice).post(
        decide_url(approval),
        {"decision": "rejected", "note": "the customer withdrew the request", "feedback": "ask the customer first"},
        headers={"HX-Request": "true", "HX-Target": f"card-{approval.id}"},
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 409 and "Someone decided first" in page
    assert "the customer withdrew the request" in page and "ask the customer first" in page


def test_it_shows_the_edit_that_came_too_late_on_the_page(client_for, alice, bob, approval):
    decide(approval, "rejected", by="bob", note="duplicate")

    response = client_for(alice).post(
        decide_url(approval),
        {"decision": "approved", "arguments": '{"order_id": "A1001", "amount_cents": 1234}'},
    )

    page = html.unescape(response.content.decode())
    assert response.status_code == 409 and "Someone decided first" in page
    assert "Your arguments (not recorded)" in page and '"amount_cents": 1234' in page


def test_it_brings_a_reviewer_signed_out_mid_decision_back_to_the_approval(client, client_for, alice, approval):
    # Signed out meanwhile, the form (without htmx) is sent to the sign-in page, which returns to the decide URL.
    sent = client.post(decide_url(approval), {"decision": "approved"})
    assert sent.status_code == 302 and sent.url.startswith("/accounts/login/?next=")

    back = client_for(alice).get(decide_url(approval))

    assert back.status_code == 302 and back.url == f"/approvals/{approval.id}"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_it_brings_a_reviewer_signed_out_mid_bulk_decision_back_to_the_inbox(client, client_for, alice):
    sent = client.post("/approvals/bulk", {"decision": "approved"})
    assert sent.status_code == 302 and sent.url.startswith("/accounts/login/?next=")

    back = client_for(alice).get("/approvals/bulk")

    assert back.status_code == 302 and back.url == "/"


def test_it_clears_the_deadline_of_an_approval_decided_on_its_page(agent_config, client_for, alice):
    agent_config(support_yaml(timeout="10m"))
    [approval] = pending(start("Refund order A1001 for 25.00 USD"))
    page = client_for(alice).get(f"/approvals/{approval.id}").content.decode()
    assert f'id="deadline-{approval.id}"' in page and "Extend by 1 h" in page

    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved"}, headers={"HX-Request": "true", "HX-Target": "decision"}
    )

    answer = response.content.decode()
    assert response.status_code == 200
    # The deadline's part is swapped out of band with nothing: no "then it is rejected" beside an approval.
    assert f'<div id="deadline-{approval.id}" hx-swap-oob="true" hidden></div>' in answer
    assert "Extend by 1 h" not in answer


def test_it_shows_the_call_as_edited_by_a_vote_on_its_page(client_for, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))  # quorum 2: the vote leaves it pending
    before = approval.short_digest

    response = client_for(alice).post(
        decide_url(approval),
        {"decision": "approved", "arguments": '{"order_id": "A1004", "amount_cents": 6000}'},
        headers={"HX-Request": "true", "HX-Target": "decision"},
    )

    answer = html.unescape(response.content.decode())
    approval.refresh_from_db()
    assert response.status_code == 200 and approval.status == Approval.Status.PENDING
    assert approval.short_digest != before
    # The call's panel is swapped too: its arguments and digest are the edited ones the next approver approves.
    call = answer[answer.index('id="call"') :]
    assert 'hx-swap-oob="true"' in call[:80]
    assert '"amount_cents": 6000' in call and approval.short_digest in call


def test_it_marks_a_refused_htmx_decision_as_the_answer_to_show(client_for, alice, bob):
    [approval] = pending(start("Refund order A1004 for 75.00 USD"))
    card = {"HX-Request": "true", "HX-Target": f"card-{approval.id}"}

    refused = client_for(alice).post(decide_url(approval), {"decision": "approved", "remember": "3600"}, headers=card)

    assert refused.status_code == 403 and refused["X-Agentfast-Refusal"] == "not-permitted"
    assert "cannot be remembered" in refused.content.decode()
    # A 403 that is no decision's answer (not a reviewer at all) is not marked: htmx leaves it unswapped.
    bob.groups.clear()
    bob.user_permissions.clear()
    page = client_for(bob).post(decide_url(approval), {"decision": "approved"}, headers=card)
    assert page.status_code == 403 and "X-Agentfast-Refusal" not in page


def test_it_says_a_card_expired_rather_than_that_someone_decided_it_in_bulk(client_for, alice, approval):
    services.approval_expire(approval=approval, actor="deadline", reason="no decision in 10 min", resume=False)

    response = client_for(alice).post(
        "/approvals/bulk", {"decision": "approved", "cards": [f"{approval.id}:{approval.digest}"]}
    )

    page = html.unescape(response.content.decode())
    assert "0 of 1 approved" in page
    assert f"{approval.id}</code></a>: not decided: approval {approval.id} was already expired by deadline" in page
    assert "someone decided it first" not in page


@pytest.mark.parametrize("target", ["card", "decision", None])
def test_it_says_a_call_expired_rather_than_that_someone_decided_it_first(client_for, alice, approval, target):
    services.approval_expire(approval=approval, actor="deadline", reason="no decision in 10 min", resume=False)
    headers = (
        {}
        if target is None
        else {"HX-Request": "true", "HX-Target": f"card-{approval.id}" if target == "card" else target}
    )

    response = client_for(alice).post(decide_url(approval), {"decision": "rejected", "note": "dupe"}, headers=headers)

    page = html.unescape(response.content.decode())
    assert response.status_code == 409
    assert "The call expired first: your decision was not recorded." in page
    assert "Someone decided first" not in page
    assert "Your note (not recorded)" in page


def test_it_shows_the_bulk_note_back_when_nothing_was_decided(client_for, alice, approval):
    response = client_for(alice).post("/approvals/bulk", {"decision": "rejected", "note": "all duplicates <b>x</b>"})

    page = response.content.decode()
    assert response.status_code == 400 and "Nothing was decided" in page
    assert "all duplicates &lt;b&gt;x&lt;/b&gt;" in page
