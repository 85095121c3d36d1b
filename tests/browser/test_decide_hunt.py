"""Deciding on the approval page in real Chromium: the page shows what the decision left, and keeps what a refusal did not take."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.gateway import services as gateway
from agents.models import Approval
from tests.browser.conftest import wait_js
from tests.support.flows import pending, start
from tests.support.policies import support_yaml

pytestmark = pytest.mark.browser

MAIL = {"to": "bob@example.com", "subject": "Your account", "body": "Closed."}


def test_it_takes_the_deadline_away_once_the_call_is_approved_on_its_page(agent_config, viewer, alice):
    agent_config(support_yaml(timeout="10m"))
    [approval] = pending(start("Refund order A1001 for 25.00 USD", auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    page.wait_for_selector(f"#deadline-{approval.id} [data-action=extend]")

    page.click("#decision button[value=approved]")

    page.wait_for_selector("#decision .decided-line")
    wait_js(page, "id => !document.querySelector('#deadline-' + id + ' [data-action=extend]')", arg=approval.id)
    assert not page.is_visible(f"#deadline-{approval.id}")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert alices.errors == []


def test_it_shows_the_edited_call_after_a_vote_and_keeps_a_note_a_refusal_did_not_take(viewer, alice):
    [approval] = pending(start("Refund order A1004 for 75.00 USD", auto_resume=False))  # quorum 2
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    page.wait_for_selector("#decision form")

    page.fill("#id_arguments", '{"order_id": "A1004", "amount_cents": 6000}')
    page.click("#decision button[value=approved]")
    page.click("[data-preview-send]")
    wait_js(page, "() => document.querySelector('#call pre.args').textContent.includes('6000')")
    approval.refresh_from_db()
    assert approval.short_digest in page.inner_text("#call") and approval.status == Approval.Status.PENDING

    page.fill("#id_note", "my vote stands")
    page.select_option("#id_remember", "3600")  # a quorum of two: it cannot be remembered
    page.click("#decision button[value=approved]")
    page.wait_for_selector("#decision .notice:has-text('cannot be remembered')")
    assert page.input_value("#id_note") == "my vote stands"
    assert alices.errors == []


def test_it_takes_the_preview_away_when_the_arguments_change_under_it(viewer, alice):
    [approval] = pending(start("Refund order A1001 for 25.00 USD", auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    page.wait_for_selector("#decision form")
    page.fill("#id_arguments", '{"order_id": "A1001", "amount_cents": 1500}')
    page.click("#decision button[value=approved]")
    page.wait_for_selector(".diff-preview:not([hidden]) ins:has-text('1500')")

    # Still editing with the preview open: "Send approval" would send 4000, the preview says 1500.
    page.fill("#id_arguments", '{"order_id": "A1001", "amount_cents": 4000}')

    assert page.locator(".diff-preview").is_hidden()
    page.click("#decision button[value=approved]")
    page.wait_for_selector(".diff-preview:not([hidden]) ins:has-text('4000')")
    page.click("[data-preview-send]")
    page.wait_for_selector("#decision .decided-line")
    approval.refresh_from_db()
    assert approval.arguments == {"order_id": "A1001", "amount_cents": 4000}
    assert alices.errors == []


def test_it_counts_one_digit_changed_in_a_big_integer_as_an_edit_and_shows_it(viewer, carol):
    # An account number past 2^53, which a browser's JSON.parse rounds: ...993 and ...992 read alike.
    User.objects.create_user(username="billing-bot")
    request = gateway.GateRequest(
        agent="billing", session="s1", call_id="c1", tool="send_email", arguments={**MAIL, "account": 9007199254740993}
    )
    approval_id = gateway.gate_call(owner="billing-bot", request=request).approval_id
    carols = viewer("carol", path=f"/approvals/{approval_id}")
    page = carols.page
    approve = page.locator("[data-label-approve]")

    page.fill("#id_arguments", json.dumps({**MAIL, "account": 9007199254740993}))
    expect(approve).to_have_text("Approve")
    page.fill("#id_arguments", json.dumps({**MAIL, "account": 9007199254740992}))
    expect(approve).to_have_text("Approve with edits")
    approve.click()

    # Shown before it is sent, as typed (the tool's schema then refuses the extra key: the server's say).
    expect(page.locator(".diff-preview")).to_contain_text("account: 9007199254740993 → 9007199254740992")
    assert carols.errors == []
