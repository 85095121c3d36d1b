"""Triage in real Chromium: two reviewers aware of each other, bulk decisions, a keyboard-only
triage, the diff of an edit before it is sent, and the pages at 1280 and 390 px.

No worker: decisions are recorded by the site; what runs afterwards is the engine's tests' business.
"""

from __future__ import annotations

import os
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from agents.models import Approval, AuditEntry
from tests.browser.conftest import screenshot, wait_js, wait_live
from tests.support.flows import pending, start

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"
EMAIL = "Email bob@example.com that his refund is on its way"
CARD = "#inbox-cards > .card"
# How many cards the keyboard-only triage decides (the measurement uses 20).
TRIAGE_CARDS = int(os.environ.get("AGENTFAST_TRIAGE_CARDS", "10"))


def test_it_keeps_what_a_reviewer_typed_when_someone_else_decides_and_updates_the_approval_page(viewer, alice, bob):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices, bobs = viewer("alice"), viewer("bob")
    wait_live(alices.page)
    card = f"#card-{approval.id}"
    alices.page.click(f"{card} [data-action=reject]")
    alices.page.fill(f"{card} textarea[name=note]", "Wait: the customer wrote again")

    # Alice also has the approval open in a second tab; bob opens it too: each sees the other.
    tab = alices.context.new_page()
    tab.goto(f"/approvals/{approval.id}")
    tab.fill("#id_note", "my draft")
    bobs.page.goto(f"/approvals/{approval.id}")
    tab.wait_for_selector("#approval-live .viewer >> text=bob")
    bobs.page.wait_for_selector("#approval-live .viewer >> text=alice")
    bobs.screenshot("approval-presence")

    bobs.page.click("#decision button[value=approved]")
    bobs.page.wait_for_selector("#decision .decided-line")

    status = alices.page.wait_for_selector(f"#card-status-{approval.id}.decided-elsewhere")
    assert status.inner_text().startswith("bob approved this ")
    assert alices.page.input_value(f"{card} textarea[name=note]") == "Wait: the customer wrote again"
    assert alices.page.is_disabled(f"{card} [data-label-reject]")
    alices.screenshot("inbox-decided-elsewhere")
    wait_js(tab, "document.getElementById('approval-status').textContent.trim() === 'approved'")
    assert tab.inner_text("#approval-live .live-status").startswith("bob approved this")
    assert tab.input_value("#id_note") == "my draft" and tab.is_disabled("#decision button[value=rejected]")
    assert Approval.objects.get(pk=approval.id).decided_by == "bob"
    assert alices.errors == [] and bobs.errors == []


def test_it_approves_several_cards_at_once_and_the_other_reviewer_sees_them_go(viewer, alice, bob):
    approvals = [pending(start(prompt, auto_resume=False))[0] for prompt in (REFUND, EMAIL, REFUND)]
    alices, bobs = viewer("alice"), viewer("bob")
    wait_live(bobs.page)
    page = alices.page
    assert page.is_disabled("#bulk-form button[value=approved]")
    for approval in approvals[:2]:
        page.check(f"#card-{approval.id} input.pick")
    assert page.inner_text("#bulk-form .bulk-count") == "2 selected"
    alices.screenshot("inbox-bulk-selected")

    page.click("#bulk-form button[value=approved]")

    assert page.inner_text("h1") == "2 of 2 approved"
    alices.screenshot("bulk-result")
    for approval in approvals[:2]:
        bobs.page.wait_for_selector(f"#card-{approval.id}", state="detached")
    assert bobs.page.locator(CARD).count() == 1
    decided = AuditEntry.objects.filter(actor="alice", outcome="decided").values_list("approval_id", flat=True)
    assert sorted(decided) == sorted(a.id for a in approvals[:2])


