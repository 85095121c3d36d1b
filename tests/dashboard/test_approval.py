"""The approval page and its decisions: approve, edit and approve, reject, revise, conflicts."""

from __future__ import annotations

import json

import pytest

from agents import services
from agents.models import Approval, AuditEntry, Message, SideEffect
from tests.support.flows import decide, pending, resume, start


def decide_url(approval: Approval) -> str:
    return f"/approvals/{approval.id}/decide"


def test_it_shows_the_call_the_conversation_and_the_tool(client_for, alice, approval):
    response = client_for(alice).get(f"/approvals/{approval.id}")

    html = response.content.decode()
    assert response.status_code == 200
    assert "&quot;amount_cents&quot;: 2500" in html
    # The conversation so far: the task, the lookup and its result, the model's words.
    assert "Refund order A1001 for 25.00 USD" in html and "lookup_order" in html
    assert "customer1@example.com" in html and "Let me look up order A1001 first." in html
    # The tool's description and argument schema.
    assert "Refund part or all of an order to the customer&#x27;s card." in html
    assert "Amount to refund, in cents" in html
    # The editor is prefilled with the proposal.
    assert 'name="arguments"' in html and "&quot;order_id&quot;: &quot;A1001&quot;" in html
    assert 'name="csrfmiddlewaretoken"' in html


def test_it_answers_404_for_an_unknown_approval(client_for, alice):
    assert client_for(alice).get("/approvals/appr_nope").status_code == 404
    assert client_for(alice).post("/approvals/appr_nope/decide", {"decision": "approved"}).status_code == 404


def test_it_approves_and_records_the_web_decision(client_for, alice, approval, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():
        response = client_for(alice).post(
            decide_url(approval), {"decision": "approved", "arguments": json.dumps(approval.tool_call.arguments)}
        )

    assert response.status_code == 302 and response.url == f"/approvals/{approval.id}"
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.arguments) == ("approved", "alice", None)
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.actor, entry.source, entry.outcome, entry.origin) == ("alice", "web", "decided", "127.0.0.1")


def test_it_approves_with_edited_arguments(client_for, alice, approval):
    edited = {"order_id": "A1001", "amount_cents": 1500}

    client_for(alice).post(decide_url(approval), {"decision": "approved", "arguments": json.dumps(edited)})

    approval.refresh_from_db()
    assert approval.status == "approved" and approval.arguments == edited
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert entry.detail["arguments_diff"] == {"amount_cents": [2500, 1500]}


def test_it_shows_a_schema_error_next_to_the_arguments_and_audits_it(client_for, alice, approval):
    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved", "arguments": '{"order_id": "A1001", "amount_cents": "lots"}'}
    )

    html = response.content.decode()
    assert response.status_code == 422
    assert 'id="arguments-error"' in html and "amount_cents" in html and "aria-invalid" in html
    assert "&quot;lots&quot;" in html  # the reviewer's text is kept in the editor
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert AuditEntry.objects.get(approval_id=approval.id).outcome == "invalid_arguments"


def test_it_refuses_arguments_that_the_tools_own_check_refuses(client_for, alice, approval):
    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved", "arguments": '{"order_id": "A1001", "amount_cents": 999999}'}
    )

    assert response.status_code == 422
    assert "at most the order total" in response.content.decode()
    assert Approval.objects.get(pk=approval.id).status == "pending"


def test_it_refuses_and_audits_arguments_that_are_not_json(client_for, alice, approval):
    for text, message in (("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object")):
        response = client_for(alice).post(decide_url(approval), {"decision": "approved", "arguments": text})
        assert response.status_code == 422
        assert message in response.content.decode()
    assert Approval.objects.get(pk=approval.id).status == "pending"
    refusals = AuditEntry.objects.filter(approval_id=approval.id, outcome="invalid_arguments", source="web")
    assert (
        refusals.count() == 2
        and "arguments: These arguments cannot be used: not valid JSON" in refusals.last().detail["error"]
    )


def test_it_rejects_with_a_note_and_ignores_the_editor(client_for, alice, approval):
    client_for(alice).post(
        decide_url(approval),
        {"decision": "rejected", "note": "customer already refunded", "arguments": '{"amount_cents": 1}'},
    )

    approval.refresh_from_db()
    assert (approval.status, approval.note, approval.arguments, approval.feedback) == (
        "rejected",
        "customer already refunded",
        None,
        "",
    )


@pytest.mark.parametrize("editor", ['{"order_id": "A1001", "amount_cents": ', "[1, 2]", '{"amount_cents": NaN}'])
def test_it_rejects_with_a_note_whatever_is_left_in_the_editor(client_for, alice, approval, editor):
    """A reviewer who began an edit, then chose to reject, is not stopped by the edit they abandoned."""
    response = client_for(alice).post(
        decide_url(approval), {"decision": "rejected", "note": "customer already refunded", "arguments": editor}
    )

    approval.refresh_from_db()
    assert response.status_code == 302
    assert (approval.status, approval.note, approval.arguments) == ("rejected", "customer already refunded", None)
    assert not AuditEntry.objects.filter(outcome=AuditEntry.Outcome.INVALID_ARGUMENTS).exists()


