"""A reviewer's words are never dropped nor invented (issue 7, item 17, the pages' side): a
question is approved with an answer typed in its card, and the decision buttons say what
they send, refusing to approve while feedback for a new draft is typed."""

from __future__ import annotations

import json

import pytest

from agents.models import Approval, AuditEntry
from tests.browser.conftest import screenshot
from tests.support.flows import pending, start

pytestmark = pytest.mark.browser

QUESTION = "Ask a human whether to expedite order A1003"
REFUND = "Refund order A1001 for 25.00 USD"


def test_it_approves_a_question_only_with_the_typed_answer(viewer, alice):
    [question] = pending(start(QUESTION, auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    card = f"#card-{question.id}"
    page.wait_for_selector(".live[data-state=open]")
    assert page.inner_text(f"{card} [data-action=approve]") == "Approve with answer"
    screenshot(page, "question-card")

    page.click(f"{card} [data-action=approve]")  # no answer yet: the browser keeps the form
    assert page.eval_on_selector(f"{card} input[name=answer]", "input => input.matches(':invalid')")
    page.evaluate("document.activeElement.blur()")  # the browser focused the empty answer box
    page.keyboard.press("j")
    page.keyboard.press("a")  # the approve key asks for the answer first
    assert page.evaluate("document.activeElement.name") == "answer"
    page.keyboard.type("   ")
    page.keyboard.press("Enter")
    assert page.eval_on_selector(f"{card} input[name=answer]", "input => input.matches(':invalid')")
    page.fill(f"{card} input[name=answer]", "Yes, ship it overnight")
    page.click(f"{card} [data-action=approve]")
    page.wait_for_selector(f"{card}.decided")

    question.refresh_from_db()
    assert (question.status, question.payload) == (Approval.Status.APPROVED, {"answer": "Yes, ship it overnight"})
    # Nothing was sent before the answer was there: one attempt, the decision.
    assert list(AuditEntry.objects.filter(approval_id=question.id).values_list("outcome", flat=True)) == ["decided"]
    assert alices.errors == []


def test_it_names_what_each_decision_sends_and_keeps_feedback_from_an_approval(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    approve, reject = "#decision button[value=approved]", "#decision button[value=rejected]"
    assert (page.inner_text(approve), page.inner_text(reject)) == ("Approve", "Reject")

    edited = json.dumps({"amount_cents": 2500, "order_id": "A1001"})  # same values, other order
    page.fill("#id_arguments", edited)
    assert page.inner_text(approve) == "Approve"
    page.fill("#id_arguments", json.dumps({"order_id": "A1001", "amount_cents": 1500}))
    assert page.inner_text(approve) == "Approve with edits"
    page.fill("#id_note", "Half now")
    assert page.inner_text(reject) == "Reject with note"

    page.fill("#id_feedback", "Offer 15.00 instead")
    assert page.inner_text(reject) == "Reject and ask to revise"
    assert page.is_disabled(approve)
    assert page.is_visible("#approve-hint")
    screenshot(page, "approval-feedback")
    page.click(reject)
    page.wait_for_selector("#decision .decided-line")

    approval.refresh_from_db()
    assert (approval.status, approval.note, approval.feedback) == ("rejected", "Half now", "Offer 15.00 instead")
    assert alices.errors == []


def _fetched_again(response) -> bool:
    return response.request.headers.get("hx-request") == "true" and "/approvals/" not in response.url


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_it_keeps_a_card_pushed_while_the_list_was_being_fetched_again(viewer, alice, order):
    """A reconnect fetches the list again; a card pushed before that answer lands, read
    before the card existed, stays (once, where the push put it), and a card the answer has
    comes fresh."""
    [older] = pending(start(REFUND, auto_resume=False))
    page = (alices := viewer("alice", path=f"/?order={order}")).page
    page.wait_for_selector(".live[data-state=open]")
    page.eval_on_selector(f"#card-{older.id}", "card => { card.dataset.marker = 'stale'; }")
    answers = []

    def hold(route) -> None:
        if route.request.headers.get("hx-request") != "true":
            route.continue_()
            return
        answers.append((route, route.fetch()))  # the server answers now, before the approval below

    page.route(lambda url: "/approvals/" not in url, hold)
    page.evaluate("htmx.trigger('#inbox', 'htmx:wsOpen')")  # what a reconnect does
    while not answers:
        page.wait_for_timeout(20)
    [newer] = pending(start(REFUND, auto_resume=False))  # pushed over the websocket meanwhile
    page.wait_for_selector(f"#card-{newer.id}")
    page.eval_on_selector("#inbox-cards", "list => { list.dataset.marker = 'before'; }")
    route, answer = answers[0]
    assert newer.id not in answer.text() and older.id in answer.text()

    route.fulfill(response=answer)
    page.wait_for_function("() => !document.getElementById('inbox-cards').dataset.marker")  # swapped

    assert page.locator(f"#card-{newer.id}").count() == 1
    assert page.get_attribute(f"#card-{older.id}", "data-marker") is None  # the answer's copy
    ids = page.eval_on_selector_all("#inbox-cards > .card", "cards => cards.map(card => card.id)")
    expected = [f"card-{older.id}", f"card-{newer.id}"]
    assert ids == (expected if order == "oldest" else expected[::-1])
    page.unroute_all()
    assert alices.errors == []


def test_it_keeps_a_worked_on_card_whole_when_the_list_is_fetched_again(viewer, alice):
    """The list comes again at every (re)connect: the card being typed in, and a decision on
    its way, stay as they are, and the answer of that decision still reaches the card."""
    [first] = pending(start(REFUND, auto_resume=False))
    [second] = pending(start(REFUND, auto_resume=False))
    page = (alices := viewer("alice")).page
    card, note = f"#card-{first.id}", f"#card-{first.id} textarea[name=note]"
    page.wait_for_selector(".live[data-state=open]")
    page.click(f"{card} [data-action=reject]")
    page.fill(note, "not this one")
    page.eval_on_selector(card, "card => { card.dataset.marker = 'kept'; }")
    page.eval_on_selector(f"#card-{second.id}", "card => { card.dataset.marker = 'stale'; }")

    with page.expect_response(_fetched_again):
        page.evaluate("htmx.trigger('#inbox', 'htmx:wsOpen')")  # what a reconnect does
    # The answer is in; htmx swaps it in a moment: the other card becomes a fresh copy.
    page.wait_for_function("id => !document.getElementById(id).dataset.marker", arg=f"card-{second.id}")
    assert page.get_attribute(card, "data-marker") == "kept"  # the same element, not a fresh copy
    assert page.input_value(note) == "not this one"
    assert page.evaluate("document.activeElement.name") == "note"

    held = []
    page.route(f"**/approvals/{first.id}/decide", lambda route: held.append(route))
    page.click(f"{card} button.danger")
    page.wait_for_selector(f"{card}.deciding")
    while not held:
        page.wait_for_timeout(20)
    with page.expect_response(_fetched_again):
        page.evaluate("htmx.trigger('#inbox', 'htmx:wsOpen')")
    held[0].fulfill(status=500, body="boom")
    page.wait_for_selector(f"{card} .decide-error")
    assert page.input_value(note) == "not this one"
    assert Approval.objects.get(pk=first.id).status == Approval.Status.PENDING
    assert alices.errors == []


def test_it_keeps_an_opened_reject_open_when_the_list_is_fetched_again(viewer, alice):
    """Opening Reject… is working on the card, even once the focus has left it."""
    [approval] = pending(start(REFUND, auto_resume=False))
    page = viewer("alice").page
    card = f"#card-{approval.id}"
    page.wait_for_selector(".live[data-state=open]")
    page.click(f"{card} [data-action=reject]")
    page.eval_on_selector(card, "card => { card.dataset.marker = 'kept'; document.activeElement.blur(); }")

    with page.expect_response(_fetched_again):
        page.evaluate("htmx.trigger('#inbox', 'htmx:wsOpen')")

    assert page.get_attribute(card, "data-marker") == "kept"
    assert page.is_visible(f"{card} textarea[name=note]")