def test_it_triages_the_inbox_with_the_keyboard_only(viewer, alice):
    approvals = [pending(start(REFUND if n % 3 else EMAIL, auto_resume=False))[0] for n in range(TRIAGE_CARDS)]
    person = viewer("alice")
    page = person.page
    wait_live(page)
    page.keyboard.press("?")
    assert page.is_visible("#keys-help")
    page.keyboard.press("Escape")
    assert not page.is_visible("#keys-help")

    began = time.monotonic()
    page.keyboard.press("j")
    # Cards created in the same instant may sort either way: follow the selection, deciding each card once.
    waiting = {approval.id: n for n, approval in enumerate(approvals)}
    selected = "#inbox-cards > .card.selected:not(.decided):not(.deciding)"
    repressed = 0
    while waiting:
        try:
            page.wait_for_selector(selected, timeout=3000)
        except PlaywrightTimeoutError:
            # Known gap: a list refresh racing a decision can drop the selection; a reviewer presses j again.
            repressed += 1
            page.keyboard.press("j")
            page.wait_for_selector(selected)
        approval_id = page.get_attribute(selected, "id").removeprefix("card-")
        n = waiting.pop(approval_id)
        if n % 4 == 3:  # every fourth: reject with a note, sent with Ctrl+Enter
            page.keyboard.press("r")
            page.keyboard.type(f"not this one ({n})")
            page.keyboard.press("Control+Enter")
        else:  # high risk: the first "a" asks for a second
            page.keyboard.press("a")
            assert "press a again" in page.inner_text(f"#card-status-{approval_id}")
            page.keyboard.press("a")
        page.wait_for_selector(f"#card-{approval_id}.decided")
    wait_js(page, "document.getElementById('pending-count').dataset.count === '0'")
    took = time.monotonic() - began

    statuses = [Approval.objects.get(pk=a.id).status for a in approvals]
    assert statuses == ["rejected" if n % 4 == 3 else "approved" for n in range(TRIAGE_CARDS)]
    assert Approval.objects.get(pk=approvals[3].id).note == "not this one (3)"
    print(f"\nkeyboard-only triage of {TRIAGE_CARDS} cards: {took:.2f} s, j pressed again {repressed} times")
    assert person.errors == [] and person.dialogs == []


def test_it_shows_the_diff_of_an_edit_before_sending_it(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    person = viewer("alice", path=f"/approvals/{approval.id}")
    page = person.page
    page.keyboard.press("e")
    page.fill("#id_arguments", '{"order_id": "A1001", "amount_cents": 1500}')

    page.click("#decision button[value=approved]")
    assert page.inner_text(".diff-preview ul") == "amount_cents: 2500 → 1500"
    person.screenshot("approval-diff-preview")
    page.click("[data-preview-back]")  # nothing was sent
    assert page.is_hidden(".diff-preview") and Approval.objects.get(pk=approval.id).status == "pending"
    page.focus("#id_arguments")
    page.keyboard.press("Control+Enter")  # the same preview, from the keyboard
    page.wait_for_selector(".diff-preview:not([hidden])")
    page.keyboard.press("Enter")  # the preview's focused button sends it
    page.wait_for_selector("#decision .decided-line")

    approval.refresh_from_db()
    assert approval.status == "approved" and approval.arguments == {"order_id": "A1001", "amount_cents": 1500}
    assert page.inner_text("#decision .edits") == "amount_cents: 2500 → 1500"
    person.screenshot("approval-edited")
    assert person.errors == []


def test_it_announces_new_cards_and_fits_a_phone(viewer, alice):
    pending(start(REFUND, auto_resume=False))
    wide = viewer("alice")
    wait_live(wide.page)
    [approval] = pending(start(EMAIL, auto_resume=False))
    wide.page.wait_for_selector(f"#card-{approval.id}")
    wait_js(wide.page, "document.getElementById('announcer').textContent.includes('Email bob@example.com')")
    assert wide.page.get_attribute("#announcer", "aria-live") == "polite"
    # Every control of a card has a name a screen reader can read.
    unnamed = wide.page.evaluate(
        """() => [...document.querySelectorAll('#inbox-cards input, #inbox-cards textarea, #bulk-form input')]
             .filter((el) => el.type !== 'hidden' && !el.labels.length && !el.getAttribute('aria-label')).length"""
    )
    assert unnamed == 0
    screenshot(wide.page, "triage-inbox-1280")
    phone = viewer("alice", viewport={"width": 390, "height": 844})
    phone.page.wait_for_selector(CARD)
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(phone.page, "triage-inbox-390")
    phone.page.goto(f"/approvals/{approval.id}")
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(phone.page, "triage-approval-390")
    wide.page.goto(f"/approvals/{approval.id}")
    screenshot(wide.page, "triage-approval-1280")