def test_it_rejects_with_feedback_for_the_model_to_revise(client_for, alice, paused, approval):
    client_for(alice).post(
        decide_url(approval), {"decision": "rejected", "note": "too much", "feedback": "make it 20.00"}
    )

    approval.refresh_from_db()
    assert approval.feedback == "make it 20.00"

    run = resume(paused)
    assert Message.objects.filter(run=run, role="user", content="make it 20.00").exists()
    [revised] = pending(run)
    assert revised.tool_call.arguments == {"order_id": "A1001", "amount_cents": 2000}


def test_it_shows_who_decided_first_instead_of_an_error(client_for, alice, bob, approval):
    decide(approval, "approved", by="bob")

    response = client_for(alice).post(decide_url(approval), {"decision": "rejected", "note": "no"})

    html = response.content.decode()
    assert response.status_code == 409
    assert "Someone decided first" in html
    assert "<strong>Approved</strong> by bob, <time" in html and "s</time> ago" in html
    assert Approval.objects.get(pk=approval.id).status == "approved"
    refused = AuditEntry.objects.get(approval_id=approval.id, actor="alice")
    assert (refused.outcome, refused.source, refused.action) == ("already_decided", "web", "rejected")


def test_it_answers_a_repeated_decision_with_the_existing_one(client_for, alice, approval):
    client = client_for(alice)
    client.post(decide_url(approval), {"decision": "approved"})

    response = client.post(decide_url(approval), {"decision": "approved"}, headers={"HX-Request": "true"})

    assert response.status_code == 200
    assert "<strong>Approved</strong> by alice" in response.content.decode()
    assert list(
        AuditEntry.objects.filter(approval_id=approval.id).values_list("outcome", flat=True).order_by("id")
    ) == [
        "decided",
        "idempotent",
    ]


def test_it_answers_htmx_with_the_decision_panel(client_for, alice, approval):
    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved"}, headers={"HX-Request": "true", "HX-Target": "decision"}
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="decision"') and "<html" not in html
    assert 'id="approval-status" class="badge status-approved" hx-swap-oob="true"' in html


def test_it_shows_a_decided_approval_with_its_decider(client_for, alice, bob, approval):
    decide(approval, "approved", by="bob", arguments={"order_id": "A1001", "amount_cents": 1500}, auto_resume=False)

    html = client_for(alice).get(f"/approvals/{approval.id}").content.decode()

    assert "<strong>Approved</strong> by bob" in html and "with edited arguments" in html
    assert "&quot;amount_cents&quot;: 1500" in html
    assert 'name="decision"' not in html


def test_it_takes_an_answer_for_a_tool_that_asks_a_question(client_for, alice):
    run = start("Ask a human whether to expedite order A1003")
    [question] = pending(run)
    client = client_for(alice)
    assert "Should we expedite order A1003?" in client.get(f"/approvals/{question.id}").content.decode()

    client.post(decide_url(question), {"decision": "approved", "answer": "yes, ship it"})

    question.refresh_from_db()
    assert question.payload == {"answer": "yes, ship it"}


# -- untrusted input (issue 7, items 2, 3, 15, 17) ------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"arguments": '{"order_id": "A1001", "amount_cents": NaN}'}, "NaN is not a JSON number"),
        ({"arguments": '{"order_id": "A1001", "amount_cents": Infinity}'}, "Infinity is not a JSON number"),
        ({"arguments": '{"order_id": "A1001", "x": ' + DEEP + "}"}, "nested deeper than"),
        ({"arguments": '{"order_id": "A1\\u0000001", "amount_cents": 1}'}, "NUL"),
        ({"arguments": '{"order_id": "\\ud800", "amount_cents": 1}'}, "lone surrogate"),
        ({"arguments": '{"order_id": "A1001", "amount_cents": true}'}, "amount_cents"),
        ({"arguments": '{"order_id": "A1001", "amount_cents": "1500"}'}, "amount_cents"),
        ({"arguments": '{"order_id": "A1001", "amount_cents": 1000.0}'}, "amount_cents"),
        ({"note": "fine\x00print"}, "Null characters are not allowed"),
        ({"feedback": "ask for the order total first"}, "feedback goes with a rejection"),
    ],
    ids=["nan", "infinity", "deep", "nul", "surrogate", "bool", "string-number", "float", "nul-note", "feedback"],
)
def test_it_refuses_bad_input_on_the_form_with_4xx_and_audits_it(client_for, alice, approval, fields, message):
    response = client_for(alice).post(decide_url(approval), {"decision": "approved", **fields})

    assert response.status_code == 422
    assert message in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.arguments is None
    [refusal] = AuditEntry.objects.filter(approval_id=approval.id, source="web")
    assert refusal.outcome == "invalid_arguments" and refusal.actor == "alice"
    assert SideEffect.objects.count() == 0


