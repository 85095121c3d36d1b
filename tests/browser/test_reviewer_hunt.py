"""What a hurried reviewer does in the inbox and on the approval page, in real Chromium.

A decision that lost the race keeps saying so with the words typed; Ctrl+Enter sends a
question's answer, and on the approval page only a decision the reviewer chose; cards picked for a bulk decision stay picked when the list or a card is
drawn again; Enter in the bulk note decides nothing; a long edited word stays on a phone's screen.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from agents.gateway import services as gateway
from agents.models import Approval
from tests.browser.conftest import wait_js, wait_live
from tests.support.flows import decide, pending, start

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"
PHONE = {"width": 390, "height": 844}
MAIL = {"to": "bob@example.com", "subject": "Your refund", "body": "On its way."}
LINK = "https://example.com/refunds/" + "A1001" * 20  # no space to wrap at


def _fetched_again(response) -> bool:
    return response.request.headers.get("hx-request") == "true" and "/approvals/" not in response.url


def test_it_keeps_the_picked_cards_when_the_list_is_fetched_again(viewer, alice):
    first, second, third = (pending(start(REFUND, auto_resume=False))[0] for _ in range(3))
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    page.check(f"#card-{first.id} input.pick")
    page.check(f"#card-{second.id} input.pick")
    page.click("h1")  # the reviewer moves on: no card has the focus
    page.eval_on_selector("#inbox-cards", "list => { list.dataset.marker = 'before'; }")

    with page.expect_response(_fetched_again):
        page.evaluate("htmx.trigger('#inbox', 'htmx:wsOpen')")  # what a reconnect does
    wait_js(page, "() => !document.getElementById('inbox-cards').dataset.marker")  # swapped

    assert page.inner_text("#bulk-form .bulk-count") == "2 selected"
    page.click("#bulk-form button[value=approved]")
    assert page.inner_text("h1") == "2 of 2 approved"
    statuses = [Approval.objects.get(pk=a.id).status for a in (first, second, third)]
    assert statuses == ["approved", "approved", "pending"]
    assert alices.errors == []


def test_it_keeps_a_picked_card_picked_when_another_reviewers_vote_redraws_it(viewer, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD", auto_resume=False))  # quorum 2
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    card = f"#card-{approval.id}"
    page.check(f"{card} input.pick")
    page.click("h1")
    page.eval_on_selector(card, "card => { card.dataset.marker = 'before'; }")

    decide(approval, "approved", by="bob")  # a vote: the card comes again with its tally
    wait_js(page, "id => !document.getElementById(id).dataset.marker", f"card-{approval.id}")

    assert page.inner_text("#bulk-form .bulk-count") == "1 selected"
    page.click("#bulk-form button[value=approved]")
    assert page.inner_text("h1") == "1 of 1 approved"
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.APPROVED
    assert alices.errors == []


def test_it_does_not_approve_the_picked_cards_when_enter_ends_a_typed_bulk_note(viewer, alice):
    first, second = (pending(start(REFUND, auto_resume=False))[0] for _ in range(2))
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    page.check(f"#card-{first.id} input.pick")
    page.check(f"#card-{second.id} input.pick")
    # The note's own words: "the model reads it on a rejection". Enter is not a choice of button.
    page.fill("#bulk-form input[name=note]", "Not these: wrong customer")
    page.press("#bulk-form input[name=note]", "Enter")
    page.press("#bulk-form input[name=note]", "Control+Enter")
    page.wait_for_timeout(500)

    assert [Approval.objects.get(pk=a.id).status for a in (first, second)] == ["pending", "pending"]
    page.click("#bulk-form button[value=rejected]")
    assert page.inner_text("h1") == "2 of 2 rejected"
    assert [Approval.objects.get(pk=a.id).note for a in (first, second)] == ["Not these: wrong customer"] * 2
    assert alices.errors == []


def test_it_keeps_the_someone_decided_first_card_and_the_unrecorded_note(viewer, alice):
    [approval] = pending(start("Refund order A1001 for 25.00 USD", auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    card = f"#card-{approval.id}"
    held = []
    page.route(f"**/approvals/{approval.id}/decide", lambda route: held.append(route))
    page.click(f"{card} [data-action=reject]")
    page.fill(f"{card} textarea[name=note]", "wrong customer, call them first")
    page.click(f"{card} button.danger")
    while not held:
        page.wait_for_timeout(20)
    decide(approval, "approved", by="bob")  # bob's approval lands while alice's rejection is on its way
    page.wait_for_selector(f"#card-status-{approval.id}.decided-elsewhere")  # its removal push arrived
    held[0].continue_()
    page.wait_for_selector(f"{card} .unrecorded")

    page.wait_for_timeout(2500)  # a decided card leaves after 1.5 s + 0.6 s

    assert page.locator(f"{card} [role=alert]").inner_text().startswith("Someone decided first")
    assert "wrong customer, call them first" in page.inner_text(f"{card} .unrecorded")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.APPROVED
    assert alices.errors == []


def test_it_sends_a_questions_answer_with_ctrl_enter(viewer, alice):
    [question] = pending(start("Ask a human whether to expedite order A1003", auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    card = f"#card-{question.id}"
    page.fill(f"{card} input[name=answer]", "Yes, overnight")

    page.keyboard.press("Control+Enter")

    page.wait_for_selector(f"{card}.decided", timeout=3000)
    question.refresh_from_db()
    assert (question.status, question.payload) == (Approval.Status.APPROVED, {"answer": "Yes, overnight"})
    assert alices.errors == []


def test_it_sends_an_answer_typed_the_moment_the_list_was_drawn_again(viewer, alice):
    # A card the list's re-fetch just drew was not yet wired to htmx for the 20 ms htmx waits
    # before settling: an answer sent then went out as the browser's own GET, the answer in the
    # address and nothing recorded.
    [question] = pending(start("Ask a human whether to expedite order A1003", auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    card = f"#card-{question.id}"
    page.evaluate(
        """card => {
            document.body.addEventListener("htmx:afterSwap", () => setTimeout(() => {
                document.querySelector(card + " input[name=answer]").value = "Yes, overnight";
                document.querySelector(card + " button[data-action=approve]").click();
            }), { once: true });
            htmx.trigger(document.getElementById("inbox"), "htmx:wsOpen");
        }""",
        card,
    )

    page.wait_for_selector(f"{card}.decided", timeout=5000)
    assert "answer=" not in page.url
    question.refresh_from_db()
    assert (question.status, question.payload) == (Approval.Status.APPROVED, {"answer": "Yes, overnight"})
    assert alices.errors == []


def test_it_sends_no_decision_with_ctrl_enter_on_the_approval_page_until_one_is_chosen(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    # A note written for a rejection, in a field reached with the mouse: Approve is the first button.
    page.click("#id_note")
    page.keyboard.type("No: wrong account")
    page.keyboard.press("Control+Enter")

    page.wait_for_timeout(500)  # time for a decision to be sent, were one sent
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING
    assert page.inner_text("#decision .key-notice") == "Nothing sent: choose Approve or Reject (Esc, then a or r)."

    page.keyboard.press("Escape")  # out of the note, which keeps its words
    page.keyboard.press("r")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#decision .decided-line")
    approval.refresh_from_db()
    assert (approval.status, approval.note) == (Approval.Status.REJECTED, "No: wrong account")
    assert alices.errors == []


def test_it_approves_with_ctrl_enter_in_the_arguments_which_are_only_ever_approved(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    alices.page.click("#id_arguments")  # reached with the mouse: no r or e
    alices.page.keyboard.press("Control+Enter")

    alices.page.wait_for_selector("#decision .decided-line")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.APPROVED
    assert alices.errors == []


def test_it_keeps_the_preview_and_the_decided_edit_of_a_long_word_within_390_px(viewer, carol):
    User.objects.create_user(username="billing-bot")
    request = gateway.GateRequest(agent="billing", session="s1", call_id="c1", tool="send_email", arguments=MAIL)
    approval_id = gateway.gate_call(owner="billing-bot", request=request).approval_id
    seen = viewer("carol", path=f"/approvals/{approval_id}", viewport=PHONE)
    page = seen.page
    page.fill("#id_arguments", json.dumps({**MAIL, "body": LINK}))
    page.click("#decision button[value=approved]")
    page.wait_for_selector(".diff-preview:not([hidden])")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    page.click("[data-preview-send]")
    page.wait_for_selector("#decision ul.edits")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert Approval.objects.get(pk=approval_id).arguments == {**MAIL, "body": LINK}
    assert seen.errors == []