@pytest.mark.parametrize("blank", ["", "  \n\t "])
def test_it_refuses_to_approve_erased_arguments_and_keeps_the_text(client_for, alice, approval, blank):
    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved", "arguments": blank}, headers={"HX-Request": "true"}
    )

    html = response.content.decode()
    assert response.status_code == 422
    assert 'id="arguments-error" role="alert">The arguments are empty: put them back, or reset them' in html
    assert f'aria-describedby="arguments-error">{blank}</textarea>' in html and "data-reset-arguments" in html
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.arguments is None
    assert AuditEntry.objects.get(approval_id=approval.id).outcome == "invalid_arguments"


def test_it_approves_the_proposal_when_no_editor_is_sent_and_rejects_with_a_blank_one(client_for, alice):
    [card] = pending(start("Refund order A1001 for 25.00 USD"))
    [panel] = pending(start("Refund order A1002 for 25.00 USD"))
    client = client_for(alice)

    client.post(decide_url(card), {"decision": "approved"})  # an inbox card sends no editor
    client.post(decide_url(panel), {"decision": "rejected", "arguments": " ", "note": "no"})

    assert [Approval.objects.get(pk=a.id).status for a in (card, panel)] == ["approved", "rejected"]
    assert Approval.objects.get(pk=card.id).arguments is None


def test_it_says_a_number_in_the_arguments_is_too_long_in_its_own_words(client_for, alice, approval):
    arguments = '{"order_id": "A1001", "amount_cents": ' + "1" * 5001 + "}"

    response = client_for(alice).post(decide_url(approval), {"decision": "approved", "arguments": arguments})

    html = response.content.decode()
    assert response.status_code == 422
    assert "These arguments cannot be used: a number is too long (over 4,300 digits)." in html
    assert "set_int_max_str_digits" not in html and "4300" not in html
    assert Approval.objects.get(pk=approval.id).status == "pending"


def test_it_keeps_the_typed_feedback_when_approving_with_it_is_refused(client_for, alice, approval):
    response = client_for(alice).post(
        decide_url(approval), {"decision": "approved", "feedback": "Offer 10.00 instead", "note": "hm"}
    )

    assert response.status_code == 422
    assert "Offer 10.00 instead" in response.content.decode()  # the form keeps what was typed


def test_it_audits_an_unknown_or_oversized_approval_id_with_fields_that_fit(client_for, alice, approval):
    long_id = "appr_" + "x" * 300
    client = client_for(alice)

    response = client.post(
        f"/approvals/{long_id}/decide", {"decision": "approved"}, HTTP_X_FORWARDED_FOR="10.0.0.1" + "9" * 300
    )

    assert response.status_code == 404
    [refusal] = AuditEntry.objects.filter(outcome="not_found")
    assert refusal.approval_id == long_id[:200] and len(refusal.origin) <= 200 and refusal.actor == "alice"


def test_it_refuses_to_approve_a_question_without_an_answer(client_for, alice):
    [question] = pending(start("Ask a human whether to expedite order A1003"))

    response = client_for(alice).post(decide_url(question), {"decision": "approved", "answer": " "})

    assert response.status_code == 422
    assert "asked a question" in response.content.decode()
    question.refresh_from_db()
    assert question.status == "pending" and question.payload is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"arguments": {"order_id": "A1001", "amount_cents": True}}, "amount_cents"),
        ({"arguments": {"order_id": "A1001", "amount_cents": "1500"}}, "amount_cents"),
        ({"arguments": {"order_id": "A1001", "amount_cents": 1000.0}}, "amount_cents"),
        ({"feedback": "offer 10.00"}, "feedback"),
        ({"note": "ok\u0000"}, "note"),
    ],
    ids=["bool", "string", "float", "feedback", "nul-note"],
)
def test_it_refuses_the_same_input_through_the_api(client, alice, approval, body, field):
    token = services.token_create(username="alice")[1]

    response = client.post(
        f"/api/approvals/{approval.id}/decide",
        data=json.dumps({"decision": "approved", **body}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )

    assert response.status_code == 400, response.content  # the API's status for invalid input
    assert response.json()["error_code"] == "invalid" and field in response.json()["field"]
    approval.refresh_from_db()
    assert approval.status == "pending" and SideEffect.objects.count() == 0


def test_it_audits_an_approval_id_with_a_nul_as_not_found(client_for, alice, approval):
    response = client_for(alice).post(f"/approvals/{approval.id}%00/decide", {"decision": "approved"})

    assert response.status_code == 404
    [refusal] = AuditEntry.objects.filter(outcome="not_found")
    assert refusal.approval_id == approval.id + "\ufffd"
